"""The classifier reward kind: a tiny random sequence-classification model made here, scored as transformers scores
it, by label name or index, probability or logit, in batches; refused in a public demo unless the owner offers it;
in the estimate, the playground and a short training on the CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertForSequenceClassification

from dragon_ui.config import RunConfig
from dragon_ui.engine.reward_models import classifiers_on, load_classifier
from dragon_ui.errors import ConfigError
from dragon_ui.rewards import build_rewards, parse_rewards, reward_rule, score_completion, score_completions
from dragon_ui.public import LAPTOP

pytestmark = pytest.mark.timeout(300)
REPLIES = ["What is 12 + 30?", "42", "The answer is 42", "", "12 12 12 12 12 12 12 12 12 12 12 12 12 12"]
LONG = "What is 12 + 30? " * 40  # longer than the tiny classifier's 64 positions: read up to them


def direct_logits(folder: Path, text: str) -> list[float]:
    """transformers on its own, one reply at a time (up to the model's 64 positions; the tiny tokenizer adds no
    special tokens, so an empty reply is read as its pad token: a model cannot read zero tokens)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = BertForSequenceClassification.from_pretrained(folder).eval()
    with torch.inference_mode():
        inputs = tokenizer([text or tokenizer.pad_token], return_tensors="pt", truncation=True, max_length=64)
        return model(**inputs).logits[0].tolist()


def classifier_reward(folder: Path, **settings):
    specs = parse_rewards([{"kind": "classifier", "model": str(folder), **settings}], policy=LAPTOP)
    return build_rewards(specs, classifiers=classifiers_on("cpu"), policy=LAPTOP)


@pytest.mark.parametrize("label, output, index", [("POSITIVE", "probability", 1), ("negative", "probability", 0),
                                                  ("1", "logit", 1), (0, "logit", 0)])
def test_each_score_is_the_labels_probability_or_logit(classifier_dir, label, output, index):
    rewards = classifier_reward(classifier_dir, label=label, output=output)
    for reply in [*REPLIES, LONG]:
        logits = direct_logits(classifier_dir, reply)
        expected = logits[index] if output == "logit" else math.exp(logits[index]) / sum(map(math.exp, logits))
        assert score_completion(rewards, reply).scores["classifier"] == pytest.approx(expected, abs=1e-5)


def test_a_batch_is_scored_in_one_go_and_agrees_with_one_at_a_time(classifier_dir, monkeypatch):
    rewards = classifier_reward(classifier_dir, label="POSITIVE")
    one_by_one = [score_completion(rewards, reply).scores["classifier"] for reply in REPLIES]
    classifier = load_classifier(str(classifier_dir), "cpu")
    asked = []
    original = type(classifier).logits
    monkeypatch.setattr(type(classifier), "logits", lambda self, texts: asked.append(len(texts)) or original(self, texts))
    count = len(REPLIES)
    batched = score_completions(rewards, REPLIES, [None] * count, [""] * count, [{}] * count)
    assert asked == [len(REPLIES)]  # one call for the whole batch (padding included), none per reply
    assert [result.scores["classifier"] for result in batched] == pytest.approx(one_by_one, abs=1e-5)
    assert load_classifier(str(classifier_dir), "cpu") is classifier  # loaded once


def test_settings_are_checked_with_the_field_named(classifier_dir):
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.model is missing"):
        parse_rewards([{"kind": "classifier", "label": "POSITIVE"}], policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.label is missing"):
        parse_rewards([{"kind": "classifier", "model": "x/y"}], policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.output 'odds' is not one of: probability, logit"):
        parse_rewards([{"kind": "classifier", "model": "x/y", "label": "1", "output": "odds"}], policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.label 'JOY' is not a label of .*; its labels are: "
                                          r"0 NEGATIVE, 1 POSITIVE"):
        classifier_reward(classifier_dir, label="JOY")
    with pytest.raises(ConfigError, match="holds no model"):
        classifier_reward(classifier_dir.parent, label="1")  # a folder without a model in it
    with pytest.raises(ConfigError, match="is not a label of"):
        classifier_reward(classifier_dir, label="²")  # a digit to isdigit(), not to int()
    assert reward_rule(parse_rewards([{"kind": "classifier", "model": "m", "label": "POSITIVE"}], policy=LAPTOP)[0]) == \
        "m says POSITIVE (its probability)"


def test_a_language_model_is_not_taken_for_a_classifier(tiny_model_dir):
    """It would load, with a random classification head: scores that are noise."""
    with pytest.raises(ConfigError, match="is not a sequence-classification model .*LlamaForCausalLM.*untrained"):
        classifier_reward(tiny_model_dir, label="1")


def test_check_finds_a_wrong_label_before_the_run_starts(tiny_config_dict, classifier_dir):
    from dragon_ui.engine import training

    tiny_config_dict["rewards"] = [{"kind": "classifier", "model": str(classifier_dir), "label": "JOY"}]
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.label 'JOY' is not a label"):
        training.inspect(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)


def test_rewards_naming_one_classifier_share_its_forward_pass(classifier_dir, monkeypatch):
    specs = parse_rewards([{"kind": "classifier", "name": f"c{i}", "model": str(classifier_dir), "label": "1"}
                           for i in range(5)], policy=LAPTOP)
    rewards = build_rewards(specs, classifiers=classifiers_on("cpu"), policy=LAPTOP)
    classifier = load_classifier(str(classifier_dir), "cpu")
    passes = []
    original = type(classifier.model).forward
    monkeypatch.setattr(type(classifier.model), "forward",
                        lambda self, *args, **kwargs: passes.append(1) or original(self, *args, **kwargs))
    replies = [f"{reply}!" for reply in REPLIES]  # not the batch another test left in the classifier's memory
    count = len(replies)
    results = score_completions(rewards, replies, [None] * count, [""] * count, [{}] * count)
    assert len(passes) == 1 and len({result.scores["c0"] for result in results}) > 1
    assert all(len(set(result.scores.values())) == 1 for result in results)


def test_without_a_loader_it_fails_on_each_reply_in_words():
    rewards = build_rewards(parse_rewards([{"kind": "classifier", "model": "x/y", "label": "1"}], policy=LAPTOP), policy=LAPTOP)
    assert "the classifier model is not loaded here" in score_completion(rewards, "hi").errors["classifier"]


def test_a_public_demo_offers_only_the_classifiers_its_owner_lists(classifier_dir):
    from dragon_ui.public import LAPTOP, Limits, Policy

    settings = [{"kind": "classifier", "model": str(classifier_dir), "label": "POSITIVE"}]
    specs = parse_rewards(settings, policy=LAPTOP)  # the settings themselves are fine anywhere
    build_rewards(specs, policy=LAPTOP)
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.model .* is not offered as a classifier in this public "
                                          r"demo; it offers none .*DRAGON_UI_PUBLIC_CLASSIFIERS"):
        build_rewards(specs, policy=Policy(limits=Limits()))  # where it would be loaded
    (reward,) = build_rewards(specs, policy=Policy(limits=Limits(), classifiers=("org/other", str(classifier_dir))))
    assert reward.name == "classifier"


def test_a_public_run_uses_one_classifier_model(tiny_config_dict, classifier_dir, monkeypatch):
    from dragon_ui.engine import public_checks
    from dragon_ui.public import Limits, Policy

    demo = Policy(limits=Limits(), classifiers=("org/other", str(classifier_dir)),
                  runs_dir=tiny_config_dict["runs_dir"])  # the demo's runs folder, which the config names
    monkeypatch.setattr(public_checks, "check_model", lambda model, policy: None)  # the tiny model is not offered
    tiny_config_dict["rewards"] = [{"kind": "classifier", "name": f"c{i}", "model": model, "label": "1"}
                                   for i, model in enumerate(("org/other", str(classifier_dir)))]
    with pytest.raises(ConfigError, match="The rewards use 2 classifier models; a run in this public demo may use one"):
        public_checks.check_run(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), reads_data=False, policy=demo)
    tiny_config_dict["rewards"][0]["model"] = "org/unlisted"
    with pytest.raises(ConfigError, match=r"rewards\[0\]\.model 'org/unlisted' is not offered as a classifier"):
        public_checks.check_run(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), reads_data=False, policy=demo)


def test_the_estimate_counts_the_classifiers_memory(tiny_config_dict, classifier_dir):
    from dragon_ui.engine.estimate import estimate_run
    from dragon_ui.engine.hardware import HardwareInfo, resolve_hardware

    info = HardwareInfo(cuda=[], mps=False, cpu_cores=2)
    plain = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    tiny_config_dict["rewards"].append({"kind": "classifier", "model": str(classifier_dir), "label": "POSITIVE"})
    with_classifier = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    probe = lambda dtype: 5e10  # noqa: E731 - any CPU speed
    before = estimate_run(plain, resolve_hardware(plain.hardware, info), info, probe=probe)
    after = estimate_run(with_classifier, resolve_hardware(with_classifier.hardware, info), info, probe=probe)
    parameters = sum(p.numel() for p in BertForSequenceClassification.from_pretrained(classifier_dir).parameters())
    assert after.memory.reward_models_gb == pytest.approx(parameters * 4 / 2**30, rel=0.25)
    assert after.memory.total_gb > before.memory.total_gb and "reward models" in after.describe()


def test_the_playground_scores_a_typed_reply_with_it(tiny_config_dict, classifier_dir):
    from dragon_ui.studio.playground import playground_rewards

    draft = {**tiny_config_dict, "rewards": [{"kind": "classifier", "model": str(classifier_dir), "label": "1"}]}
    score = score_completion(playground_rewards(draft, policy=LAPTOP), "42").scores["classifier"]
    logits = direct_logits(classifier_dir, "42")
    assert score == pytest.approx(math.exp(logits[1]) / sum(map(math.exp, logits)), abs=1e-5)


def test_a_short_cpu_training_is_scored_by_the_classifier(tiny_config_dict, classifier_dir):
    from dragon_ui.engine import training

    tiny_config_dict["rewards"] = [{"kind": "classifier", "model": str(classifier_dir), "label": "POSITIVE"}]
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    status = run.read_status()
    assert status["state"] == "succeeded", status.get("error")
    assert all(row["errors"]["classifier"] == 0 for row in run.read_progress())
    for record in run.read_rollouts():
        for group in record["groups"]:
            for completion in group["completions"]:
                logits = direct_logits(classifier_dir, completion["text"])
                expected = math.exp(logits[1]) / sum(map(math.exp, logits))
                assert completion["scores"]["classifier"] == pytest.approx(expected, abs=1e-4)
    evaluation = json.loads(run.eval_path.read_text())
    assert 0 < evaluation["after"]["reward_mean"] < 1
