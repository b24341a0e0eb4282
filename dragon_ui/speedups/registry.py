"""Which speed-ups exist, what each changes and for how long, the library versions CI verified each with, whether
each is on, and each one's self-check on the libraries this machine has; plus the two ways a speed-up changes a
library: for the length of a block, then undone.

A speed-up is on unless ``DRAGON_UI_SPEEDUPS`` leaves it out (the processes that train or sample read it as they
start and pass it to ``choose``), it raised while installing or running, its self-check
failed on this machine's libraries, or a library is outside the versions CI verified it with and no self-check on
these versions has passed yet (``selfcheck`` runs them, once per set of versions). Off, the libraries' own code runs
and one log line says why; a run never fails because a library moved under a speed-up.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, describe
from ..system.disk import cache_dir, replaced_atomically

log = logging.getLogger("dragon_ui.speedups")


@dataclass(frozen=True)
class Verified:
    """A range of a library's versions that CI ran the speed-ups' identity and distribution tests with
    (tests/test_speedups.py, tests/test_training.py), and the releases in it they were run on."""

    package: str
    versions: str
    checked_on: tuple[str, ...]


TORCH = Verified("torch", ">=2.13,<2.16", ("2.13.0", "2.14.1", "2.15.0"))
TRL = Verified("trl", ">=1.16,<1.17", ("1.16.0",))
TRANSFORMERS = Verified("transformers", ">=5.24,<5.25", ("5.24.0",))
PEFT = Verified("peft", ">=0.21,<0.22", ("0.21.2",))


@dataclass(frozen=True)
class SpeedUp:
    """One speed-up. ``changes`` names the library internals it relies on; ``lasts`` says how long the change
    lasts (a block that undoes it, or the life of the model it was made to); ``verified`` gives the library
    versions its bit-identity and distribution tests and ``bench/speedups.py`` ran with."""

    name: str
    family: str  # the module of dragon_ui.speedups that holds it
    changes: str
    lasts: str
    verified: tuple[Verified, ...]


# In the order they were added: bench/speedups.py switches them on one after another in this order.
SPEEDUPS: dict[str, SpeedUp] = {speedup.name: speedup for speedup in (
    SpeedUp("completion_logprobs", "lm_head", "trl.trainer.utils._use_triton", "while TRL scores", (TRL,)),
    SpeedUp("contiguous_lm_head", "lm_head", "a forward pre-hook on the output embeddings", "the loaded model",
            (TORCH, TRANSFORMERS)),
    SpeedUp("sampling_without_dropout", "sampling", "the model's training mode", "while the trainer samples",
            (TRL,)),
    SpeedUp("sparse_dropout", "lora_layers", "the LoRA layers' lora_dropout entries", "the trainer's model",
            (TORCH, PEFT)),
    SpeedUp("inverse_cdf_sampling", "sampling", "torch.multinomial", "while the trainer or the app samples",
            (TORCH, TRANSFORMERS)),
    SpeedUp("short_sequence_attention", "attention", "the model's attention implementation", "the loaded model",
            (TORCH, TRANSFORMERS)),
    SpeedUp("cache_sized_logprob_tiles", "lm_head", "trl.trainer.utils._ChunkedLogProbFunction", "while TRL scores",
            (TRL,)),
    SpeedUp("lean_adapter_layers", "lora_layers", "the class of PEFT's LoRA Linear layers", "the trainer's model",
            (TORCH, PEFT)),
    SpeedUp("lean_logprob_head", "lm_head", "trl.trainer.utils._ChunkedLogProbFunction", "while TRL scores",
            (TORCH, TRL)),
    SpeedUp("merged_sampling", "lora_layers", "the lean LoRA layers' weights", "while the trainer samples",
            (TORCH, PEFT)),
    SpeedUp("shared_prompts", "shared_prompts", "the backbone's forward, generate, transformers' DynamicCache",
            "while the trainer samples, TRL scores and the app generates", (TORCH, TRANSFORMERS, TRL)),
)}
ALL = tuple(SPEEDUPS)
ENV = "DRAGON_UI_SPEEDUPS"
LIBRARIES = ("torch", "trl", "transformers", "peft", "accelerate", "gradio")
_failed: dict[str, str] = {}  # speed-up -> why it was switched off in this process (it raised)
_chosen_names: frozenset[str] | None = None  # choose's; None: every speed-up
_checking = threading.local()  # .names: the speed-ups a self-check in this thread has on


def enabled(name: str) -> bool:
    """Whether the speed-up ``name`` is on (see the module's docstring for when it is not). Inside a self-check
    (``checking``) only the speed-ups under check are on, in the checking thread."""
    under_check = getattr(_checking, "names", None)
    if under_check is not None:
        return name in under_check
    return _chosen(name) and off_reason(name) is None


@contextlib.contextmanager
def checking(names: tuple[str, ...]):
    """In this thread, inside the block, exactly the speed-ups ``names`` are on, whatever the versions, the
    environment or earlier checks say: what a self-check compares against the libraries' own code."""
    _checking.names = frozenset(names)
    try:
        yield
    finally:
        del _checking.names


def choose(setting: str) -> None:
    """Use the speed-ups ``setting`` names (``DRAGON_UI_SPEEDUPS``): every one when it is empty or ``all``, none for
    ``none``, else the names it lists, separated by commas. A ConfigError names an unknown one, as a process starts
    rather than when a speed-up is first asked for."""
    global _chosen_names
    setting = setting.strip()
    names = None if setting in ("", "all") else frozenset(part.strip() for part in setting.split(",") if part.strip())
    unknown = (names or frozenset()) - set(ALL) - {"none"}
    if unknown:
        raise ConfigError(f"{ENV} names unknown speed-ups: {', '.join(sorted(unknown))}; known: {', '.join(ALL)}, "
                          "or none")
    _chosen_names = names


def _chosen(name: str) -> bool:
    if name not in SPEEDUPS:
        raise ValueError(f"unknown speed-up {name!r}; known: {', '.join(ALL)}")
    return _chosen_names is None or name in _chosen_names


def off_reason(name: str) -> str | None:
    """Why a chosen speed-up is off anyway (None when it is on); said once in the log."""
    reason = _failed.get(name) or _check_reason(name)
    if reason:
        _say_off(name, reason)
    return reason


def _check_reason(name: str) -> str | None:
    """A failed self-check turns any speed-up off; outside CI's versions, only a passed one turns it on."""
    check = self_checks().get(name)
    if check is not None and not check["passed"]:
        return f"its self-check failed on this machine's libraries: {check['why']}"
    outside = outside_verified(name)
    if outside and check is None:
        return f"{outside}, and its self-check has not run on these versions yet"
    return None


@functools.cache
def _say_off(name: str, reason: str) -> None:
    log.info("Speed-up %s is off (%s); the libraries' own code runs instead.", name, reason)


@functools.cache
def outside_verified(name: str) -> str | None:
    """How an installed library lies outside the versions CI verified the speed-up with (None when none does)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    for verified in SPEEDUPS[name].verified:
        installed = library_version(verified.package)
        if installed is None:
            return f"{verified.package} is not installed"
        if Version(Version(installed).base_version) not in SpecifierSet(verified.versions):  # 2.13.0+cpu is 2.13.0
            return f"verified with {verified.package}{verified.versions}, found {installed}"
    return None


@functools.cache
def library_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """The versions a run trained with, for its status.json."""
    return {package: library_version(package) for package in LIBRARIES}


def status() -> dict:
    """{"active": [...], "disabled": {name: reason}} for status.json and the Model & Hardware tab."""
    active, disabled = [], {}
    for name in ALL:
        if not _chosen(name):
            disabled[name] = f"not chosen in {ENV}"
        elif (reason := off_reason(name)) is not None:
            disabled[name] = reason
        else:
            active.append(name)
    return {"active": active, "disabled": disabled}


def table() -> list[dict]:
    """Each speed-up: on or off, why, and the versions CI verified it with, for ``dragon speedups``."""
    rows = []
    for name in ALL:
        on = enabled(name)
        why: str | None
        if on:
            checked = ("its self-check passed on this machine" if name in self_checks()
                       else "its self-check has not run here yet")
            why = f"{outside_verified(name) or 'within the versions CI verified'}; {checked}"
        else:
            why = f"not chosen in {ENV}" if not _chosen(name) else off_reason(name)
        rows.append({"name": name, "on": on, "why": why,
                     "verified": ", ".join(f"{v.package}{v.versions} (tested on {', '.join(v.checked_on)})"
                                           for v in SPEEDUPS[name].verified)})
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The self-checks' results, kept per set of library versions in the cache folder (beside the offline model).

CHECKS_FILE = "speedup_checks.json"
KEPT_STACKS = 20  # sets of versions remembered; the oldest go first
_checks_lock = threading.Lock()
_checks: dict[str, dict[str, dict]] = {}  # stack key -> speed-up -> {"passed", "why", "seconds"}, as read or made


def stack() -> dict[str, str | None]:
    """What a self-check's result depends on: the libraries the speed-ups change, Python, the processor's kind and
    the speed-ups' own code (a new release of Dragon checks again)."""
    return {**{package: library_version(package) for package in ("torch", "transformers", "trl", "peft")},
            "python": platform.python_version(), "machine": platform.machine() or sys.platform,
            "dragon speed-ups": _code_fingerprint()}


@functools.cache
def _code_fingerprint() -> str:
    code = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        code.update(source.read_bytes())
    return code.hexdigest()[:12]


@functools.cache
def stack_key() -> str:
    """``stack()`` as one line: the key of its self-checks' results."""
    return " | ".join(f"{name} {value}" for name, value in stack().items())


def self_checks(reread: bool = False) -> dict[str, dict]:
    """This machine's self-check results for the installed versions ({} before any has run); ``reread`` reads
    what another process may have kept meanwhile."""
    key = stack_key()
    with _checks_lock:
        if reread or key not in _checks:
            _checks[key] = _read_checks().get(key, {}).get("results", {})
        return _checks[key]


def record_self_checks(results: dict[str, dict]) -> None:
    """Keep ``results`` (speed-up -> {"passed", "why", "seconds"}) for the installed versions, here and on disk."""
    versions, key = stack(), stack_key()
    with _checks_lock:
        _checks[key] = {**_checks.get(key, {}), **results}
        known = _read_checks()
        known[key] = {"versions": versions, "checked_at": time.time(), "results": _checks[key]}
        newest = sorted(known, key=lambda k: known[k].get("checked_at", 0))[-KEPT_STACKS:]
        try:
            with replaced_atomically(cache_dir() / CHECKS_FILE) as tmp:
                tmp.write_text(json.dumps({k: known[k] for k in newest}, indent=1), encoding="utf-8")
        except OSError as exc:  # a read-only home: this process keeps the results, the next one checks again
            log.warning("The speed-ups' self-checks could not be kept in %s (%s).", cache_dir(), describe(exc))
    _say_off.cache_clear()


def _read_checks() -> dict:
    """The kept results, each set of versions as record_self_checks wrote it; anything else in the file (a hand edit,
    a half-written disk) counts as not checked, so it is checked again rather than read wrongly."""
    try:
        known = json.loads((cache_dir() / CHECKS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}

    def well_formed(entry) -> bool:
        results = entry.get("results") if isinstance(entry, dict) else None
        return isinstance(results, dict) and all(
            isinstance(result, dict) and isinstance(result.get("passed"), bool) for result in results.values())

    return {key: entry for key, entry in known.items() if well_formed(entry)} if isinstance(known, dict) else {}


def switch_off(name: str, exc: BaseException) -> None:
    """A speed-up raised while installing or running: off for the rest of the process, said once, the run goes on."""
    _failed.setdefault(name, f"it raised {describe(exc)}")
    log.warning("Speed-up %s raised %s; it is off from now on and the libraries' own code runs.", name,
                type(exc).__name__, exc_info=exc)


def falls_back(*names: str):
    """An installer that, if it raises, switches its speed-ups off instead of failing the run."""
    def decorate(install):
        @functools.wraps(install)
        def guarded(*args, **kwargs):
            try:
                return install(*args, **kwargs)
            except Exception as exc:  # a library moved: run without this speed-up, never fail the run
                for name in names:
                    switch_off(name, exc)
                return None

        return guarded

    return decorate


def enter_or_switch_off(stack: contextlib.ExitStack, names: tuple[str, ...], make_block) -> None:
    """Enter the block ``make_block()`` on ``stack`` where any of the speed-ups ``names`` (which share it) is on;
    one that raises while it sets itself up switches them off and the caller's block runs without it. What the
    caller's block raises is the caller's: it never switches a speed-up off."""
    if not any(enabled(name) for name in names):
        return
    try:
        stack.enter_context(make_block())
    except Exception as exc:  # a library moved: run without this speed-up, never fail the run
        for name in names:
            switch_off(name, exc)


@contextlib.contextmanager
def replaced(owner, name: str, replacement):
    """``owner.name`` is ``replacement`` inside the block, then what it was (its class's attribute, or its own)."""
    had_own, original = name in vars(owner), getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if had_own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


_shared_lock = threading.Lock()
_shared: dict[tuple[int, str], list] = {}  # (id(owner), name) -> [blocks open, owner, the library's own attribute]


@contextlib.contextmanager
def replaced_while_open(owner, name: str, make_replacement):
    """``owner.name`` (a library's module-level function or class, seen by every thread) is
    ``make_replacement(original)`` while at least one such block is open in any thread, and the library's own
    again when the last one closes; nested and concurrent blocks share one replacement."""
    key = (id(owner), name)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            original = getattr(owner, name)
            replacement = make_replacement(original)
            setattr(owner, name, replacement)
            entry = _shared[key] = [0, owner, original]
        entry[0] += 1
    try:
        yield
    finally:
        with _shared_lock:
            entry[0] -= 1
            if entry[0] == 0:
                setattr(owner, name, entry[2])
                del _shared[key]
