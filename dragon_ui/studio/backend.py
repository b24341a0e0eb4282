"""The backend the Gradio UI talks to: recipes, drafts, run control, and one cached model for previews.

It holds the little state the UI needs across requests (where runs live, which model is loaded for previews) and
delegates everything else to the engine modules. The UI receives a Studio as an argument, so tests can give it one
pointed at a temporary runs folder and a tiny model.
"""

from __future__ import annotations

import copy
import secrets
from pathlib import Path

from ..config import HardwareSettings, ModelConfig, RunConfig, resolve_runs_dir
from ..data import resolve_source
from ..engine import training
from ..engine.hardware import HardwareInfo, ResolvedHardware, detect_hardware, resolve_hardware
from ..engine.models import ModelCache
from ..errors import BusyError, ConfigError
from ..rewards import is_public_demo
from ..runstore import ACTIVE_STATES, RunDir, list_runs, read_json, write_json_atomic

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"
DEFAULT_RECIPE = "arithmetic"
# What sampling a group in the playground reads from a draft: the model, where it runs, the data and rewards, GRPO's
# sampling settings, and LoRA (4-bit loading needs it).
SAMPLING_SETTINGS = ("model", "data", "rewards", "grpo", "hardware", "lora", "base_dir", "runs_dir")


class Studio:
    """One per app process. Thread-safe: Gradio calls it from several worker threads at once."""

    def __init__(self, runs_dir: str | Path | None = None, recipes_dir: str | Path | None = None) -> None:
        self.runs_dir = resolve_runs_dir(runs_dir)
        self.recipes_dir = Path(recipes_dir or ASSETS_DIR / "recipes").resolve()
        self.public = is_public_demo()
        self._hardware: HardwareInfo | None = None
        self.models = ModelCache(self.hardware)

    # --- recipes and drafts --------------------------------------------------------------------------------------
    def recipe_names(self) -> list[str]:
        return sorted(p.stem for p in self.recipes_dir.glob("*.yaml"))

    def load_recipe(self, name: str) -> dict:
        """A recipe as a draft: the config dict the UI edits, with paths made absolute so they survive any cwd."""
        path = self.recipes_dir / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"There is no recipe called {name!r}; choose one of: {', '.join(self.recipe_names())}.")
        config = RunConfig.from_file(path)
        config.data.source = resolve_source(config.data.source, base_dir=config.base_dir)
        config.runs_dir = str(self.runs_dir)
        return config.to_dict()

    def default_draft(self) -> dict:
        return self.load_recipe(DEFAULT_RECIPE)

    def run_settings(self, run_id: str) -> tuple[dict, str]:
        """(draft, what it is): a past run's settings as a draft, to train them again or change them."""
        if not run_id:
            raise ConfigError("Choose a run first.")
        config = self.run(run_id).read_config()
        config.runs_dir = str(self.runs_dir)
        return config.to_dict(), f"the settings of run {run_id}"

    def browser_secret(self) -> str:
        """The key the browser's copy of the draft is encrypted with, kept beside the runs so that a restarted app
        still reads what browsers kept (gradio would make a new one each start)."""
        path = self.runs_dir / ".browser-secret.json"
        secret = read_json(path)
        if not isinstance(secret, str) or not secret:
            secret = secrets.token_urlsafe(24)
            write_json_atomic(path, secret)
        return secret

    def validate(self, draft: dict) -> RunConfig:
        """The draft as a validated RunConfig (raises ConfigError with the sentence to show)."""
        return RunConfig.from_dict(copy.deepcopy(draft))

    def validate_for_sampling(self, draft: dict) -> RunConfig:
        """The settings the playground's sampling uses, validated; the others are left at their defaults, so a
        learning rate half typed on the Model tab does not stop anyone trying rewards."""
        return self.validate({key: value for key, value in draft.items() if key in SAMPLING_SETTINGS})

    # --- hardware ------------------------------------------------------------------------------------------------
    def hardware(self, refresh: bool = False) -> HardwareInfo:
        if self._hardware is None or refresh:
            self._hardware = detect_hardware()
        return self._hardware

    def resolve_hardware(self, draft: dict) -> ResolvedHardware:
        return resolve_hardware(self.validate(draft).hardware, self.hardware())

    # --- runs ----------------------------------------------------------------------------------------------------
    def start(self, draft: dict) -> RunDir:
        config = self.validate(draft)
        self._refuse_if_training()
        config.runs_dir = str(self.runs_dir)
        self.release_model()  # training needs the memory more than a preview does
        return training.start(config).run

    def resume(self, run_id: str) -> RunDir:
        self._refuse_if_training()
        self.release_model()
        return training.resume(self.run(run_id).path).run

    def stop(self, run_id: str) -> None:
        """Ask a run to stop after its current step, whichever process trains it."""
        handle = training.active_run()
        if handle is not None and handle.run.id == run_id:
            handle.stop()
        else:
            self.run(run_id).request_stop()

    def _refuse_if_training(self) -> None:
        """One training per machine: a run started from the command line or another app counts too."""
        active = self.active_run_id()
        if active is not None:
            raise BusyError(f"A training is already running ({active}); stop it on the Train tab or wait for it to "
                            "finish first.")

    def active_run_id(self) -> str | None:
        """The run training right now, in this process or (seen through the run store) in another one."""
        handle = training.active_run()
        if handle is not None:
            return handle.run.id
        for summary in self.runs():
            if summary["state"] in ACTIVE_STATES:
                return summary["id"]
        return None

    def runs(self) -> list[dict]:
        return list_runs(self.runs_dir)

    def run(self, run_id: str) -> RunDir:
        path = (self.runs_dir / run_id).resolve()
        if path.parent != self.runs_dir or not (path / "config.json").is_file():
            raise ConfigError(f"There is no run called {run_id!r} in {self.runs_dir}.")
        return RunDir(path)

    # --- one cached model for previews (playground and compare) ----------------------------------------------------
    def inference_model(self, model: ModelConfig, adapter_dir: Path | None = None, settings: HardwareSettings | None = None):
        """(model, tokenizer) for previews from the one cached load (engine.models.ModelCache); refused while a
        training uses this machine's CPU."""
        if training.active_run() is not None and self.hardware().cuda == []:
            raise BusyError("A training is running on this machine's CPU; generating previews now would slow it down "
                            "badly. Wait for it to finish or stop it first.")
        return self.models.load(model, adapter_dir, settings)

    def release_model(self) -> None:
        self.models.release()
