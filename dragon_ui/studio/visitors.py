"""The visitors of a public demo, told apart so that each owns its runs and its uploads.

A browser keeps a random token (``gr.BrowserState``, so a reload or a restart of the app keeps it too) and sends it
when the page loads; its visitor key is a hash of the token, so the key written into a run's status.json cannot be
replayed to take the run over. A session that sends an event before any page load (an API client, or a page acting
before its load is answered) is given a random token of its own at once; a page loading in that session with no
token of its browser's takes that one, so what it did before its load stays its own. Whoever enters the owner key
(``DRAGON_UI_OWNER_KEY``) owns every run, in that session (page) only.

A session is in use while its page's heartbeat is open (gradio's page and gradio_client keep one) or for QUIET_S
after its last event: the server holds gradio's copy of its page meanwhile, and forgets it after (ui/guard.py). A
session in use is never pushed out by others: a new one is refused instead when the demo, or its network address,
has as many in use as it may. Wrong owner keys are counted per network address; past a few, a session that sent
one must wait, while any other session's key is still checked, so the owner behind a shared address gets in. Wrong
class codes are counted per page and per address (``_refuse_guessing``), with allowances a room of learners
mistyping it does not exhaust; every guess counts by the network address, even a seated learner's.

A browser that took a seat in a class (studio.classroom, with the class code) is a visitor counted as its seat:
its ``Visitor.address`` is the seat's own, and so are its turns in the server's queue (``turn_of``).
"""

from __future__ import annotations

import collections
import hmac
import re
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from ..errors import BusyError, ConfigError
from ..public import LIFT, NOBODY, Visitor, key_of
from .classroom import Classroom

TOKEN = re.compile(r"[A-Za-z0-9_-]{16,200}")  # what a browser's token looks like (secrets.token_urlsafe)
MAX_SESSION_CHARS = 100  # a page's session names have 11 characters, gradio_client's 36
# Sessions remembered (a few hundred bytes each), far more than are in use: past it, the stalest not in use is
# forgotten (an API client can open one per call).
MAX_SESSIONS = 50_000
# A session whose heartbeat is closed (or never opened: a raw API client) is in use this long after its last sign of
# life: longer than a page's heartbeat takes to reconnect, or a script between its calls.
QUIET_S = 30
# Each session in use holds gradio's copy of its page: about 1 MB, measured (0.6 MB made at its first event, the rest
# what its page load fills in). 4,000 of them take 4 GB, a quarter of the 16 GB machine public.Limits is sized for.
SESSIONS_IN_USE = 4_000
# One network address may have a tenth of them in use (a workshop behind one address: a hundred people with a few
# tabs each), so that filling the demo takes ten addresses.
SESSIONS_IN_USE_PER_ADDRESS = SESSIONS_IN_USE // 10
# New sessions one network address may open in NEW_SESSIONS_WINDOW_S: a workshop behind one address reloads far
# fewer, while a client opening one per call could otherwise push everyone's sessions out of MAX_SESSIONS.
NEW_SESSIONS_ALLOWED = 2_000
NEW_SESSIONS_WINDOW_S = 10 * 60
# Streams one session may hold open at once: its page's heartbeat and its stream of results, and as many again while
# they reconnect. Each holds a connection of the server's.
STREAMS_PER_SESSION = 4
WRONG_KEYS_ALLOWED = 5  # wrong owner keys from one address within WRONG_KEYS_WINDOW_S, before guessing is limited
WRONG_KEYS_WINDOW_S = 15 * 60
OWNER_KEY, CLASS_CODE = "owner key", "class code"  # the secrets a visitor may guess at
# Wrong class codes in that window: from one page, before it waits; from one address, before every page there waits
# (a room of learners mistypes some, and a guesser with a new page per guess is held up there).
WRONG_CODES_PER_PAGE, WRONG_CODES_PER_ADDRESS = 5, 200


@dataclass
class _Session:
    key: str  # its visitor's
    unclaimed: str | None = None  # the token a page loading in this session may still take (see Visitors.of)
    unlocked: bool = False  # the owner key was entered in this session
    address: str | None = None  # the network address it last came from
    seen: float = 0.0  # time.monotonic() of its last sign of life: an event, its heartbeat opening or closing
    heartbeats: int = 0  # its heartbeats open now
    # secret guessed -> when it sent its latest wrong ones (as many as are counted: WRONG_CODES_PER_PAGE)
    wrong: dict[str, collections.deque] = field(default_factory=dict)


class Visitors:
    """Sessions (one per open page or API client) mapped to visitors; thread-safe."""

    def __init__(self, owner_key: str = "", classroom: Classroom | None = None) -> None:
        self._owner_key = owner_key  # public.Policy's: empty, nobody can unlock
        self.classroom = classroom  # a public demo's: its seats
        self._lock = threading.Lock()
        self._sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()  # the stalest first
        self._heartbeating: dict[str, _Session] = {}  # the sessions with a heartbeat open
        # address -> [start of its window, sessions it opened in it], the newest window last
        self._new_sessions: collections.OrderedDict[str, list] = collections.OrderedDict()
        # secret -> address -> times of its latest wrong guesses of it (as many as it may send: whether it sent
        # more is all that is asked)
        self._wrong: dict[str, dict[str, collections.deque]] = {OWNER_KEY: {}, CLASS_CODE: {}}

    def arrive(self, session: str, token: str | None) -> str:
        """A page loaded in ``session`` with the token its browser kept; returns the token it is to keep from now
        on. A browser that kept none takes the token its session's earlier events were served with, once (a
        second page load in that session gets a new one, so nobody else can take it); else a new one."""
        with self._lock:
            known, _ = self._enter(session, None)
            if not isinstance(token, str) or not TOKEN.fullmatch(token):
                token = known.unclaimed or secrets.token_urlsafe(24)
            known.key, known.unclaimed = key_of(token), None
        return token

    def of(self, session: str | None, address: str | None = None) -> Visitor:
        """Who sent an event of ``session`` from ``address`` (a hash of the network address): its page's visitor.
        A session no page has loaded in yet becomes a visitor of its own, as a new browser would: a page acting
        before its load is answered (its uploads, its runs) stays that visitor when the load comes (arrive).
        BusyError when no session may come into use now (see enter)."""
        if not session:
            return NOBODY
        with self._lock:
            known, _ = self._enter(session, address)
            who = Visitor(key=known.key, unlocked=known.unlocked, address=address, session=session)
        seat = self.classroom.seat_of(who.key) if self.classroom is not None else None
        return who if seat is None else replace(who, seat=seat.name, address=seat.address)

    def turn_of(self, session: str | None, address: str | None) -> str | None:
        """What an event of ``session`` from ``address`` takes its turns in the server's queue as: its seat, for a
        learner with one; else its network address. Nothing is counted or remembered here."""
        with self._lock:
            known = self._sessions.get(session) if session else None
        seat = self.classroom.seat_of(known.key) if known is not None and self.classroom is not None else None
        return seat.address if seat is not None else address

    def sit(self, who: Visitor, code: object, name: object) -> Visitor:
        """``who``, seated in the class under ``name`` if ``code`` is the class code: ConfigError for a wrong code
        or name; BusyError once its page, or its network address, has sent too many wrong codes (_refuse_guessing),
        before the code is even compared."""
        classroom = self.classroom
        if classroom is None or not classroom.open:
            raise ConfigError(f"This demo has no class open: its owner opens one with a class code ({LIFT} to train "
                              "without limits).")
        if not who.key:
            raise ConfigError("A seat is taken from a page of this demo (or an API session).")
        if not isinstance(code, str) or not code.strip():
            raise ConfigError("Type the class code your teacher gave you.")
        with self._lock:
            self._refuse_guessing(who, CLASS_CODE)
        if not classroom.is_code(code):
            self._count_wrong(who, CLASS_CODE)
            raise ConfigError("That is not this class's code; check it with your teacher.")
        seat = classroom.sit(who.key, name)
        return replace(who, seat=seat.name, address=seat.address)

    def enter(self, session: str, address: str | None) -> bool:
        """``session`` sent a request from ``address``: it is in use from now on; whether it was not before. A
        session not in use comes into use only while the demo has fewer than SESSIONS_IN_USE in use, and its address
        fewer than SESSIONS_IN_USE_PER_ADDRESS; a new one only while its address has opened fewer than
        NEW_SESSIONS_ALLOWED in NEW_SESSIONS_WINDOW_S (BusyError otherwise). ConfigError for a name longer than
        MAX_SESSION_CHARS."""
        with self._lock:
            return self._enter(session, address)[1]

    def heartbeat_opened(self, session: str, address: str | None) -> bool:
        """A heartbeat (or a stream of results) of ``session`` opened, as enter: the session is in use while one is
        open. BusyError past STREAMS_PER_SESSION open at once."""
        with self._lock:
            known, came = self._enter(session, address)
            if known.heartbeats >= STREAMS_PER_SESSION:
                raise BusyError(f"This page has {STREAMS_PER_SESSION} connections open to this public demo already, "
                                "the most one page may have; close one.")
            known.heartbeats += 1
            self._heartbeating[session] = known
        return came

    def heartbeat_closed(self, session: str) -> None:
        """A heartbeat of ``session`` closed: once none is open, the session is in use for QUIET_S more."""
        with self._lock:
            known = self._sessions.get(session)
            if known is None:  # forgotten meanwhile
                return
            known.heartbeats = max(0, known.heartbeats - 1)
            if not known.heartbeats:
                self._heartbeating.pop(session, None)
            self._touch(session, known, time.monotonic())

    def quiet(self, sessions: Iterable[str]) -> list[str]:
        """Those of ``sessions`` not in use (nor known): what the server may forget of them now."""
        now = time.monotonic()
        with self._lock:
            return [session for session in sessions
                    if session not in self._sessions or not self._in_use(self._sessions[session], now)]

    def unlock(self, who: Visitor, key: str) -> Visitor | None:
        """``who``, owning every run from now on in its session, if ``key`` is the owner key; None if it is not.

        Once WRONG_KEYS_ALLOWED wrong keys came from ``who``'s address in WRONG_KEYS_WINDOW_S, a session that sent
        one of them (or any key nobody can tell the session of) gets BusyError, whatever the key, until its own
        wrong key is that old; any other session's key is checked, so the right key from a shared address unlocks
        its page whoever guessed there. Guessing on then takes a new session per guess, which is counted as every
        new session is (NEW_SESSIONS_ALLOWED)."""
        expected = self._owner_key
        if not expected or not isinstance(key, str) or not key.strip():
            return None  # no key to guess, or nothing entered: not a wrong guess
        with self._lock:
            self._refuse_guessing(who, OWNER_KEY)
        if not hmac.compare_digest(key.strip().encode("utf-8"), expected.encode("utf-8")):
            self._count_wrong(who, OWNER_KEY)
            return None
        with self._lock:
            known = self._sessions.get(who.session) if who.session else None
            if who.key and known is not None:
                known.unlocked = True
        return replace(who, unlocked=bool(who.key))

    def forgive(self, secret: str) -> None:
        """Forget the wrong guesses of ``secret`` (CLASS_CODE: the teacher opened the class again)."""
        with self._lock:
            self._wrong[secret].clear()
            for known in self._sessions.values():
                known.wrong.pop(secret, None)

    def _refuse_guessing(self, who: Visitor, secret: str) -> None:
        """BusyError, whatever is guessed, while ``who`` may not guess ``secret``; the caller holds the lock.

        Owner keys: once WRONG_KEYS_ALLOWED came from its network address within WRONG_KEYS_WINDOW_S, a page that
        sent one of them waits (see unlock). Class codes: a page that sent WRONG_CODES_PER_PAGE waits; once its
        address sent WRONG_CODES_PER_ADDRESS, every page there does, until the window passes or the teacher opens
        the class again (forgive). Guesses count by the network address, even a seated learner's."""
        now = time.monotonic()
        known = self._sessions.get(who.session) if who.session else None
        from_address = self._wrong[secret].get(self._address_of(who, known)) or collections.deque()
        own = known.wrong.get(secret) if known is not None else None
        since, where = None, "your network address"
        if secret == OWNER_KEY:
            if len(from_address) == WRONG_KEYS_ALLOWED and now - from_address[0] < WRONG_KEYS_WINDOW_S:
                since = own[-1] if own else (now if known is None else None)
        elif len(from_address) == WRONG_CODES_PER_ADDRESS and now - from_address[0] < WRONG_KEYS_WINDOW_S:
            since = from_address[0]
        elif own is not None and len(own) == WRONG_CODES_PER_PAGE:
            since, where = own[0], "this page"
        if since is None or now - since >= WRONG_KEYS_WINDOW_S:
            return
        minutes = max(1, round((WRONG_KEYS_WINDOW_S - (now - since)) / 60))
        ask = ", or ask your teacher to open the class again" if secret == CLASS_CODE and where != "this page" else ""
        raise BusyError(f"Too many wrong {secret}s from {where}; try again in {minutes} minute{'s' * (minutes != 1)}"
                        f"{ask}.")

    def _count_wrong(self, who: Visitor, secret: str) -> None:
        """A wrong guess of ``secret`` from ``who``, counted for its page and its network address."""
        now = time.monotonic()
        with self._lock:
            known = self._sessions.get(who.session) if who.session else None
            most = WRONG_KEYS_ALLOWED if secret == OWNER_KEY else WRONG_CODES_PER_ADDRESS
            self._wrong[secret].setdefault(self._address_of(who, known), collections.deque(maxlen=most)).append(now)
            if known is not None:
                per_page = 1 if secret == OWNER_KEY else WRONG_CODES_PER_PAGE
                known.wrong.setdefault(secret, collections.deque(maxlen=per_page)).append(now)

    @staticmethod
    def _address_of(who: Visitor, known: _Session | None) -> str:
        """The network address guesses count by: the session's own, not a seat's (which one person may hold many
        of)."""
        return (known.address if known is not None else None) or who.address or ""

    def _enter(self, session: str, address: str | None) -> tuple[_Session, bool]:
        """enter, for a caller that holds the lock: the session's record, and whether it came into use now."""
        if len(session) > MAX_SESSION_CHARS:  # every session is remembered: its name must be short
            raise ConfigError(f"A session_hash has at most {MAX_SESSION_CHARS} characters.")
        now = time.monotonic()
        known = self._sessions.get(session)
        coming = known is None or not self._in_use(known, now)
        if coming:
            self._check_room(address or (known.address if known is not None else None), now)
        if known is None:
            self._count_new_session(address, now)
            if len(self._sessions) >= MAX_SESSIONS:  # forget the stalest not in use (_check_room: there is one)
                del self._sessions[next(name for name, other in self._sessions.items() if not self._in_use(other, now))]
            token = secrets.token_urlsafe(24)
            known = self._sessions[session] = _Session(key_of(token), unclaimed=token)
        known.address = address or known.address
        self._touch(session, known, now)
        return known, coming

    def _touch(self, session: str, known: _Session, now: float) -> None:
        known.seen = now
        self._sessions.move_to_end(session)

    @staticmethod
    def _in_use(known: _Session, now: float) -> bool:
        return known.heartbeats > 0 or now - known.seen < QUIET_S

    def _sessions_in_use(self, now: float) -> Iterator[_Session]:
        """The sessions in use: those seen within QUIET_S (the newest, at the end), and those with a heartbeat."""
        for known in reversed(self._sessions.values()):
            if now - known.seen >= QUIET_S:
                break
            yield known
        yield from (known for known in self._heartbeating.values() if now - known.seen >= QUIET_S)

    def _check_room(self, address: str | None, now: float) -> None:
        """BusyError when no more sessions may be in use, in the demo or from ``address``."""
        in_use = from_address = 0
        for known in self._sessions_in_use(now):
            in_use += 1
            from_address += bool(address) and known.address == address
        most = min(SESSIONS_IN_USE, MAX_SESSIONS)  # a session in use is never forgotten to make room
        if in_use >= most:
            raise BusyError(f"{most:,} pages are already open in this public demo, the most it holds at once; try "
                            f"again in a few minutes ({LIFT} without limits).")
        if from_address >= SESSIONS_IN_USE_PER_ADDRESS:
            raise BusyError(f"{SESSIONS_IN_USE_PER_ADDRESS:,} pages from your network address are already open, this "
                            "public demo's limit of pages open from one network address; close one, or try again "
                            f"in a minute ({LIFT} without limits).")

    def _count_new_session(self, address: str | None, now: float) -> None:
        """Count a session ``address`` opens, or raise BusyError past its allowance; the caller holds the lock."""
        if not address:  # unknown only outside a web server: nothing to count by
            return
        window = self._new_sessions.get(address)
        if window is None or now - window[0] >= NEW_SESSIONS_WINDOW_S:
            window = self._new_sessions[address] = [now, 0]
            self._new_sessions.move_to_end(address)
            while len(self._new_sessions) > MAX_SESSIONS:  # the oldest windows go first
                self._new_sessions.popitem(last=False)
        if window[1] >= NEW_SESSIONS_ALLOWED:
            minutes = max(1, round((NEW_SESSIONS_WINDOW_S - (now - window[0])) / 60))
            raise BusyError(f"Too many new sessions from your network address; try again in {minutes} minutes.")
        window[1] += 1
