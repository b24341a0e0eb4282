"""Settings that carry their own label and help, as TRL's configs do.

The Model tab's fields, `dragon settings` and docs/reference.md's table are all made from this metadata, so a
setting is explained in one place. The help is Markdown with absolute links only (it is shown in the app as well
as in the docs); ``see`` is a pointer into the reference that only the reference shows.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, Field, field
from typing import Any, Callable


def setting(default: Any = MISSING, *, label: str, help: str, factory: Callable[[], Any] | None = None,
            shown_default: str | None = None, see: str | None = None) -> Any:
    """A dataclass field with its label (a few words, as a form names it) and help (what it does, in sentences).
    ``shown_default`` says the default in words where the value itself would mislead (None that means "automatic")."""
    metadata = {"label": label, "help": help, "shown_default": shown_default, "see": see}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def is_described(spec: Field[Any]) -> bool:
    return "help" in spec.metadata


def plain(markdown: str) -> str:
    """Help as a terminal shows it: a link becomes its text, code marks go."""
    return re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", markdown).replace("`", "")


def shown_default(spec: Field[Any]) -> str:
    """The default as the reference writes it: a word for "none", code marks around names and lists."""
    if spec.metadata.get("shown_default"):
        return str(spec.metadata["shown_default"])
    factory = spec.default_factory
    value = factory() if spec.default is MISSING and callable(factory) else spec.default
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return re.sub(r"e-0*(\d)", r"e-\1", repr(value))  # 1e-05 -> 1e-5
    if isinstance(value, int):
        return str(value)
    return f"`{value}`" if isinstance(value, str) else f"`{value!r}`"
