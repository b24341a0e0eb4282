"""Tab 2 · Rewards: build the list of rewards, then try it in a playground before spending a training run on it.

The editor is one form for every kind; only the settings of the selected kind are shown (rewards.kind_fields), each
field labelled, explained and filled with its default as the kind's class declares it (rewards.spec). Each add or
save goes through rewards.parse_rewards, the same validation as a run, and writes draft["rewards"] as
RewardSpec.to_dict() dicts; a rejected form leaves the draft as it was and says why next to the buttons.

The playground scores a typed reply with rewards.score_completion, or samples a group of replies from the starting
model and shows GRPO's view of them: per-reward scores, totals, advantages, and a warning when a group has no
learning signal.
"""

from __future__ import annotations

import contextvars
import functools
import json
import queue
import re
import shlex
import threading
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import gradio as gr
import pandas as pd

from ..config import Draft
from ..data import prompt_text
from ..errors import ConfigError, DragonError
from ..public import Policy
from ..settings import plain
from ..studio.draft import place_problem
from ..studio.playground import (GroupScores, advantages_of, data_config, display_text, generate_groups,
                                 no_signal_warning, playground_rewards, preview_examples, prompt_limit_of,
                                 red_team_draft, refuse_long_prompts, reward_failures, sampling_rewards,
                                 sampling_tools, score_example, unpayable)
from ..rewards import (REWARD_CLASSES, REWARD_KINDS, REWARD_SETTINGS, Choice, RewardSpec, check_some_weight, gate_of,
                       goal_names, kind_fields, parse_rewards, public_demo_refusal, reward_rule)
from ..studio.backend import Studio
from . import tools_section
from .common import (ONE_MODEL_AT_A_TIME, SAMPLING, asked, bound, explain, Form, message, number, optional_number,
                     Shared, shown_number, shows_errors)
from .guard import in_page_order

# The settings the form shows after kind, name and weight: every kind's, then each kind's own, in declared order.
SETTINGS = tuple(name for name in REWARD_SETTINGS if name not in ("name", "weight"))
# kind, name, weight, help, the settings, the Add / Save / Remove buttons, and which reward the form shows
EDITOR_SIZE = 4 + len(SETTINGS) + 3 + 1
TAB_TITLE = "Rewards"
REPLY_CHARS = 20_000  # a typed reply to score
SCORE_COLUMNS = ["reward", "weight", "score", "weighted", "problem"]
SAMPLED_ROWS = (1, 2, 3)  # rows one "Generate a group" samples
MOST_ROW = 10**9  # the largest row number a client may send for the playground (no file read here has more)
DEFAULTS: dict[str, Any] = {name: spec.default for name, spec in REWARD_SETTINGS.items()}
# Each setting's declared type, which picks its field: a list is typed as comma-separated text (argv as a command
# line), and a whole number that may stay empty (its default then) is an optional number.
TYPES = {name: hint for cls in REWARD_CLASSES for name, hint in typing.get_type_hints(cls).items()
         if name in REWARD_SETTINGS}
LIST_SETTINGS = tuple(name for name in SETTINGS if TYPES[name] == list[str] | None and name != "argv")
OPTIONAL_NUMBERS = tuple(name for name in SETTINGS if TYPES[name] == int | None)
COMMON_SETTINGS = tuple(name for name in SETTINGS if name not in {own for kind in REWARD_KINDS
                                                                  for own in kind_fields(kind)})
GOAL_CHOICES = {"automatic": None, "yes": True, "no": False}  # the goal radio's choices and what each stores
NUMBER_STEPS = {"tolerance": 0.01}  # what a number field's arrows add, where 1 is too much
STARTER_CODE = '''def reward(prompt, completion, reference, row):
    """Return a number; higher means a better reply. row holds every column of the data row as text."""
    return 1.0 if reference and reference.strip() in completion else 0.0
'''
KIND_HELP = {cls.kind: cls.help for cls in REWARD_CLASSES}  # Markdown, as the tab shows it


# --------------------------------------------------------------------------------------------- the editor


def visible_settings(kind: str, public: bool) -> set[str]:
    """The settings to show for a kind; none for a kind a public demo refuses (its reason is shown instead)."""
    if kind not in REWARD_KINDS or (public and public_demo_refusal(kind)):
        return set()
    return {*COMMON_SETTINGS, *kind_fields(kind)}


def kind_help(kind: str, public: bool) -> str:
    """What a kind scores, in one sentence; in a public demo, why code-running kinds are refused."""
    if public and public_demo_refusal(kind):
        return message(f"{kind.capitalize()} rewards: {public_demo_refusal(kind)}", "warn")
    return KIND_HELP.get(kind, "")


def described(name: str) -> dict:
    """A setting's label and info as its field shows them: its declared label and help (as plain text), and how a
    list is typed there."""
    spec = REWARD_SETTINGS[name]
    said = plain(spec.metadata["help"])
    return {"label": spec.metadata["label"], "info": f"{said} Comma-separated." if name in LIST_SETTINGS else said}


def form_values(spec: dict) -> list:
    """A reward dict (RewardSpec.to_dict shape) as the form shows it, in SETTINGS order; unset settings as defaults."""
    values = []
    for setting in SETTINGS:
        value = spec.get(setting, DEFAULTS[setting])
        if setting in LIST_SETTINGS:
            value = ", ".join(value or [])
        elif setting in OPTIONAL_NUMBERS:
            value = shown_number(value)
        elif setting == "argv":
            value = shlex.join(value) if isinstance(value, list) else (value or "")
        elif setting == "code":  # a starting point for a new custom reward, unless it reads a file instead
            value = value or ("" if spec.get("file") else STARTER_CODE)
        elif setting == "goal":
            value = next((choice for choice, stored in GOAL_CHOICES.items() if stored is value), "automatic")
        elif value is None and not isinstance(REWARD_SETTINGS[setting].metadata["read"], Choice):
            value = ""  # a text box shows no value as empty (a menu, as nothing chosen)
        values.append(value)
    return values


def form_to_dict(kind: str, name: str | None, weight: float | None, values) -> dict:
    """The form as a reward dict for RewardSpec.from_dict: only the selected kind's settings, lists split on commas."""
    spec: dict = {"kind": kind, "name": (name or "").strip(), "weight": weight}
    for setting, value in zip(SETTINGS, values, strict=True):
        if kind not in REWARD_KINDS or setting not in (*COMMON_SETTINGS, *kind_fields(kind)):
            continue
        if setting == "train" and value is True:
            continue  # trained on is the default: a stored reward says "train" only for a metric
        if setting == "goal":
            value = GOAL_CHOICES.get(value, value)  # anything else is sent on, for parse_rewards to refuse
            if value is None:
                continue  # automatic: the default, not written
        if setting in LIST_SETTINGS:
            value = [item.strip() for item in (value or "").split(",") if item.strip()] or None
        elif setting in OPTIONAL_NUMBERS:
            value = number(value)
        spec[setting] = value
    return spec


def rewards_table(rewards: list[dict], *, policy: Policy) -> pd.DataFrame:
    """One line per reward: name, kind, weight, whether it is the goal, what it pays for and the settings that
    differ from their defaults."""
    def settings(spec: dict) -> str:
        shown = []
        for key, value in spec.items():
            if key in ("kind", "name", "weight", "goal", "only_when"):  # their own column, or said in "pays for"
                continue
            if key == "train":
                shown += ["a metric: not trained on"] if value is False else []
            elif key == "code":
                shown.append(f"code ({len(value.splitlines())} lines)")
            else:
                shown.append(f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}")
        return "; ".join(shown)

    def pays_for(spec: dict) -> str:
        try:
            return reward_rule(RewardSpec.from_dict(spec, policy=policy))
        except DragonError:  # a reward still being fixed: its problem is shown under the table
            return ""

    try:
        goal = set(goal_names(parse_rewards(rewards, policy=policy))) if rewards else set()
    except DragonError:  # a list still being fixed: its problem is shown under the table
        goal = set()
    return pd.DataFrame([[spec.get("name") or spec["kind"], spec["kind"], spec.get("weight", 1.0),
                          "🎯 goal" if (spec.get("name") or spec["kind"]) in goal else "", pays_for(spec),
                          settings(spec)] for spec in rewards],
                        columns=["name", "kind", "weight", "goal", "pays for", "settings"])


# name, kind, weight, goal, pays for, settings: the short columns wide enough for their headers ("weight" wrapped as
# "weig ht" once the sentences took the room), the sentences the rest.
REWARD_COLUMN_WIDTHS: list[str | int] = ["13%", "10%", "9%", "9%", "35%", "24%"]
NEW_REWARD = "+ new"  # the selector's "New reward" entry; no reward can have this name (it has a space)
NEW_REWARD_LABEL = "➕ New reward"


def _names(rewards: list[dict]) -> list[str]:
    return [spec.get("name") or spec["kind"] for spec in rewards]


def unique_name(kind: str, taken: list[str]) -> str:
    """numeric, numeric_2, numeric_3, ...: a second reward of a kind needs its own name (it becomes a column)."""
    name, number = kind, 1
    while name in taken:
        number += 1
        name = f"{kind}_{number}"
    return name


def _is_automatic_name(name: str) -> bool:
    """A name the editor chose (a kind's name, perhaps numbered), which follows the kind; a typed one is kept."""
    base = re.sub(r"_\d+$", "", (name or "").strip())
    return not name or base in REWARD_KINDS


def selector(rewards: list[dict], selected: str) -> gr.Dropdown:
    choices = [(name, name) for name in _names(rewards)] + [(NEW_REWARD_LABEL, NEW_REWARD)]
    return gr.Dropdown(choices=choices, value=selected)


def editor(spec: dict, public: bool, selected: str) -> list:
    """The editor showing one reward: (kind, name, weight, help, *settings, add, save, remove, selected).

    ``selected``: the name of the reward of the list it shows (Save and Remove), or NEW_REWARD (Add); the form keeps
    it (a gr.State) for the edits that follow. Every setting is set, hidden ones to their defaults, so nothing of a
    reward shown before stays behind in the form.
    """
    kind, editing = spec["kind"], selected != NEW_REWARD
    shown = visible_settings(kind, public)
    return [kind, spec.get("name") or kind, spec.get("weight", 1.0), kind_help(kind, public),
            *(gr.update(value=value, visible=setting in shown) for setting, value in zip(SETTINGS, form_values(spec))),
            gr.Button(visible=not editing), gr.Button(visible=editing), gr.Button(visible=editing), selected]


def new_spec(kind: str, rewards: list[dict]) -> dict:
    """A new reward of a kind with that kind's defaults: named after the kind (made unique), weight 1."""
    return {"kind": kind, "name": unique_name(kind, _names(rewards)), "weight": 1.0}


def _listing(rewards: list[dict], selected: str, status: str, *, policy: Policy) -> list:
    """Everything the editor shows after the list or the selection changed: (rewards, table, selector, status,
    *editor), with the form showing exactly the selected reward (or a fresh new one)."""
    names = _names(rewards)
    if selected in names:
        shown = editor(rewards[names.index(selected)], policy.public, selected)
    else:
        selected, shown = NEW_REWARD, editor(new_spec("numeric", rewards), policy.public, NEW_REWARD)
    return [rewards, rewards_table(rewards, policy=policy), selector(rewards, selected), status, *shown]


def _problem(exc: DragonError, rewards: list[dict]) -> str:
    return message(place_problem(str(exc), {}, rewards).text, "error")


def _validated(rewards: list[dict], keep: list[dict], selected: str, status: str, *, policy: Policy) -> list:
    """The new list validated as a run would (``policy``'s refusals included); rejected, the list and the form stay
    as they are and the status says why (``keep`` is the list before)."""
    try:
        parsed = parse_rewards(rewards, policy=policy) if rewards else []
    except DragonError as exc:
        return [keep, gr.skip(), gr.skip(), _problem(exc, rewards), *[gr.skip()] * EDITOR_SIZE]
    specs = [spec.to_dict() for spec in parsed]
    if not specs:
        status = message("There are no rewards left; add at least one before training.", "warn")
    return _listing(specs, selected, status, policy=policy)


def add_reward(rewards: list[dict], kind: str, name: str, weight: float, *values, policy: Policy) -> list:
    """Append the form as a new reward and select it. Returns (rewards, table, selector, status, *editor)."""
    spec = form_to_dict(kind, name, weight, values)
    spec["name"] = spec["name"] or unique_name(kind, _names(rewards))
    return _validated([*rewards, spec], rewards, spec["name"], message(f"Added the reward {spec['name']}.", "ok"),
                      policy=policy)


def save_reward(rewards: list[dict], selected: str, kind: str, name: str, weight: float, *values,
                policy: Policy) -> list:
    """Replace the selected reward with the form. Returns (rewards, table, selector, status, *editor)."""
    names = _names(rewards)
    if selected not in names:
        return [rewards, gr.skip(), gr.skip(), message("Choose the reward to change first.", "warn"),
                *[gr.skip()] * EDITOR_SIZE]
    spec = form_to_dict(kind, name, weight, values)
    spec["name"] = spec["name"] or kind
    changed = list(rewards)
    changed[names.index(selected)] = spec
    return _validated(changed, rewards, spec["name"], message(f"Saved the reward {spec['name']}.", "ok"), policy=policy)


def remove_reward(rewards: list[dict], selected: str, *, policy: Policy) -> list:
    """Remove the selected reward; the next one (or a new one) is shown. Returns (rewards, table, selector, status,
    *editor)."""
    names = _names(rewards)
    if selected not in names:
        return [rewards, gr.skip(), gr.skip(), message("Choose the reward to remove first.", "warn"),
                *[gr.skip()] * EDITOR_SIZE]
    position = names.index(selected)
    left = [spec for spec, name in zip(rewards, names, strict=True) if name != selected]
    following = _names(left)[min(position, len(left) - 1)] if left else NEW_REWARD
    return _validated(left, rewards, following, message(f"Removed the reward {selected}.", "ok"), policy=policy)


def select_reward(rewards: list[dict], selected: str, *, policy: Policy) -> list:
    """Show the chosen reward in the form (or a fresh new one). Returns (rewards, table, selector, status,
    *editor), the list and its table unchanged (skipped): a Remove clicked right after the choice may be answered
    first, and this answer, holding the list as it was, would put the removed reward back."""
    return [gr.skip(), gr.skip(), *_listing(rewards, selected, "", policy=policy)[2:]]


def change_kind(rewards: list[dict], selected: str, kind: str, name: str, weight: float,
                *, policy: Policy) -> list:
    """Another kind was chosen: the settings start from that kind's defaults (a saved reward of that kind shows its
    own). An automatic name follows the kind, a saved reward's too (an `exact` reward called "numeric" would
    mislead); a typed name and the weight shown are kept. Returns the editor."""
    names = _names(rewards)
    editing = selected in names
    selected = selected if editing else NEW_REWARD
    stored = rewards[names.index(selected)] if editing else {}
    spec = dict(stored) if stored.get("kind") == kind else {"kind": kind}
    if _is_automatic_name(name):
        others = [other for other in names if other != selected]
        name = stored["name"] if stored.get("kind") == kind and stored.get("name") not in others \
            else unique_name(kind, others)
    spec.update(name=name, weight=weight)
    return editor(spec, policy.public, selected)


def fill_rewards(draft: Draft, *, policy: Policy) -> list:
    """A whole new draft was loaded: list its rewards and show the first. Returns (rewards, table, selector, status,
    *editor)."""
    rewards = list(draft.get("rewards") or [])
    names = _names(rewards)
    return _listing(rewards, names[0] if names else NEW_REWARD, "", policy=policy)


def rewards_problem(rewards: list[dict] | None, *, policy: Policy) -> str:
    """What stops the list from training, next to it: no rewards, an invalid one, or every weight 0."""
    if not rewards:
        return message("Add at least one reward: training needs something to score replies with.", "warn")
    try:
        check_some_weight(parse_rewards(rewards, policy=policy))
    except DragonError as exc:
        return _problem(exc, rewards)
    return ""


# --------------------------------------------------------------------------------------------- the playground


def _row_label(number: int, example: dict) -> str:
    text = " ".join(prompt_text(example).split())
    return f"{number}: {text[:70]}{'…' if len(text) > 70 else ''}"


def playground_rows(draft: Draft, current: int | None, labels: dict[str, str] | None = None,
                    *, policy: Policy) -> tuple:
    """The rows one can try: the first mapped rows of the draft's data, and the ``current`` one (a row of the file,
    1-based) wherever it is, as a pre-flight's prompt opens it. Returns (row picker, row status)."""
    try:
        config = data_config(draft)
        examples = preview_examples(config, draft.get("base_dir") or None, policy=policy) if config.source else []
    except DragonError as exc:
        return gr.Dropdown(choices=[], value=None), message(f"No rows to try: {sentence(exc, draft, labels)}", "warn")
    if _is_row(current) and current not in [example["number"] for example in examples]:
        try:
            examples += [_example(draft, current, policy=policy)]
        except DragonError:  # no such row in this data: the first is shown instead
            pass
    choices = [(_row_label(example["number"], example), example["number"]) for example in examples]
    numbers = [number for _, number in choices]
    keep = current if current in numbers else (numbers[0] if numbers else None)
    return gr.Dropdown(choices=choices, value=keep), show_row(draft, keep, examples, policy=policy)


def _example(draft: Draft, row: int | None, *, policy: Policy) -> dict:
    """The mapped example of a row of the file (raises ConfigError when the data cannot be mapped or the row gives no
    prompt)."""
    if not _is_row(row):
        raise gr.Error("Choose a row to try first.")
    return _examples_from(data_config(draft), draft.get("base_dir") or None, row, 1, policy=policy)[0]


def _examples_from(data, base_dir: str | None, row: int, count: int, *, policy: Policy) -> list[dict]:
    """The examples of ``count`` rows of the file from ``row`` on; ConfigError when the first gives no prompt."""
    examples = preview_examples(data, base_dir, policy=policy, first=row, count=count)
    if not examples or examples[0]["number"] != row:
        raise ConfigError(f"Row {row} gives an empty prompt; choose another row.")
    return examples


def _is_row(row: object) -> TypeGuard[int]:
    """A row of a file (1-based), as the picker offers them; any client can send anything in its place."""
    return isinstance(row, int) and not isinstance(row, bool) and 1 <= row <= MOST_ROW


def show_row(draft: Draft, row: int | None, examples: list[dict] | None = None, *, policy: Policy) -> str:
    """The chosen row's prompt and reference answer, which the rewards will see."""
    if row is None:
        return ""
    try:
        shown = [example for example in examples or [] if example["number"] == row]
        example = shown[0] if shown else _example(draft, row, policy=policy)
    except DragonError as exc:
        return message(sentence(exc, draft, None), "error")
    system = next((m["content"] for m in example["prompt"] if m["role"] == "system"), "")
    lines = [f"**Prompt:** {prompt_text(example)}", f"**Reference:** {example.get('reference') or '(none)'}"]
    return "\n\n".join(([f"**System:** {system}"] if system else []) + lines)


@shows_errors
def score_typed(draft: Draft, row: int | None, completion: str, *, policy: Policy) -> tuple:
    """Score a typed reply to the chosen row with every reward. Returns (scores table, total line)."""
    if isinstance(completion, str) and len(completion) > REPLY_CHARS:
        raise gr.Error(f"The reply has {len(completion):,} characters; score one of at most {REPLY_CHARS:,} (a "
                       "completion is rarely longer than a few thousand).", print_exception=False)
    rewards = playground_rewards(draft, policy=policy)
    try:
        result = score_example(rewards, _example(draft, row, policy=policy),
                               completion if isinstance(completion, str) else "",
                               policy.limits.scoring_seconds if policy.limits else None)
    except ConfigError as exc:  # its time limit
        raise gr.Error(str(exc), print_exception=False) from None
    by_name = {reward.name: reward for reward in rewards}

    def problem(name: str) -> str:
        gate = gate_of(by_name[name].spec)
        if name in result.withheld and gate is not None:  # its gate stayed shut: say what it would have paid
            return f"pays only when {gate.describe()}; it would pay {result.withheld[name]:.2f}"
        return result.errors.get(name, "")

    table = pd.DataFrame([[f"{name} (metric)" if by_name[name].metric else name, by_name[name].weight, round(score, 4),
                           round(by_name[name].weight * score, 4), problem(name)]
                          for name, score in result.scores.items()], columns=SCORE_COLUMNS)
    total = f"**Total (weighted sum): {result.total:.3f}**"
    if result.errors:
        total += "\n\n" + message("Failed rewards score 0; see the problem column.", "warn")
    return table, total


STALE_GROUPS = ("The rewards changed since these replies were scored: press **Generate a group** to sample and "
                "score new ones.")


def rewards_changed(draft: Draft, row: int | None, completion: str, scores: Any, groups: Any, red_team_said: str,
                    *, policy: Policy) -> tuple:
    """The playground once the rewards changed: a typed reply scored by the new ones, and the sampled replies and the
    red team's verdict (scored by the old ones) cleared, so no row of a removed reward, nor its warning, stays.
    Returns (scores, total, progress, groups, warnings, red team verdict, red team table)."""
    skip = gr.skip()
    try:
        typed = score_typed(draft, row, completion, policy=policy) if shows_rows(scores) else (skip, skip)
    except gr.Error as exc:  # the reply cannot be scored now: said where its total was, the rest still cleared
        typed = (pd.DataFrame(columns=SCORE_COLUMNS), message(str(exc.message), "warn"))
    sampled = (message(STALE_GROUPS, "info"), group_table([], []), "") if shows_rows(groups) else (skip,) * 3
    gamed = ("", gr.Dataframe(visible=False)) if red_team_said else (skip, skip)
    return (*typed, *sampled, *gamed)


def shows_rows(table: Any) -> bool:
    """Whether a table the page sent back shows any row."""
    return isinstance(table, pd.DataFrame) and not table.empty


# One red team at a time, whoever asks: each scores about a hundred replies, and the default turns are everyone's clicks.
RED_TEAM_TURNS: dict[str, Any] = {"concurrency_limit": 1, "concurrency_id": "red-team"}
RED_TEAM_COLUMNS = ["Gaming reply", "Flagged", "Share of honest", "Its total", "Honest total", "Paid by",
                    "As made for the first row"]


def red_team_shown(draft: Draft, *, policy: Policy) -> tuple:
    """The red team of the draft's rewards on the playground's rows: (verdict, table)."""
    try:
        found = red_team_draft(draft, policy=policy)
    except DragonError as exc:
        return message(str(exc), "error"), gr.Dataframe(visible=False)
    rows = [[check.name, "⚠️ yes" if check.flagged else "no",
             "–" if check.share is None else f"{round(100 * check.share)} %", round(check.total, 3),
             round(check.honest, 3), ", ".join(check.paid_by) or "–", display_text(check.example, 80)]
            for check in found.checks]
    return (message(found.verdict, "warn" if found.flagged else "ok"),
            gr.Dataframe(pd.DataFrame(rows, columns=RED_TEAM_COLUMNS), visible=True))


def group_table(groups: list[GroupScores], rows: list[int], advantages: Sequence[list[float]] = (),
                reward_names: list[str] | None = None, unscored: Sequence[str] = ()) -> pd.DataFrame:
    """One line per sampled reply: its row (``rows``: the file rows sampled, in order), the reply, each reward's
    score, the total and the advantage (one list per group: advantages_of); then the ``unscored`` replies to the next
    row as far as they are generated, their scores still blank."""
    names = groups[0].reward_names if groups else list(reward_names or [])
    lines = []
    for row, group, advantage_of in zip(rows, groups, advantages):
        for completion, result, advantage in zip(group.completions, group.results, advantage_of, strict=True):
            lines.append([row, completion, *(round(result.scores[n], 3) for n in names),
                          round(result.total, 3), round(advantage, 2) + 0.0])  # + 0.0: no "-0.0"
    lines += [[rows[len(groups)], reply, *[""] * (len(names) + 2)] for reply in unscored]
    return pd.DataFrame(lines, columns=["row", "completion", *names, "total", "advantage"])


def group_warnings(groups: list[GroupScores], rows: list[int]) -> str:
    """Per row: the no-learning-signal warning and failing rewards, or one line saying every group is usable."""
    lines = []
    for row, group in zip(rows, groups):
        problems = [no_signal_warning(group), *reward_failures(group)]
        lines += [message(f"Row {row}: {text}", "warn") for text in problems if text]
    return "\n\n".join(lines) or message("Every group has different scores, so GRPO can learn from each of them.", "ok")


_generating: set[str | None] = set()  # the sessions generating a group now
_cancelled_sessions: set[str | None] = set()  # those of them whose Cancel was pressed


def cancel_generation(request: gr.Request | None = None) -> str:
    """The Cancel button: the sampling stops within a token (generate_replies asks after each). Only a session
    that is generating is remembered, so the set cannot grow with sessions that never generate."""
    session = request.session_hash if request is not None else None
    if session in _generating:
        _cancelled_sessions.add(session)
    return message("Cancelled.", "info")


def sentence(exc: BaseException, draft: Draft, labels: dict[str, str] | None) -> str:
    """An error as this tab says it: in the form's words, naming the tab it concerns when that is another one."""
    return place_problem(explain(exc), labels or {}, draft.get("rewards") or [],
                         draft.get("tools") or []).seen_from(TAB_TITLE)


def generate_samples(studio: Studio, draft: Draft, row: int | None, n_prompts: int, request: gr.Request | None = None,
                     labels: dict[str, str] | None = None):
    """Sample a GRPO group (group_size replies) for 1-3 rows from the starting model and score them.

    A generator: yields (progress, group table, warnings) after loading the model and after each prompt.
    """
    session = request.session_hash if request is not None else None
    _cancelled_sessions.discard(session)
    _generating.add(session)
    try:
        yield from _generate(studio, draft, row, n_prompts, session, labels)
    finally:
        _generating.discard(session)
        _cancelled_sessions.discard(session)


def _generate(studio: Studio, draft: Draft, row: int | None, n_prompts: int, session: str | None,
              labels: dict[str, str] | None):
    if not _is_row(row):
        yield message("Choose a row to try first.", "warn"), gr.skip(), ""
        return
    if n_prompts not in SAMPLED_ROWS:
        yield message(f"Sample {SAMPLED_ROWS[0]} to {SAMPLED_ROWS[-1]} rows at a time.", "warn"), gr.skip(), ""
        return
    try:
        config = studio.recipes.validate_for_sampling(draft)
        examples = _examples_from(config.data, config.base_dir or None, row, int(n_prompts), policy=studio.policy)
        studio.recipes.check_sampling(config.grpo.group_size * len(examples))
        yield message(f"Loading {config.model.id}…", "info"), gr.skip(), ""
        model, tokenizer = studio.previews.load(config.model, settings=config.hardware)
        examples, tokenizer, tools = sampling_tools(config, examples, tokenizer, policy=studio.policy)
        refuse_long_prompts(examples, tokenizer, prompt_limit_of(draft, config.data, policy=studio.policy), tools)
        rewards = sampling_rewards(config, tokenizer, str(model.device), policy=studio.policy)
    except Exception as exc:  # a BusyError (CPU training running), a bad setting, an unloadable model
        yield message(sentence(exc, draft, labels), "error"), gr.skip(), ""
        return
    group_size, started = config.grpo.group_size, time.monotonic()
    groups: list[GroupScores] = []
    shown: list[list[float]] = []
    numbers = [example["number"] for example in examples]
    yield (message(f"Generating {group_size} replies to row {row} (temperature {config.grpo.temperature:g}, up "
                   f"to {config.grpo.max_new_tokens} tokens each)…", "info"), gr.skip(), "")
    names = [reward.name for reward in rewards]
    limits = studio.policy.limits
    for sampled in _sampled(model, tokenizer, rewards, examples, config.grpo, session,
                            limits.sampling_seconds if limits else None, tools):
        if isinstance(sampled, str):
            yield message(sampled, "error"), gr.skip(), gr.skip()
            return
        if isinstance(sampled, list):  # replies to the next row, as far as they go
            yield gr.skip(), group_table(groups, numbers, shown, names, sampled), gr.skip()
            continue
        groups.append(sampled)
        shown = advantages_of(groups, rewards, config.grpo)  # the rows sampled together are one step's batch
        done = len(groups) == len(examples)
        progress = (f"Sampled {len(groups) * group_size} replies to {len(groups)} row(s) in "
                    f"{time.monotonic() - started:.1f} s." if done else
                    f"Row {numbers[len(groups) - 1]} done; generating row {numbers[len(groups)]}…")
        yield message(progress, "ok" if done else "info"), group_table(groups, numbers, shown), \
            group_warnings(groups, numbers)


def _sampled(model, tokenizer, rewards, examples: list[dict], grpo, session: str | None,
             time_limit_s: float | None = None, tools=None):
    """generate_groups on a thread of its own, so the page sees the replies as they grow: yields the replies so far
    (a list), then the scored group for each row, or the sentence to show once if sampling failed or took longer
    than a public demo's ``time_limit_s``; nothing more once Cancel was pressed. Closing it (gradio does,
    on the event loop, when the page goes away or Cancel is pressed) stops the sampling within a token without
    waiting for it; the next group waits for that token (SAMPLING)."""
    updates: queue.Queue = queue.Queue()
    closed = threading.Event()
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() > deadline

    def stopped() -> bool:
        return closed.is_set() or session in _cancelled_sessions or out_of_time()

    def sample() -> None:
        try:
            with SAMPLING:
                for group in generate_groups(model, tokenizer, rewards, examples, grpo, should_stop=stopped,
                                             on_replies=updates.put, tools=tools):
                    updates.put(group)
        except Exception as exc:
            if not stopped():
                updates.put(explain(exc))  # logged here, with its traceback, when it is unexpected
        finally:
            updates.put(None)

    # In the context of the request (public.visiting): the sampling acts for the visitor who asked.
    worker = threading.Thread(target=contextvars.copy_context().run, args=(sample,), name="playground-sampling",
                              daemon=True)
    worker.start()
    try:
        while True:
            waiting = [updates.get()]
            while not updates.empty():
                waiting.append(updates.get())
            # A slow page gets the latest replies, not every one on the way.
            for update in [*(update for update in waiting[:-1] if not isinstance(update, list)), waiting[-1]]:
                if update is None or stopped():
                    closed.set()
                    worker.join()  # within a token: the model is free for the next one when this event ends
                    if out_of_time() and session not in _cancelled_sessions:
                        yield (f"Stopped: sampling took longer than this public demo's limit of {time_limit_s:g} "
                               "seconds per playground group; sample fewer rows, or lower the group size or max new "
                               "tokens.")
                    return
                yield update
    finally:
        closed.set()


# --------------------------------------------------------------------------------------------- layout and events


def setting_field(name: str, visible: bool):
    """The field of one setting, made from its declaration: labelled and explained as it says, filled with its
    default, and chosen by its type (a choice of two: buttons; of more: a menu)."""
    spec, hint = REWARD_SETTINGS[name], TYPES[name]
    default: Any = spec.default
    words = {**described(name), "visible": visible, "elem_id": f"rewards-settings-{name.replace('_', '-')}"}
    placeholder = plain(spec.metadata["shown_default"] or "") or None
    choices = getattr(spec.metadata["read"], "choices", None)
    if name == "goal":
        return gr.Radio(list(GOAL_CHOICES), value="automatic", **words)
    if name == "code":
        return gr.Code(STARTER_CODE, language="python", label=words["label"], visible=visible, elem_id="rewards-code")
    if choices is not None:
        return (gr.Radio if len(choices) == 2 else gr.Dropdown)(list(choices), value=default, **words)
    if hint is bool:
        return gr.Checkbox(default, **words)
    if name in OPTIONAL_NUMBERS:
        return optional_number(placeholder=placeholder, **words)
    if hint in (int, float):
        return gr.Number(default, precision=0 if hint is int else None, step=NUMBER_STEPS.get(name, 1), **words)
    return gr.Textbox(default or "", placeholder=placeholder, **words)


def problem_line(draft: Draft, *, policy: Policy) -> str:
    """What stops the list from training, or else the rewards that cannot pay on the data's references."""
    return rewards_problem(draft.get("rewards"), policy=policy) or "\n\n".join(
        message(said, "warn") for said in unpayable(draft.get("rewards") or [], data_config(draft),
                                                    draft.get("base_dir") or None, policy=policy))


def rows_for(draft: Draft, current, shown_for, *, labels: dict[str, str], policy: Policy) -> tuple:
    """The playground's row picker, its row and the data settings it shows rows of, anew only when the data settings
    (``shown_for``: those it shows now) changed."""
    data = json.dumps([draft.get("data"), draft.get("base_dir")], sort_keys=True, default=str)
    if data == shown_for:
        return gr.skip(), gr.skip(), gr.skip()
    picker, said = playground_rows(draft, current, labels, policy=policy)
    return picker, said, data if picker.choices else None  # no rows: asked again at the next change


def build(shared: Shared) -> Callable[[], None]:
    """The editor, the list (a field of the form at "rewards"), the Tools section and the playground; returns the
    function that wires what reads the whole form, once every tab is built."""
    gr.Markdown("Rewards score each reply; GRPO pushes the model towards replies that score above their group's "
                "average. The total is the weighted sum of the rewards trained on (a metric is only measured).")
    _build_editor(shared)
    connect_tools = tools_section.build(shared)
    connect_playground = _build_playground(shared)

    def connect() -> None:
        connect_tools()
        connect_playground()

    return connect


def _build_editor(shared: Shared) -> None:
    """The list of rewards, what stops it from training, and the form that adds, changes and removes them."""
    studio, form = shared.studio, shared.form
    public = studio.policy.public
    rewards = form.add("rewards", gr.State([]), label="Rewards")
    table = gr.Dataframe(rewards_table([], policy=studio.policy), label="Rewards (what training uses)",
                         interactive=False, max_height=260, wrap=True, elem_id="rewards-table",
                         column_widths=REWARD_COLUMN_WIDTHS)
    problem = gr.Markdown(elem_id="rewards-problem")
    with gr.Row():
        with gr.Column(scale=1):
            selected = gr.Dropdown([(NEW_REWARD_LABEL, NEW_REWARD)], value=NEW_REWARD, label="Reward to edit",
                                   elem_id="rewards-selected", info="A reward of the list, or a new one to add.")
            kind = gr.Dropdown(list(REWARD_KINDS), value="numeric", label="Kind", elem_id="rewards-kind",
                               info="custom and command are turned off in this public demo." if public else None)
            name = gr.Textbox("numeric", **described("name"), elem_id="rewards-name")
            weight = gr.Number(DEFAULTS["weight"], **described("weight"), step=0.1, minimum=0,
                               elem_id="rewards-weight")
            help_text = gr.Markdown(kind_help("numeric", public), elem_id="rewards-kind-help")
            # The reward the form shows, as the answers to its edits left it: an edit reads it as it starts, after
            # the edits before it (the picker, by contrast, sends what it showed when clicked, which an answer
            # still on its way can have changed back for a moment).
            editing = gr.State(NEW_REWARD)
        with gr.Column(scale=2):
            settings = [setting_field(setting, setting in visible_settings("numeric", public))
                        for setting in SETTINGS]
    with gr.Row():
        add = gr.Button("Add reward", variant="primary", elem_id="rewards-add")
        save = gr.Button("Save changes", variant="primary", visible=False, elem_id="rewards-save")
        remove = gr.Button("Remove", variant="stop", visible=False, elem_id="rewards-remove")
    status = gr.Markdown(elem_id="rewards-status")

    values = [kind, name, weight, *settings]
    shown_editor = [kind, name, weight, help_text, *settings, add, save, remove, editing]
    listing = [rewards, table, selected, status, *shown_editor]
    # always_last everywhere: a click while the previous one is still being handled runs after it, on the list
    # that one left, instead of being dropped. One queue for every edit of the list: gradio reads a State input as
    # an event starts, so an Add still being handled while a Remove (or a choice) started lost its reward when the
    # later one wrote back the list it had read. Each edit takes milliseconds; the queue keeps each page's order.
    edits: dict[str, Any] = {"trigger_mode": "always_last", "show_progress": "hidden", "api_visibility": "private",
             **in_page_order("reward-list-edits")}
    add.click(asked(add_reward, studio), [rewards, *values], listing, **edits)
    save.click(asked(save_reward, studio), [rewards, editing, *values], listing, **edits)
    remove.click(asked(remove_reward, studio), [rewards, editing], listing, **edits)
    selected.input(asked(select_reward, studio), [rewards, selected], listing, **edits)
    kind.input(asked(change_kind, studio), [rewards, editing, kind, name, weight], shown_editor, **edits)
    shared.fills.append((asked(fill_rewards, studio), listing))
    form.watch(asked(problem_line, studio), [problem])
    shared.first_paint.append((asked(problem_line, studio), [problem]))


@dataclass
class PlaygroundFields:
    """The playground's components, wired to the whole form by connect_playground once every tab is built."""

    row: gr.Dropdown
    row_text: gr.Markdown
    completion: gr.Textbox
    score: gr.Button
    scores: gr.Dataframe
    total: gr.Markdown
    n_prompts: gr.Slider
    generate: gr.Button
    cancel: gr.Button
    progress: gr.Markdown
    groups: gr.Dataframe
    warnings: gr.Markdown
    game: gr.Button
    red_team_said: gr.Markdown
    red_team_table: gr.Dataframe


def _build_playground(shared: Shared) -> Callable[[], None]:
    """The playground: a typed reply scored, a group sampled, the rewards gamed; returns the function that wires
    it to the whole form."""
    gr.Markdown("## Playground\nTry the rewards on a reply before training: type one, or let the starting model "
                "sample a group of replies the way one GRPO step would.")
    with gr.Row():
        with gr.Column():
            row = gr.Dropdown(label="Row", elem_id="rewards-row")
            row_text = gr.Markdown(elem_id="rewards-row-text")
            shared.playground_row, shared.playground_row_text = row, row_text
            completion = gr.Textbox(label="A reply to score", lines=3, elem_id="rewards-completion")
            score = gr.Button("Score this reply", elem_id="rewards-score")
        with gr.Column():
            scores = gr.Dataframe(pd.DataFrame(columns=SCORE_COLUMNS), label="Scores", interactive=False,
                                  elem_id="rewards-scores")
            total = gr.Markdown(elem_id="rewards-total")
    with gr.Row():
        n_prompts = gr.Slider(SAMPLED_ROWS[0], SAMPLED_ROWS[-1], value=1, step=1,
                              label="Rows to sample (starting at the chosen row)", elem_id="rewards-n-prompts")
        generate = gr.Button("Generate a group", variant="primary", elem_id="rewards-generate")
        cancel = gr.Button("Cancel", variant="stop", elem_id="rewards-cancel")
    progress = gr.Markdown(elem_id="rewards-progress")
    groups = gr.Dataframe(group_table([], []), label="Sampled replies", interactive=False, wrap=True, max_height=420,
                          elem_id="rewards-groups")
    warnings = gr.Markdown(elem_id="rewards-warnings")
    with gr.Row():
        game = gr.Button("Try to game these rewards", elem_id="rewards-red-team", scale=0, min_width=260)
        gr.Markdown("Scores nine replies a model could learn instead of the answer (empty, padded, the answer "
                    "beside a wrong one, …) on the first rows, beside an honest one.")
    red_team_said = gr.Markdown(elem_id="rewards-red-team-verdict")
    red_team_table = gr.Dataframe(headers=RED_TEAM_COLUMNS, visible=False, interactive=False, wrap=True,
                                  elem_id="rewards-red-team-table")
    return functools.partial(connect_playground, shared, PlaygroundFields(
        row, row_text, completion, score, scores, total, n_prompts, generate, cancel, progress, groups, warnings,
        game, red_team_said, red_team_table))


PLAYGROUND_EVENTS: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}


def connect_playground(shared: Shared, fields: PlaygroundFields) -> None:
    """Wire the playground to the whole form: it reads every tab's settings, so this runs once all are built."""
    studio, form, shown = shared.studio, shared.form, fields
    rows_of = gr.State(None)  # the data settings the row picker shows rows of
    form.watch(asked(functools.partial(rows_for, labels=form.labels), studio), [shown.row, shown.row_text, rows_of],
               [shown.row, rows_of])
    shared.first_paint.append((asked(functools.partial(rows_for, current=None, shown_for=None, labels=form.labels),
                                     studio), [shown.row, shown.row_text, rows_of]))
    scored = form.takes_draft(asked(score_typed, studio))
    shown.row.input(form.takes_draft(asked(show_row, studio)), [*form.inputs, shown.row], [shown.row_text],
                    **PLAYGROUND_EVENTS)
    for scoring in (shown.score.click, shown.completion.submit):
        scoring(scored, [*form.inputs, shown.row, shown.completion], [shown.scores, shown.total], **PLAYGROUND_EVENTS)
    generating = shown.generate.click(bound(sample_shown, studio, form), [*form.inputs, shown.row, shown.n_prompts],
                                      [shown.progress, shown.groups, shown.warnings], api_visibility="private",
                                      **ONE_MODEL_AT_A_TIME)
    shown.cancel.click(cancel_generation, None, [shown.progress], cancels=[generating], api_visibility="private",
                       show_progress="hidden")
    shown.game.click(form.takes_draft(asked(red_team_shown, studio)), form.inputs,
                     [shown.red_team_said, shown.red_team_table], **PLAYGROUND_EVENTS, **RED_TEAM_TURNS)
    form.component("rewards").change(
        form.takes_draft(asked(rewards_changed, studio)),
        [*form.inputs, shown.row, shown.completion, shown.scores, shown.groups, shown.red_team_said],
        [shown.scores, shown.total, shown.progress, shown.groups, shown.warnings, shown.red_team_said,
         shown.red_team_table], **PLAYGROUND_EVENTS)


def sample_shown(studio: Studio, form: Form, request: gr.Request, *shown: Any) -> Iterator[tuple]:
    """A group sampled for the rows chosen (the last two of ``shown``), on the settings the form shows (the rest),
    as the session that asked."""
    draft, (chosen, rows) = form.compose(*shown[:-2]), shown[-2:]
    yield from generate_samples(studio, draft, chosen, rows, request, form.labels)
