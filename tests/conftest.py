"""Shared fixtures: a tiny random Llama with a locally trained tokenizer (no Hub), and small run configs.

The model has hidden size 16 and 2 layers, like TRL's own test models, so a GRPO step takes well under a second.
"""

from __future__ import annotations

import csv
import os
import random
import time
from pathlib import Path

import pytest


os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never touch the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _corpus() -> list[str]:
    rng = random.Random(0)
    lines = [f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? Reply with just the number." for _ in range(200)]
    lines += [str(n) for n in range(200)] + ["The answer is", "<think>", "</think>", "<answer>", "</answer>", "{\"name\": 1}"]
    return lines


def build_tiny_model(target: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|end|>", pad_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def tiny_tool_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 taught to call a calculator (tests/tool_model.py): a random model never writes a tool call."""
    from tool_model import build_tiny_tool_model

    return build_tiny_tool_model(tmp_path_factory.mktemp("tiny-tool-qwen2"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    # Before any test loads a model: the speed-ups' self-checks (a few seconds, once per set of library versions)
    # would otherwise run inside the first test that does, among the calls it counts.
    from dragon_ui import speedups

    speedups.ensure_checked()
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def classifier_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A random two-label classifier (NEGATIVE, POSITIVE) that reads the tiny model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny-classifier")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                        id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_arithmetic_csv(path: Path, rows: int = 30, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["question", "answer"])
        for _ in range(rows):
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            writer.writerow([f"What is {a} + {b}? Reply with just the number.", a + b])
    return path


def uploaded_by(key: str, path: Path) -> str:
    """``path`` copied to where a public demo keeps the uploads of the visitor with this key (as the Data tab's
    upload puts it, Files.keep_upload); the copy's path, which that visitor alone may read."""
    import shutil

    from dragon_ui import public

    folder = demo(public.Visitor(key=key)).own_uploads_dir() / "test-upload"
    folder.mkdir(parents=True, exist_ok=True)
    return str(Path(shutil.copy(path, folder / Path(path).name)).resolve())


def environment_of(pid: int, timeout: float = 30) -> list[bytes]:
    """The environment of a process as the kernel shows it (/proc/<pid>/environ), one b"NAME=value" per entry.

    A process started a moment ago may still be inside execve: the kernel lets the parent go on (subprocess.Popen
    returns) once the old program is gone, and sets where the new program's environment lies a moment later; in
    between /proc shows it empty. So this waits until the kernel has set it (a busy machine widens the moment)."""
    deadline = time.monotonic() + timeout
    while True:
        entries = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        if entries != [b""] or time.monotonic() > deadline:
            return entries
        time.sleep(0.01)


def turn_public_mode_on(monkeypatch, model_dir: Path) -> None:
    """DRAGON_UI_PUBLIC=1 for this test, with ``model_dir`` on the allow-list (as an owner would add a model) and
    every limit at its default."""
    from dragon_ui import public

    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv(public.MODELS_ENV, str(model_dir))
    monkeypatch.delenv(public.CLASS_CODE_ENV, raising=False)
    for env, _, _ in public.Limits.documented():
        monkeypatch.delenv(env, raising=False)


def demo(who=None):
    """The policy the app would build from this test's environment: a public demo's where a fixture turned public
    mode on (each limit the test set, the runs folder the runs_dir fixture chose), else the laptop's; asked by
    ``who`` (a public.Visitor), else by nobody."""
    from dragon_ui.system.disk import resolve_runs_dir
    from dragon_ui.public import NOBODY, Policy

    return Policy.from_env(resolve_runs_dir()).asked_by(who or NOBODY)


def ended(run, timeout: float = 120) -> str:
    """The state ``run`` ended in, once the training process this app runs it in (if any) has finished. Asking
    ``active_runs()`` after a stop races the run: one stopped at its first step may have ended already."""
    from dragon_ui.engine import training

    for handle in training.active_runs():
        if handle.run.id == run.id:
            handle.wait(timeout)
    return run.read_status().get("state", "unknown")


def stop_the_training() -> None:
    """Stop the trainings this app started that still run, and wait for them to save and end."""
    from dragon_ui.engine import training

    handles = training.active_runs()
    for handle in handles:
        handle.stop()
    for handle in handles:
        handle.wait(120)


@pytest.fixture(scope="session")
def training_processes(tiny_model_dir):
    """The app's training processes (engine/workers.py), shared by the tests' Studios as one app's are by its runs:
    a worker warms up (the libraries and the tiny model) while the tests before its run go on, so a Start trains at
    once. ``training_processes(public)``: a public demo's, whose workers hold no Hub token."""
    from dragon_ui.config import HardwareSettings, ModelConfig
    from dragon_ui.engine.workers import Workers

    pools: dict[bool, Workers] = {}

    def pool(public: bool) -> Workers:
        if public not in pools:
            pools[public] = Workers(hub_token=not public, side_by_side=public)
            pools[public].warm((ModelConfig(id=str(tiny_model_dir)), HardwareSettings(device="cpu")))
        return pools[public]

    yield pool
    for workers in pools.values():
        workers.close()


@pytest.fixture
def studio(runs_dir, training_processes):
    """The app's backend on a temporary runs folder, under the policy of the test's environment (public mode where
    a fixture listed before it turned it on), training in the session's warm processes; fails the test if it leaves
    a training behind."""
    from dragon_ui.engine import training
    from dragon_ui.studio.backend import Studio

    policy = demo()
    studio = Studio(runs_dir=runs_dir, policy=policy, workers=training_processes(policy.public))
    yield studio
    stop_the_training()
    assert not training.active_runs()


@pytest.fixture
def app(studio):
    from dragon_ui.ui import build_app

    return build_app(studio)


def handler(app, api_name: str):
    """The Python function behind the app's event with this api_name, to call it directly in a test."""
    (fn,) = [block_fn.fn for block_fn in app.fns.values() if block_fn.api_name == api_name]
    return fn


@pytest.fixture
def runs_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "runs"
    monkeypatch.setenv("DRAGON_UI_RUNS_DIR", str(path))
    return path


def tiny_config(model_dir: Path, data_dir: Path, runs_dir: Path) -> dict:
    """A complete, fast run config on the tiny model: 2 steps of 2 prompts x 2 completions x 6 tokens on the CPU."""
    data = write_arithmetic_csv(data_dir / "arithmetic.csv")
    return {
        "name": "tiny",
        "model": {"id": str(model_dir)},
        "data": {"source": str(data), "prompt": "question", "reference": "answer", "eval_frac": 0.2},
        "rewards": [{"kind": "numeric"}, {"kind": "length", "max_chars": 12, "weight": 0.3}],
        "grpo": {"group_size": 2, "max_new_tokens": 6},
        "training": {"batch_size": 2, "max_steps": 2, "save_steps": 1, "learning_rate": 0.01},
        "lora": {"r": 4, "alpha": 8},
        "hardware": {"device": "cpu", "cpu_threads": 1},
        "n_samples": 3,
        "runs_dir": str(runs_dir),
    }


@pytest.fixture
def tiny_config_dict(tiny_model_dir, tmp_path, runs_dir) -> dict:
    return tiny_config(tiny_model_dir, tmp_path, runs_dir)


@pytest.fixture(scope="session")
def _trained_tiny_run(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny LoRA run trained to the end once per test session, in float32 (so replies can be compared token for
    token); finished_run hands each test its own copy."""
    from dragon_ui.config import RunConfig
    from dragon_ui.engine import training
    from dragon_ui.public import LAPTOP

    folder = tmp_path_factory.mktemp("trained")
    config = tiny_config(tiny_model_dir, folder, folder / "runs")
    config["hardware"]["dtype"] = "float32"
    run = training.train_config(RunConfig.from_dict(config, policy=LAPTOP), policy=LAPTOP)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    return run.path


@pytest.fixture
def finished_run(_trained_tiny_run, runs_dir):
    """A tiny LoRA run trained to the end: a copy of the session's, in this test's runs folder (its config says so),
    so a test may change, resume or re-evaluate it freely. Its RunDir."""
    import json
    import shutil

    from dragon_ui.config import RunConfig
    from dragon_ui.public import LAPTOP
    from dragon_ui.runstore import RunDir

    copy = runs_dir / _trained_tiny_run.name
    shutil.copytree(_trained_tiny_run, copy)
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))
    config["runs_dir"] = str(runs_dir)
    (copy / "config.json").write_text(json.dumps(RunConfig.from_dict(config, policy=LAPTOP).to_dict()), encoding="utf-8")
    return RunDir(copy)


def stop_after_last_checkpoint(run) -> tuple[dict, list]:
    """Turn a finished run into what a stop after its last checkpoint leaves: no adapter/ folder, no "after" score.

    Returns the original eval.json and samples.json contents, so a test can check that re-scoring gives them back.
    """
    import json
    import shutil

    original_eval, original_samples = run.read_eval(), run.read_samples()
    shutil.rmtree(run.adapter_dir)
    evaluation = {k: v for k, v in original_eval.items() if k not in ("after", "improvement")}
    run.eval_path.write_text(json.dumps(evaluation), encoding="utf-8")
    samples = [{k: v for k, v in sample.items() if k != "after"} for sample in original_samples]
    run.samples_path.write_text(json.dumps(samples), encoding="utf-8")
    run.update_status(state="cancelled", heldout_after=None)
    return original_eval, original_samples



def strengthen_adapter(run) -> None:
    """Give the run's adapters (final and checkpoints) large random LoRA B weights, seeded.

    Two GRPO steps on the random tiny model barely move an adapter (its B matrices start at zero), so "the trained
    model" would answer exactly like the starting one; tests that must tell the two sides apart use this instead.
    """
    import torch
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(0)
    for path in sorted(run.path.glob("**/adapter_model.safetensors")):
        weights = load_file(path)
        for name, tensor in weights.items():
            if "lora_B" in name:
                weights[name] = torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
        save_file(weights, path, metadata={"format": "pt"})


def openmp_threads_around(action) -> tuple[int, int, object]:
    """(OpenMP workers a fresh thread's parallel torch work started, how many of them are left after ``action()``,
    its result): the workers are the threads that appeared during that work, told apart by their ids, so other
    threads of the test process starting or ending meanwhile change nothing (Linux only). Waits up to 5 s for them
    to end."""
    import threading
    import time

    import torch

    found = {}

    def tasks() -> set[str]:
        return set(os.listdir("/proc/self/task"))

    def busy_then_act():
        before = tasks()
        torch.set_num_threads(2)
        weights = torch.randn(512, 512)
        for _ in range(5):
            weights @ weights
        workers = tasks() - before
        found["busy"] = len(workers)
        found["result"] = action()
        deadline = time.monotonic() + 5
        while workers & tasks() and time.monotonic() < deadline:
            time.sleep(0.01)
        found["after"] = len(workers & tasks())

    worker = threading.Thread(target=busy_then_act)
    worker.start()
    worker.join()
    return found["busy"], found["after"], found["result"]


def said(text: str) -> list[tuple[str, str]]:
    """What the messages in ``text`` (Markdown from ``ui.common.message``, one per paragraph) mean: (kind, words)
    each, whatever icon draws the kind; a paragraph that is no message has the kind None."""
    from dragon_ui.ui.common import MESSAGE_ICONS

    meanings = []
    for paragraph in text.split("\n\n"):
        kind = next((kind for kind, icon in MESSAGE_ICONS.items() if paragraph.startswith(icon + " ")), None)
        meanings.append((kind, paragraph.removeprefix(f"{MESSAGE_ICONS[kind]} ") if kind else paragraph))
    return meanings

