"""Errors the engine raises on purpose, each carrying one sentence a workshop participant can act on."""


class DragonError(Exception):
    """Base class: the message is meant to be shown to the user as is."""


class ConfigError(DragonError, ValueError):
    """A setting, data file or reward is wrong; raised at validation, before any training starts."""


class BusyError(DragonError):
    """Another training is already running in this process."""


class NotYoursError(DragonError):
    """A public demo's visitor asked to change or take a run another visitor started."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" when it has none): library errors can run to pages."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def describe(exc: BaseException) -> str:
    """"TypeError: its first line", or just the type when the message is empty."""
    first = first_line(exc)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__

