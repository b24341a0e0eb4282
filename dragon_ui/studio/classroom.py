"""A class on one shared machine: the seats a class code gives out, the teacher's board of them, and the recipe the
teacher hands every seat.

A public demo counts each visitor's share by network address, and a class connects from one room, behind one. With
the class code (``DRAGON_UI_CLASS_CODE``, or set on the owner panel) a learner takes a seat under a name they type;
from then on their browser counts as the seat (``public.seat_address``), with the limits of one network address,
and the whole class within the teacher's totals (``Limits.class_seats``, ``Limits.class_runs``). A seat belongs to
the browser that took it (its visitor key, a hash of the token the browser keeps), so it survives a reload and a
restart of the app: seats, the code's hash and the recipe handed out are kept in the runs folder (``.class``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Draft
from ..engine import queue
from ..errors import BusyError, ConfigError, NotYoursError
from ..public import Limits, Policy, RequestPolicy, Visitor, checked_class_code, seat_address, visiting
from ..runstore import ACTIVE_STATES, RunDir, read_json, write_json_atomic
from .files import shown_draft
from .monitor import health_alerts, read_snapshot
from .runs import Runs

CLASS_FOLDER = ".class"  # in the runs folder, beside the runs (list_runs reads only folders with a config)
NAME_CHARS = 40
NAME = re.compile(r"[\w .'-]+")  # a name, never markup: the board and the seat's line show it as it was typed
# Letters that draw nothing (Hangul fillers): a name of them would look empty, or like another's.
BLANK_LETTERS = {"\u115f", "\u1160", "\u3164", "\uffa0"}
CODE_ALPHABET = "23456789abcdefghjkmnpqrstuvwxyz"
# Who a hand-out is checked as: a learner with a seat, no uploads of their own, and no runs.
A_LEARNER = Visitor(key="a-learner-of-the-class", seat="a learner")
HANDOUT_LABEL = "your teacher's recipe"
BOARD_COLUMNS = ["Seat", "Run", "State", "Turn", "Training reward", "Held-out", "Alerts", "Rewards"]


@dataclass(frozen=True)
class Seat:
    """A learner's seat: the name they typed, the visitor key of the browser that took it, and when."""

    name: str
    key: str
    joined_at: float

    @property
    def address(self) -> str:
        """What the seat's share is counted by (public.Visitor.address)."""
        return seat_address(self.key)


@dataclass(frozen=True)
class Handout:
    """The recipe the teacher handed every seat: its settings (a draft's), its number (each hand-out's is higher than
    any before it, through a closed class and a restart too: a browser keeps the number it was last offered), and
    when."""

    number: int
    draft: dict
    label: str
    at: float


def seat_name(text: object) -> str:
    """The name a learner typed, tidied (spaces collapsed), or ConfigError in the screen's words."""
    if not isinstance(text, str):
        raise ConfigError("Type your name to take a seat.")
    # One spelling of each letter (full-width "Ａ" is "A"), so that two names that look alike are alike.
    name = " ".join(unicodedata.normalize("NFKC", text[:NAME_CHARS * 4]).split())
    if not name:
        raise ConfigError("Type your name to take a seat.")
    if len(name) > NAME_CHARS:
        raise ConfigError(f"A seat's name has at most {NAME_CHARS} characters; type a shorter one.")
    if not NAME.fullmatch(name) or BLANK_LETTERS & set(name):
        raise ConfigError("A seat's name is letters, digits, spaces and . ' - _ only.")
    if not any(char.isalpha() for char in name):
        raise ConfigError("A seat's name has a letter in it: type your name.")
    return name


class Classroom:
    """The seats of a public demo's class, kept in ``runs_dir``/.class; thread-safe. ``code``: the class code the
    demo was started with (public.Policy.class_code), which wins over one set on the owner panel before a restart."""

    def __init__(self, runs_dir: Path, code: str, limits: Limits) -> None:
        self.folder = runs_dir / CLASS_FOLDER
        self.limits = limits
        self._lock = threading.Lock()
        kept = read_json(self._path("code"))
        self._code = _Hashed.of(code) if code else _Hashed.from_json(kept)
        seats = read_json(self._path("seats"))
        self._seats: dict[str, Seat] = {}
        for key, seat in (seats if isinstance(seats, dict) else {}).items():
            if isinstance(seat, dict) and isinstance(seat.get("name"), str):
                self._seats[key] = Seat(seat["name"], key, float(seat.get("joined_at") or 0))
        handout = read_json(self._path("handout"))
        self._handout = Handout(**handout) if isinstance(handout, dict) and set(handout) == {
            "number", "draft", "label", "at"} else None

    @property
    def open(self) -> bool:
        """Whether a class code is set: without one, nobody can take a seat."""
        return self._code is not None

    def set_code(self, code: str) -> None:
        """The teacher's new class code (the owner panel): kept as a salted hash, beside the runs. Seats already
        taken stay."""
        code = checked_class_code(code, "The class code")
        if not code:
            raise ConfigError("Type a class code to open the class.")
        with self._lock:
            self._code = _Hashed.of(code)
            self._write("code", self._code.to_json())

    def free(self, name: object) -> Seat:
        """Give up the seat called ``name``: its browser counts by network address again, and another may take it."""
        with self._lock:
            seat = next((seat for seat in self._seats.values() if seat.name == name), None)
            if seat is None:
                raise ConfigError("Choose a seat of the class to free.")
            del self._seats[seat.key]
            self._write_seats()
        return seat

    def close(self) -> None:
        """The workshop is over: no code, no seats, no recipe handed out (the runs stay, as every visitor's do)."""
        with self._lock:
            self._code, self._seats, self._handout = None, {}, None
            for name in ("code", "seats", "handout"):
                self._path(name).unlink(missing_ok=True)

    def is_code(self, given: object) -> bool:
        """Whether ``given`` is the class code, compared in constant time (hashes of equal length)."""
        code = self._code
        if code is None or not isinstance(given, str) or not given.strip():
            return False
        return code.matches(given.strip())

    def sit(self, key: str, name: object) -> Seat:
        """Give the browser of visitor ``key`` a seat named ``name`` (its seat renamed, if it has one): refused for a
        name another seat has, or when every seat is taken."""
        name = seat_name(name)
        with self._lock:
            if self._code is None:  # closed meanwhile
                raise ConfigError("This class has just been closed: ask your teacher.")
            taken = next((seat for other, seat in self._seats.items()
                          if other != key and seat.name.casefold() == name.casefold()), None)
            if taken is not None:
                raise ConfigError(f"A seat named {name!r} is taken already; add your surname's first letter, say.")
            if key not in self._seats and len(self._seats) >= self.limits.class_seats:
                raise BusyError(f"All {self.limits.class_seats} seats of this class are taken, its teacher's limit "
                                "(DRAGON_UI_CLASS_SEATS); ask your teacher for one.")
            before = self._seats.get(key)
            seat = self._seats[key] = Seat(name, key, before.joined_at if before else time.time())
            self._write_seats()
        return seat

    def seat_of(self, key: str | None) -> Seat | None:
        return self._seats.get(key) if key else None

    def seats(self) -> list[Seat]:
        """Every seat, by name: as a teacher looks a learner up."""
        with self._lock:
            return sorted(self._seats.values(), key=lambda seat: seat.name.casefold())

    def hand_out(self, draft: dict, label: str) -> Handout:
        """Hand ``draft`` (settings as the form holds them, checked by the caller) to every seat: each page fills its
        form with it at its next load or tick, asking first where its learner has edited theirs."""
        with self._lock:
            now = time.time()
            number = max(int(now * 1000), (self._handout.number + 1) if self._handout else 0)  # in ms: see Handout
            self._handout = Handout(number, draft, label, now)
            self._write("handout", vars(self._handout))
            return self._handout

    def handout(self) -> Handout | None:
        return self._handout

    def board(self, summaries: list[dict], turn: Callable[[str], str]) -> list[list[Any]]:
        """One row per seat (BOARD_COLUMNS): its run training or waiting, else its newest; ``summaries`` as
        runstore.list_runs gives them, newest first; ``turn`` says a waiting run's place and expected start."""
        rows: list[list[Any]] = []
        for seat in self.seats():
            run = self.run_of(seat, summaries)
            if run is None:
                rows.append([seat.name, "", "no run yet", "", None, "", "", ""])
                continue
            rows.append([seat.name, run["id"], _state(run), turn(run["id"]) if run.get("waiting") else "",
                         _rounded(run.get("reward")), _held_out(run), *_alerts_and_rewards(Path(run["dir"]))])
        return rows

    @staticmethod
    def run_of(seat: Seat, summaries: list[dict]) -> dict | None:
        """The seat's run the board shows: the one training or waiting, else its newest (``summaries`` newest first)."""
        own = [summary for summary in summaries if summary.get("owner") == seat.key]
        return next((summary for summary in own if summary["state"] in ACTIVE_STATES), own[0] if own else None)

    def _write_seats(self) -> None:
        self._write("seats", {key: {"name": seat.name, "joined_at": seat.joined_at} for key, seat in self._seats.items()})

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def _write(self, name: str, value: object) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._path(name), value)


@dataclass(frozen=True)
class _Hashed:
    """A class code as it is kept: a salted PBKDF2 hash (a runs folder copied elsewhere does not give the code away
    to a dictionary of short words in a second)."""

    salt: str
    digest: str

    ROUNDS = 20_000  # about 5 ms a guess here: slow for a dictionary, nothing for a class taking its seats

    @classmethod
    def of(cls, code: str) -> _Hashed:
        salt = secrets.token_hex(16)
        return cls(salt, cls._digest(code, salt))

    @classmethod
    def from_json(cls, kept: object) -> _Hashed | None:
        if isinstance(kept, dict) and isinstance(kept.get("salt"), str) and isinstance(kept.get("digest"), str):
            return cls(kept["salt"], kept["digest"])
        return None

    def to_json(self) -> dict:
        return {"salt": self.salt, "digest": self.digest}

    def matches(self, code: str) -> bool:
        return hmac.compare_digest(self._digest(code, self.salt), self.digest)

    @classmethod
    def _digest(cls, code: str, salt: str) -> str:
        return hashlib.pbkdf2_hmac("sha256", code.encode(), bytes.fromhex(salt), cls.ROUNDS).hex()


def new_code() -> str:
    """A class code nobody guesses: 10 letters and digits that cannot be misread for one another (no 0/O, 1/l/I)."""
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(10))


def _rounded(value: object) -> float | None:
    return round(value, 3) if isinstance(value, int | float) and math.isfinite(value) else None


def _state(run: dict) -> str:
    step, total = run.get("step") or 0, run.get("total_steps")
    if run["state"] == "running" and total:
        return f"running (step {step} of {total})"
    if run["state"] == "queued":  # in the line, or handed to its training process a moment ago
        return "waiting" if run.get("waiting") else "starting"
    return run["state"]


def _held_out(run: dict) -> str:
    before, after = _rounded(run.get("heldout_before")), _rounded(run.get("heldout_after"))
    if before is None and after is None:
        return ""
    return f"{'–' if before is None else before} → {'…' if after is None else after}"


def _alerts_and_rewards(folder: Path) -> list[str]:
    """The titles of the health alerts that fire on the run (the hacking watch's among them), and its rewards in one
    line: name × weight."""
    snap = read_snapshot(folder)
    config = read_json(RunDir(folder).config_path, default={}) or {}
    alerts = health_alerts(snap.progress, snap.status, config, snap.log, snap.rollouts, snap.heldout)
    rewards = [f"{spec.get('name') or spec.get('kind')} × {_weight(spec.get('weight', 1.0))}"
               for spec in config.get("rewards") or [] if isinstance(spec, dict)]
    return ["; ".join(alert.title for alert in alerts), ", ".join(rewards)]



def _weight(value: object) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


class Teacher:
    """What the demo's owner does with the class, from the teacher's board: each refused to anyone else, in a
    public demo alone (a class shares a public demo's machine)."""

    policy = RequestPolicy()  # asked by the visitor of the request being served

    def __init__(self, classroom: Classroom, runs: Runs, forgive_guesses: Callable[[], object], *,
                 policy: Policy) -> None:
        self.classroom, self.runs, self.policy = classroom, runs, policy
        self.forgive_guesses = forgive_guesses  # forgets the wrong class codes counted (visitors.Visitors.forgive)

    def board(self) -> list[list[Any]]:
        """One row per seat (Classroom.board)."""
        self._check("see the class board")
        return self.classroom.board(self.runs.summaries(), self.runs.place)

    def seat_run(self, row: object) -> str:
        """The run shown in the board's row ``row`` (counted from 0), read without the rest of the board."""
        self._check("open a seat's run")
        seats = self.classroom.seats()
        if not isinstance(row, int) or isinstance(row, bool) or not 0 <= row < len(seats):
            raise ConfigError("Click a seat's row to open its run.")
        run = self.classroom.run_of(seats[row], self.runs.summaries())
        if run is None:
            raise ConfigError(f"{seats[row].name} has no run yet.")
        return run["id"]

    def open_class(self, code: object) -> str:
        """Open the class with ``code``; with none typed, keep the code of a class open already, or make a new one.
        The code when it was made here (for the teacher to give out), else "". Learners held up by wrong codes may
        try again."""
        self._check("open the class")
        typed = code.strip() if isinstance(code, str) else ""
        made = "" if typed or self.classroom.open else new_code()
        if typed or made:
            self.classroom.set_code(typed or made)
        self.forgive_guesses()
        return made

    def free_seat(self, name: object) -> None:
        """Free a learner's seat (one taken by mistake, or by someone who should not have the code)."""
        self._check("free a seat")
        self.classroom.free(name)

    def close_class(self) -> None:
        """No code, no seats: learners become visitors counted by address again."""
        self._check("close the class")
        self.classroom.close()

    def hand_out(self, draft: Draft) -> Handout:
        """Hand ``draft`` to every seat, checked first as a learner's Start would check it: data the teacher
        uploaded, or a model of the teacher's runs, is the teacher's alone."""
        self._check("give everyone a recipe")
        with visiting(A_LEARNER):
            try:
                self.runs.recipes.validate(draft)
            except ConfigError as exc:
                raise ConfigError(f"A learner could not start these settings: {exc}") from None
            shown = shown_draft(draft, policy=self.policy)
        return self.classroom.hand_out(shown, HANDOUT_LABEL)

    def stop_all(self) -> int:
        """Every run stopped and every waiting one taken out of the queue; how many."""
        self._check("stop every run")
        return len(queue.stop_all(self.runs.folder))

    def pause_queue(self, paused: bool) -> None:
        """Hold the waiting runs where they are (runs training go on), or let them start again."""
        self._check("pause the queue")
        (queue.pause if paused else queue.resume_queue)(self.runs.folder)

    def queue_paused(self) -> bool:
        return queue.paused(self.runs.folder)

    def _check(self, action: str) -> None:
        if not self.policy.public:
            raise ConfigError("A class is taught on a public demo (DRAGON_UI_PUBLIC=1): on your own machine there "
                              "are no seats.")
        if not self.policy.visitor.owns_everything:
            raise NotYoursError(f"Only this demo's owner can {action}: enter the owner key on the owner panel.")
