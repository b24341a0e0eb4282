"""The visitors of a public demo, told apart so that each owns its runs and its uploads.

A browser keeps a random token (``gr.BrowserState``, so a reload or a restart of the app keeps it too) and sends it
when the page loads; its visitor key is a hash of the token, so the key written into a run's status.json cannot be
replayed to take the run over. An API client that never loads the page is one visitor per session. Whoever enters
the owner key (``DRAGON_UI_OWNER_KEY``) owns every run, in this session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from dataclasses import replace

from ..public import NOBODY, Visitor, owner_key


def key_of(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:32]


class Visitors:
    """Sessions (one per open page or API client) mapped to visitors; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._visitors: dict[str, Visitor] = {}  # visitor key -> visitor
        self._sessions: dict[str, str] = {}  # session -> visitor key

    def arrive(self, session: str, token: str | None) -> str:
        """A page loaded in ``session`` with the token its browser kept (None the first time); returns the token it
        is to keep from now on."""
        if not isinstance(token, str) or len(token) < 16:
            token = secrets.token_urlsafe(24)
        key = key_of(token)
        with self._lock:
            self._visitors.setdefault(key, Visitor(key=key))
            self._sessions[session] = key
        return token

    def of(self, session: str | None) -> Visitor:
        """Who sent an event of ``session``: its page's visitor, or, for a client that never loaded the page, a
        visitor of its own for that session."""
        if not session:
            return NOBODY
        with self._lock:
            key = self._sessions.get(session)
            if key is None:
                key = self._sessions[session] = key_of(f"session:{session}")
                self._visitors.setdefault(key, Visitor(key=key))
            return self._visitors[key]

    def unlock(self, who: Visitor, key: str) -> Visitor | None:
        """``who``, owning every run from now on, if ``key`` is the owner key; None if it is not."""
        expected = owner_key()
        if not expected or not isinstance(key, str) or not hmac.compare_digest(key.strip().encode("utf-8"),
                                                                               expected.encode("utf-8")):
            return None
        return self._update(who, unlocked=True)

    def add_upload(self, who: Visitor, path: str) -> Visitor:
        """``who``, with the file it just uploaded among the files it may train on."""
        return self._update(who, uploads=who.uploads | {str(path)})

    def _update(self, who: Visitor, **changes) -> Visitor:
        if not who.key:
            return who
        with self._lock:
            updated = self._visitors[who.key] = replace(self._visitors.get(who.key, who), **changes)
        return updated
