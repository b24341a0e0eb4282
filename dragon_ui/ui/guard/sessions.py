"""Sessions of a public demo: a request naming a session brings it into use before gradio makes anything of it
(SessionDoor), events join gradio's queue only within a session's and its address's share (SessionDoor), and the
server holds a lean copy of each session's page, forgotten with its waiting events once it is no longer in use
(keeping_sessions_small).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from gradio.blocks import Blocks
from gradio.state_holder import SessionState, StateHolder
from starlette.datastructures import QueryParams

from ...errors import BusyError, DragonError
from ...public import Policy
from ...studio.draft import KEPT_DRAFT_BYTES, json_shape
from ...studio.files import Files
from ...studio.visitors import Visitors
from .answers import forwarded_for, read_body, refuse, replay
from .routes import CALL_RESULT, EVENT_ROUTE, HEARTBEAT, RESULTS, UPLOAD_ROUTE, route_path
from .waiting import EVENT_VALUES, Waiting, held_bytes

log = logging.getLogger("dragon_ui")

SWEEP_S = 5  # how often a public demo forgets the pages of the sessions no longer in use
FILE_DATA = "gradio.FileData"  # the type gradio's files carry in their meta, in an event's inputs
NO_SESSION = ("This public demo answers only calls made within a session, as its page and gradio_client make them; "
              "send a session_hash.")


class SessionDoor:
    """ASGI middleware of a public demo, inside guard.RequestLimits (which has capped the body this reads).

    Sessions: a request naming a session brings it into use (Visitors.enter) before gradio makes anything of it, and
    the session stays in use while its heartbeat or its stream of results is open (Visitors.heartbeat_opened). gradio
    makes its copy of the page (about 1 MB, 50 ms) for any request that names a new session_hash, before the app's
    handlers run, so they would count it too late. That, and reading a request larger than any page sends, is work in
    the server's one thread, where every visitor's requests are answered: such requests take turns, so that forty at
    once hold up another visitor's request by one of them, not all.

    Events: an event must name a session, its request hold at most EVENT_VALUES JSON values, the files it names be
    ones uploaded here (gradio fetches a file named by its web address into memory, whatever its size), and it joins
    gradio's queue only within its page's and its address's share (waiting.Waiting). A refusal is HTTP 400, 413 or
    429, with the sentence."""

    def __init__(self, app, visitors: Visitors, files: Files, *, policy: Policy) -> None:
        self.app, self.visitors, self.policy, self.files = app, visitors, policy, files
        self._turns = asyncio.Lock()  # the costly requests', one at a time
        self._waiting = Waiting()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("GET", "POST"):
            return await self.app(scope, receive, send)
        path = route_path(scope)
        address = self.policy.network_address(forwarded_for(scope), (scope.get("client") or (None,))[0])
        if scope["method"] == "GET":
            session = _listening(scope, path)
            if session is None:
                return await self.app(scope, receive, send)
            if await self._entered(send, self.visitors.heartbeat_opened, session, address) is None:
                return None
            try:
                return await self.app(scope, receive, send)
            finally:
                self.visitors.heartbeat_closed(session)
        if UPLOAD_ROUTE.fullmatch(path):
            return await self.app(scope, receive, send)
        body = await read_body(receive)
        if body is None:  # the client left before sending it all
            return None
        event = EVENT_ROUTE.fullmatch(path) is not None  # joins the queue, answered as soon as it is queued
        large = len(body) > KEPT_DRAFT_BYTES  # more than any page sends: its largest is a page load's kept draft
        async with contextlib.AsyncExitStack() as turn:
            if large:
                await turn.enter_async_context(self._turns)
            sent = _parsed(body)
            session = sent.get("session_hash") if isinstance(sent.get("session_hash"), str) else None
            if event and not session:
                return await refuse(send, 400, NO_SESSION)
            values = json_shape(sent, EVENT_VALUES)[0] if event else 0
            if values > EVENT_VALUES:
                return await refuse(send, 413, f"An event's request holds at most {EVENT_VALUES:,} values in this "
                                               "public demo (no page sends more); send less.")
            if event and not self._only_uploads(sent):
                return await refuse(send, 400, "An event may name only files uploaded to this public demo.")
            coming = bool(session) and await self._entered(send, self.visitors.enter, session, address)
            if coming is None:
                return None
            if not event:
                await turn.aclose()  # the other routes may run an event before they answer: never in a turn
                return await self.app(scope, replay(body, receive), send)
            pending, cost = scope["app"].get_blocks()._queue.pending_event_ids_session, held_bytes(body, values)
            refusal = self._waiting.refusal(pending, session, address, cost, self.policy.limits)
            if refusal:
                return await refuse(send, 429, refusal)
            with self._waiting.joining(session, address, cost) as answered:  # counted before any wait for a turn
                if coming and not large:
                    await turn.enter_async_context(self._turns)
                return await self.app(scope, replay(body, receive), _answer_read(send, answered))

    def _only_uploads(self, sent: dict) -> bool:
        """Whether every file the event names (gradio's FileData, anywhere in its request: what its meta says it is)
        lies where this demo's uploads arrive."""
        arrivals, stack = self.files.arrivals.resolve(), [sent]
        while stack:
            item = stack.pop()
            if isinstance(item, dict) and isinstance(item.get("meta"), dict) and "_type" in item["meta"]:
                if not (item["meta"]["_type"] == FILE_DATA and isinstance(item.get("path"), str)
                        and not item.get("is_stream") and _lies_in(item["path"], arrivals)):
                    return False
            elif isinstance(item, dict | list):
                stack.extend(item.values() if isinstance(item, dict) else item)
        return True

    @staticmethod
    async def _entered(send, enter, *args) -> bool | None:
        """What ``enter(*args)`` answered; None if it refused the session, whose sentence is then the answer."""
        try:
            return enter(*args)
        except DragonError as exc:
            await refuse(send, 429 if isinstance(exc, BusyError) else 400, str(exc))
            return None


def _lies_in(path: str, folder: Path) -> bool:
    """Whether ``path`` names a file of the server's inside ``folder`` (not a web address, nor a path that cannot
    be)."""
    try:
        return "://" not in path and Path(path).resolve().is_relative_to(folder)
    except (ValueError, OSError):  # a NUL byte, a loop of links
        return False


def _answer_read(send, answered):
    """A send() that passes gradio's answer on, and hands ``answered`` its body once it is a success's."""
    status, chunks = None, []

    async def sending(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and status == 200:
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered(b"".join(chunks))
        await send(message)

    return sending


def _listening(scope, path: str) -> str | None:
    """The session a GET request keeps in use while it is open: its page's heartbeat, or a stream of its results
    (of the session it names, as gradio reads the name, or of the event an HTTP call's result route names)."""
    heartbeat = HEARTBEAT.fullmatch(path)
    if heartbeat:
        return heartbeat["session"]
    if RESULTS.fullmatch(path):
        return QueryParams(scope.get("query_string", b"")).get("session_hash") or None
    called = CALL_RESULT.fullmatch(path)
    if called:
        queue = scope["app"].get_blocks()._queue
        event = queue.event_ids_to_events.get(called["event"])
        return event.session_hash if event is not None else next(
            (session for session, ids in list(queue.pending_event_ids_session.items()) if called["event"] in ids), None)
    return None


def _parsed(body: bytes) -> dict:
    """A request's JSON body, as gradio's queue/join and its API routes take it; {} if it is not a JSON object."""
    try:
        sent = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return sent if isinstance(sent, dict) else {}


class SessionPage(SessionState):
    """gradio's copy of the page for one session, without its second copy of every component's config: only deep
    links read that copy (closed, SessionDoor), and making it (about 360 components, each through inspect.signature)
    was most of what a new session cost the server's one thread, where every visitor's requests are answered.

    gradio's own initialiser runs, on a stand-in that lists no component to copy; later updates copy nothing either
    (this session's BlocksConfig is its own, and gr.render, its one other reader of block configs, is not used)."""

    def __init__(self, blocks) -> None:
        super().__init__(cast(Blocks, SimpleNamespace(default_config=blocks.default_config, blocks={})))
        setattr(self.blocks_config, "config_for_block", _no_config)  # this session's own, in place of the method


def _no_config(*_args, **_kwargs) -> dict:
    return {}


class SessionPages(StateHolder):
    """gradio's table of sessions, making each a SessionPage."""

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = SessionPage(self.blocks)
        return super().__getitem__(session_id)


def keeping_sessions_small(visitors: Visitors):
    """A lifespan for gradio's server that makes its sessions SessionPages, and forgets, every SWEEP_S, the page and
    the events of each session not in use (Visitors.quiet): a session without a heartbeat (a raw client) is
    forgotten QUIET_S after its last sign of life.

    gradio itself forgets a session only past its capacity, the oldest first whether in use or not, and an hour
    after its heartbeat closed only the values of its gr.State (StateHolder.delete_state); a session's events wait
    in its queue, and their answers for it, until its stream of results asks for them. Its StateHolder has no call
    that forgets a whole session, so this removes the session's entry under the holder's lock, as the holder's own
    eviction does; a later request of that session starts a fresh copy. Its queue's own clean-up (clean_events, as
    when a stream of results closes) drops the session's waiting events and tells a running one its client left."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        app.state_holder.__class__ = SessionPages  # before any session; the blocks and the queue share this holder

        async def sweep():
            while True:
                await asyncio.sleep(SWEEP_S)
                try:
                    await _forget_quiet_sessions(app, visitors)
                except Exception:  # noqa: BLE001 - the next sweep tries again; the server goes on either way
                    log.exception("Forgetting the sessions no longer in use failed")

        task = asyncio.create_task(sweep())
        try:
            yield
        finally:
            task.cancel()

    return lifespan


async def _forget_quiet_sessions(app, visitors: Visitors) -> None:
    """Forget the page and the events of each session no longer in use: its waiting events leave the queue in one
    pass, and a running one is told its client left, as gradio's own clean-up does for one session."""
    holder, queue = app.state_holder, app.get_blocks()._queue
    with holder.lock:
        held = set(holder.session_data)
    quiet = set(visitors.quiet(held | set(queue.pending_event_ids_session)))
    if not quiet:
        return
    with holder.lock:
        for session in quiet:
            holder.session_data.pop(session, None)
            holder.time_last_used.pop(session, None)
    for job in queue.active_jobs:
        for event in job or ():
            if event.session_hash in quiet:
                event.alive = False
    async with queue.delete_lock:
        for waiting in queue.event_queue_per_concurrency_id.values():
            gone = [event for event in waiting.queue if event.session_hash in quiet]
            for event in gone:
                waiting.queue.remove(event)
                queue.event_ids_to_events.pop(event._id, None)
    for session in quiet:
        queue.pending_event_ids_session.pop(session, None)
        queue.pending_messages_per_session.pop(session, None)
