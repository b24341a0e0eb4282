"""Where a run's trained weights are (its final adapter or model, else its latest checkpoint), and a prompt of the
run's own to show them with: what evaluating, exporting and describing a run all start from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..data import read_jsonl
from ..errors import ConfigError
from ..runstore import RunDir, state_label


@dataclass
class TrainedWeights:
    """The newest trained weights of a run: its final adapter/model, or else its latest checkpoint."""

    path: Path
    label: str  # "the final adapter", "the final model" or "checkpoint-12": how the UI names where "after" comes from
    is_adapter: bool  # LoRA adapter (apply to the starting model) or a full model folder
    is_final: bool


def trained_weights(run: RunDir) -> TrainedWeights:
    """Where the run's trained weights are; ConfigError with a sentence when it has saved none yet."""
    config = run.read_config()
    lora = config.lora.enabled
    final = run.adapter_dir if lora else run.full_model_dir
    marker = "adapter_config.json" if lora else "config.json"
    if (final / marker).is_file():
        return TrainedWeights(final, "the final adapter" if lora else "the final model", lora, True)
    checkpoint = run.latest_checkpoint()
    if checkpoint is not None and (checkpoint / marker).is_file():
        return TrainedWeights(checkpoint, checkpoint.name, lora, False)
    state = state_label(run.read_status().get("state"))
    raise ConfigError(f"The run {run.id} has no trained weights yet (it is {state}): it saves them every "
                      f"{config.training.save_steps} steps and when it finishes or is stopped.")


# The README's example when the run has no data files left to take a prompt from.
PLACEHOLDER_PROMPT = [{"role": "user", "content": "Write a prompt like the ones this run trained on."}]


def example_prompt(run: RunDir) -> tuple[list[dict], str]:
    """(chat messages, where they come from) for the README's example: the run's first held-out prompt, else its
    first training prompt, so the example asks what the adapter was trained for, system message included."""
    for path, origin in ((run.eval_data_path, "a held-out prompt of this run"),
                         (run.train_data_path, "a training prompt of this run")):
        try:
            with open(path, encoding="utf-8") as fh:
                return json.loads(fh.readline())["prompt"], origin
        except (OSError, ValueError):  # no such file, or an empty one (nothing was held out)
            continue
    return PLACEHOLDER_PROMPT, "a placeholder: this run's data files are gone"


def shared_system_message(run: RunDir) -> list[dict]:
    """The system message every training prompt had (recipes use one), as a list of none or one message: a prompt
    asked elsewhere (the free prompt, an exported model's Modelfile) is then asked the same way."""
    path = run.train_data_path
    examples = read_jsonl(path) if path.is_file() else []
    systems = {json.dumps([m for m in ex["prompt"] if m.get("role") == "system"]) for ex in examples}
    return json.loads(systems.pop()) if len(systems) == 1 else []
