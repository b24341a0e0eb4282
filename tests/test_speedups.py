"""The speed-ups change how fast a step runs, never what it computes: each is checked against the slow path."""

from __future__ import annotations

import pytest
import torch

from dragon_ui import speedups
from dragon_ui.errors import ConfigError


@pytest.mark.parametrize("setting, expected", [
    (None, set(speedups.ALL)),
    ("", set(speedups.ALL)),
    ("all", set(speedups.ALL)),
    ("none", set()),
    ("contiguous_lm_head", {"contiguous_lm_head"}),
    (" completion_logprobs , sampling_without_dropout ", {"completion_logprobs", "sampling_without_dropout"}),
])
def test_the_environment_variable_chooses_the_speedups(monkeypatch, setting, expected):
    if setting is None:
        monkeypatch.delenv(speedups.ENV, raising=False)
    else:
        monkeypatch.setenv(speedups.ENV, setting)
    assert {name for name in speedups.ALL if speedups.enabled(name)} == expected


def test_an_unknown_speedup_name_is_an_error_that_lists_the_known_ones(monkeypatch):
    monkeypatch.setenv(speedups.ENV, "contiguous_lm_head,turbo")
    with pytest.raises(ConfigError, match="turbo.*known: completion_logprobs"):
        speedups.enabled("contiguous_lm_head")


def _tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_completion_only_logprobs_equal_the_all_positions_ones_with_their_gradients(tiny_model_dir, monkeypatch):
    from trl.kernels import chunked_logprob
    from trl.trainer import utils
    from trl.trainer.utils import add_fused_lm_head

    monkeypatch.setattr(utils, "_use_triton", chunked_logprob._use_triton)  # TRL's choice, whatever ran before
    model = _tiny(tiny_model_dir)
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    input_ids = torch.randint(5, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0  # left padding, as in a GRPO batch
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-5] = -100  # only the last 5 tokens are the completion

    def logprobs_and_grads():
        model.zero_grad()
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        (out.log_probs.sum() + out.entropy[:, -5:].sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return out.log_probs[:, -5:].detach(), out.entropy[:, -5:].detach(), grads

    all_positions = logprobs_and_grads()
    assert not utils._use_triton(torch.device("cpu"))  # TRL's own choice on the CPU: score every position
    speedups.score_completion_tokens_only()
    assert utils._use_triton(torch.device("cpu"))
    completions_only = logprobs_and_grads()
    torch.testing.assert_close(completions_only[0], all_positions[0])
    torch.testing.assert_close(completions_only[1], all_positions[1])
    for got, want in zip(completions_only[2], all_positions[2], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not chunked_logprob._use_triton(torch.device("cpu"))  # the kernel choice is TRL's, untouched


def test_contiguous_lm_head_input_gives_the_same_logits_and_generations(tiny_model_dir):
    model = _tiny(tiny_model_dir).eval()
    model.requires_grad_(False)  # frozen, as under LoRA: the case torch.matmul handles with a copy per sequence
    input_ids = torch.randint(5, model.config.vocab_size, (4, 9), generator=torch.Generator().manual_seed(1))
    hidden = torch.randn(4, 9, model.config.hidden_size)[:, -1:, :]  # the slice generation hands the head
    assert not hidden.is_contiguous()
    with torch.no_grad():
        before_logits = model.lm_head(hidden)
        before = model.generate(input_ids=input_ids, max_new_tokens=6, do_sample=False)
        seen = []
        speedups.contiguous_lm_head_input(model)
        speedups.contiguous_lm_head_input(model)  # a second call adds nothing
        model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0].is_contiguous()))
        torch.testing.assert_close(model.lm_head(hidden), before_logits)
        after = model.generate(input_ids=input_ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(before, after)
    assert seen and all(seen)
    assert len(model.lm_head._forward_pre_hooks) == 2  # ours once, plus the one this test added


def test_sampling_mode_turns_dropout_off_then_restores_the_mode(tiny_model_dir):
    model = _tiny(tiny_model_dir).train()
    with speedups.sampling_mode(model):
        assert not model.training
        assert not any(module.training for module in model.modules())
    assert all(module.training for module in model.modules())
    model.eval()
    with pytest.raises(RuntimeError), speedups.sampling_mode(model):
        raise RuntimeError("generation failed")
    assert not model.training  # put back as it was, even after an error


def test_sampling_mode_does_nothing_when_its_speedup_is_off(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(speedups.ENV, "none")
    model = _tiny(tiny_model_dir).train()
    with speedups.sampling_mode(model):
        assert model.training


@pytest.mark.parametrize("setting, sampled_in_training_mode", [("all", False), ("none", True)])
def test_a_run_samples_its_completions_in_eval_mode(tiny_config_dict, monkeypatch, setting, sampled_in_training_mode):
    """End to end: what the trainer's model looks like each time transformers' generate runs during a real run."""
    from transformers import GenerationMixin

    from dragon_ui import training
    from dragon_ui.config import RunConfig

    monkeypatch.setenv(speedups.ENV, setting)
    modes = []
    original = GenerationMixin.generate

    def recording_generate(self, *args, **kwargs):
        modes.append(self.training)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", recording_generate)
    tiny_config_dict["data"]["eval_frac"] = 0.0  # only the trainer generates
    tiny_config_dict["training"]["max_steps"] = 1
    handle = training.start(RunConfig.from_dict(tiny_config_dict))
    handle.wait(timeout=240)
    assert handle.run.read_status()["state"] == "succeeded", handle.run.read_status().get("error")
    assert modes and all(mode == sampled_in_training_mode for mode in modes)
    row = handle.run.read_progress()[0]
    assert row["completion_len"] is not None and row["clipped_ratio"] is not None  # TRL filed them as training metrics
