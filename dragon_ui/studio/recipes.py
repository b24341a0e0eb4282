"""Recipes, and drafts made into checked configs: what the form starts from and what it may train.

A draft is the config dict the UI edits. It becomes a RunConfig here only, validated under the app's policy, with
the app's own runs folder whatever the draft says.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, cast

from ..config import Draft, RunConfig
from ..engine import public_checks, training
from ..errors import ConfigError
from ..public import Policy, RequestPolicy
from .files import real_source

DEFAULT_RECIPE = "arithmetic"
# What sampling a group in the playground reads from a draft: the model, where it runs, the data and rewards, GRPO's
# sampling settings, and LoRA (4-bit loading needs it).
SAMPLING_SETTINGS = ("model", "data", "rewards", "grpo", "hardware", "lora", "base_dir", "runs_dir")


class Recipes:
    """The recipes in ``folder`` and the drafts of an app keeping its runs in ``runs_dir`` under ``policy``."""

    policy = RequestPolicy()  # asked by the visitor of the request being served

    def __init__(self, folder: Path, runs_dir: Path, *, policy: Policy) -> None:
        self.folder = folder
        self.runs_dir = runs_dir
        self.policy = policy
        self._read: dict[tuple, tuple[int, Draft]] = {}  # (file, public) -> its change time, as load last read it

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.yaml"))

    def load(self, name: str) -> Draft:
        """A recipe as a draft: the config dict the UI edits, with paths made absolute so they survive any cwd (in
        a public demo without the runs and recipes folders, which it does not use). The name must be one of the
        recipes listed (it is never joined to a folder as it was sent)."""
        names = self.names()
        if not name:
            raise ConfigError(f"Choose a recipe first: {', '.join(names)}.")
        if name not in names:
            shown = name if isinstance(name, str) and len(name) <= 60 else "that"
            raise ConfigError(f"There is no recipe called {shown!r}; choose one of: {', '.join(names)}.")
        path = self.folder / f"{name}.yaml"
        key, changed = (path, self.policy.public), path.stat().st_mtime_ns  # the recipe box asks at every edit
        if self._read.get(key, (None,))[0] != changed:
            self._read[key] = changed, self._read_recipe(path)
        return copy.deepcopy(self._read[key][1])

    def _read_recipe(self, path: Path) -> Draft:
        config = RunConfig.from_file(path, policy=self.policy)
        # A recipe's data file lies beside it (the bundled datasets): the recipe's own folder, never a visitor's,
        # resolves it; a Hub id stays as it is.
        beside = Path(config.base_dir, config.data.source.strip())
        if beside.exists():
            config.data.source = os.path.normpath(beside)
        if self.policy.public:  # it uses neither (validate): the server's folders are shown to nobody
            config.runs_dir = config.base_dir = ""
        else:
            config.runs_dir = str(self.runs_dir)
        return cast(Draft, config.to_dict())

    def default(self) -> Draft:
        return self.load(DEFAULT_RECIPE)

    def notes(self) -> set[str]:
        """The recipes' notes: a lesson's, in a run of another visitor, are still the app's own words."""
        return {RunConfig.from_file(self.folder / f"{name}.yaml", policy=self.policy).notes for name in self.names()}

    def validate(self, draft: Draft) -> RunConfig:
        """The draft as a validated RunConfig that this demo allows (raises ConfigError with the sentence to show).

        The app keeps runs in its own folder, whatever a draft says; in a public demo no folder of a draft is used
        at all (``base_dir`` would make relative paths read files of the server's choosing of the visitor's), and a
        data source shown without the server's folders (files.shown_source) is the file it stands for."""
        # A client may send anything in a draft's place: from_dict refuses what is not settings with a sentence.
        config = RunConfig.from_dict(copy.deepcopy(cast(dict[str, Any], draft)), policy=self.policy)
        config.runs_dir = str(self.runs_dir)
        config.data.source = real_source(config.data.source, policy=self.policy)  # the file a shown name stands for
        if self.policy.public:
            config.base_dir = ""
        public_checks.check_run(config, policy=self.policy)
        return config

    def check(self, draft: Draft) -> RunConfig:
        """What ``dragon check`` checks: the settings, then the data, prompts and rewards read as a Start reads them
        (a Hub dataset that cannot be reached is refused here, not at Start). A public demo checks the settings and
        its limits only: reading a visitor's data takes the demo's one reading slot, and a Start, which reads it,
        counts against the visitor's starts (public_checks.take_start), where a check would count against
        nothing."""
        config = self.validate(draft)
        if not self.policy.public:
            training.inspect(config, policy=self.policy)
        return config

    def check_sampling(self, replies: int) -> None:
        """Refuse a playground group larger than a public demo's limit of completions per step: sampling it takes
        the machine from everyone like a training step does."""
        most = self.policy.limits.completions_per_step if self.policy.limits else None
        if most is not None and replies > most:
            raise ConfigError(f"That samples {replies} replies, more than this public demo's limit of {most} "
                              "completions per step; sample fewer rows or lower the group size.")

    def validate_for_sampling(self, draft: Draft) -> RunConfig:
        """The settings the playground's sampling uses, validated; the others are left at their defaults, so a
        learning rate half typed on the Model tab does not stop anyone trying rewards."""
        return self.validate(cast(Draft, {key: value for key, value in draft.items() if key in SAMPLING_SETTINGS}))
