"""The visitors of a public demo, told apart so that each owns its runs and its uploads.

A browser keeps a random token (``gr.BrowserState``, so a reload or a restart of the app keeps it too) and sends it
when the page loads; its visitor key is a hash of the token, so the key written into a run's status.json cannot be
replayed to take the run over. An API client that never loads the page is one visitor per session. Whoever enters
the owner key (``DRAGON_UI_OWNER_KEY``) owns every run, in this session; wrong keys are counted per network address,
and after a few in a row that address must wait before it may try again.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import replace

from ..errors import BusyError
from ..public import NOBODY, Visitor, owner_key

# What a browser's token looks like (secrets.token_urlsafe): an API session's key is made from "session:...",
# which no token can be, so the two never meet.
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,200}")
MAX_SESSIONS = 50_000  # sessions remembered; the oldest are forgotten (an API client can open one per call)
WRONG_KEYS_ALLOWED = 5  # wrong owner keys from one address within WRONG_KEYS_WINDOW_S, before it must wait
WRONG_KEYS_WINDOW_S = 15 * 60


def key_of(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:32]


class Visitors:
    """Sessions (one per open page or API client) mapped to visitors; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unlocked: set[str] = set()  # keys of the visitors who entered the owner key
        self._sessions: collections.OrderedDict[str, str] = collections.OrderedDict()  # session -> visitor key
        self._wrong_keys: dict[str, collections.deque] = {}  # address -> times of its wrong owner keys

    def arrive(self, session: str, token: str | None) -> str:
        """A page loaded in ``session`` with the token its browser kept (None the first time); returns the token it
        is to keep from now on."""
        if not isinstance(token, str) or not TOKEN.fullmatch(token):
            token = secrets.token_urlsafe(24)
        with self._lock:
            self._remember(session, key_of(token))
        return token

    def of(self, session: str | None, address: str | None = None) -> Visitor:
        """Who sent an event of ``session`` from ``address`` (a hash of the network address): its page's visitor,
        or, for a client that never loaded the page, a visitor of its own for that session."""
        if not session:
            return NOBODY
        with self._lock:
            key = self._sessions.get(session)
            if key is None:
                key = key_of(f"session:{session}")
                self._remember(session, key)
            return Visitor(key=key, unlocked=key in self._unlocked, address=address)

    def unlock(self, who: Visitor, key: str) -> Visitor | None:
        """``who``, owning every run from now on, if ``key`` is the owner key; None if it is not. BusyError after
        WRONG_KEYS_ALLOWED wrong keys from ``who``'s address in WRONG_KEYS_WINDOW_S."""
        expected = owner_key()
        if not expected or not isinstance(key, str) or not key.strip():
            return None  # no key to guess, or nothing entered: not a wrong guess
        with self._lock:
            wrong = self._wrong_keys.get(who.address or "", collections.deque())
            while wrong and time.monotonic() - wrong[0] >= WRONG_KEYS_WINDOW_S:
                wrong.popleft()
            if len(wrong) >= WRONG_KEYS_ALLOWED:
                minutes = max(1, round((WRONG_KEYS_WINDOW_S - (time.monotonic() - wrong[0])) / 60))
                raise BusyError(f"Too many wrong owner keys from your network address; try again in {minutes} "
                                "minutes.")
            if not hmac.compare_digest(key.strip().encode("utf-8"), expected.encode("utf-8")):
                wrong.append(time.monotonic())
                self._wrong_keys[who.address or ""] = wrong
                return None
            if who.key:
                self._unlocked.add(who.key)
        return replace(who, unlocked=bool(who.key))

    def _remember(self, session: str, key: str) -> None:
        """Map ``session`` to ``key``, forgetting the oldest sessions past MAX_SESSIONS; the caller holds the lock."""
        self._sessions[session] = key
        self._sessions.move_to_end(session)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
