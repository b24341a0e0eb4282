"""Settings that carry their own label and help, as TRL's configs do.

The Model tab's fields, `dragon settings` and docs/reference.md's table are all made from this metadata, so a
setting is explained in one place; so are the fields of each kind of reward and tool (a dataclass of the settings
it takes) and the reference's tables of them. The help is Markdown with absolute links only (it is shown in the app
as well as in the docs); ``see`` is a pointer into the reference that only the reference shows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, Field, field, fields
from typing import Any, Callable, ClassVar, Protocol

from .errors import ConfigError, check_length

# A list setting (a reward's keywords, say) may have at most this many items: any client can send millions.
MOST_ITEMS = 100


def setting(default: Any = MISSING, *, label: str, help: str, factory: Callable[[], Any] | None = None,
            shown_default: str | None = None, see: str | None = None,
            read: Callable[[object, str], Any] | None = None, longest: int | None = None) -> Any:
    """A dataclass field with its label (a few words, as a form names it) and help (what it does, in sentences).
    ``shown_default`` says the default in words where the value itself would mislead (None that means "automatic").
    A setting checked one by one as it is read (a reward's, a tool's) says how: ``read(value, where)`` returns the
    value or raises ConfigError naming ``where``, after a text (or each item of a list) longer than ``longest``
    characters was refused."""
    metadata = {"label": label, "help": help, "shown_default": shown_default, "see": see, "read": read,
                "longest": longest}
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


class Kind(Protocol):
    """A kind of reward or of tool: a dataclass of the settings it takes, which names itself and says what it does
    (``help``, shown by the app and the reference; ``details``, by the reference only)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    kind: ClassVar[str]
    help: ClassVar[str]
    details: ClassVar[str]


def own_settings(kind: type[Kind], base: type[Kind]) -> list[Field[Any]]:
    """The settings a kind (a dataclass extending ``base``, as a reward's or a tool's kind does) adds to ``base``'s."""
    shared = {spec.name for spec in fields(base)}
    return [spec for spec in fields(kind) if spec.name not in shared]


def read_kind_settings(data: Mapping[Any, object], where: str, kind: type[Kind], kinds: Sequence[type[Kind]],
                       base: type[Kind], *, noun: str, longest: int) -> dict[str, Any]:
    """The settings ``data`` gives a ``kind`` (one of ``kinds``, which all extend ``base``), each read and checked by
    its own ``read`` after its size: a text longer than its ``longest`` (else ``longest``), or a list of more than
    MOST_ITEMS items. A key no kind takes, or that only other kinds take, is a ConfigError naming it (``noun``:
    "reward", "tool"). A value of None or "" counts as not given: it falls back to its default."""
    allowed = ("kind", *(spec.name for spec in fields(kind)))
    known = {spec.name for other in kinds for spec in fields(other)}
    for key, value in data.items():
        shown = str(key)[:40]
        if key not in known and key != "kind":
            raise ConfigError(f"{where} has an unknown setting {shown!r}; known settings for {_a_kind(kind, noun)} "
                              f"are: {', '.join(allowed)}.")
        if key not in allowed and _given(value):
            owners = [other.kind for other in kinds if key in {spec.name for spec in own_settings(other, base)}]
            raise ConfigError(f"{where}.{shown} does not apply to {_a_kind(kind, noun)}; it is a setting of "
                              f"{' and '.join(owners)} {noun}s.")
    values = {}
    for spec in fields(kind):
        value = data.get(spec.name)
        if _given(value):
            label = f"{where}.{spec.name}"
            _check_size(value, label, spec.metadata["longest"] or longest)
            values[spec.name] = spec.metadata["read"](value, label)
    return values


def _a_kind(kind: type[Kind], noun: str) -> str:
    """"an exact reward", "a lookup tool"."""
    return f"{'an' if kind.kind[0] in 'aeiou' else 'a'} {kind.kind} {noun}"


def _given(value: object) -> bool:
    return value is not None and value != ""


def _check_size(value: object, label: str, longest: int) -> None:
    items = value if isinstance(value, (list, tuple)) else [value]
    if len(items) > MOST_ITEMS:
        raise ConfigError(f"{label} has {len(items)} items, more than the {MOST_ITEMS} it may have.")
    for item in items:
        check_length(label, item, longest)


def kinds_table(kinds: Sequence[type[Kind]], base: type[Kind], what: str) -> str:
    """docs/reference.md's table of kinds (of reward, of tool), in Markdown: each kind's own settings and ``what``
    it does: its ``help`` (the app shows it too), then its ``details`` (only the reference does)."""
    rows = [f"| kind | settings | {what} |", "|---|---|---|"]
    for kind in kinds:
        own = ", ".join(f"`{spec.name}`" for spec in own_settings(kind, base)) or "–"
        rows.append(f"| `{kind.kind}` | {own} | {_cell(f'{kind.help} {kind.details}'.strip())} |")
    return "\n".join(rows) + "\n"


def kind_settings_table(kinds: Sequence[type[Kind]], base: type[Kind]) -> str:
    """docs/reference.md's table of the settings of kinds, in Markdown: each setting once, with the kinds that take
    it (every kind takes ``base``'s), its default and its help."""
    owners: dict[str, list[str]] = {spec.name: ["every"] for spec in fields(base)}
    described: dict[str, Field[Any]] = {spec.name: spec for spec in fields(base)}
    for kind in kinds:
        for spec in own_settings(kind, base):
            described.setdefault(spec.name, spec)
            owners.setdefault(spec.name, []).append(f"`{kind.kind}`")
    rows = ["| setting | kinds | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{name}` | {', '.join(owners[name])} | {shown_default(spec)} | {_cell(spec.metadata['help'])} |"
             for name, spec in described.items()]
    return "\n".join(rows) + "\n"


def _cell(markdown: str) -> str:
    """Text as one cell of a Markdown table."""
    return markdown.replace("|", "&#124;")
