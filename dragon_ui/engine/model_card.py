"""The model card: a ``README.md`` with Hub front matter beside a run's trained weights (``adapter/``, a merged model,
the adapter zip, a Hub upload), so that what was trained says what it is, how well it does and how to load it.

Everything in it is read from the run directory (config.json, status.json, progress.jsonl, eval.json), so a card
written after training, after a merge or at upload time says the same. The reward curve is a PNG beside it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..config import RunConfig
from ..data import is_hub_dataset_id
from ..rewards import reward_rule
from ..tools import described
from ..runstore import RunDir, RunStatus, reward_key, value_at
from .models import OFFLINE_NOTE, is_hub_id, is_run_dir


CARD_FILE = "README.md"
CURVE_FILE = "reward_curve.png"
TAGS = ["grpo", "trl", "dragon-grpo-studio"]


@dataclass(frozen=True)
class Stage:
    """One link of a chain of runs: a run trained on top of the model ``starting_model``."""

    run_id: str
    starting_model: str


def chain_of(config: RunConfig) -> tuple[str, list[Stage]]:
    """(the first starting model, the earlier runs in training order) of a run whose model may be an earlier run's
    folder: its weights are that model with every earlier adapter merged in, in this order."""
    earlier: list[Stage] = []
    model = config.model.id.strip()
    while is_run_dir(Path(model).expanduser()):
        parent = RunDir(Path(model)).read_config().model.id.strip()
        earlier.insert(0, Stage(Path(model).name, parent))
        model = parent
    return model, earlier


def write_model_card(run: RunDir, folder: Path, merged: bool = False, repo_id: str | None = None,
                     curve: bool = True) -> Path:
    """Write ``README.md`` and (``curve``) the reward curve into ``folder`` (the adapter's, a checkpoint's or the
    merged model's). ``repo_id`` is where it is published: the loading snippets use it instead of a local folder."""
    from huggingface_hub import ModelCard, ModelCardData

    config = run.read_config()
    root, earlier = chain_of(config)
    has_curve = curve and _plot_reward_curve(run, folder / CURVE_FILE)
    hub_data = config.data.source.strip()
    metadata = ModelCardData(
        base_model=root if is_hub_id(root) else None,
        library_name="transformers" if merged or not config.lora.enabled else "peft",
        pipeline_tag="text-generation",
        tags=[*TAGS, *(["lora"] if config.lora.enabled and not merged else [])],
        datasets=[hub_data] if is_hub_dataset_id(hub_data, look_on_disk=False) else None,
    )
    body = _body(run, config, root, earlier, merged, repo_id, has_curve)
    card = ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}")
    target = folder / CARD_FILE
    card.save(target)
    return target


def _body(run: RunDir, config: RunConfig, root: str, earlier: list[Stage], merged: bool, repo_id: str | None,
          has_curve: bool) -> str:
    status = run.read_status()
    adapter = config.lora.enabled and not merged
    what = "LoRA adapter" if adapter else "model"
    names = ", ".join(spec.name for spec in config.rewards if spec.train)
    metrics = ", ".join(spec.name for spec in config.rewards if not spec.train)
    lines = [
        f"# {config.name or run.id}",
        "",
        f"A {what} for {_model_name(root)} trained with GRPO (reinforcement learning with rewards that "
        f"can be checked, TRL's `GRPOTrainer`) in Dragon GRPO Studio, run `{run.id}`. It was rewarded for: {names}."
        + (f" It was also measured by {metrics}, which training never saw (metrics)." if metrics else ""),
        "",
    ]
    if OFFLINE_NOTE in (status.get("model_label") or ""):
        lines += [f"It was trained on the {OFFLINE_NOTE}, whose weights differ slightly from the Hub's "
                  f"full-precision {root}; on that model it behaves almost, not exactly, as it did here.", ""]
    if earlier:
        lines += ["It continues earlier runs. Its starting weights were, in this order:", "",
                  f"1. {_model_name(root)}"]
        lines += [f"{n}. with the adapter of run `{stage.run_id}` merged in" for n, stage in enumerate(earlier, 2)]
        lines += ["", "so this adapter applies to that merged model, not to the first one alone." if adapter else
                  "The merge folds all of them in: this model stands on its own.", ""]
    lines += ["## Rewards", "", "| reward | weight | pays 1 when |", "|---|---:|---|"]
    lines += [f"| {spec.name} | {spec.weight:g} | {reward_rule(spec)} |" if spec.train else
              f"| {spec.name} | metric, not trained on | {reward_rule(spec)} |" for spec in config.rewards]
    if config.tools:
        lines += ["", "## Tools", "", "It was trained to call these tools while it answers (multi-turn GRPO); give it "
                  "the same ones, with the chat template saved beside it, to use it that way.", "",
                  "| tool | kind | what it was told |", "|---|---|---|"]
        lines += [f"| {spec.name} | {spec.kind} | {described(spec)} |" for spec in config.tools]
        if any(spec.examples for spec in config.tools):
            lines += ["", "Each prompt began with worked examples of a call: "
                      + "; ".join(f"{example.question} → {spec.name}({json.dumps(example.arguments, ensure_ascii=False)})"
                                  for spec in config.tools for example in spec.examples) + "."]
    lines += ["", "## Data", "", f"- Source: {_data_name(config.data.source.strip())}",
              f"- {status.get('data_summary') or 'Rows: -'}",
              f"- Prompt: {_template(config.data.prompt)}"]
    if config.data.system:
        lines.append(f"- System message: {_template(config.data.system)}")
    if config.data.reference:
        lines.append(f"- Reference answer: {_template(config.data.reference)}")
    lines += ["", "## Held-out prompts, before and after", "", *_eval_table(run), ""]
    if has_curve:
        lines += ["## Reward during training", "", f"![Mean reward per step, per reward]({CURVE_FILE})", ""]
    checks = run.read_heldout()
    if checks:
        from .evaluation import heldout_curve  # it imports weights, which imports this module

        lines += [f"Held-out reward during training, on {checks[-1].get('n_prompts', '?')} of the held-out prompts "
                  f"(greedy): {heldout_curve(checks)}.", ""]
    lines += ["## Settings", "", "| setting | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in _settings(config, status)]
    lines += ["", "## How to load it", "", *_load_snippet(run, config, adapter, repo_id, root, earlier), ""]
    lines += ["## Training", "", *_training_facts(status), ""]
    return "\n".join(lines)


def _model_name(model: str) -> str:
    """A Hub model as a link; a local folder by its name only, since a card may be published (no machine paths)."""
    return f"[{model}](https://huggingface.co/{model})" if is_hub_id(model) else f"the local model `{Path(model).name}`"


def _loadable(model: str) -> str:
    """What the loading snippet passes to from_pretrained: the Hub id, or a stand-in for the local folder."""
    return model if is_hub_id(model) else f"path/to/{Path(model).name}"


def _data_name(source: str) -> str:
    if is_hub_dataset_id(source, look_on_disk=False):
        return f"[{source}](https://huggingface.co/datasets/{source})"
    return f"`{Path(source).name}`" if source else "-"


def _template(text: str | None) -> str:
    """A data mapping as the card shows it: a column name, or a template with ``{column}`` fields."""
    text = (text or "").strip()
    return f"`{text}`" if "{" in text or " " in text else f"the column `{text}`"


def _eval_table(run: RunDir) -> list[str]:
    from .evaluation import before_and_after, metric_names, shown_reward_name  # it imports weights, which imports this module

    evaluation = run.read_eval()
    if not evaluation.get("before") and not evaluation.get("after"):
        return ["This run was not scored on held-out prompts."]
    rows = [f"Mean reward on {evaluation.get('n_prompts', '?')} held-out prompts, greedy replies:", "",
            "| reward | before | after | change |", "|---|---:|---:|---:|"]
    metrics = metric_names(evaluation)
    for name, before, after in before_and_after(evaluation):
        change = f"{after - before:+.3f}" if before is not None and after is not None else "-"
        shown = shown_reward_name(name, metrics)
        rows.append(f"| {f'**{shown}**' if name is None else shown} | "
                    + " | ".join("-" if v is None else f"{v:.3f}" for v in (before, after)) + f" | {change} |")
    return rows


def _settings(config: RunConfig, status: RunStatus) -> list[tuple[str, str]]:
    lora = (f"r {config.lora.r}, alpha {config.lora.alpha}, dropout {config.lora.dropout:g}" if config.lora.enabled
            else "off (every weight trained)")
    steps = (f"{config.training.max_steps} steps" if config.training.max_steps else
             f"{config.training.epochs:g} epoch{'s' if config.training.epochs != 1 else ''}")
    return [
        ("starting model", _loadable(config.model.id.strip()) + (f" @ {config.model.revision}" if config.model.revision else "")),
        ("LoRA", lora),
        ("completions per prompt (group size)", str(config.grpo.group_size)),
        ("prompts per step", str(config.training.batch_size * config.training.grad_accum)),
        ("learning rate", f"{config.training.learning_rate:g}"),
        ("KL penalty (beta)", f"{config.grpo.beta:g}"),
        ("temperature", f"{config.grpo.temperature:g}"),
        ("max new tokens", str(config.grpo.max_new_tokens)),
        ("loss", config.grpo.loss_type),
        ("GRPO variants", ", ".join(f"{name} {value}" for name, value in config.grpo.changed_variants().items())
         or "TRL's defaults"),
        ("training length", str(steps)),
        ("steps trained", f"{status.get('step', '-')} of {status.get('total_steps') or '?'}"),
    ]


def _load_snippet(run: RunDir, config: RunConfig, adapter: bool, repo_id: str | None, root: str,
                  earlier: list[Stage]) -> list[str]:
    here = repo_id or "path/to/this/folder"
    if not adapter:
        return ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                f"model = AutoModelForCausalLM.from_pretrained({here!r})",
                f"tokenizer = AutoTokenizer.from_pretrained({here!r})", *_chat_lines(run, config), "```"]
    base = "merged-earlier-runs" if earlier else _loadable(root)
    lines = []
    if earlier:
        lines += [f"First merge the earlier runs (`dragon merge runs/{earlier[-1].run_id} --to merged-earlier-runs` on "
                  "the machine that has them); that folder is the base below.", ""]
    return lines + ["```python", "from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer",
                    "", f"base = AutoModelForCausalLM.from_pretrained({base!r})",
                    f"model = PeftModel.from_pretrained(base, {here!r})",
                    f"tokenizer = AutoTokenizer.from_pretrained({here!r})",
                    "model = model.merge_and_unload()  # optional: a plain transformers model, as fast as the base",
                    *_chat_lines(run, config), "```"]


def _chat_lines(run: RunDir, config: RunConfig) -> list[str]:
    from .trained import example_prompt

    messages, _ = example_prompt(run)
    return ["", f"messages = {json.dumps(messages, ensure_ascii=False)}",
            "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors='pt', "
            "return_dict=True)",
            f"reply = model.generate(**inputs, max_new_tokens={config.grpo.max_new_tokens})",
            "print(tokenizer.decode(reply[0, inputs['input_ids'].shape[1]:], skip_special_tokens=True))"]


def _training_facts(status: RunStatus) -> list[str]:
    from ..runstore import format_seconds

    device = status.get("device", "?")
    threads = status.get("cpu_threads")
    where = status.get("gpu_name") or (f"CPU, {threads} thread{'s' if threads != 1 else ''}" if threads else device)
    facts = [f"- Hardware: {where} ({device}, {status.get('dtype', '?')})"]
    if status.get("world_size", 1) > 1:
        facts.append(f"- Processes: {status['world_size']}")
    started, finished = status.get("started_at"), status.get("finished_at")
    if started and finished:
        facts.append(f"- Took {format_seconds(finished - started)} from start to finish, "
                     f"{format_seconds(status.get('elapsed_s') or 0)} of it training")
    versions = status.get("versions") or {}
    if versions:
        facts.append("- Libraries: " + ", ".join(f"{name} {version}" for name, version in sorted(versions.items())))
    return facts


def _plot_reward_curve(run: RunDir, target: Path) -> bool:
    """The mean reward per step, total and per reward, and the held-out checks, as a PNG; False (and no file) when
    nothing was logged."""
    points = [row for row in run.read_progress() if "reward" in row and "step" in row]
    if not points:
        target.unlink(missing_ok=True)
        return False
    import matplotlib

    matplotlib.use("Agg")  # no screen needed; the card is written from the training thread
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 3.6), dpi=110)
    axes = figure.add_subplot()
    steps = [row["step"] for row in points]
    axes.plot(steps, [math.nan if row["reward"] is None else row["reward"] for row in points], label="total (weighted)", linewidth=2.2, color="#059669")
    for name in sorted({name for row in points for name in row.get("rewards") or {}}):
        series = [(row["step"], value) for row in points
                  if (value := value_at(row, reward_key(name))) is not None]
        axes.plot(*zip(*series), label=name, linewidth=1.2, alpha=0.85)
    checks = [(row["step"], row["reward"]) for row in run.read_heldout() if row.get("reward") is not None]
    if checks:
        axes.plot(*zip(*checks), label="held-out (total)", linewidth=1.6, linestyle="--", marker="o", color="#111827")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("step")
    axes.set_ylabel("mean reward")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize=8)
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target)
    return True
