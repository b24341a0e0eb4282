"""Build the Dragon GRPO Studio app: a recipe picker over five tabs, each a module with ``build(shared)``.

The app never owns a training: it asks the Studio to start one and then only reads the run directory, so a page
reload or a second browser simply re-attaches (``demo.load``) to whatever is running. The settings being edited live
in the form (common.Form) and, between visits, in the browser (``gr.BrowserState``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import gradio as gr
from gradio.context import LocalContext
from gradio.queueing import Event
from gradio.utils import get_upload_folder
from starlette.middleware import Middleware

from ..config import Draft
from ..system.disk import resolve_runs_dir
from ..errors import ConfigError, DragonError
from ..public import Limits, Policy, visiting
from .. import ASSETS_DIR
from ..studio import machine
from ..studio.backend import Studio
from ..studio.recipes import DEFAULT_RECIPE
from ..studio.files import real_draft, shown_draft
from ..studio.draft import kept_draft_refusal, same_settings, settings_of
from ..studio.visitors import SESSIONS_IN_USE
from .guard import NO_SESSION, PageCache, guards, keeping_sessions_small, take_turns_fairly
from . import class_section, compare_tab, data_tab, experiments_tab, model_tab, rewards_tab, train_tab
from .common import (ONE_MODEL_AT_A_TIME, TAB_COMPARE, TAB_DATA, TAB_EXPERIMENTS, TAB_MODEL, TAB_REWARDS, TAB_TRAIN,
                     UNCHANGED, DraftMaker, Form, Shared, as_draft, bound, client_left, explain, in_the_page,
                     made_apart, message, progress_shown_quietly, show_at_first, shows_errors, tab_selected, visible)

log = logging.getLogger(__name__)

TITLE = "Dragon GRPO Studio"
INTRO = ("Teach a small language model with rewards you can check: pick data, build rewards, choose a model and "
         "press **Start**, then watch it learn and compare it with where it began.")


# What the recipe box says once the form holds no recipe (recipe_held); loading it is refused in a sentence.
OWN_SETTINGS = "your own settings"
DRAFT_STORAGE_KEY = "dragon-grpo-studio-draft"
VISITOR_STORAGE_KEY = "dragon-grpo-studio-visitor"  # the random token that tells this browser's runs from others'
OWNER_KEY_STORAGE_KEY = "dragon-grpo-studio-owner-key"


def kept_none_of(storage_keys: list[str]) -> str:
    """A step in the page: whether this browser kept none of ``storage_keys`` (where storage is blocked, as in some
    embedded frames, it kept none)."""
    kept = " || ".join(f"localStorage.getItem({json.dumps(key)}) !== null" for key in storage_keys)
    return f"(() => {{ try {{ return !({kept}); }} catch {{ return true; }} }})()"


SKIPPED = gr.skip()  # what gradio answers for an output an event leaves as it is: {"__type__": "update"}
FIRST_PAGE_S = 3.0  # how long the warm-up leaves the CPUs to a page opening as the app starts (make run opens one)


class StudioApp(gr.Blocks):
    """The app: gradio's Blocks, with the form its tabs fill (its fields and their config paths, for tests and for
    apps that embed this one) and the studio it serves, under its policy."""

    form: Form
    studio: Studio

    async def postprocess_data(self, block_fn, predictions, state):
        """gradio's, but an output an event leaves as it is (``gr.skip()``) is answered as such at once. gradio makes
        the component anew for it, through inspect, in the server's event loop: the page load's 120 outputs, most of
        them skipped, took 100 ms of it for every page that opened, and a class opening the page at once held up
        every other request by seconds."""
        outputs = block_fn.outputs
        if isinstance(predictions, dict) and predictions == SKIPPED and len(outputs) > 1:  # one skip for them all
            predictions = [SKIPPED] * len(outputs)
        if (block_fn.batch or not isinstance(predictions, list | tuple) or len(outputs) < 2
                or len(predictions) != len(outputs)):
            return await super().postprocess_data(block_fn, predictions, state)
        skipped = {at for at, (block, value) in enumerate(zip(outputs, predictions, strict=True))
                   if not block.stateful and isinstance(value, dict) and value == SKIPPED}
        if not skipped:
            return await super().postprocess_data(block_fn, predictions, state)
        rest = [at for at in range(len(outputs)) if at not in skipped]
        if rest:
            some = copy.copy(block_fn)
            some.outputs = [outputs[at] for at in rest]
            given = [predictions[at] for at in rest]
            made = iter(await super().postprocess_data(some, given if len(given) > 1 else given[0], state))
        return [dict(SKIPPED) if at in skipped else next(made) for at in range(len(outputs))]


@dataclass
class OwnerPanel:
    """A public demo's owner unlocks every run with the key it was started with."""

    key: gr.Textbox
    remember: gr.Checkbox
    unlock: gr.Button
    status: gr.Markdown
    class_code: gr.Textbox  # a class's: learners take a seat with it (class_section)
    open_class: gr.Button


@dataclass
class Header:
    """What the page shows above the tabs: the recipe picker, the loaded settings' notes, the question before an
    edited draft is replaced, a public demo's notice and owner panel, and the banner of a run training now."""

    recipe: gr.Dropdown
    load_recipe: gr.Button
    recipe_status: gr.Markdown
    notes_box: gr.Accordion
    notes_text: gr.Markdown
    confirm_row: gr.Row
    confirm_text: gr.Markdown
    replace_button: gr.Button
    keep_button: gr.Button
    owner: OwnerPanel | None
    seat: class_section.SeatPanel | None
    running_banner: gr.Row
    running_text: gr.Markdown
    watch_it: gr.Button


def build_app(studio: Studio | None = None) -> StudioApp:
    """The app serving ``studio``; without one, a backend configured as ``main`` configures it from the
    environment (the runs folder, public mode), for a script that embeds the app."""
    if studio is None:
        runs_dir = resolve_runs_dir()
        studio = Studio(runs_dir, policy=Policy.from_env(runs_dir))
    # A public demo's copies of downloads and uploads in gradio's cache go after an hour (ours: engine.retention).
    with StudioApp(title=TITLE, delete_cache=(3600, 3600) if studio.public else None) as demo:
        # The draft lives in the browser too: a reload, or another tab of the same browser, finds it as it was.
        storage_key = studio.browser_storage_key()  # no secret: gradio sends it to every page (see the method)
        top = header(studio, storage_key)
        shared = Shared(studio=studio, form=Form(gr.State({})), pristine=gr.State({}),
                        auto_name=gr.State(""), run_id=gr.State(""), timer=gr.Timer(1.0, active=False),
                        banner=top.running_banner, banner_text=top.running_text)
        shared.fills.append((_notes, [top.notes_box, top.notes_text]))
        pending = gr.State(None)  # {"draft", "label"} waiting for the user to confirm replacing an edited draft
        kept = KeptInBrowser(gr.BrowserState(None, storage_key=DRAFT_STORAGE_KEY, secret=storage_key),
                             gr.BrowserState(None, storage_key=VISITOR_STORAGE_KEY, secret=storage_key),
                             gr.BrowserState("", storage_key=OWNER_KEY_STORAGE_KEY, secret=storage_key))
        drafts = Drafts(shared, top, pending, gr.Markdown(message("Opening your settings…"), elem_id="form-opening"))
        form_area, tabs = build_tabs(shared)
        shared.offer_draft(top.load_recipe.click, functools.partial(recipe_offered, studio), [top.recipe])
        if top.seat is not None:
            class_section.offer_handouts(shared, top.seat)
        drafts.connect()
        shared.form.watch(functools.partial(remember, studio), [kept.draft], [shared.pristine, shared.auto_name],
                          alone=True)
        held = gr.State(DEFAULT_RECIPE)  # what the form holds, as recipe_held last said (the first paint's recipe)
        shared.form.watch(functools.partial(recipe_held, studio), [top.recipe, held], [held])
        top.keep_button.click(recipe_kept, [held], [top.recipe], api_visibility="private", show_progress="hidden")
        shared.form.connect_watchers()
        paint_first(studio, shared, drafts)
        page_loaded = connect_page_load(demo, shared, drafts, kept, top, form_area)
        if top.seat is not None:
            class_section.connect_seat(shared, top.seat, page_loaded)
        top.watch_it.click(**in_the_page([tabs, top.running_banner], f"[{tab_selected(TAB_TRAIN)}, {visible(False)}]"))
        if top.owner is not None:
            top.owner.unlock.click(functools.partial(unlock_everything, studio), [top.owner.key, top.owner.remember],
                                   [kept.owner_key, top.owner.status, shared.runs_list[0]], api_visibility="private")
            top.owner.open_class.click(functools.partial(class_section.class_opened, studio), [top.owner.class_code],
                                       [top.owner.class_code, top.owner.status], api_visibility="private")
        serve_the_api(studio)
        progress_shown_quietly(demo, gr.Markdown(visible=False, elem_id="no-progress"))
    serve_as_visitors(demo, studio)
    # A public demo's events run only through the queue, with its shares per visitor (gradio lets off-Space clients
    # skip it through /gradio_api/run/<api name>), and every app's queue takes turns fairly (guard.turns).
    demo.queue(default_concurrency_limit=4, api_open=not studio.public)
    take_turns_fairly(demo._queue, functools.partial(event_address, studio))
    studio.files.serve_from(get_upload_folder())  # downloads go where the server hands them out without a copy
    demo.form, demo.studio = shared.form, studio
    return demo


def header(studio: Studio, storage_key: str) -> Header:
    with gr.Row(equal_height=True):
        gr.Markdown(f"# 🐉 {TITLE}\n{INTRO}", elem_id="intro")
        with gr.Column(scale=0, min_width=320):
            recipe = gr.Dropdown([*studio.recipes.names(), OWN_SETTINGS], value=DEFAULT_RECIPE, label="Recipe",
                                 info="Loads data, rewards and settings in one click.", elem_id="recipe")
            load_recipe = gr.Button("Load recipe", size="sm", elem_id="load-recipe")
    recipe_status = gr.Markdown(elem_id="recipe-status")
    with gr.Accordion("Notes on these settings", open=True, visible=False, elem_id="draft-notes") as notes_box:
        notes_text = gr.Markdown(elem_id="draft-notes-text")
    with gr.Row(visible=False, elem_id="replace-draft") as confirm_row:
        confirm_text = gr.Markdown(elem_id="replace-draft-text")
        replace_button = gr.Button("Replace my settings", variant="stop", scale=0, min_width=200,
                                   elem_id="replace-draft-yes")
        keep_button = gr.Button("Keep my settings", scale=0, min_width=180, elem_id="replace-draft-no")
    owner = owner_panel(studio.policy.limits) if studio.policy.limits is not None else None
    seat = class_section.seat_panel(storage_key) if studio.policy.limits is not None else None
    with gr.Row(visible=False, equal_height=True, elem_id="running-banner") as running_banner:
        running_text = gr.Markdown(elem_id="running-banner-text")
        watch_it = gr.Button("Open the Train tab", size="sm", scale=0, min_width=200, elem_id="running-banner-open")
    return Header(recipe, load_recipe, recipe_status, notes_box, notes_text, confirm_row, confirm_text, replace_button,
                  keep_button, owner, seat, running_banner, running_text, watch_it)


def owner_panel(limits: Limits) -> OwnerPanel:
    """A public demo's notice of what it allows (``limits``), and the panel where its owner unlocks every run."""
    gr.Markdown(message(
        "This is a public demo shared with other visitors: your runs are yours (others see them, but only "
        f"this browser can stop or download them); each run trains for at most {limits.run_minutes:g} "
        "minutes; custom Python and command rewards are turned off, and only the bundled datasets, your "
        "uploads and Hub datasets can be read. Run it on your own machine (`make run`) without limits.",
        "warn"), elem_id="public-notice")
    with gr.Accordion("Owner of this demo?", open=False, elem_id="owner-panel"):
        with gr.Row():
            key = gr.Textbox(label="Owner key", type="password", scale=3, elem_id="owner-key",
                             info="The DRAGON_UI_OWNER_KEY this demo was started with: lets this "
                                  "page stop, resume and download every run.")
            with gr.Column(scale=1):
                remember_key = gr.Checkbox(False, label="Remember on this browser", elem_id="owner-remember",
                                           info="Only on a computer nobody else uses.")
                unlock = gr.Button("Unlock", elem_id="owner-unlock")
        with gr.Row(equal_height=True):
            class_code = gr.Textbox(label="Class code to give out", type="password", scale=3, elem_id="owner-class-code",
                                    info="Teaching a class here? Learners who type this code take a seat each, with "
                                         "the limits of one network address. Leave it empty to have one made.")
            open_class = gr.Button("Open the class", scale=1, elem_id="owner-open-class")
        status = gr.Markdown(elem_id="owner-status")
    return OwnerPanel(key, remember_key, unlock, status, class_code, open_class)


def build_tabs(shared: Shared) -> tuple[gr.Column, gr.Tabs]:
    """The six tabs, in the form's area (hidden until the page's draft is in), their events wired once every tab
    has added its fields to the form."""
    with gr.Column(visible=False, elem_id="form-area") as form_area, gr.Tabs(elem_id="tabs") as tabs:
        shared.tabs = tabs
        with gr.Tab("1 · Data", id=TAB_DATA, elem_id="tab-data"):
            connectors = [data_tab.build(shared)]
        with gr.Tab("2 · Rewards", id=TAB_REWARDS, elem_id="tab-rewards"):
            connectors.append(rewards_tab.build(shared))
        with gr.Tab("3 · Model & Hardware", id=TAB_MODEL, elem_id="tab-model"):
            connectors.append(model_tab.build(shared))
        with gr.Tab("4 · Train", id=TAB_TRAIN, elem_id="tab-train"):
            train_tab.build(shared)
        with gr.Tab("5 · Compare", id=TAB_COMPARE, elem_id="tab-compare"):
            compare_tab.build(shared)
        with gr.Tab("6 · Experiments", id=TAB_EXPERIMENTS, elem_id="tab-experiments"):
            experiments_tab.build(shared)
    for connect in connectors:  # events that read the whole form, now that every tab has added its fields
        connect()
    return form_area, tabs


class Drafts:
    """Loading a whole draft (a recipe, a past run's settings, the browser's kept one) into every tab, asking first
    when the form has been edited since the last load; and changing the settings shown (a pre-flight's fix).

    ``pending`` holds the draft waiting for the answer to the question ({"draft", "label"}); ``opening`` is the
    "Opening…" line a page shows until its own draft is in."""

    def __init__(self, shared: Shared, top: Header, pending: gr.State, opening: gr.Markdown) -> None:
        self.shared, self.top, self.pending, self.opening = shared, top, pending, opening
        # What every answer to a load writes first: the question's row and text, the draft waiting, the status line.
        self.asking = [top.confirm_row, top.confirm_text, pending, top.recipe_status]

    @property
    def filled(self) -> list:
        """What loading a whole draft writes, after ``asking``: the form's draft, pristine, auto-name, the
        "Opening…" line (emptied by the page's load alone: the page then shows the form) and every tab's fill of
        the draft. Known once every tab is built."""
        shared = self.shared
        return [shared.loaded, shared.pristine, shared.auto_name, self.opening,
                *(output for _, outputs in shared.fills for output in outputs)]

    def loaded(self, new_draft: Draft | dict, label: str, pristine: Draft | dict | None = None,
               auto_name: str | None = None) -> tuple:
        """``asking`` answered, and the draft shown in every tab, in one answer: each event the page runs costs
        it time, more so while a run trains (the fills were an event each)."""
        status = message(f"Loaded {label}: data, rewards and settings.", "ok") if label else gr.skip()
        shown: list[Any] = []
        for fill, outputs in self.shared.fills:
            try:
                filled = fill(new_draft)
                shown.extend(filled if len(outputs) > 1 else [filled])
            except Exception as exc:  # a draft kept by the browser may be anything: the other tabs still show
                log.warning("A tab could not show a draft: %s", exc)
                status = message(f"Some settings could not be shown: {explain(exc)}", "warn")
                shown.extend([gr.skip()] * len(outputs))
        return (gr.Row(visible=False), "", None, status, new_draft,
                new_draft if pristine is None else pristine,
                new_draft.get("name", "") if auto_name is None else auto_name, gr.skip(), *shown)

    def unchanged(self, status: str) -> tuple:
        """``asking`` answered with ``status``; nothing loaded."""
        return (gr.skip(), gr.skip(), gr.skip(), status, *[gr.skip()] * len(self.filled))

    def offer(self, get_draft: DraftMaker, pristine: dict, *args: Any) -> tuple:
        """Load the draft ``get_draft`` gives (a recipe, a past run's settings), asking first when the form has
        been edited since the last load. ``args``: the form's inputs, then ``get_draft``'s."""
        form, policy = self.shared.form, self.shared.studio.policy
        current, rest = form.compose(*args[:len(form.inputs)]), args[len(form.inputs):]
        try:
            new_draft, label = get_draft(*rest)
        except DragonError as exc:
            return self.unchanged(message(str(exc), "error"))
        if not pristine or same_settings(cast(dict, current), pristine, policy=policy):  # it reads plain dicts
            return self.loaded(new_draft, label)
        question = message(f"You have changed the settings since they were loaded. Replace them with {label}? "
                           "What you changed is lost.", "warn")
        return (gr.Row(visible=True), question, {"draft": new_draft, "label": label}, "",
                *[gr.skip()] * len(self.filled))

    def change(self, make_change: DraftMaker, pristine: dict, auto_name: str, *args: Any) -> tuple:
        """Show the settings ``make_change`` makes of the ones shown, without asking (nothing shown is lost);
        the last load stays the pristine one, so the change counts as an edit. ``args``: the form's inputs, then
        ``make_change``'s."""
        form = self.shared.form
        current, rest = form.compose(*args[:len(form.inputs)]), args[len(form.inputs):]
        try:
            new_draft, said = make_change(current, *rest)
        except DragonError as exc:
            return self.unchanged(message(str(exc), "error"))
        shown = list(self.loaded(new_draft, "", pristine, auto_name))
        shown[self.asking.index(self.top.recipe_status)] = message(said, "ok")
        return tuple(shown)

    def replace(self, wanted: dict | None) -> tuple:
        """"Replace my settings": the draft that waited for the answer, shown."""
        return self.loaded(wanted["draft"], wanted["label"]) if wanted else self.unchanged("")

    def fill_loaded(self, trigger: Any, fn: Callable[..., Any], inputs: list, before: Sequence[Any] = (),
                    after: Sequence[Any] = (), **options: Any) -> Any:
        """Wire ``trigger`` to ``fn``, which may load a whole draft (``loaded``) into ``asking`` and ``filled``
        (between the outputs ``before`` and ``after``); after it, the tabs' refreshes run on what the form shows,
        side by side."""
        event = trigger(fn, inputs, [*before, *self.asking, *self.filled, *after], api_visibility="private",
                        show_progress="hidden", **options)
        for refresh, refresh_inputs, outputs, *refresh_options in self.shared.refreshes:
            event.then(refresh, refresh_inputs, outputs, api_visibility="private", show_progress="hidden",
                       **(refresh_options[0] if refresh_options else {}))
        return event

    def connect(self) -> None:
        """The loads and changes the tabs asked for (Shared.offer_draft, Shared.change_draft), and the answers to
        the question."""
        shared, top = self.shared, self.top
        for trigger, get_draft, inputs in shared.offers:
            self.fill_loaded(trigger, functools.partial(self.offer, get_draft),
                             [shared.pristine, *shared.form.inputs, *inputs])
        for trigger, make_change, inputs, said_in in shared.changes:
            self.fill_loaded(trigger, functools.partial(self.change, make_change),
                             [shared.pristine, shared.auto_name, *shared.form.inputs, *inputs]).then(
                said_again, [top.recipe_status], [said_in], api_visibility="private", show_progress="hidden")
        self.fill_loaded(top.replace_button.click, self.replace, [self.pending])
        top.keep_button.click(keep_settings, None, self.asking, api_visibility="private", show_progress="hidden")


@dataclass
class KeptInBrowser:
    """What the browser keeps between visits: the draft, this browser's visitor token, an owner key it was asked to
    remember."""

    draft: gr.BrowserState
    visitor_token: gr.BrowserState
    owner_key: gr.BrowserState


def recipe_kept(held: str) -> str:
    """The recipe box after "Keep my settings": what the form holds (recipe_held), not the recipe picked."""
    return held


def recipe_offered(studio: Studio, name: str) -> tuple[Draft | dict, str]:
    if name == OWN_SETTINGS:
        raise ConfigError("The form already holds your own settings: choose a recipe to load one instead.")
    return studio.recipes.load(name), f"the {name} recipe"


def said_again(said: str) -> str:
    """A change's sentence, shown next to what was pressed too."""
    return said


def keep_settings() -> tuple:
    """"Keep my settings": the question goes, and nothing is loaded."""
    return gr.Row(visible=False), "", None, message("Kept your settings.", "info")


def recipe_held(studio: Studio, draft: Draft, last: str | None) -> tuple:
    """(recipe box, what the form holds) after a change of the form: the recipe it holds, or "your own settings"
    once it holds none (an edit, one's own data, a kept draft after a reload). Written only when that changed
    (``last``), so that a recipe picked in the box and not loaded yet stays picked."""
    names, settings = studio.recipes.names(), settings_of(cast(dict, draft), policy=studio.policy)
    if last in names and holds_recipe(studio, settings, last):
        return gr.skip(), gr.skip()
    held = next((name for name in names if holds_recipe(studio, settings, name)), OWN_SETTINGS)
    return (gr.skip(), gr.skip()) if held == last else (held, held)


def holds_recipe(studio: Studio, settings: dict, name: str) -> bool:
    """Whether ``settings`` (a draft's, settings_of) are the recipe ``name`` as it loads."""
    return settings_of(cast(dict, studio.recipes.load(name)), policy=studio.policy) == settings


def remember(studio: Studio, draft: Draft, pristine: Draft, auto_name: str) -> dict:
    """What the browser keeps: the drafts without the server's folders (files.shown_draft)."""
    return {"draft": shown_draft(draft, policy=studio.policy),
            "pristine": shown_draft(pristine, policy=studio.policy), "auto_name": auto_name}


def paint_first(studio: Studio, shared: Shared, drafts: Drafts) -> None:
    """The page's first paint shows the default recipe, before any event is answered: every tab's fill of it, and
    what the tabs work out from it quickly (the Data tab's table, the playground's rows), made the components' own
    values now."""
    first_draft = studio.recipes.default()
    with made_apart():
        for block, update in zip(drafts.filled, drafts.loaded(first_draft, "")[len(drafts.asking):], strict=True):
            if block is not drafts.opening:
                show_at_first(block, update)
        for view, outputs in shared.first_paint:
            try:
                painted = view(first_draft)
            except Exception:  # noqa: BLE001 - its components show what they were built with, until an answer
                log.exception("The first paint of the default recipe left out %s", outputs)
                continue
            for block, update in zip(outputs, painted if len(outputs) > 1 else [painted], strict=True):
                show_at_first(block, update)


def connect_page_load(demo: gr.Blocks, shared: Shared, drafts: Drafts, kept: KeptInBrowser, top: Header,
                      form_area: gr.Column) -> Any:
    """A browser that kept no draft shows the form at once (a step in the page); one that did shows "Opening…"
    until its own draft is in. In a public demo a browser that kept its token waits for its load too: what it did
    before would be done as a visitor of its own (Visitors.of), not as the one its token makes it. A new browser
    takes that visitor."""
    kept_keys = [DRAFT_STORAGE_KEY, *([VISITOR_STORAGE_KEY] if shared.studio.public else [])]
    opening = drafts.opening
    demo.load(**in_the_page([form_area, opening], kept_none_of(kept_keys) + f" ? [{visible(True)}, "
                                                                         f"{visible(False)}] : [{UNCHANGED}, "
                                                                         f"{UNCHANGED}]"))
    page_loaded = drafts.fill_loaded(
        demo.load, bound(on_page_load, shared.studio, drafts), [kept.visitor_token, kept.owner_key, kept.draft],
        before=[kept.visitor_token, kept.draft],
        after=[shared.run_id, shared.timer, *shared.runs_list, top.running_banner, top.running_text],
        **PAGE_LOADS)  # "Opening…" is its progress
    # A page that kept a draft or a token shows the form once its load is answered: it was hidden until then, so
    # that nothing typed meanwhile is overwritten, nor done as another visitor than the token's. Only the load
    # shows it (a recipe loaded before it would show it early); a page whose load failed keeps "Opening…".
    page_loaded.then(**in_the_page([form_area, opening], f"inputs[0] === '' ? [{visible(True)}, "
                                                         f"{visible(False)}] : [{UNCHANGED}, {UNCHANGED}]"),
                     inputs=[opening])
    return page_loaded


def on_page_load(studio: Studio, drafts: Drafts, token: str | None, owner_key_kept: str, kept: dict | None,
              request: gr.Request) -> tuple:
    """Who this browser is (the token it keeps), the draft it kept (or the default recipe), and re-attach to a
    running (or the latest) run."""
    session = request.session_hash
    if not session:  # a page always has one
        raise gr.Error(NO_SESSION, print_exception=False)
    studio.page_opened()
    token = studio.visitors.arrive(session, token)
    who = studio.visitors.of(session, request_address(studio, request))
    try:  # the owner key this browser was asked to remember
        who = studio.visitors.unlock(who, owner_key_kept) or who
    except DragonError:  # too many wrong keys from here: the page opens locked
        pass
    with visiting(who):
        runs = studio.runs.summaries()
        training_now = studio.runs.active_ids()
        own = [run["id"] for run in runs if run["id"] in training_now and studio.runs.owns(run.get("owner"))]
        active = next(iter(own + training_now), None)  # the visitor's own training first
        run_id = active or (runs[0]["id"] if runs else "")
        refusal = studio.public and kept_draft_refusal(kept)
        if refusal:  # the browser forgets it, and the page shows the default recipe it was drawn with
            shown = list(drafts.unchanged(message(f"{refusal} The page shows the {DEFAULT_RECIPE} recipe.", "warn")))
        elif isinstance(kept, dict) and isinstance(kept.get("draft"), dict) and kept["draft"]:
            pristine, auto_name = kept.get("pristine"), kept.get("auto_name")  # anything, as the browser kept
            policy = studio.policy
            shown = list(drafts.loaded(real_draft(as_draft(kept["draft"]), policy=policy), "",
                                       real_draft(as_draft(pristine), policy=policy) if isinstance(pristine, dict)
                                       else {},
                                       auto_name if isinstance(auto_name, str) else ""))
        else:  # the page shows the default recipe since its first paint: what was done since stays
            shown = [gr.skip()] * (len(drafts.asking) + len(drafts.filled))
        opening_at = next(at for at, block in enumerate(drafts.filled) if block is drafts.opening)
        shown[len(drafts.asking) + opening_at] = ""  # then the page shows the form (page_loaded)
        return (token, None if refusal else gr.skip(), *shown, run_id, gr.Timer(active=bool(active)),
                *train_tab.runs_outputs(studio), *running_now(studio, active))


def running_now(studio: Studio, active: str | None) -> tuple:
    """The banner a page opens with while a run trains: a second browser, or a reload, sees it at once."""
    if not active:
        return gr.Row(visible=False), ""
    return gr.Row(visible=True), train_tab.banner_markdown(active, studio.runs.get(active).read_status())


def unlock_everything(studio: Studio, key: str, remember: bool) -> tuple:
    """Unlock this page with the owner key; the browser keeps the key only when asked to remember it."""
    try:
        who = studio.visitors.unlock(studio.policy.visitor, key)
    except DragonError as exc:
        return gr.skip(), message(str(exc), "error"), gr.skip()
    if who is None:
        return "", message("That is not this demo's owner key.", "error"), gr.skip()
    kept = key if remember is True else ""
    where = "this browser" if kept else "this page (until it is closed)"
    with visiting(who):
        return kept, message(f"Unlocked: {where} can stop, resume and download every run.", "ok"), \
            train_tab.runs_outputs(studio)[0]


# The HTTP API (gradio_client): whole configs in, the same validation and run control as the buttons.


def recipe(studio: Studio, name: str) -> dict:
    """A recipe as a configuration to change and start (its data source as a public demo shows it)."""
    return shown_draft(studio.recipes.load(name), policy=studio.policy)


def check(studio: Studio, config: dict) -> str:
    """"valid", or the first problem, in the configuration file's words (dotted setting names): what
    ``dragon check`` says of the same file."""
    try:
        studio.recipes.check(as_draft(config))
    except DragonError as exc:
        return str(exc)
    return "valid"


def start(studio: Studio, config: dict) -> str:
    """Start training a configuration; returns the run's id (follow it with /train_tick or the run list)."""
    return studio.runs.start(as_draft(config)).id


def preflight(studio: Studio, config: dict, prompts: int | None = None) -> dict:
    """Will it learn? Sample the configuration's groups for some of its training prompts (by default about a
    minute's worth, at least 16) and report: the verdict, the shares of groups with no spread (all fail, all
    pass), each reward's mean, spread and failures, the prompts hardest first, and the fixes as settings. It
    stops once its client has gone."""
    return studio.preflight(as_draft(config), prompts, should_stop=client_left()).to_dict()


def serve_the_api(studio: Studio) -> None:
    for endpoint in (recipe, check, start):
        gr.api(shows_errors(bound(endpoint, studio)), api_name=endpoint.__name__)
    gr.api(shows_errors(bound(preflight, studio)), api_name="preflight", **ONE_MODEL_AT_A_TIME)


def serve_as_visitors(demo: gr.Blocks, studio: Studio) -> None:
    """Run every event of ``demo`` as the visitor whose page (or API session) sent it (``public.visiting``), so the
    engine's public-mode checks know whose uploads and runs are whose without each handler passing it along.

    Gradio sets the request of the event being served (``LocalContext.request``) around each handler. An event
    without a session (a bare REST call) is refused: every such caller would be the same visitor. Outside public
    mode everyone is the operator, and nothing is wrapped.
    """
    if not studio.public:
        return

    def as_visitor(fn):
        def who():
            request = LocalContext.request.get(None)
            session = getattr(request, "session_hash", None)
            if not session or session == LocalContext.event_id.get(None):  # gradio names a sessionless call by its id
                raise gr.Error(NO_SESSION, print_exception=False)  # guard.SessionDoor refuses it first
            try:
                return studio.visitors.of(session, request_address(studio, request))
            except DragonError as exc:  # a session name too long, or no room for another session
                raise gr.Error(str(exc), print_exception=False) from None

        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def generator(*args, **kwargs):
                asking = who()
                with visiting(asking):
                    steps = fn(*args, **kwargs)
                try:
                    while True:
                        with visiting(asking):
                            try:
                                item = next(steps)
                            except StopIteration:
                                return
                        yield item
                finally:
                    steps.close()

            return generator
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(f"{fn!r}: the app's handlers are synchronous (see serve_as_visitors)")

        @functools.wraps(fn)
        def handler(*args, **kwargs):
            with visiting(who()):
                return fn(*args, **kwargs)

        return handler

    for block_fn in demo.fns.values():
        if block_fn.fn is not None:
            block_fn.fn = as_visitor(block_fn.fn)


# Page loads take turns of their own: a burst of them (a class opening the demo at once, or a flood of new sessions)
# waits behind itself, not in front of every other visitor's clicks, which share gradio's default turns.
PAGE_LOADS = {"concurrency_id": "page-loads", "concurrency_limit": 4}


def request_address(studio: Studio, request) -> str | None:
    """The network address (a hash) a request came from, as the studio's policy tells it (public.Policy): it counts
    the runs and starts of API clients that open a new session for every call."""
    headers = request.headers  # starlette's, or (a request gradio rebuilt) a dict of one value per name
    hops = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [headers.get("x-forwarded-for", "")]
    return studio.policy.network_address(", ".join(hops), getattr(getattr(request, "client", None), "host", None))


def event_address(studio: Studio, event: Event) -> str:
    """Whose turn a queued event takes, for the queue's fair turns: its seat's in a class, else the network address
    it came from ("" where none is known)."""
    return studio.visitors.turn_of(event.session_hash, request_address(studio, event.request)) or ""


def look() -> dict:
    """The app's theme, CSS and page script, as every server of it launches them. The Soft theme's emerald labels,
    grey help and white-on-emerald buttons read below WCAG's 4.5:1 contrast (axe-core): darker shades of the same
    colours instead."""
    theme = gr.themes.Soft(primary_hue="emerald").set(
        block_label_text_color="*primary_800", block_title_text_color="*primary_800",
        body_text_color_subdued="*neutral_600", input_placeholder_color="*neutral_500",
        button_primary_background_fill="*primary_700", button_primary_background_fill_hover="*primary_800",
        checkbox_label_background_fill_selected="*primary_700", color_accent="*primary_700")
    return {"theme": theme, "css_paths": [str(ASSETS_DIR / "app.css")],
            "js": (ASSETS_DIR / "app.js").read_text(encoding="utf-8")}


def launch(demo: StudioApp, **options) -> None:
    """Serve ``demo`` (built by build_app) with what its studio's policy allows (serving_options), its look, and
    ``options``."""
    demo.launch(**serving_options(demo.studio), **{**look(), **options})


def main(argv: list[str] | None = None, desktop_driver=None) -> int:
    """The app in the browser, or (--desktop) in its own window; ``desktop_driver`` runs with that window once it
    is shown (tests and the README's screenshot drive it)."""
    prog = "dragon-studio" if Path(sys.argv[0]).name == "dragon-studio" else "python app.py"
    parser = argparse.ArgumentParser(prog=prog, description=f"{TITLE}: point-and-click GRPO in the browser.")
    on_space = bool(os.environ.get("SPACE_ID"))
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0" if on_space else "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="also serve through a public gradio.live link")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    parser.add_argument("--desktop", action="store_true",
                        help="open the app in a window of its own (needs requirements-desktop.txt, "
                             "or pip install 'dragon-grpo-studio[desktop]'; make desktop installs it)")
    parser.add_argument("--runs-dir", help="folder for runs (default: $DRAGON_UI_RUNS_DIR or ./runs)")
    args = parser.parse_args(argv)
    _log_to_terminal()
    machine.choose_speedups(os.environ.get(machine.SPEEDUPS_ENV, ""))  # the previews' (each run's process: its own)
    runs_dir = resolve_runs_dir(args.runs_dir)
    studio = Studio(runs_dir, policy=Policy.from_env(runs_dir))
    demo = build_app(studio)
    studio.runs.start_queue()  # waiting runs (from before a restart, too) start by themselves from now on

    def serve(host: str, port: int, inbrowser: bool, block: bool = True) -> str:
        """Serve the app; with ``block`` until the process is stopped, else in the background. Its address."""
        launch(demo, server_name=host, server_port=port, share=args.share, inbrowser=inbrowser,
               prevent_thread_lock=True, show_error=True, footer_links=["api", "gradio"])
        studio.warm_up(FIRST_PAGE_S)  # the hardware, the libraries and the default model, once a page is up
        if block:
            demo.block_thread()  # until Ctrl+C
            studio.close()
        if demo.local_url is None:
            raise RuntimeError("The app's server did not start.")
        return demo.local_url

    if args.desktop:
        from . import desktop

        return desktop.run(studio, serve, driver=desktop_driver)
    serve(args.host, args.port, inbrowser=not (args.no_browser or on_space))
    return 0


def _log_to_terminal() -> None:
    """The app's own lines on the terminal that started it: its warm-up, a queued run that could not start, and the
    training's progress (each run also writes its lines to its own log.txt)."""
    logger = logging.getLogger("dragon_ui")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def serving_options(studio: Studio) -> dict:
    """What the server may hand out and keep: on your own machine the runs folder (downloads come straight from
    it); in a public demo nothing of it (downloads are copies, handed to their owner alone), uploads up to the limit,
    only what its guards let through (guard.guards), and what it holds of sessions kept to those in use
    (keeping_sessions_small). No run history (in a public demo it could make the server use its Hugging Face token)
    and no monitoring (it shows every visitor's requests to anyone). Every server makes its page and its config once
    (guard.PageCache), not for every request."""
    options = {"run_history": False, "enable_monitoring": False}
    limits = studio.policy.limits
    if limits is not None:  # a public demo
        # gradio forgets its oldest session past this many, in use or not: never reached, since at most
        # SESSIONS_IN_USE are in use and the others are forgotten within SWEEP_S.
        return {**options, "max_file_size": f"{limits.upload_mb:g}mb",
                "state_session_capacity": 2 * SESSIONS_IN_USE,
                "app_kwargs": {"middleware": guards(studio), "lifespan": keeping_sessions_small(studio.visitors)}}
    return {**options, "allowed_paths": [str(studio.runs_dir)], "app_kwargs": {"middleware": [Middleware(PageCache)]}}


def _notes(draft: Draft) -> tuple:
    """The loaded settings' notes (a lesson recipe's: what to try, what to look for), shown only when there are some."""
    notes = draft.get("notes")
    text = notes if isinstance(notes, str) else ""
    return gr.Accordion(visible=bool(text.strip())), text

