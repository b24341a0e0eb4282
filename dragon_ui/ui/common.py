"""What the tabs share: the form every tab adds its fields to, the cross-tab state, and one way to show engine
errors as sentences."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, cast

import gradio as gr
from gradio.context import Context, LocalContext, get_render_context

from ..config import Draft, setting_help
from ..errors import DragonError, describe
from ..studio import draft as drafts
from ..studio.backend import Studio

log = logging.getLogger(__name__)

TAB_DATA, TAB_REWARDS, TAB_MODEL, TAB_TRAIN, TAB_COMPARE = "data", "rewards", "model", "train", "compare"
TAB_EXPERIMENTS = "experiments"


@dataclass
class FormField:
    path: str  # where the value goes in the config ("training.max_steps")
    component: Any
    label: str  # the words on the screen, used in messages about this setting
    to_draft: Callable[[Any], Any]


class Form:
    """Every component whose value is part of the run's config, and the config path it fills.

    The form is the only copy of the settings being edited: a handler that acts on the config takes ``inputs`` and
    gets the draft composed from what the screen shows at that moment (``takes_draft``), so no event dropped or
    still pending can make it act on other values than the ones shown.
    """

    def __init__(self, loaded: gr.State) -> None:
        self.loaded = loaded  # the draft last loaded: the settings the form does not show come from it
        self.fields: list[FormField] = []
        self._watchers: list[tuple[Callable[..., Any], list, list]] = []
        self._alone: list[tuple[Callable[..., Any], list, list]] = []

    def add(self, path: str, component, to_draft: Callable[[Any], Any] = lambda value: value, label: str | None = None):
        self.fields.append(FormField(path, component, label or component.label or path, to_draft))
        return component

    @property
    def inputs(self) -> list:
        return [self.loaded, *(f.component for f in self.fields)]

    @property
    def triggers(self) -> list:
        """A change of any field (typed, or filled in by a load)."""
        return [f.component.change for f in self.fields]

    def component(self, path: str):
        (found,) = [f.component for f in self.fields if f.path == path]
        return found

    @property
    def labels(self) -> dict[str, str]:
        return {f.path: f.label for f in self.fields}

    def compose(self, loaded: dict, *values: Any) -> Draft:
        return as_draft(drafts.compose(loaded, {f.path: f.to_draft(value)
                                                for f, value in zip(self.fields, values, strict=True)}))

    def takes_draft(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn(draft, *rest)`` as a handler whose inputs are ``[*self.inputs, *rest]`` (a generator stays one).

        Not functools.wraps: gradio would read ``fn``'s parameters and inject request objects at wrong places.
        """
        count = len(self.inputs)
        if inspect.isgeneratorfunction(fn):
            def stream(*args):
                yield from fn(self.compose(*args[:count]), *args[count:])

            return stream

        def handler(*args):
            return fn(self.compose(*args[:count]), *args[count:])

        return handler

    def watch(self, fn: Callable[..., Any], outputs: list, inputs: Sequence[Any] = (), alone: bool = False) -> None:
        """Run ``fn(draft, *inputs)`` for ``outputs`` after every change of the form; ``alone``: in an event of its
        own, so that its answer does not wait for the slowest of the others (the draft the browser keeps, which a
        reload seconds after an edit must find, waited for a cold start's hardware detection)."""
        if alone:
            self._alone.append((fn, list(outputs), list(inputs)))
        else:
            self._watchers.append((fn, list(outputs), list(inputs)))

    def connect_watchers(self) -> None:
        """One event for every change of the form that runs all watchers on one draft: each event costs the page
        time, so there is one, not one per watcher. always_last: a change while it is running is not dropped but
        handled once it is done, with the values the form shows then.

        A load changes many fields at once, and gradio's page sends an always_last event once for each of them
        when they change together (it only notices the first is running after it was sent), so a loaded draft was
        worked out six times over. The fields' changes first count up a hidden number in the page, once for all
        the changes made together (FORM_EDITED); the watchers run on its change."""
        edits = gr.Number(0, visible="hidden", interactive=False, elem_id="form-edits")
        gr.on(self.triggers, **in_the_page([edits], FORM_EDITED))
        edits.change(self.on_change, [*self.inputs, *(c for _, _, inputs in self._watchers for c in inputs)],
                     [c for _, outputs, _ in self._watchers for c in outputs], trigger_mode="always_last",
                     show_progress="hidden", api_visibility="private")
        for fn, outputs, inputs in self._alone:
            edits.change(self.takes_draft(fn), [*self.inputs, *inputs], outputs, trigger_mode="always_last",
                         show_progress="hidden", api_visibility="private")

    def on_change(self, *args: Any) -> list:
        """Every watcher's answer to one change of the form: ``args`` are the form's inputs, then each watcher's."""
        count = len(self.inputs)
        draft, rest = self.compose(*args[:count]), list(args[count:])
        shown: list[Any] = []
        for fn, outputs, inputs in self._watchers:
            values, rest = rest[:len(inputs)], rest[len(inputs):]
            try:
                result = fn(draft, *values)
                shown.extend(result if len(outputs) > 1 else [result])
            except Exception:  # one watcher's failure leaves the others' answers (the kept draft among them)
                log.exception("a watcher of the form failed")
                shown.extend([gr.skip()] * len(outputs))
        return shown


# The count of the form's edits (Form.connect_watchers). The first change of a burst opens it and every change until
# the page next runs a task of its own (a posted message: unlike a timer, never held back in a background tab) gets
# the same promise, of the count once the burst is over: the fields then all show their new values when the watchers
# read them. A change after that starts a new burst, and always_last runs the watchers again.
FORM_EDITED = ("(() => { const burst = (window.dragonFormEdits ??= {count: 0, next: null}); "
               "if (!burst.next) { burst.next = new Promise((resolve) => { const channel = new MessageChannel(); "
               "channel.port1.onmessage = () => { burst.next = null; burst.count += 1; resolve(burst.count); }; "
               "channel.port2.postMessage(null); }); } return burst.next; })()")


def as_draft(settings: Mapping[str, Any]) -> Draft:
    """``settings`` as the Draft the studio's functions take: a client's config or the draft a browser kept (not
    validated yet, as a Draft never is), or a draft that a function of the studio hands on as a plain dict
    (studio.draft.compose, files.real_draft)."""
    return cast(Draft, settings)


# A function of an event's inputs that makes a whole draft: (the draft, what it is or what changed), the draft as
# the studio's function gives it, a Draft or a plain dict (Runs.settings_of, preflight_view.apply_fix).
DraftMaker = Callable[..., tuple[Draft | dict, str]]


@dataclass
class Shared:
    """Components every tab may read or write. Built once by app.build_app before the tabs."""

    studio: Studio
    form: Form
    pristine: gr.State  # the draft as last loaded, unedited: replacing an edited draft asks first
    auto_name: gr.State  # the run name the app chose (from the recipe or the data file); a typed one is kept
    run_id: gr.State  # the run shown on the Train and Compare tabs ("" when none)
    timer: gr.Timer  # drives the Train tab's refresh while a run is active
    tabs: gr.Tabs | None = None
    # The banner above the tabs naming a run that trains (its row and its line): the Train tab keeps it current.
    banner: Any = None
    banner_text: Any = None
    # Events that put a new data source in the form (a pick, an upload, a typed path): the run name follows them.
    source_replaced: list = field(default_factory=list)
    # The Train tab's list of past runs and its run picker, refreshed when a page loads (each visitor sees whose
    # runs are whose); set by train_tab.build.
    runs_list: list = field(default_factory=list)
    # The Train tab's status line, which Start fills at once (else it would show "no run yet" until the run is read).
    train_status: Any = None
    # The Rewards tab's playground row picker and the row it shows: a pre-flight's prompt opens there.
    playground_row: Any = None
    playground_row_text: Any = None
    # Events that replace the whole draft (a past run's "Load these settings") and events that change the settings
    # shown (a pre-flight's fix), as offer_draft and change_draft take them; app.build_app wires them once every tab
    # has said what it fills.
    offers: list[tuple[Any, DraftMaker, list]] = field(default_factory=list)
    changes: list[tuple[Any, DraftMaker, list, Any]] = field(default_factory=list)
    # What each tab shows of a whole draft just loaded: (function of the draft, its outputs), run one after another
    # before the form appears (app.Drafts.loaded)...
    fills: list = field(default_factory=list)
    # ...and what each tab then works out from the form as it shows: (function, inputs, outputs[, event options]),
    # the Data tab's preview among them, which may take seconds and must not hold the form back.
    refreshes: list = field(default_factory=list)
    # What the page's first paint shows of the default recipe besides the fills, worked out while the app is built:
    # (function of the draft, its outputs); quick ones only (no model, no hardware, no run).
    first_paint: list = field(default_factory=list)

    @property
    def loaded(self) -> gr.State:
        return self.form.loaded

    def offer_draft(self, trigger: Any, get_draft: DraftMaker, inputs: list) -> None:
        """Have ``trigger`` load the draft that ``get_draft(*inputs)`` returns as (draft, what it is) in every tab,
        asking first if the form was edited."""
        self.offers.append((trigger, get_draft, inputs))

    def change_draft(self, trigger: Any, make_change: DraftMaker, inputs: list, said_in: Any) -> None:
        """Have ``trigger`` show the settings ``make_change(draft, *inputs)`` returns as (draft, a sentence saying
        what changed) in every tab, the sentence in ``said_in`` too."""
        self.changes.append((trigger, make_change, inputs, said_in))


def in_the_page(outputs: list, updates: str) -> dict:
    """An event step that only changes ``outputs`` in the browser: ``updates`` is a JavaScript expression of the
    step's ``inputs`` (an array) giving one gradio update per output, ``{__type__: 'update', ...}``.

    Why, for layouts (the form, the tabs): the page keeps the loading status of every component any server event
    ever wrote to, and at every later status change (three or four per click) it copies the value of each of them
    and of everything inside them. One server write to the tabs made every later click copy the whole app, which
    kept a 2-CPU machine's browser busy for most of a second while a run trained. A step run in the page has no
    loading status."""
    return {"fn": None, "outputs": outputs, "js": f"(...inputs) => ({updates})", "api_visibility": "private",
            "show_progress": "hidden"}


def progress_shown_quietly(demo: gr.Blocks, nowhere) -> None:
    """Every server event of ``demo`` that shows no progress keeps its loading status on ``nowhere`` (a component
    never shown) instead of on its outputs.

    Why: the page keeps the loading status of every component any server event ever wrote to, and at every status
    change of any event (three or four per click, two per timer tick) it updates each of them, calling every
    component inside it. After a page load had written the whole form, a click or a tick while a run trained cost
    the browser a fraction of a second. An event's status goes to its ``show_progress_on`` components when it has
    them (gradio 6.31), so the events with nothing to show now add one component to that list, the same for all."""
    for block_fn in demo.fns.values():
        if block_fn.fn is not None and block_fn.show_progress == "hidden" and block_fn.show_progress_on is None:
            block_fn.show_progress_on = [nowhere]


UNCHANGED = "{__type__: 'update'}"  # the update that changes nothing (in_the_page)


class Described(TypedDict):
    """A field's label and info, as gradio's components take them (``**described(...)``)."""

    label: str
    info: str


def described(path: str, hint: str = "") -> Described:
    """A field's label and info: the setting's own (config.setting_help), then ``hint`` on how this widget behaves."""
    setting = setting_help(path)
    return Described(label=setting.label, info=f"{setting.help} {hint}".strip())


def optional_number(value: float | None = None, **options) -> gr.Textbox:
    """A number field that may stay empty, which means its setting's default. Not gr.Number: gradio 6 shows and
    sends 0 for an empty one, and 0 means something else for several settings (held-out checks: none; the upper
    clip: invalid). ``number`` reads it."""
    return gr.Textbox(value=shown_number(value), lines=1, max_lines=1, **options)


def shown_number(value: float | None) -> str:
    return "" if value is None else str(value)


def number(text: Any) -> int | float | str | None:
    """An optional number field's value: empty is None, a number is itself, and anything else goes on as typed,
    for the settings' check to refuse in words ("… must be a whole number, not the text 'ten'")."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return text
    text = str(text or "").strip()
    if not text:
        return None
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def visible(shown: bool) -> str:
    """The update that shows or hides a component (``in_the_page``)."""
    return f"{{__type__: 'update', visible: {'true' if shown else 'false'}}}"


def tab_selected(tab_id: str, when: str = "true") -> str:
    """The update that selects the tab ``tab_id`` when ``when`` holds (``in_the_page``). ``when`` is JavaScript
    source: only the app's own constants go in it, written with ``json.dumps``, never anything a visitor sent."""
    return f"(({when}) ? {{__type__: 'update', selected: {json.dumps(tab_id)}}} : {UNCHANGED})"


class EventOptions(TypedDict, total=False):
    """Options that a tab gives several of its events alike (``**options``), as gradio's listeners take them."""

    trigger_mode: Literal["once", "multiple", "always_last"]
    api_visibility: Literal["public", "private", "undocumented"]
    show_progress_on: Sequence[gr.components.Component]


class Turns(TypedDict):
    """How many events of a group run at once, across the app (gradio's concurrency group)."""

    concurrency_limit: int
    concurrency_id: str


# What loads or writes a whole model (previews, scoring, merging, zipping, publishing) takes turns across the app,
# whoever asks: two at once would hold two models in memory and share the cores with a training.
ONE_MODEL_AT_A_TIME: Turns = {"concurrency_limit": 1, "concurrency_id": "models"}
# Held by the thread that samples for such an event (the playground's group, the pre-flight): gradio lets the next
# model event start once it has closed a cancelled one, while that thread may still be finishing its token.
SAMPLING = threading.Lock()



def tab_being_built() -> gr.Tab:
    """The tab that app.build_app builds the calling tab's components in: its selection re-reads what may have
    changed meanwhile."""
    tab = get_render_context()
    if not isinstance(tab, gr.Tab):
        raise TypeError("A tab is built inside its gr.Tab (app.build_tabs).")
    return tab


def client_left() -> Callable[[], bool]:
    """A should_stop for the event being served: true once its client has gone. gradio marks the event so when the
    client's stream of results closes, and a public demo's guard when its session is no longer in use
    (guard.keeping_sessions_small); outside an event, never."""
    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    jobs = blocks._queue.active_jobs if blocks is not None and blocks._queue is not None else []
    event = next((event for job in jobs if job for event in job if event._id == event_id), None)
    return (lambda: False) if event is None else (lambda: not event.alive)


MESSAGE_ICONS = {"info": "ℹ️", "ok": "✅", "warn": "⚠️", "error": "❌"}


def message(text: str, kind: str = "info") -> str:
    """A one-line status shown next to the control it concerns (Markdown), its kind drawn as an icon."""
    return f"{MESSAGE_ICONS[kind]} {text}"


def explain(exc: BaseException) -> str:
    """The sentence to show for an exception: the engine's own message, or a short generic one (logged in full)."""
    if isinstance(exc, DragonError):
        return str(exc)
    log.exception("unexpected error in the UI")
    return f"Something went wrong: {describe(exc)}"


def asked(fn: Callable[..., Any], studio: Studio) -> Callable[..., Any]:
    """``fn(*inputs, policy=...)`` as a handler of ``inputs`` that passes the policy of the request it serves
    (``Studio.policy``, asked by that request's visitor), read when it is called; a generator stays one.

    Not functools.wraps, for the reason Form.takes_draft gives."""
    if inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "func", None)):
        def stream(*args):
            yield from fn(*args, policy=studio.policy)

        return stream

    def handler(*args):
        return fn(*args, policy=studio.policy)

    return handler


def bound(fn: Callable[..., Any], *first: Any) -> Callable[..., Any]:
    """``fn`` with its first parameters given ``first``, as a handler of the rest: functools.partial, except that
    gradio still reads the annotations of the rest, by which it passes the request (``gr.Request``) or the event's
    data (``gr.EventData``, ``gr.SelectData``); a generator stays one."""
    if inspect.isgeneratorfunction(fn):
        def handler(*args, **kwargs):
            yield from fn(*first, *args, **kwargs)
    else:
        def handler(*args, **kwargs):
            return fn(*first, *args, **kwargs)

    functools.update_wrapper(handler, fn)  # its annotations, resolved in fn's module
    signature = inspect.signature(fn)
    setattr(handler, "__signature__", signature.replace(parameters=list(signature.parameters.values())[len(first):]))
    return handler


def first_cell(event: gr.SelectData) -> Any:
    """The first cell of a table's row that was picked (a run's id, a preset's model); None when there is none."""
    row = event.row_value
    return row[0] if isinstance(row, list) and row else None


def chosen_or_unchanged(value: Any) -> Any:
    """A picker's value for the field it fills, leaving the field as it is when nothing was picked."""
    return value or gr.skip()


def shows_errors(fn):
    """Turn any exception of a handler into a gr.Error popup with a readable sentence (never a raw traceback); a
    generator stays one."""
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def stream(*args, **kwargs):
            with _said_as_a_sentence():
                yield from fn(*args, **kwargs)

        return stream

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _said_as_a_sentence():
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def _said_as_a_sentence():
    try:
        yield
    except gr.Error:
        raise
    except Exception as exc:
        raise gr.Error(explain(exc), print_exception=False) from None


@contextlib.contextmanager
def made_apart():
    """Components made meanwhile (the updates a tab's fill returns) stay out of the app being built, as they do
    when an event's handler makes them: gradio places a component in the Blocks whose ``with`` it is made in."""
    root, block = Context.root_block, Context.block
    Context.root_block = Context.block = None
    try:
        yield
    finally:
        Context.root_block, Context.block = root, block


def show_at_first(block, update) -> None:
    """Make ``update`` (what an event would answer for ``block``: a value, a gradio update or a component standing
    for its new properties) the block's own, so the page shows it on its first paint, before any event answered.

    Called while the app is built. As gradio does with an event's update, the block is made anew from its
    constructor's arguments and the update's, and keeps them: gradio rebuilds it from them at a later update.
    This and made_apart use gradio's own workings (a block's ``_constructor_args``, ``Context``): with another
    gradio, tests/test_draft.py's first-paint test says whether they still hold."""
    if isinstance(update, gr.blocks.Block):
        changed = {key: value for key, value in update.constructor_args.items() if key != "render"}
    elif isinstance(update, dict) and "__type__" in update:  # gr.update(...), or gr.skip(): nothing
        changed = {key: value for key, value in update.items() if key != "__type__"}
    else:
        changed = {"value": update}
    if not changed:
        return
    remade = type(block)(**{**block.constructor_args, **changed, "render": False})
    for key in changed:
        setattr(block, key, getattr(remade, key))
    block._constructor_args[0].update(changed)
