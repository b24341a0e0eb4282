"""The routes a public demo answers: those its page and gradio_client use. gradio serves many more (its run history,
which can make the server use its Hugging Face token; its monitoring, which shows every visitor's requests; deep
links, which write any session's page to disk; a proxy; streams; profiling; vibe editing), each a way for a stranger
to make the server work, write or reach out. A public demo answers the others 404, before gradio reads anything.
"""

from __future__ import annotations

import re

from .answers import refuse

# Paths from the app's root path on (route_path).
_PAGE = r"/|/config/?|/theme\.css|/favicon\.ico|/manifest\.json|/robots\.txt|/pwa_icon(/\d+)?|/(assets|static|svelte)/.+"
# A file by its path on the server, not a web address (gradio would fetch one for anyone, and wait on it forever).
_READ = (r"/gradio_api/(info/?|heartbeat/[^/=]+/?|queue/data|queue/status|upload_progress|file=/.+|startup-events"
         r"|call/[^/]+/[^/]+)")
_SEND = r"/gradio_api/(queue/join|upload|cancel|reset/?|call/[^/]+/?)"
ANSWERED = {"GET": re.compile(f"{_PAGE}|{_READ}"), "POST": re.compile(_SEND)}
ANSWERED["HEAD"] = ANSWERED["GET"]
EVENT_ROUTE = re.compile(r"/gradio_api/(queue/join|call/[^/]+)/?")  # the routes that put an event in the queue
UPLOAD_ROUTE = re.compile(r"/gradio_api/upload/?")
UPLOAD_PROGRESS = re.compile(r"/gradio_api/upload_progress")
HEARTBEAT = re.compile(r"/gradio_api/heartbeat/(?P<session>[^/=]+)/?")
RESULTS = re.compile(r"/gradio_api/queue/data/?")  # a session's stream of its events' results
CALL_RESULT = re.compile(r"/gradio_api/call/[^/]+/(?P<event>[^/]+)/?")  # an HTTP call's result, by its event


def route_path(scope) -> str:
    """The request's path from the app's root path on (where a proxy serves it under a prefix)."""
    path, root = scope["path"], scope.get("root_path") or ""
    return path[len(root):] if root and path.startswith(root) else path


class OpenRoutes:
    """ASGI middleware of a public demo: HTTP 404, with a sentence, for every route but those in ANSWERED; no
    websockets. The outermost of a public demo's guards."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        answered = ANSWERED.get(scope.get("method", ""))
        if scope["type"] != "http" or answered is None or not answered.fullmatch(route_path(scope)):
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await refuse(send, 404, "This public demo answers only what its page and gradio_client ask for.")
        return await self.app(scope, receive, send)
