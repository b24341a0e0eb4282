"""Errors the engine raises on purpose, each carrying one sentence a workshop participant can act on."""


class DragonError(Exception):
    """Base class: the message is meant to be shown to the user as is."""


class ConfigError(DragonError, ValueError):
    """A setting, data file or reward is wrong; raised at validation, before any training starts."""


class BusyError(DragonError):
    """Another training is already running in this process."""
