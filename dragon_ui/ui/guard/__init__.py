"""What a public demo's server refuses or bounds before any event runs, in the order a request meets them:

- ``routes.OpenRoutes``: only the routes its page and gradio_client use are answered;
- ``requests.RequestLimits``: a request's body is capped, and uploads are taken in gradio's place, one file each,
  counted against their network address's share of the disk;
- ``sessions.SessionDoor``: sessions in use are counted and their pages kept lean (``keeping_sessions_small``), and an
  event joins gradio's queue only within its page's and its address's share (``waiting``);
- ``pages.PageCache`` (every app): the page and its config, which gradio makes anew for every request, made once per
  root address, so that a class opening the page at once does not hold everyone up;
- ``turns.FairQueue`` (every app, not only a public demo): whose waiting event runs next, fairly between network
  addresses, and page by page in the groups that need a page's order.
"""

from __future__ import annotations

from starlette.middleware import Middleware

from ...studio.backend import Studio
from .requests import BODY_BYTES, FILES_PER_UPLOAD, RequestLimits
from .pages import PageCache
from .routes import OpenRoutes
from .sessions import NO_SESSION, SWEEP_S, SessionDoor, SessionPage, keeping_sessions_small
from .turns import FairQueue, in_page_order, take_turns_fairly
from .waiting import EVENT_VALUES, held_bytes

__all__ = ["BODY_BYTES", "EVENT_VALUES", "FILES_PER_UPLOAD", "NO_SESSION", "SWEEP_S", "FairQueue", "OpenRoutes",
           "PageCache", "RequestLimits", "SessionDoor", "SessionPage", "guards", "held_bytes", "in_page_order",
           "keeping_sessions_small", "take_turns_fairly"]


def guards(studio: Studio) -> list[Middleware]:
    """A public demo's middleware, outermost first."""
    return [Middleware(OpenRoutes), Middleware(RequestLimits, files=studio.files, policy=studio.policy),
            Middleware(SessionDoor, visitors=studio.visitors, policy=studio.policy, files=studio.files),
            Middleware(PageCache)]
