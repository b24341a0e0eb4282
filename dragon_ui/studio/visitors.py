"""The visitors of a public demo, told apart so that each owns its runs and its uploads.

A browser keeps a random token (``gr.BrowserState``, so a reload or a restart of the app keeps it too) and sends it
when the page loads; its visitor key is a hash of the token, so the key written into a run's status.json cannot be
replayed to take the run over. A session that sends an event before any page load (an API client, or a page acting
before its load is answered) is given a random token of its own at once; a page loading in that session with no
token of its browser's takes that one, so what it did before its load stays its own. Whoever enters the owner key
(``DRAGON_UI_OWNER_KEY``) owns every run, in that session (page) only; wrong keys are counted per network address,
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
from dataclasses import dataclass, replace

from ..errors import BusyError
from ..public import NOBODY, Visitor

TOKEN = re.compile(r"[A-Za-z0-9_-]{16,200}")  # what a browser's token looks like (secrets.token_urlsafe)
MAX_SESSIONS = 50_000  # sessions remembered; the oldest are forgotten (an API client can open one per call)
# New sessions one network address may open in NEW_SESSIONS_WINDOW_S: a workshop behind one address reloads far
# fewer, while a client opening one per call could otherwise push everyone's sessions out of MAX_SESSIONS.
NEW_SESSIONS_ALLOWED = 2_000
NEW_SESSIONS_WINDOW_S = 10 * 60
WRONG_KEYS_ALLOWED = 5  # wrong owner keys from one address within WRONG_KEYS_WINDOW_S, before it must wait
WRONG_KEYS_WINDOW_S = 15 * 60


def key_of(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:32]


@dataclass
class _Session:
    key: str  # its visitor's
    unclaimed: str | None = None  # the token a page loading in this session may still take (see Visitors.of)
    unlocked: bool = False  # the owner key was entered in this session


class Visitors:
    """Sessions (one per open page or API client) mapped to visitors; thread-safe."""

    def __init__(self, owner_key: str = "") -> None:
        self._owner_key = owner_key  # public.Policy's: empty, nobody can unlock
        self._lock = threading.Lock()
        self._sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()
        # address -> [start of its window, sessions it opened in it], the newest window last
        self._new_sessions: collections.OrderedDict[str, list] = collections.OrderedDict()
        self._wrong_keys: dict[str, collections.deque] = {}  # address -> times of its wrong owner keys

    def arrive(self, session: str, token: str | None) -> str:
        """A page loaded in ``session`` with the token its browser kept; returns the token it is to keep from now
        on. A browser that kept none takes the token its session's earlier events were served with, once (a
        second page load in that session gets a new one, so nobody else can take it); else a new one."""
        with self._lock:
            known = self._sessions.get(session)
            if not isinstance(token, str) or not TOKEN.fullmatch(token):
                token = (known and known.unclaimed) or secrets.token_urlsafe(24)
            self._remember(session, _Session(key_of(token), unlocked=bool(known and known.unlocked)))
        return token

    def of(self, session: str | None, address: str | None = None) -> Visitor:
        """Who sent an event of ``session`` from ``address`` (a hash of the network address): its page's visitor.
        A session no page has loaded in yet becomes a visitor of its own, as a new browser would: a page acting
        before its load is answered (its uploads, its runs) stays that visitor when the load comes (arrive).
        BusyError when ``address`` opened more than NEW_SESSIONS_ALLOWED sessions in NEW_SESSIONS_WINDOW_S."""
        if not session:
            return NOBODY
        with self._lock:
            known = self._sessions.get(session)
            if known is None:
                self._count_new_session(address)
                token = secrets.token_urlsafe(24)
                known = self._remember(session, _Session(key_of(token), unclaimed=token))
            return Visitor(key=known.key, unlocked=known.unlocked, address=address, session=session)

    def unlock(self, who: Visitor, key: str) -> Visitor | None:
        """``who``, owning every run from now on in its session, if ``key`` is the owner key; None if it is not.
        BusyError after WRONG_KEYS_ALLOWED wrong keys from ``who``'s address in WRONG_KEYS_WINDOW_S."""
        expected = self._owner_key
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
            if who.key and who.session in self._sessions:
                self._sessions[who.session].unlocked = True
        return replace(who, unlocked=bool(who.key))

    def _count_new_session(self, address: str | None) -> None:
        """Count a session ``address`` opens, or raise BusyError past its allowance; the caller holds the lock."""
        if not address:  # unknown only outside a web server: nothing to count by
            return
        now = time.monotonic()
        window = self._new_sessions.get(address)
        if window is None or now - window[0] >= NEW_SESSIONS_WINDOW_S:
            window = self._new_sessions[address] = [now, 0]
            self._new_sessions.move_to_end(address)
            while len(self._new_sessions) > MAX_SESSIONS:  # the oldest windows go first, as sessions do
                self._new_sessions.popitem(last=False)
        if window[1] >= NEW_SESSIONS_ALLOWED:
            minutes = max(1, round((NEW_SESSIONS_WINDOW_S - (now - window[0])) / 60))
            raise BusyError(f"Too many new sessions from your network address; try again in {minutes} minutes.")
        window[1] += 1

    def _remember(self, session: str, known: _Session) -> _Session:
        """Map ``session`` to ``known``, forgetting the oldest sessions past MAX_SESSIONS; the caller holds the
        lock."""
        self._sessions[session] = known
        self._sessions.move_to_end(session)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return known
