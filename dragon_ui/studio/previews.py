"""One cached model for previews (the playground's groups, the Compare tab's answers), kept out of a training's way.

On the CPU (or a Mac's shared memory) a preview beside a training would slow it down badly, and on a full GPU it
would end it out of memory; so previews wait, with the reason, unless a GPU has room.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import HardwareSettings, ModelConfig
from ..engine import public_checks, training
from ..engine.estimate import preview_memory_gb
from ..engine.hardware import HardwareInfo, resolve_for_this_machine
from ..engine.models import ModelCache
from ..errors import BusyError, ConfigError
from ..public import Policy, RequestPolicy


class Previews:
    """The preview model of an app serving under ``policy``; ``hardware(refresh)`` says what this machine has.
    Runs train in worker processes of their own, which load their own model."""

    policy = RequestPolicy()  # asked by the visitor of the request being served

    def __init__(self, hardware: Callable[..., HardwareInfo], *, policy: Policy) -> None:
        self.hardware = hardware
        self.policy = policy
        self.cache = ModelCache(hardware)

    def load(self, model: ModelConfig, adapter_dir: Path | None = None, settings: HardwareSettings | None = None):
        """(model, tokenizer) for previews from the one cached load (engine.models.ModelCache); refused while a
        training uses this machine's CPU."""
        public_checks.check_model(model, policy=self.policy)
        settings = settings or HardwareSettings()
        if training.active_runs():
            self._refuse_unless_room_beside_training(model, settings, self.cache.holds(model, adapter_dir, settings))
        return self.cache.load(model, adapter_dir, settings)

    def _refuse_unless_room_beside_training(self, model: ModelConfig, settings: HardwareSettings, held: bool) -> None:
        """Previews beside a running training only on a GPU with room for the model (or with it there already,
        ``held``)."""
        info = self.hardware(refresh=True)  # the free memory of now, with the training's share taken
        hardware = resolve_for_this_machine(settings, info)
        if hardware.device != "cuda":
            where = "this Mac's GPU" if hardware.device == "mps" else "this machine's CPU"
            raise BusyError(f"A training is running on {where}; generating previews now would slow it down badly. "
                            "Wait for it to finish or stop it first.")
        if held:
            return
        free = info.cuda[hardware.gpu or 0].free_gb
        try:
            needed = preview_memory_gb(model.id, hardware.dtype, hardware.load_in_4bit)
        except ConfigError:
            needed = None
        if needed is None or free is None or needed > free:
            need = f"about {needed:.1f} GB" if needed is not None else "an amount of memory unknown here"
            have = f"{free:.1f} GB are free" if free is not None else "its free memory is unknown"
            raise BusyError(f"A training is using GPU {hardware.gpu}, and a preview of {model.id} beside it needs "
                            f"{need} while {have}; wait for the training to finish or stop it first.")

    def refuse_while_training(self, doing: str) -> None:
        """BusyError while a training uses this machine's CPU (or a Mac's GPU): ``doing`` something as heavy as
        loading a whole model beside it would slow it down badly."""
        if not training.active_runs():
            return
        device = resolve_for_this_machine(HardwareSettings(), self.hardware()).device
        if device != "cuda":
            raise BusyError(f"A training is running on this machine; {doing} now would slow it down badly. Wait "
                            "for it to finish or stop it first.")

    def release(self) -> None:
        """Let go of the preview model: a training about to start needs the memory more (its worker process loads
        its own, engine/workers.py)."""
        self.cache.release()
