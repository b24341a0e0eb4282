"""What a public demo's server refuses before any event runs: request bodies over a size, and uploads past each
network address's share. gradio caps an upload's size (``max_file_size``) but no other request: a 400 MB JSON body
would be read into memory (and copied into gradio's log) by anyone.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time

from ..studio.visitors import key_of

BODY_BYTES = 2 * 2**20  # an event's inputs: a whole config and a reply to score are far less
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


class RequestLimits:
    """ASGI middleware: a request that is not an upload may carry at most ``body_bytes``; uploads from one address
    may carry at most ``upload_bytes`` in UPLOAD_WINDOW_S. A refusal is HTTP 413 or 429 with one sentence."""

    def __init__(self, app, body_bytes: int = BODY_BYTES, upload_bytes: int = 100 * 2**20) -> None:
        self.app, self.body_bytes, self.upload_bytes = app, body_bytes, upload_bytes
        self._uploads: dict[str, collections.deque] = {}  # address -> (time, bytes) of its uploads in the window
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        declared = int(headers["content-length"]) if headers.get("content-length", "").isdigit() else None
        if scope["path"].rstrip("/").endswith("/upload"):
            address = network_address(headers, (scope.get("client") or (None,))[0]) or ""
            if not self._take_upload_share(address, declared or 0):
                return await _refuse(send, 429, "Uploads from your network address have reached this public demo's "
                                                f"share of {self.upload_bytes / 2**20:g} MB per "
                                                f"{UPLOAD_WINDOW_S // 60} minutes; try again later.")
            return await self.app(scope, receive, send)
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

    def _too_large(self) -> str:
        return (f"This public demo takes requests of at most {self.body_bytes / 2**20:g} MB (no setting needs more); "
                "send less.")

    def _take_upload_share(self, address: str, size: int) -> bool:
        now = time.monotonic()
        with self._lock:
            recent = self._uploads.setdefault(address, collections.deque())
            while recent and now - recent[0][0] >= UPLOAD_WINDOW_S:
                recent.popleft()
            if sum(sent for _, sent in recent) + size > self.upload_bytes:
                return False
            recent.append((now, size))
        return True


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
