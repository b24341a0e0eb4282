"""Errors the engine raises on purpose, each carrying one sentence a workshop participant can act on."""


class DragonError(Exception):
    """Base class: the message is meant to be shown to the user as is."""


class ConfigError(DragonError, ValueError):
    """A setting, data file or reward is wrong; raised at validation, before any training starts."""


class RewardError(DragonError):
    """An expected reward failure (timeout, missing reference, ...) whose message is already readable as is."""


class BusyError(DragonError):
    """Another training is already running in this process."""


class Stopped(DragonError):
    """A stop, or a public demo's time limit, ended the work before it was done."""


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



def one_line(error: BaseException | str) -> str:
    """One short line: our own messages as they are, anything else as "ZeroDivisionError: division by zero" (a
    reward's failure, as the Train tab and the playground show it)."""
    if isinstance(error, str):
        text = error
    elif isinstance(error, DragonError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    line = next((line.strip() for line in text.splitlines() if line.strip()), "unknown error")
    return line if len(line) <= 200 else line[:197] + "..."


def check_length(where: str, text: object, most: int) -> None:
    """Refuse a text setting longer than ``most`` characters: any client can send megabytes in a field, and every
    check, preview and saved config would carry them."""
    if isinstance(text, str) and len(text) > most:
        raise ConfigError(f"{where} has {len(text):,} characters, more than the {most:,} it may have.")


def check_unique_names(where: str, names: list[str], what: str) -> None:
    """Refuse a list whose entries share a name (``what``: "rewards", "tools"): a name is how a run tells them apart."""
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            raise ConfigError(f"{where}[{index}].name: two {what} are named {name!r} ({where}[{seen[name]}] and "
                              f"{where}[{index}]); give one of them a different name.")
        seen[name] = index


MAX_SEED = 2**32 - 1  # NumPy's seeds are 32-bit


def check_seed(where: str, seed: object) -> None:
    """Refuse a seed that is not a whole number NumPy and PyTorch both take."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{where} must be a whole number from 0 to {MAX_SEED:,}, got {seed!r}.")
