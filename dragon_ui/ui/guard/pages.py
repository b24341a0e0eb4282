"""The page and its config, made once: gradio makes them anew for every request (a deep copy of the app's whole config,
about 500 KB of JSON, every file address in it rewritten for the request's root, and the API page's code snippets),
some 40 ms of the server's one interpreter each. A class of 25 opening the page at once asked it for 50 of them:
every visitor's page, /config and events waited 2.4 s behind them.

What gradio answers for ``/`` and ``/config`` (without a query) depends only on the app's config, which it makes once
at launch, and on the app's root address, which it reads from the request (its Host, X-Forwarded-Host,
X-Forwarded-Proto and X-Gradio-Server headers, and the root path). ``PageCache`` keeps gradio's own answer for each
root, made once while every request for it waits for that one (a class arriving together makes it once, not 25
times), and answers it again as long as the app's config is the same object. Anyone chooses the headers their
request carries, so it keeps the answers of the last few roots only (``ANSWERS_KEPT``): a visitor who asks under many
roots makes them as gradio would have, and costs the others no more than today.

gradio compresses only the files whose names end in .html, .json, ...: the page and the config went out whole, 500
KB each, to every visitor. Each kept answer is compressed once too (brotli, gzip), and sent as the request accepts
it: 40 KB.

It keeps nothing where an answer could depend on who asks (an app with a login), nor one other than a plain 200.
"""

from __future__ import annotations

import asyncio
import collections
import gzip
import re
from dataclasses import dataclass, field

import brotli

from .answers import headers_of
from .routes import route_path

ANSWERS_KEPT = 8  # the page and the config of four roots (a demo has one; behind a proxy, perhaps two)
CACHED = {"/": "page", "/config": "config", "/config/": "config"}  # route path -> what is kept of it
ROOT_HEADERS = (b"host", b"x-forwarded-host", b"x-forwarded-proto", b"x-gradio-server")  # what gradio's root is made of
UNSAFE_HEADER = re.compile(rb"set-cookie", re.IGNORECASE)  # an answer that sets a cookie is someone's own
ENCODED_HEADERS = {b"content-length", b"content-encoding", b"vary"}  # what a kept answer's encoding sets anew
BROTLI_QUALITY, GZIP_LEVEL = 5, 6  # 5 ms for both, once; 500 KB of page -> 40 KB


@dataclass(frozen=True)
class Kept:
    """One answer as gradio sent it, the app config it was made from, and its body compressed (by encoding)."""

    config: object
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    encoded: dict[str, bytes] = field(default_factory=dict)

    def compressed(self) -> Kept:
        """This answer, with its body compressed in each encoding (none where gradio encoded it already)."""
        if any(name.lower() == b"content-encoding" for name, _ in self.headers):
            return self
        made = brotli.Compressor(quality=BROTLI_QUALITY)
        return Kept(self.config, self.status, self.headers, self.body,
                    {"br": made.process(self.body) + made.finish(), "gzip": gzip.compress(self.body, GZIP_LEVEL)})

    async def send(self, send, accepted: set[str]) -> None:
        """Send it, its body in the first encoding of ours that the request accepts (as is if none)."""
        encoding = next((name for name in self.encoded if name in accepted), None)
        if encoding is None:  # as is; a cache between must still tell the askers that accept an encoding apart
            headers, body = self.headers, self.body
            if self.encoded:
                headers = [*headers, (b"vary", b"Accept-Encoding")]
        else:
            body = self.encoded[encoding]
            headers = [(name, value) for name, value in self.headers if name.lower() not in ENCODED_HEADERS]
            headers += [(b"content-encoding", encoding.encode()), (b"content-length", str(len(body)).encode()),
                        (b"vary", b"Accept-Encoding")]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class PageCache:
    """ASGI middleware: gradio's answers to GET ``/`` and ``/config`` (see the module), made once per root and app
    config; every other request goes on to gradio as it came."""

    def __init__(self, app, answers_kept: int = ANSWERS_KEPT) -> None:
        self.app, self.answers_kept = app, answers_kept
        self._kept: collections.OrderedDict[tuple, Kept] = collections.OrderedDict()  # the latest used last
        self._making: dict[tuple, asyncio.Task] = {}  # key -> the answer being made for it

    async def __call__(self, scope, receive, send):
        kind = CACHED.get(route_path(scope)) if scope["type"] == "http" and scope["method"] == "GET" else None
        server = scope.get("app")
        if kind is None or scope.get("query_string") or not _same_for_everyone(server):
            return await self.app(scope, receive, send)
        config = server.get_blocks().config
        key = (kind, *_root_of(scope, server))
        kept = self._kept.get(key)
        if kept is not None and kept.config is config:
            self._kept.move_to_end(key)
            return await kept.send(send, _accepted(scope))
        making, mine = self._making.get(key), False
        if making is None:
            making = self._making[key] = asyncio.ensure_future(_answer(self.app, dict(scope), config))
            making.add_done_callback(lambda done: self._made(key, done))
            mine = True
        try:  # the answer is made once, whoever of its askers leaves meanwhile
            made = await asyncio.shield(making)
        except Exception:
            if mine:  # gradio's own error, for its server to answer
                raise
            made = None
        if mine or (made is not None and made.config is config and _keepable(made)):
            return await made.send(send, _accepted(scope))
        return await self.app(scope, receive, send)  # as gradio answers this one asker

    def _made(self, key: tuple, done: asyncio.Task) -> None:
        if self._making.get(key) is done:
            del self._making[key]
        if done.cancelled() or done.exception() is not None or not _keepable(done.result()):
            return
        self._kept[key] = done.result()
        self._kept.move_to_end(key)
        while len(self._kept) > self.answers_kept:
            self._kept.popitem(last=False)


async def _answer(app, scope, config) -> Kept:
    """gradio's answer to ``scope`` (a GET: its body is empty), read whole; its connection is left only once it is
    (no asker's own leaving ends it: each waits on its own)."""
    status, headers, chunks, ended, asked = 0, [], [], asyncio.Event(), False

    async def receive():
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                ended.set()

    try:
        await app(scope, receive, send)
    finally:
        ended.set()
    kept = Kept(config, status, headers, b"".join(chunks))
    # Compressed beside the event loop (10 to 25 ms for 500 KB): a root asked once, with made-up headers, holds up
    # nobody else's request.
    return await asyncio.to_thread(kept.compressed) if _keepable(kept) else kept


def _keepable(kept: Kept | None) -> bool:
    return kept is not None and kept.status == 200 and not any(UNSAFE_HEADER.fullmatch(name) for name, _ in kept.headers)


def _accepted(scope) -> set[str]:
    """The encodings a request accepts (Accept-Encoding), less those it gives a q of 0."""
    accepted = set()
    for part in headers_of(scope).get("accept-encoding", "").lower().split(","):
        name, *params = (piece.strip() for piece in part.split(";"))
        if not any(param.replace(" ", "") in ("q=0", "q=0.0", "q=0.00", "q=0.000") for param in params):
            accepted.add(name)
    return accepted


def _same_for_everyone(server) -> bool:
    """Whether gradio's page and config are the same for everyone who asks: no login (gradio's, or an auth
    dependency) that would put the visitor's name in them."""
    return (server is not None and hasattr(server, "get_blocks") and getattr(server, "auth", None) is None
            and getattr(server, "auth_dependency", None) is None and not getattr(server, "tokens", None))


def _root_of(scope, server) -> tuple:
    """All that gradio's root address for a request is made of (route_utils.get_root_url): the request's address
    (scheme, server, root path, path) and the headers it reads, each as sent, and the app's own root paths."""
    asked = [(name, value) for name, value in scope["headers"] if name.lower() in ROOT_HEADERS]
    return (scope.get("scheme"), str(scope.get("server")), scope.get("root_path", ""), scope["path"],
            server.root_path, server.get_blocks().custom_mount_path, tuple(asked))
