"""Public mode: what a Hugging Face Space or a workshop's shared machine allows each visitor (``Policy``), and who
is asking (``Visitor``). The entry points (the app, the command line) build the policy once from the environment
(``Policy.from_env``) and pass it down; nothing below them reads the environment for it. The checks that apply it
to a run are in ``engine/public_checks.py``; the data loader and the rewards take it as an argument.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import ipaddress
import os
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, cast

from .errors import ConfigError

PUBLIC_ENV = "DRAGON_UI_PUBLIC"
MODELS_ENV = "DRAGON_UI_PUBLIC_MODELS"
CLASSIFIERS_ENV = "DRAGON_UI_PUBLIC_CLASSIFIERS"
OWNER_KEY_ENV = "DRAGON_UI_OWNER_KEY"
CLASS_CODE_ENV = "DRAGON_UI_CLASS_CODE"
CLASS_CODE_CHARS = 6  # the shortest class code: each guess costs a session, and a short word is guessed first
PROXIES_ENV = "DRAGON_UI_PROXIES"
UPLOADS_FOLDER = ".uploads"  # in the runs folder: each visitor's uploads, in a folder named by its key
LIFT = "run Dragon GRPO Studio on your own machine (make run)"  # how every refusal says a limit is lifted
HUB_TOKENS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")  # how the Hub's libraries find a token
SHARE_WINDOW_S = 600  # the window of each network address's share of the disk (Limits.disk_mb, Limits.disk_files)


def _limit(default: float, env: str, meaning: str) -> Any:
    return field(default=default, metadata={"env": env, "meaning": meaning})


@dataclass(frozen=True)
class Limits:
    """What one visitor's run may take on a public demo. The defaults suit a free 2-vCPU, 16 GB CPU Space: a run
    of the bundled recipes fits in 15 minutes and the machine stays responsive for the next visitor."""

    run_minutes: float = _limit(15, "DRAGON_UI_MAX_RUN_MINUTES",
                                "minutes per run, held-out scoring included")
    max_new_tokens: int = _limit(256, "DRAGON_UI_MAX_NEW_TOKENS", "new tokens per completion")
    prompt_tokens: int = _limit(512, "DRAGON_UI_MAX_PROMPT_TOKENS", "tokens per prompt, chat template included "
                                "(longer ones are dropped)")
    text_chars: int = _limit(10_000, "DRAGON_UI_MAX_TEXT_CHARS", "characters in one row's prompt, reference answer "
                             "or system message")
    completions_per_step: int = _limit(32, "DRAGON_UI_MAX_COMPLETIONS_PER_STEP", "completions per step")
    dataset_rows: int = _limit(10_000, "DRAGON_UI_MAX_DATASET_ROWS", "rows of data")
    upload_mb: float = _limit(20, "DRAGON_UI_MAX_UPLOAD_MB", "MB per uploaded file or Hub dataset")
    columns: int = _limit(1000, "DRAGON_UI_MAX_COLUMNS", "columns of a data file")
    sampling_seconds: float = _limit(120, "DRAGON_UI_MAX_SAMPLING_SECONDS", "seconds one playground group may "
                                     "take, sampled and scored")
    scoring_seconds: float = _limit(15, "DRAGON_UI_MAX_SCORING_SECONDS", "seconds the rewards may take on one reply "
                                    "typed into the playground")
    held_out_prompts: int = _limit(50, "DRAGON_UI_MAX_HELD_OUT", "held-out prompts scored before and after")
    lora_rank: int = _limit(64, "DRAGON_UI_MAX_LORA_RANK", "LoRA rank (full fine-tuning is off)")
    queue_length: int = _limit(10, "DRAGON_UI_MAX_QUEUE", "runs waiting in the queue")
    runs_per_visitor: int = _limit(2, "DRAGON_UI_MAX_RUNS_PER_VISITOR",
                                   "runs one visitor may have training or waiting")
    runs_per_address: int = _limit(4, "DRAGON_UI_MAX_RUNS_PER_ADDRESS",
                                   "runs training or waiting from one network address")
    starts_per_hour: int = _limit(10, "DRAGON_UI_MAX_STARTS_PER_HOUR", "starts and resumes per network address "
                                  "per hour")
    keep_hours: float = _limit(72, "DRAGON_UI_KEEP_HOURS", "hours a finished run and an upload are kept")
    preflights_per_hour: int = _limit(20, "DRAGON_UI_MAX_PREFLIGHTS_PER_HOUR", "pre-flights (Will it learn?) per "
                                      "network address per hour")
    dry_runs_per_hour: int = _limit(0, "DRAGON_UI_MAX_DRY_RUNS_PER_HOUR", "dry runs (Measure one step) per network "
                                    "address per hour; none unless the owner sets it")
    waiting_per_session: int = _limit(12, "DRAGON_UI_MAX_WAITING_PER_SESSION", "events one page (or API session) "
                                      "may have in the server's queue: waiting, running, or answered but not read")
    waiting_mb_per_address: float = _limit(64, "DRAGON_UI_MAX_WAITING_MB_PER_ADDRESS", "MB the events from one "
                                           "network address may hold in the server's queue, as the server estimates "
                                           "them")
    disk_mb: float = _limit(100, "DRAGON_UI_MAX_DISK_MB", f"MB of uploads and downloads the server writes for one "
                            f"network address per {SHARE_WINDOW_S // 60} minutes")
    disk_files: int = _limit(30, "DRAGON_UI_MAX_DISK_FILES", f"files (uploads and downloads) the server writes for "
                             f"one network address per {SHARE_WINDOW_S // 60} minutes")
    class_seats: int = _limit(30, "DRAGON_UI_CLASS_SEATS", "seats a class code gives out; each seat has the limits of "
                              "one network address")
    class_runs: int = _limit(30, "DRAGON_UI_CLASS_RUNS", "runs the whole class may have training or waiting (runs "
                             "of visitors without a seat count against the queue's limit)")

    @classmethod
    def from_env(cls) -> Limits:
        """The defaults, with each limit the environment sets; a value that is not a positive number is refused
        when the app starts, not when a visitor meets it."""
        values: dict[str, Any] = {}
        for limit in fields(cls):
            raw = os.environ.get(limit.metadata["env"], "").strip()
            if not raw:
                continue
            try:
                value = float(raw)
            except ValueError:
                value = float("nan")  # refused just below
            if not value > 0 or (limit.type == "int" and not value.is_integer()):
                kind = "a whole number" if limit.type == "int" else "a number"
                raise ConfigError(f"{limit.metadata['env']} must be {kind} above 0 ({limit.metadata['meaning']}); "
                                  f"got {raw!r}.")
            values[limit.name] = int(value) if limit.type == "int" else value
        return cls(**values)

    @staticmethod
    def documented() -> list[tuple[str, str, float]]:
        """(environment variable, what it limits, default) of every limit, for the reference and the app."""
        return [(limit.metadata["env"], limit.metadata["meaning"], cast(float, limit.default))
                for limit in fields(Limits)]

    @staticmethod
    def table() -> str:
        """docs/reference.md's table of the limits, in Markdown (make reference)."""
        rows = ["| variable | limits | default |", "|---|---|---|"]
        rows += [f"| `{env}` | {meaning} | {default:g} |" for env, meaning, default in Limits.documented()]
        return "\n".join(rows) + "\n"


def checked_class_code(code: str, where: str) -> str:
    """``code`` as a class code (stripped), or ConfigError naming ``where`` it was set when it is too short to resist
    guessing; empty stays empty (no class)."""
    code = code.strip() if isinstance(code, str) else ""
    if code and len(code) < CLASS_CODE_CHARS:
        raise ConfigError(f"{where} must have at least {CLASS_CODE_CHARS} characters, so that it cannot be guessed in "
                          f"a few tries; got {len(code)}.")
    return code


def _listed(env: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in os.environ.get(env, "").split(",") if part.strip())


def _proxies() -> int:
    """How many reverse proxies in front of the app add the address they saw to X-Forwarded-For: as
    ``DRAGON_UI_PROXIES`` says, else 1 on a Space (the Space's own proxy) and 0 elsewhere."""
    raw = os.environ.get(PROXIES_ENV, "").strip()
    if not raw:
        return 1 if os.environ.get("SPACE_ID") else 0
    if not raw.isdigit() or int(raw) > 10:
        raise ConfigError(f"{PROXIES_ENV} must be a whole number from 0 to 10 (the reverse proxies in front of the "
                          f"app that add to X-Forwarded-For); got {raw!r}.")
    return int(raw)


def without_secrets(environment: dict[str, str], hub_token: bool = False) -> dict[str, str]:
    """``environment`` for a process of the app's: without the demo's owner key and class code, and unless ``hub_token`` without
    the Hub tokens, nor the token a login saved on the disk (HF_HUB_DISABLE_IMPLICIT_TOKEN)."""
    kept_out = {OWNER_KEY_ENV, CLASS_CODE_ENV, *(() if hub_token else HUB_TOKENS)}
    kept = {key: value for key, value in environment.items() if key not in kept_out}
    return kept if hub_token else {**kept, "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"}


def _one_visitor(host: str) -> str:
    """What tells one visitor's address from another's: an IPv4 address (an IPv4 one mapped into IPv6 too), an IPv6
    address's /64 network, or the text itself where it is no address."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        return str(mapped) if mapped else str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def key_of(text: str) -> str:
    """A short hash of ``text``: what the app keeps of a browser's token or a network address."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Visitor:
    """Who is asking. ``key`` identifies one browser (a hash of the random token it keeps) or one API session; the
    operator has no key and owns every run, and so does the session (page) in which the owner key was entered
    (``unlocked``). ``address`` is what the visitor's share is counted by: a hash of the network address the request
    came from (it counts the runs of an API client that opens a new session for every call), or for a learner with
    a seat in a class (``seat``, the name they typed) the seat's own (``seat_address``), so that a class behind one
    address has each seat's share instead of one between them."""

    key: str | None = None
    unlocked: bool = False
    address: str | None = None
    seat: str = ""
    session: str | None = field(default=None, compare=False)  # the gradio session asking, where one does

    @property
    def owns_everything(self) -> bool:
        return self.key is None or self.unlocked

    @property
    def turn(self) -> str:
        """Whose turn this visitor's requests take where they wait in line (system.processes.FairTurns): its network address
        (a visitor can open sessions at will), its key without one, "" for the operator and a laptop."""
        return self.address or self.key or ""


def seat_address(key: str) -> str:
    """What a seat's share is counted by in place of a network address: its visitor's own, never an address's."""
    return key_of(f"seat:{key}")


OPERATOR = Visitor()
NOBODY = Visitor(key="")  # an event nobody could be told apart for: it owns nothing and has uploaded nothing
@dataclass(frozen=True)
class Policy:
    """What this app allows: on a laptop (``LAPTOP``) everything; in a public demo (``limits`` set) each visitor's
    share of the machine, the models and classifiers it offers, and who may unlock every run."""

    limits: Limits | None = None  # None: not a public demo, so nothing is limited
    models: tuple[str, ...] = ()  # model ids the owner adds to the public allow-list
    classifiers: tuple[str, ...] = ()  # the classifier models a public demo's classifier rewards may use
    owner_key: str = field(default="", repr=False)  # unlocks every run for the Space's owner; empty: nobody has it
    class_code: str = field(default="", repr=False)  # gives a learner a seat (studio.classroom); empty: no class yet
    proxies: int = 0  # reverse proxies in front of the app that add to X-Forwarded-For (network_address)
    # A public demo's one runs folder, chosen by its entry point: every run and upload lives there. None: a
    # laptop's, where a run's config says where it goes (and a public policy without one has no uploads).
    runs_dir: Path | None = None
    # Who asks: the app serves each request under its policy asked by its visitor (asked_by), so the engine is
    # handed who asks with what they may do. NOBODY (the default) owns nothing and has uploaded nothing.
    visitor: Visitor = field(default=NOBODY, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.runs_dir is not None:  # one spelling of the folder: the public checks compare paths with it
            object.__setattr__(self, "runs_dir", Path(self.runs_dir).expanduser().resolve())

    @property
    def public(self) -> bool:
        return self.limits is not None

    @property
    def measures_steps(self) -> bool:
        """Whether the visitor asking may have a dry run (Measure one step): anywhere but on a public demo whose
        owner allows its visitors none (Limits.dry_runs_per_hour), and there the owner."""
        return self.limits is None or self.visitor.owns_everything or self.limits.dry_runs_per_hour > 0

    @classmethod
    def from_env(cls, runs_dir: Path) -> Policy:
        """Public on Hugging Face Spaces (``SPACE_ID``) or with ``DRAGON_UI_PUBLIC=1``, with the limits, models,
        classifiers (``DRAGON_UI_PUBLIC_MODELS``, ``DRAGON_UI_PUBLIC_CLASSIFIERS``, comma-separated) and owner key
        the environment sets, keeping its runs in ``runs_dir`` (the entry point's choice: system.disk.resolve_runs_dir);
        the laptop otherwise. A limit that is not a positive number is refused here, when the app starts, not when
        a visitor meets it."""
        if not (os.environ.get("SPACE_ID") or os.environ.get(PUBLIC_ENV) == "1"):
            return LAPTOP
        return cls(limits=Limits.from_env(), models=_listed(MODELS_ENV), classifiers=_listed(CLASSIFIERS_ENV),
                   owner_key=os.environ.get(OWNER_KEY_ENV, "").strip(),
                   class_code=checked_class_code(os.environ.get(CLASS_CODE_ENV, ""), CLASS_CODE_ENV),
                   proxies=_proxies(), runs_dir=runs_dir)

    def asked_by(self, who: Visitor) -> Policy:
        """This policy as it applies to a request of ``who``."""
        return self if who == self.visitor else replace(self, visitor=who)

    def network_address(self, forwarded_for: str | None, connection: str | None) -> str | None:
        """A hash of the network address a request came from: the address the outermost of the ``proxies`` saw,
        which is the ``proxies``-th entry of X-Forwarded-For from the right (each proxy appends the address that
        connected to it; whatever stands left of that, the client wrote). With no proxies, or a header shorter than
        they make it (a request that did not come through them), the connection's own address. An IPv6 address
        counts by its /64 network, which one subscriber is given whole."""
        hops = [hop.strip() for hop in (forwarded_for or "").split(",")]
        host = hops[-self.proxies] if 0 < self.proxies <= len(hops) and hops[-self.proxies] else connection
        return key_of(f"address:{_one_visitor(host)}") if host else None

    def to_json(self) -> dict[str, Any]:
        """What a training process needs of it (not the owner key): the app hands it over with each run."""
        return {"limits": None if self.limits is None else asdict(self.limits), "models": list(self.models),
                "classifiers": list(self.classifiers), "runs_dir": None if self.runs_dir is None else str(self.runs_dir)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Policy:
        limits, runs_dir = data.get("limits"), data.get("runs_dir")
        return cls(limits=None if limits is None else Limits(**limits), models=tuple(data.get("models") or ()),
                   classifiers=tuple(data.get("classifiers") or ()), runs_dir=None if runs_dir is None else Path(runs_dir))

    def classifier_refusal(self, model_id: str) -> str | None:
        """Why this demo refuses this classifier model, or None when it offers it (or is not public): each one is a
        download and memory for every visitor, so a demo offers none unless its owner lists some."""
        if not self.public or model_id.strip() in self.classifiers:
            return None
        offered = f"choose one of {', '.join(self.classifiers)}" if self.classifiers else "it offers none"
        return (f"{model_id.strip()!r} is not offered as a classifier in this public demo; {offered} ({LIFT} to use "
                f"any classifier, or add it to {CLASSIFIERS_ENV}).")

    @property
    def uploads_dir(self) -> Path | None:
        """Where a public demo keeps uploaded files: inside its runs folder (persistent storage on a Space), one
        folder per visitor. Gradio never serves it: only the runs' owners' downloads leave the server, as copies."""
        return None if self.runs_dir is None else self.runs_dir / UPLOADS_FOLDER

    def own_uploads_dir(self) -> Path | None:
        """The folder of the asking visitor's uploads; None for a visitor nobody could be told apart."""
        return self.uploads_dir / self.visitor.key if self.uploads_dir and self.visitor.key else None

    def is_own_upload(self, path: Path) -> bool:
        """Whether ``path`` (resolved) is a file the asking visitor uploaded: decided by where it lies, so a
        browser's uploads stay theirs after a restart of the app, and nobody else's can be named."""
        folder = self.own_uploads_dir()
        return folder is not None and path.is_relative_to(folder.resolve())

    def owns(self, run_owner: str | None) -> bool:
        """Whether the visitor asking may stop, resume, delete or download a run that ``run_owner`` started: anyone
        on a laptop; in a public demo its starter, and the operator or a session unlocked with the owner key. A run
        nobody could be told apart for (its owner empty or unknown) is the operator's alone."""
        who = self.visitor
        return not self.public or who.owns_everything or (bool(who.key) and run_owner == who.key)


LAPTOP = Policy()


class _Spending:
    """One asker's spending in the window: [second, amount] counts, oldest first, and their total."""

    def __init__(self) -> None:
        self.counts: collections.deque[list[float]] = collections.deque()
        self.total = 0.0


class Allowance:
    """What each asker (a network address) has spent in the last ``window_s`` seconds, of something a public demo
    shares out: starts, pre-flights, bytes and files written. Spending is counted per second, so an asker that spends
    a little at a time holds at most ``window_s`` counts; askers with nothing left in the window are forgotten.
    Thread-safe."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._spent: dict[str, _Spending] = {}
        self._lock = threading.Lock()

    def take(self, asker: str, amount: float, most: float) -> bool:
        """Count ``amount`` against ``asker``, unless that would pass ``most`` in the window: then False, counting
        nothing."""
        with self._lock:
            spending = self._current(asker)
            if spending.total + amount > most:
                return False
            now = time.monotonic()
            if spending.counts and int(now) == int(spending.counts[-1][0]):
                spending.counts[-1][1] += amount
            elif amount:
                spending.counts.append([now, amount])
                self._spent[asker] = spending
            spending.total += amount
            return True

    def spent(self, asker: str) -> float:
        with self._lock:
            return self._current(asker).total

    def minutes_to_wait(self, asker: str) -> int:
        """Whole minutes (at least 1) until the oldest spending of ``asker`` leaves the window: for a refusal."""
        with self._lock:
            counts = self._current(asker).counts
            left = self.window_s - (time.monotonic() - counts[0][0]) if counts else self.window_s
        return max(1, round(left / 60))

    def _current(self, asker: str) -> _Spending:
        """``asker``'s spending still in the window (forgetting the asker when there is none); the caller holds the
        lock."""
        spending = self._spent.get(asker) or _Spending()
        while spending.counts and time.monotonic() - spending.counts[0][0] >= self.window_s:
            spending.total -= spending.counts.popleft()[1]
        if not spending.counts:
            self._spent.pop(asker, None)
            spending.total = 0.0
        return spending


_current: ContextVar[Visitor | None] = ContextVar("dragon_ui_visitor", default=None)


def visitor() -> Visitor:
    """The visitor of the request being served, set by the app for each event of a public demo; NOBODY for anything
    else (safe: it may do nothing of its own, and a laptop's policy asks nobody who they are)."""
    current = _current.get()
    return NOBODY if current is None else current


@contextlib.contextmanager
def visiting(who: Visitor) -> Iterator[None]:
    """Serve the block as ``who``."""
    token = _current.set(who)
    try:
        yield
    finally:
        _current.reset(token)


class RequestPolicy:
    """A class attribute, ``policy = RequestPolicy()``, that keeps the policy its object is given and reads as that
    policy asked by the visitor of the request being served (``visiting``): the studio hands the engine who asks,
    with the policy, without every handler passing it along. Outside a request (a background thread, a laptop) the
    visitor is NOBODY."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.kept = f"_{name}_as_given"

    def __get__(self, instance: object, owner: type | None = None) -> Policy:
        given: Policy = getattr(instance, self.kept)
        return given.asked_by(visitor())

    def __set__(self, instance: object, value: Policy) -> None:
        setattr(instance, self.kept, value)
