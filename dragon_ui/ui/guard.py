"""What a public demo's server refuses before any event runs: request bodies over a size, uploads past each
network address's share (RequestLimits), sessions past those it may have in use and gradio's deep links
(SessionDoor); and what it holds of each session: a lean copy of the page, forgotten once no longer in use
(keeping_sessions_small). gradio caps an upload's size (``max_file_size``) but no other request: a 400 MB JSON body
would be read into memory (and copied into gradio's log) by anyone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import threading
import time
from types import SimpleNamespace

from gradio.state_holder import SessionState, StateHolder
from starlette.formparsers import MultiPartException

from ..errors import BusyError, DragonError
from ..studio.draft import KEPT_DRAFT_BYTES
from ..studio.visitors import Visitors, key_of

# An event's inputs: the largest a page sends, a page load with its kept draft (studio.draft.KEPT_DRAFT_BYTES), is a
# quarter of it. Each request waiting in gradio's queue holds several times its body (13 MB for 2 MB).
BODY_BYTES = 512 * 2**10
UPLOAD_WINDOW_S = 600
UPLOADS_PER_WINDOW = 5  # times the upload limit, per address and window: files people pick by hand


def network_address(headers, client_host: str | None) -> str | None:
    """A hash of the network address a request came from (headers as a mapping of lower-case names). On a Space
    the proxy puts the visitor's address first in X-Forwarded-For (the connection comes from the proxy); elsewhere
    uvicorn gives it (FORWARDED_ALLOW_IPS names trusted proxies)."""
    host = None
    if os.environ.get("SPACE_ID"):
        host = (headers.get("x-forwarded-for") or "").split(",")[0].strip() or None
    host = host or client_host
    return key_of(f"address:{host}") if host else None


class UploadCut(MultiPartException):
    """Raised into gradio's upload parser to end an upload part way: it is the parser's own error for a file too
    large, so gradio deletes what it wrote of the file (it keeps it when the connection merely ends)."""


class ShareSpent(UploadCut):
    """The address's share ran out part way through an upload (the middleware answers in gradio's place)."""


class UploadAbandoned(UploadCut):
    """The client left part way through an upload."""


class _Share:
    """The upload bytes one address sent in the window, as (second, bytes) counts: one per second at most, so an
    address sending a byte at a time is still a few hundred counts."""

    def __init__(self) -> None:
        self.counts: collections.deque[list] = collections.deque()
        self.spent = 0

    def take(self, now: float, size: int, share: int) -> bool:
        while self.counts and now - self.counts[0][0] >= UPLOAD_WINDOW_S:
            self.spent -= self.counts.popleft()[1]
        if self.spent + size > share:
            return False
        if self.counts and int(now) == int(self.counts[-1][0]):
            self.counts[-1][1] += size
        elif size:
            self.counts.append([now, size])
        self.spent += size
        return True


class RequestLimits:
    """ASGI middleware: a request that is not an upload may carry at most ``body_bytes``; uploads from one address
    may carry at most ``upload_bytes`` in UPLOAD_WINDOW_S. A refusal is HTTP 413 or 429 with one sentence.

    An upload's bytes count as they arrive, before the app sees them (a chunked upload declares no length), and a
    declared length counts at once: uploads sent side by side from one address draw on the one share."""

    def __init__(self, app, body_bytes: int = BODY_BYTES, upload_bytes: int = 100 * 2**20) -> None:
        self.app, self.body_bytes, self.upload_bytes = app, body_bytes, upload_bytes
        self._shares: dict[str, _Share] = {}
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        declared = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else None
        if scope["path"].rstrip("/").endswith("/upload"):
            address = network_address(headers, (scope.get("client") or (None,))[0]) or ""
            return await self._upload(scope, receive, send, address, declared or 0)
        if declared is not None and declared > self.body_bytes:
            return await _refuse(send, 413, self._too_large())
        body, more = b"", True
        while more:  # read it here, to its limit, whatever the request declared
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.body_bytes:
                return await _refuse(send, 413, self._too_large())
        return await self.app(scope, _replay(body, receive), send)

    async def _upload(self, scope, receive, send, address: str, declared: int) -> None:
        """Pass an upload on while its address's share lasts: its declared length is taken first, then every byte
        beyond it as it arrives. Once the share is spent the app's parser gets ShareSpent, and its answer gives way
        to a 429 (unless it had begun answering)."""
        if not self._take(address, declared):
            return await _refuse(send, 429, self._share_spent())
        counted, received, refused, answering = declared, 0, False, False

        async def counting_receive():
            nonlocal counted, received, refused
            message = await receive()
            if message["type"] == "http.disconnect":
                raise UploadAbandoned("The upload was abandoned part way.")
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > counted:
                    if not self._take(address, received - counted):
                        refused = True
                        raise ShareSpent(self._share_spent())
                    counted = received
            return message

        async def answering_send(message):
            nonlocal answering
            if refused and not answering:
                return  # the app's answer to the refusal: the 429 goes in its place
            answering = True
            await send(message)

        try:
            await self.app(scope, counting_receive, answering_send)
        except UploadCut:
            pass  # an app that did not catch it: answered just below, if anyone is listening
        if refused and not answering:
            await _refuse(send, 429, self._share_spent())

    def _take(self, address: str, size: int) -> bool:
        """Count ``size`` more upload bytes from ``address``; False (counting nothing) if that passes its share."""
        with self._lock:
            return self._shares.setdefault(address, _Share()).take(time.monotonic(), size, self.upload_bytes)

    def _share_spent(self) -> str:
        return (f"Uploads from your network address have reached this public demo's share of "
                f"{self.upload_bytes / 2**20:g} MB per {UPLOAD_WINDOW_S // 60} minutes; try again later.")

    def _too_large(self) -> str:
        return (f"This public demo takes requests of at most {self.body_bytes / 2**10:g} KB (no setting needs more); "
                "send less.")


def _replay(body: bytes, receive):
    """A receive() that first gives the body read already, then whatever the connection sends next."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _refuse(send, status: int, sentence: str) -> None:
    body = json.dumps({"detail": sentence}).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# gradio's route a page keeps open while it is open (under the root path it may be mounted at)
HEARTBEAT = re.compile(r"[^=]*/gradio_api/heartbeat/(?P<session>[^/=]+)/?")
# gradio's route that writes a copy of any session's page, named by its session_hash, to disk and hands out its link
DEEP_LINK = re.compile(r"[^=]*/gradio_api/deep_link/?")
SWEEP_S = 5  # how often a public demo forgets the pages of the sessions no longer in use


class SessionDoor:
    """ASGI middleware of a public demo: a request naming a session brings it into use (Visitors.enter) before
    gradio makes anything of it, and the session stays in use while its heartbeat is open (Visitors.heartbeat_opened).

    gradio makes its copy of the page (about 1 MB, 50 ms) for any request that names a new session_hash, before the
    app's handlers run, so they would count it too late. That, and reading a request larger than any page sends, is
    work in the server's one thread, where every visitor's requests are answered: such requests take turns, so that
    forty at once hold up another visitor's request by one of them, not all. A refusal is HTTP 429 (400 for a session
    name too long) with the sentence. Inside guard.RequestLimits, which has capped the body this reads.

    gradio's deep links are closed (HTTP 404): anyone who knew a session's name could have its page, as it is filled
    in, written to disk and opened by link, and each ask writes a file."""

    def __init__(self, app, visitors: Visitors) -> None:
        self.app, self.visitors = app, visitors
        self._turns = asyncio.Lock()  # the costly requests', one at a time

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("GET", "POST"):
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        address = network_address(headers, (scope.get("client") or (None,))[0])
        if DEEP_LINK.fullmatch(scope["path"]):
            return await _refuse(send, 404, "This public demo makes no links to a page as it is filled in.")
        heartbeat = HEARTBEAT.fullmatch(scope["path"]) if scope["method"] == "GET" else None
        if heartbeat:
            session = heartbeat["session"]
            if await self._entered(send, self.visitors.heartbeat_opened, session, address) is None:
                return None
            try:
                return await self.app(scope, receive, send)
            finally:
                self.visitors.heartbeat_closed(session)
        if scope["method"] == "GET" or scope["path"].rstrip("/").endswith("/upload"):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return None
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        join = scope["path"].rstrip("/").endswith("/queue/join")  # answered as soon as its event is queued
        large = len(body) > KEPT_DRAFT_BYTES  # more than any page sends: its largest is a page load's kept draft
        async with contextlib.AsyncExitStack() as turn:
            if large:
                await turn.enter_async_context(self._turns)
            session = _session_named(body)
            coming = session is not None and await self._entered(send, self.visitors.enter, session, address)
            if coming is None:
                return None
            if coming and join and not large:
                await turn.enter_async_context(self._turns)
            elif not join:  # the other routes may run the event before they answer: never in a turn
                await turn.aclose()
            return await self.app(scope, _replay(body, receive), send)

    @staticmethod
    async def _entered(send, enter, *args) -> bool | None:
        """What ``enter(*args)`` answered; None if it refused the session, whose sentence is then the answer."""
        try:
            return enter(*args)
        except DragonError as exc:
            await _refuse(send, 429 if isinstance(exc, BusyError) else 400, str(exc))
            return None


def _session_named(body: bytes) -> str | None:
    """The session_hash a request's JSON body names (as gradio's queue/join and its API routes take it), if any."""
    try:
        named = json.loads(body).get("session_hash")
    except (ValueError, AttributeError, RecursionError):  # not JSON, or not an object
        return None
    return named if isinstance(named, str) and named else None


class SessionPage(SessionState):
    """gradio's copy of the page for one session, without its second copy of every component's config: only deep
    links read that copy (closed, SessionDoor), and making it (about 360 components, each through inspect.signature)
    was most of what a new session cost the server's one thread, where every visitor's requests are answered.

    gradio's own initialiser runs, on a stand-in that lists no component to copy; later updates copy nothing either
    (this session's BlocksConfig is its own, and gr.render, its one other reader of block configs, is not used)."""

    def __init__(self, blocks) -> None:
        super().__init__(SimpleNamespace(default_config=blocks.default_config, blocks={}))
        self.blocks_config.config_for_block = _no_config


def _no_config(*_args, **_kwargs) -> dict:
    return {}


class SessionPages(StateHolder):
    """gradio's table of sessions, making each a SessionPage."""

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = SessionPage(self.blocks)
        return super().__getitem__(session_id)


def keeping_sessions_small(visitors: Visitors):
    """A lifespan for gradio's server that makes its sessions SessionPages, and forgets, every SWEEP_S, the page of
    each session not in use (Visitors.quiet): a session without a heartbeat (a raw client) is forgotten QUIET_S
    after its last event.

    gradio itself forgets a session only past its capacity, the oldest first whether in use or not, and an hour
    after its heartbeat closed only the values of its gr.State (StateHolder.delete_state). Its StateHolder has no
    call that forgets a whole session, so this removes the session's entry under the holder's lock, as the holder's
    own eviction does; a later request of that session starts a fresh copy."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        app.state_holder.__class__ = SessionPages  # before any session; the blocks and the queue share this holder

        async def sweep():
            while True:
                await asyncio.sleep(SWEEP_S)
                holder = app.state_holder
                with holder.lock:
                    held = list(holder.session_data)
                for session in visitors.quiet(held):
                    with holder.lock:
                        holder.session_data.pop(session, None)
                        holder.time_last_used.pop(session, None)

        task = asyncio.create_task(sweep())
        try:
            yield
        finally:
            task.cancel()

    return lifespan
