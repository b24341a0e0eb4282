"""The draft the app edits, as plain data: composed from what the form shows, named, and its problems placed.

The app keeps no copy of the settings that could fall behind the screen. Every action that uses them (Start, the
check, the estimate, the YAML, the command line, the cluster export, the playground) composes the draft from the
form's values at that moment (:func:`compose`), on top of the draft last loaded (a recipe, a past run, or the one the
browser kept), which supplies the settings the form does not show.

The engine's validation errors name dotted config paths (``training.learning_rate must be ...``), which is right for
a YAML file and the command line. :func:`place_problem` says the same in the words on the screen ("Learning rate must
be ...", "The 4th reward (my_check): ...") and which part of the form the problem belongs to.

A public demo opens a draft kept by a browser only if it is no larger than the form makes (:func:`kept_draft_refusal`):
anyone can send one of any size and shape with a page load.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import NOTES_CHARS, PATH_CHARS, RunConfig
from ..data import TEMPLATE_CHARS
from ..errors import DragonError
from ..public import Policy
from ..rewards.spec import MOST_REWARDS, REWARD_SETTINGS
from ..runstore import slug
from ..settings import MOST_ITEMS
from ..tools.spec import MOST_EXAMPLES, MOST_TOOLS, TOOL_SETTINGS

SECTIONS = tuple(f.name for f in dataclasses.fields(RunConfig))  # the first word of every config path
# A config path at the start of an engine message: "training.learning_rate", "rewards[3].code", "data.source".
_LEADING_PATH = re.compile(r"^(?P<path>(?P<section>[a-z_]+)(?:\[(?P<index>\d+)\])?(?:\.[a-z_0-9]+)*)(?=[\s:;,.]|$)")
_REWARD_PATH = re.compile(r"^rewards\[(?P<index>\d+)\](?:\.(?P<field>[a-z_]+))?$")
_TOOL_PATH = re.compile(r"^tools\[(?P<index>\d+)\](?:\.(?P<field>[a-z_]+))?")
_EXAMPLE_REST = re.compile(r"^\.examples\[(?P<index>\d+)\](?:\.(?P<field>[a-z_]+))?")
TOOL_FIELD_WORDS = {"kind": "the kind", "name": "the name", "key_column": "the key column",
                    "value_column": "the value column", "column": "the column to search",
                    "description": "what the model is told", "code": "the Python function", "file": "the .py file",
                    "function": "the function name", "examples": "the worked examples"}
REWARD_FIELD_WORDS = {"code": "the Python code", "file": "the .py file", "function": "the function name",
                      "pattern": "the regular expression", "keys": "the required keys", "words": "the words",
                      "tags": "the tags", "argv": "the command", "name": "the name", "weight": "the weight",
                      "kind": "the kind", "min_chars": "the minimum length", "max_chars": "the maximum length",
                      "tolerance": "the tolerance", "extract": "the part of the reply compared"}


# The most a kept draft may take, in bytes of its JSON. It holds two drafts (the settings and their pristine copy:
# app.remember), and a draft's bulk is the text the form lets one type at length: three templates of TEMPLATE_CHARS,
# notes of NOTES_CHARS, and for each of MOST_REWARDS rewards a pattern or a classifier of up to PATH_CHARS; every
# other setting, with the names around them all, takes far less than OTHER_SETTINGS_BYTES (a bundled recipe's whole
# draft takes 3 KB). 124,384 bytes: 20 times the kept draft of the largest bundled recipe, and a 14th of what one
# sent in the review (1.8 MB, held as 32 MB by its session).
OTHER_SETTINGS_BYTES = 8 * 1024
KEPT_DRAFT_BYTES = 2 * (3 * TEMPLATE_CHARS + NOTES_CHARS + MOST_REWARDS * PATH_CHARS + OTHER_SETTINGS_BYTES)
# How deep a kept draft may nest: twice the five levels of the deepest the form makes (the kept draft, the draft, its
# rewards, a reward, its list of keys or words).
KEPT_DRAFT_DEPTH = 10
# The most JSON values a kept draft may hold (each object, list, text and number is one): what it costs the server
# once parsed, which its bytes do not say (a body of empty objects takes 30 times its size). Each of its two drafts
# may have MOST_REWARDS rewards with its kind and every setting any kind has and two lists of MOST_ITEMS items,
# MOST_TOOLS tools with their kind, every setting and MOST_EXAMPLES examples, and far fewer than OTHER_SETTINGS_VALUES
# values besides (a bundled recipe's whole draft has about 100).
OTHER_SETTINGS_VALUES = 500
KEPT_DRAFT_VALUES = 2 * (MOST_REWARDS * (1 + len(REWARD_SETTINGS) + 2 * MOST_ITEMS)
                         + MOST_TOOLS * (1 + len(TOOL_SETTINGS) + MOST_EXAMPLES * 8)
                         + OTHER_SETTINGS_VALUES)


def kept_draft_refusal(kept: Any) -> str | None:
    """Why a public demo does not open the draft a browser kept (app.remember's {"draft", "pristine",
    "auto_name"}), in a sentence; None when it may. Anyone can send a draft of any size and shape with a page load,
    and the page's session holds what the tabs make of it: one larger, deeper or with more rewards than the form
    makes is refused before anything is made of it."""
    words = "The settings this browser kept were not opened:"
    try:
        size = len(json.dumps(kept, ensure_ascii=False).encode("utf-8"))
    except RecursionError:  # nested hundreds deep
        size = None
    if size is not None and size > KEPT_DRAFT_BYTES:
        return f"{words} they take {size:,} bytes, more than the {KEPT_DRAFT_BYTES:,} the form makes at most."
    values, depth = json_shape(kept, KEPT_DRAFT_VALUES)
    if size is None or depth > KEPT_DRAFT_DEPTH:
        return f"{words} they nest more than {KEPT_DRAFT_DEPTH} levels deep, deeper than the form makes."
    if values > KEPT_DRAFT_VALUES:
        return f"{words} they hold more than {KEPT_DRAFT_VALUES:,} values, more than the form makes at most."
    for part in ("draft", "pristine"):
        rewards = kept.get(part) if isinstance(kept, dict) else None
        rewards = rewards.get("rewards") if isinstance(rewards, dict) else None
        if isinstance(rewards, list) and len(rewards) > MOST_REWARDS:
            return f"{words} they have {len(rewards):,} rewards, more than the {MOST_REWARDS} a run may have."
    return None


def json_shape(value: Any, most_values: float = math.inf) -> tuple[int, int]:
    """(how many values, how many dicts and lists deep) ``value`` holds, counted without recursion; the count stops
    once it passes ``most_values``, and the depth is then that of what was counted."""
    values, deepest, stack = 0, 0, [(value, 1)]
    while stack and values <= most_values:
        item, depth = stack.pop()
        values += 1
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return values, deepest


def set_path(draft: dict[str, Any], path: str, value: Any) -> None:
    """Set ``draft["a"]["b"]`` for the path "a.b", creating missing sections and replacing any that is not one (a
    draft kept by a browser may hold anything)."""
    *parents, leaf = path.split(".")
    target = draft
    for part in parents:
        if not isinstance(target.get(part), dict):
            target[part] = {}
        target = target[part]
    target[leaf] = value


def compose(base: dict, values: dict[str, Any]) -> dict:
    """``base`` (the draft last loaded) with every form value written at its config path; ``base`` is not changed."""
    draft = copy.deepcopy(base or {})
    for path, value in values.items():
        set_path(draft, path, value)
    return draft


def same_settings(one: dict, other: dict, *, policy: Policy) -> bool:
    """Whether two drafts describe the same run: compared after validation (under ``policy``), so 1e-5 and 0.00001
    are equal."""
    return settings_of(one, policy=policy) == settings_of(other, policy=policy)


def settings_of(draft: dict, *, policy: Policy) -> dict:
    """The run a draft describes, validated (under ``policy``) and written back: what same_settings compares. A
    draft that is no valid run stays as it is."""
    try:
        return RunConfig.from_dict(copy.deepcopy(draft), policy=policy).to_dict()
    except DragonError:
        return draft


def run_name_for(source: str) -> str:
    """A run name from a data source: the file's name without extension, or a Hub id's dataset name."""
    stem = Path(source.rstrip("/")).stem if source else ""
    return slug(stem, empty="")


def renamed(current: str, auto_name: str, source: str) -> tuple[str, str]:
    """(run name, name chosen automatically) after the data source changed to ``source``.

    The name follows the data while it is the one chosen automatically (from the recipe or the previous file) or
    empty; a name the user typed is kept.
    """
    current = (current or "").strip()
    if current and current != auto_name:
        return current, auto_name
    name = run_name_for(source) or current
    return name, name


@dataclass(frozen=True)
class Problem:
    """A validation problem as the app shows it: where it belongs and the sentence in the screen's words."""

    section: str | None  # the config section it concerns ("training", "rewards", "data", ...), None if general
    path: str | None  # the full config path ("training.learning_rate"), None if the message names none
    text: str

    @property
    def tab(self) -> str | None:
        """The app tab whose fields it concerns."""
        if self.section is None:
            return None
        return {"data": "Data", "rewards": "Rewards", "tools": "Rewards"}.get(self.section, "Model & Hardware")

    def seen_from(self, tab: str) -> str:
        """The sentence as shown on ``tab``: naming the tab it is on when that is another one."""
        return self.text if self.tab in (None, tab) else f"{self.text} (on the {self.tab} tab)"


def ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def place_problem(message: str, labels: dict[str, str], rewards: list[dict] | None = None,
                  tools: list[dict] | None = None) -> Problem:
    """Where an engine message belongs and how to say it with the form's ``labels`` (config path -> label), the
    draft's ``rewards`` and ``tools`` naming the one it is about.

    Other config paths inside the message are replaced by their labels too.
    """
    match = _LEADING_PATH.match(message)
    if not match or match["section"] not in SECTIONS:
        return Problem(None, None, _with_labels(message, labels))
    path, rest = match["path"], message[match.end():]
    tool = _TOOL_PATH.match(path)
    if tool:  # "The 1st tool (calculator): the worked examples ..."
        spec = (tools or [])[int(tool["index"])] if int(tool["index"]) < len(tools or []) else {}
        name = spec.get("name") or spec.get("kind") if isinstance(spec, dict) else None
        subject = f"The {ordinal(int(tool['index']) + 1)} tool" + (f" ({name})" if name else "")
        field = TOOL_FIELD_WORDS.get(tool["field"] or "", "")
        example = _EXAMPLE_REST.match(rest)
        if example:  # tools[0].examples[1]: ... (the leading path stops before an index it cannot end at)
            field = f"its {ordinal(int(example['index']) + 1)} worked example" + ("'s arguments" if example["field"]
                                                                                  else "")
            rest = rest[example.end():]
        return Problem("tools", path, f"{subject}: {field}{rest}" if field else f"{subject}{rest}")
    reward = _REWARD_PATH.match(path)
    if reward:
        field = REWARD_FIELD_WORDS.get(reward["field"] or "", reward["field"] or "")
        subject = _reward_words(int(reward["index"]), rewards)
        text = f"{subject[0].upper()}{subject[1:]}: {field}{rest}" if field else f"{subject[0].upper()}{subject[1:]}{rest}"
        return Problem("rewards", path, _with_labels(text, labels, rewards, own_reward=int(reward["index"])))
    label = labels.get(path)
    text = f"{label}{rest}" if label else message
    return Problem(match["section"], path, _with_labels(text, labels, rewards, skip_start=len(label or "")))


def _reward_words(index: int, rewards: list[dict] | None) -> str:
    """'the 4th reward (my_check)': a reward as the Rewards tab lists it."""
    spec = (rewards or [])[index] if index < len(rewards or []) else {}
    name = (spec.get("name") or spec.get("kind")) if isinstance(spec, dict) else None
    return f"the {ordinal(index + 1)} reward" + (f" ({name})" if name else "")


def _with_labels(text: str, labels: dict[str, str], rewards: list[dict] | None = None, skip_start: int = 0,
                 own_reward: int | None = None) -> str:
    """Replace config paths inside a sentence by their quoted labels ("lora.enabled: true" -> "“Train a LoRA
    adapter” ticked", "rewards[2].max_chars" -> "the maximum length of the 3rd reward (length)"); the first
    ``skip_start`` characters are already in the screen's words; a setting of ``own_reward``, the reward the
    sentence is about, is named without repeating which reward."""
    head, tail = text[:skip_start], text[skip_start:]

    def reward_words(match: re.Match) -> str:
        subject = _reward_words(int(match["index"]), rewards)
        field = REWARD_FIELD_WORDS.get(match["field"] or "", match["field"] or "")
        if field and int(match["index"]) == own_reward:
            return field
        return f"{field} of {subject}" if field else subject

    tail = re.sub(r"(?<![\w.])rewards\[(?P<index>\d+)\](?:\.(?P<field>[a-z_]+))?", reward_words, tail)
    for path in sorted(labels, key=len, reverse=True):
        if "." not in path:  # a bare section ("name", "rewards") is also a plain word: "give a column name"
            continue
        quoted = f"“{labels[path]}”"
        tail = re.sub(rf"(?<![\w.]){re.escape(path)}: true\b", f"{quoted} ticked", tail)
        tail = re.sub(rf"(?<![\w.]){re.escape(path)}: false\b", f"{quoted} unticked", tail)
        tail = re.sub(rf"(?<![\w.]){re.escape(path)}(?![\w\[])", quoted, tail)
    return head + tail
