"""The Rewards tab's Tools section: the tools the model may call while it answers (multi-turn GRPO).

A list (a field of the form at "tools") edited through studio.tools, which validates it as a run does; each tool
shown as the model will see it (its JSON schema) and called on typed arguments (Try it). Each field is labelled,
explained and filled with its default as the kind's class declares it (tools.spec). Every handler's inputs may come
from any client in a public demo: names are looked up in the validated list, arguments are parsed as JSON and handed
to the same bounded tools a run calls, and a custom tool is refused before its code runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gradio as gr
import pandas as pd

from ..config import Draft
from ..errors import DragonError
from ..public import Policy
from ..settings import plain
from ..studio.tools import (TABLE_COLUMNS, TOOL_KINDS, added, form_settings, new_spec, removed, shown_schema,
                            tools_table, try_tool, validated)
from ..tools import TOOL_CLASSES, TOOL_SETTINGS
from .common import Shared, asked, message

# The kinds' settings the form sets, in the order it shows them (a search tool's column above what the model is told).
SETTING_NAMES = ("key_column", "value_column", "column", "description", "code", "function", "class_name")
KINDS = {cls.kind: cls for cls in TOOL_CLASSES}
KIND_HELP = {cls.kind: cls.help for cls in TOOL_CLASSES}  # Markdown, as the section shows it
STARTER_CODE = '''def tool(city: str) -> str:
    """Say what the weather is in a city.

    Args:
        city: The city's name, for example "Paris".
    """
    return "sunny" if city.lower() == "paris" else "rain"
'''
STARTER_ENVIRONMENT = '''class Environment:
    """Find the word: the reference answer is a secret word; each try says how many letters are right."""

    def reset(self, question, reference, row):
        self.secret, self.found = (reference or "").lower(), False
        return None  # or text the model reads after the question

    def try_word(self, word: str) -> str:
        """Try a word; the answer says how many of its letters are in the right place.

        Args:
            word: The word to try.
        """
        self.found = word.lower() == self.secret
        right = sum(a == b for a, b in zip(word.lower(), self.secret))
        return "Right!" if self.found else f"{right} letters are in the right place."

    def get_reward(self) -> float:
        return 1.0 if self.found else 0.0
'''


def kinds(*, policy: Policy) -> list[str]:
    return [kind for kind in TOOL_KINDS if not (policy.public and KINDS[kind].runs_code)]


def described(name: str) -> dict:
    """A setting's label and info as its field shows them: its declared label and help (as plain text)."""
    spec = TOOL_SETTINGS[name]
    return {"label": spec.metadata["label"], "info": plain(spec.metadata["help"])}


def listing(tools: list[dict], chosen: str | None, status: str, *, policy: Policy) -> list:
    """(tools, table, the tool picker, status) for a list that changed (validated by ``policy``)."""
    names = [spec["name"] for spec in tools]
    keep = chosen if chosen in names else (names[-1] if names else None)
    return [tools, gr.Dataframe(pd.DataFrame(tools_table(tools, policy=policy), columns=TABLE_COLUMNS),
                                visible=bool(tools)),
            gr.Dropdown(choices=names, value=keep, visible=bool(tools)), status]


def add_tool(tools: list[dict], kind: str, name: str, examples: str, *settings, policy: Policy) -> list:
    """Append the form's tool, validated as a run validates it; refused, the list stays and the status says why."""
    if kind not in kinds(policy=policy):
        return [gr.skip(), gr.skip(), gr.skip(), message(f"Choose a kind of tool: {', '.join(kinds(policy=policy))}.",
                                                         "warn")]
    try:
        spec = new_spec(kind, name, dict(zip(SETTING_NAMES, settings, strict=True)), examples)
        changed = added(list(tools or []), spec, policy=policy)
    except DragonError as exc:
        return [gr.skip(), gr.skip(), gr.skip(), message(str(exc), "error")]
    return listing(changed, changed[-1]["name"], message(f"Added the tool {changed[-1]['name']}.", "ok"), policy=policy)


def remove_tool(tools: list[dict], chosen: str, *, policy: Policy) -> list:
    left = removed(list(tools or []), chosen)
    if len(left) == len(tools or []):
        return [gr.skip(), gr.skip(), gr.skip(), message("Choose the tool to remove first.", "warn")]
    return listing(left, None, message(f"Removed the tool {chosen}.", "ok"), policy=policy)


def change_kind(kind: str) -> list:
    """The settings of the chosen kind, its help, its starter code, and the worked examples (not an environment's)."""
    shown = form_settings(kind)
    updates = {setting: gr.update(visible=setting in shown) for setting in SETTING_NAMES}
    known = KINDS.get(kind)
    if known is not None and known.runs_code:
        updates["code"] = gr.update(visible=True, value=STARTER_ENVIRONMENT if known.is_environment else STARTER_CODE)
    return [KIND_HELP.get(kind, ""), *updates.values(),
            gr.update(visible=not (known is not None and known.is_environment))]


def show_tool(draft: Draft, chosen: str | None, *, policy: Policy) -> tuple:
    """The chosen tool's schema as the model reads it, and arguments to try it with."""
    if not chosen:
        return "", "", ""
    try:
        schema, arguments = shown_schema(draft, chosen, policy=policy)
    except DragonError as exc:
        return "", gr.skip(), message(str(exc), "error")
    return schema, arguments, ""


def call_tool(draft: Draft, chosen: str | None, arguments: str, *, policy: Policy) -> str:
    """What the chosen tool answers the typed arguments, as the model would read it."""
    if not chosen:
        return message("Add a tool first, then try it here.", "warn")
    try:
        answer = try_tool(draft, chosen, str(arguments or "")[:2000], policy=policy)
    except DragonError as exc:
        return message(str(exc), "error")
    return f"**{chosen} answered:**\n\n```\n{answer}\n```"


def fill_tools(draft: Draft, *, policy: Policy) -> list:
    """A whole new draft was loaded: its tools and its rounds per reply. A list this demo refuses (a kept draft
    with a custom tool) is shown empty, with why."""
    rounds = (draft.get("grpo") or {}).get("max_tool_calling_iterations", 2)
    column = (draft.get("data") or {}).get("environment_column") or ""
    try:
        return [*listing(validated(draft.get("tools"), policy=policy), None, "", policy=policy), rounds, column]
    except DragonError as exc:
        return [*listing([], None, message(str(exc), "error"), policy=policy), rounds, column]


def setting_field(name: str):
    """The field of one kind's setting, made from its declaration; hidden until a kind that takes it is chosen."""
    words = {**described(name), "visible": False, "elem_id": f"tools-{name.replace('_', '-')}"}
    if name == "code":
        return gr.Code(STARTER_CODE, language="python", label=words["label"], visible=False, elem_id="tools-code")
    default: Any = TOOL_SETTINGS[name].default
    return gr.Textbox(default or "", **words)


def build(shared: Shared) -> Callable[[], None]:
    """The section; returns the function that wires what reads the whole form (the schema, Try it), to be called
    once every tab has added its fields."""
    form, studio = shared.form, shared.studio
    gr.Markdown("## Tools\nTools the model may call while it answers: it writes a call, the tool's answer is added "
                "to the conversation, and it goes on. The rewards score its final answer; the tools' answers are "
                "never trained on. Worked examples put a call before every question, which a small model copies far "
                "more readily than it follows a description.")
    tools = form.add("tools", gr.State([]), label="Tools")
    rounds = form.add("grpo.max_tool_calling_iterations",
                      gr.Number(2, precision=0, minimum=1, maximum=10, label="Tool rounds per reply",
                                info="How many times one reply may call tools before it must answer.",
                                elem_id="tools-rounds"))
    column = form.add("data.environment_column",
                      gr.Textbox(label="Environment column", elem_id="tools-environment-column",
                                 info="With two or more environments: the data column naming each row's."))
    table = gr.Dataframe(pd.DataFrame(columns=TABLE_COLUMNS), label="Tools (what training gives the model)",
                         interactive=False, wrap=True, visible=False, elem_id="tools-table")
    with gr.Row():
        with gr.Column(scale=1):
            turned_off = "Custom tools and environments are turned off in this public demo."
            kind = gr.Dropdown(kinds(policy=studio.policy), value="calculator", label="Kind of tool",
                               elem_id="tools-kind", info=turned_off if studio.policy.public else None)
            kind_help = gr.Markdown(KIND_HELP["calculator"], elem_id="tools-kind-help")
            name = gr.Textbox(**described("name"), elem_id="tools-name",
                              placeholder=TOOL_SETTINGS["name"].metadata["shown_default"])
        with gr.Column(scale=2):
            settings = [setting_field(setting) for setting in SETTING_NAMES]
            examples = gr.Textbox(label="Worked examples, one a line: question → arguments (JSON)", lines=2,
                                  info=plain(TOOL_SETTINGS["examples"].metadata["help"]),
                                  placeholder='What is 12 × 34? → {"expression": "12 × 34"}', elem_id="tools-examples")
    add = gr.Button("Add tool", variant="primary", elem_id="tools-add")
    status = gr.Markdown(elem_id="tools-status")
    with gr.Row():
        with gr.Column():
            chosen = gr.Dropdown(label="Tool", visible=False, elem_id="tools-chosen")
            schema = gr.Code(language="json", label="What the model is shown", elem_id="tools-schema")
            remove = gr.Button("Remove tool", variant="stop", elem_id="tools-remove")
        with gr.Column():
            arguments = gr.Textbox(label="Arguments to try it with (JSON)", elem_id="tools-arguments")
            call = gr.Button("Try it", elem_id="tools-try")
            answer = gr.Markdown(elem_id="tools-answer")

    listed = [tools, table, chosen, status]
    edits: dict[str, Any] = {"trigger_mode": "always_last", "show_progress": "hidden", "api_visibility": "private",
             "concurrency_limit": 1, "concurrency_id": "tool-list-edits"}  # as the reward list's: one edit at a time
    add.click(asked(add_tool, studio), [tools, kind, name, examples, *settings], listed, **edits)
    remove.click(asked(remove_tool, studio), [tools, chosen], listed, **edits)
    kind.input(change_kind, [kind], [kind_help, *settings, examples], show_progress="hidden",
               api_visibility="private")
    shared.fills.append((asked(fill_tools, studio), [*listed, rounds, column]))

    return functools.partial(connect_trying, shared, chosen, schema, arguments, call, answer)


def connect_trying(shared: Shared, chosen: gr.Dropdown, schema: gr.Code, arguments: gr.Textbox, call: gr.Button,
                   answer: gr.Markdown) -> None:
    """Wire what reads the whole form (the schema shown, Try it), once every tab has added its fields."""
    form, studio = shared.form, shared.studio
    quick: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}
    chosen.change(form.takes_draft(asked(show_tool, studio)), [*form.inputs, chosen], [schema, arguments, answer],
                  **quick)
    call.click(form.takes_draft(asked(call_tool, studio)), [*form.inputs, chosen, arguments], [answer], **quick)
