"""Which speed-ups exist, what each changes and for how long, the library versions each was verified with, and
whether each is on; plus the two ways a speed-up changes a library: for the length of a block, then undone.

A speed-up is on unless ``DRAGON_UI_SPEEDUPS`` leaves it out, an installed library is outside the versions it was
verified with, or it raised while installing or running. Off, the libraries' own code runs and one log line says
why; a run never fails because a library moved under a speed-up.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass

from ..errors import ConfigError, describe

log = logging.getLogger("dragon_ui.speedups")

TORCH, TRL, TRANSFORMERS, PEFT = (("torch", ">=2.13,<2.14"), ("trl", ">=1.16,<1.17"),
                                  ("transformers", ">=5.24,<5.25"), ("peft", ">=0.21,<0.22"))


@dataclass(frozen=True)
class SpeedUp:
    """One speed-up. ``changes`` names the library internals it relies on; ``lasts`` says how long the change
    lasts (a block that undoes it, or the life of the model it was made to); ``verified`` gives the library
    versions its bit-identity and distribution tests and ``bench/speedups.py`` ran with."""

    name: str
    family: str  # the module of dragon_ui.speedups that holds it
    changes: str
    lasts: str
    verified: tuple[tuple[str, str], ...]


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


def enabled(name: str) -> bool:
    """Whether the speed-up ``name`` is on: all are, unless DRAGON_UI_SPEEDUPS lists others (or says ``none``), or
    an installed library is outside the versions it was verified against, or it raised."""
    return _chosen(name) and off_reason(name) is None


def _chosen(name: str) -> bool:
    if name not in SPEEDUPS:
        raise ValueError(f"unknown speed-up {name!r}; known: {', '.join(ALL)}")
    chosen = os.environ.get(ENV, "").strip()
    if not chosen or chosen == "all":
        return True
    names = {part.strip() for part in chosen.split(",") if part.strip()}
    unknown = names - set(ALL) - {"none"}
    if unknown:
        raise ConfigError(f"{ENV} names unknown speed-ups: {', '.join(sorted(unknown))}; known: {', '.join(ALL)}, "
                         "or none")
    return name in names


def off_reason(name: str) -> str | None:
    """Why a chosen speed-up is off anyway (None when it is on); said once in the log."""
    reason = _failed.get(name) or _version_reason(name)
    if reason:
        _say_off(name, reason)
    return reason


@functools.cache
def _say_off(name: str, reason: str) -> None:
    log.info("Speed-up %s is off (%s); the libraries' own code runs instead.", name, reason)


@functools.cache
def _version_reason(name: str) -> str | None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    for package, verified in SPEEDUPS[name].verified:
        installed = library_version(package)
        if installed is None:
            return f"{package} is not installed"
        if Version(Version(installed).base_version) not in SpecifierSet(verified):  # 2.13.0+cpu counts as 2.13.0
            return f"verified with {package}{verified}, found {installed}"
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
