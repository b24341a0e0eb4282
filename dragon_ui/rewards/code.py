"""The code a reward's settings carry, checked when they are validated and used when a reward is built: a regular
expression, compiled and probed for patterns that take exponential time, and a custom Python function, loaded."""

from __future__ import annotations

import functools
import inspect
import os
import types
from collections.abc import Callable

import regex

from ..errors import ConfigError, one_line


def compile_pattern(text: str, case_sensitive: bool, where: str) -> regex.Pattern:
    """The pattern, compiled by the ``regex`` package (Python's syntax; it releases the GIL while it matches and
    takes a timeout), refused with a sentence when it is not valid or takes too long on some texts."""
    flags = 0 if case_sensitive else regex.IGNORECASE
    try:
        pattern = regex.compile(text, flags)
    except regex.error as error:
        raise ConfigError(f"{where}.pattern is not a valid regular expression: {error}.") from None
    slow_on = _slow_text(text, flags)
    if slow_on is not None:
        shown = slow_on if len(slow_on) <= 24 else f"{slow_on[:12]}…{slow_on[-6:]}"
        raise ConfigError(f"{where}.pattern takes too long on some replies (over {PROBE_TIMEOUT_S:g} s on "
                          f"{shown!r}): repetition that can match the same text in many ways, such as (a|aa)+ or "
                          "(a+)+, takes exponential time; rewrite it so each character can be matched one way only.")
    return pattern


# Texts that make backtracking patterns slow: a character (or pair) repeated, then one that does not fit.
_PROBE_PIECES = ("a", "0", " ", "ab", "a ", "a1", "\n", ".", ",", "<>", "-")
PROBE_REPEATS, PROBE_TIMEOUT_S = 40, 0.05


@functools.lru_cache(maxsize=256)
def _slow_text(pattern_text: str, flags: int) -> str | None:
    """A short text on which the pattern takes more than PROBE_TIMEOUT_S (checked when a reward is saved, so a
    pattern that backtracks exponentially is refused before a run meets it), or None."""
    pattern = regex.compile(pattern_text, flags)
    pieces = dict.fromkeys([*_PROBE_PIECES, *(char for char in pattern_text if char.isalnum())][:24])
    for piece in pieces:
        for end in ("!", "\x00", ""):
            text = piece * PROBE_REPEATS + end
            try:
                pattern.search(text, timeout=PROBE_TIMEOUT_S)
            except TimeoutError:
                return text
    return None


def load_function(code: str | None, file: str | None, function_name: str, module_name: str, base_dir: str | None,
                  where: str, usage: str) -> tuple[Callable, str]:
    """Compile and run Python source (``code``, or the file ``file``) in a fresh module namespace; (its function
    ``function_name``, the setting's label for errors). ``usage`` says how the function should be defined."""
    if code is not None:
        source, label, filename = code, f"{where}.code", f"<{where}.code>"
    elif file is None:
        raise ConfigError(f"{where}.code and {where}.file are both missing; give the Python source or a .py file.")
    else:
        filename = file if os.path.isabs(file) or not base_dir else os.path.join(base_dir, file)
        label = f"{where}.file ({filename})"
        try:
            with open(filename, encoding="utf-8") as handle:
                source = handle.read()
        except OSError as error:
            raise ConfigError(f"{label} cannot be read: {error.strerror or error}.") from None
    try:
        compiled = compile(source, filename, "exec")
    except SyntaxError as error:
        raise ConfigError(f"{label} has a syntax error on line {error.lineno}: {error.msg}.") from None
    module = types.ModuleType(module_name)
    module.__file__ = filename
    try:
        exec(compiled, module.__dict__)
    except Exception as error:
        raise ConfigError(f"{label} failed while loading: {one_line(error)}.") from None
    function = module.__dict__.get(function_name)
    if function is None:
        raise ConfigError(f"{label} defines no function named {function_name!r}; define {usage}.")
    if not callable(function):
        raise ConfigError(f"{label} defines {function_name!r}, but it is a {type(function).__name__}, "
                          f"not a function.")
    return function, label


def load_custom_function(code: str | None, file: str | None, function_name: str, module_name: str,
                         base_dir: str | None, where: str) -> Callable:
    """Compile and run the custom source (``code``, or the file ``file``) in a fresh module namespace and return its
    reward function, ``function_name``."""
    function, label = load_function(code, file, function_name, f"dragon_reward_{module_name}", base_dir, where,
                                    f"def {function_name}(prompt, completion, reference, row) returning a number")
    try:
        inspect.signature(function).bind("", "", None, {})
    except TypeError:
        raise ConfigError(f"{label} defines {function_name!r}, but it cannot be called as "
                          f"{function_name}(prompt, completion, reference, row).") from None
    except ValueError:  # some builtins have no inspectable signature; they are called as is
        pass
    return function
