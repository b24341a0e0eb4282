"""The speed-ups change how fast a step runs, never what it computes: each is checked against the slow path."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re

import pytest
import torch

from dragon_ui import speedups
from dragon_ui.speedups import attention, lm_head, lora_layers, registry, sampling, selfcheck, shared_prompts
from dragon_ui.public import LAPTOP


@pytest.fixture(autouse=True)
def choice_undone():
    """The process's choice of speed-ups (speedups.choose, which the entry points make) as it was, after each test
    (not through monkeypatch: a test may undo its own patches part way)."""
    chosen = registry._chosen_names
    yield
    registry._chosen_names = chosen


@pytest.mark.parametrize("setting, expected", [
    ("", set(speedups.ALL)),
    ("all", set(speedups.ALL)),
    ("none", set()),
    ("contiguous_lm_head", {"contiguous_lm_head"}),
    (" completion_logprobs , sampling_without_dropout ", {"completion_logprobs", "sampling_without_dropout"}),
])
def test_a_setting_chooses_the_speedups(setting, expected):
    speedups.choose(setting)
    assert {name for name in speedups.ALL if speedups.enabled(name)} == expected


def test_the_command_line_takes_the_environment_variable_and_refuses_an_unknown_name_as_it_starts(monkeypatch, capsys):
    from dragon_ui.cli import main

    monkeypatch.setenv(speedups.ENV, "contiguous_lm_head,turbo")
    assert main(["speedups", "--json"]) == 2
    assert re.search("turbo.*known: completion_logprobs", capsys.readouterr().err)
    monkeypatch.setenv(speedups.ENV, "none")
    assert main(["speedups", "--json"]) == 0
    assert not any(speedups.enabled(name) for name in speedups.ALL)


# ---------------------------------------------------------------------------------------------------------------
# The registry: a speed-up outside the library versions it was verified with, or one that raises, is off and the run
# goes on with the libraries' own code.


@pytest.fixture
def fresh_registry(monkeypatch, tmp_path):
    """The registry's per-process memory (versions read, reasons said, speed-ups switched off, self-checks' results),
    cleared around a test, and a cache folder of its own, so what one test switches off does not leak into the
    next."""
    speedups.choose("")
    monkeypatch.setenv("DRAGON_UI_CACHE", str(tmp_path / "cache"))

    caches = (registry.outside_verified, registry._say_off, registry.library_version,  # before a test replaces one
              registry.stack_key)

    def clear():
        registry._failed.clear()
        registry._checks.clear()
        for cached in caches:
            cached.cache_clear()

    clear()
    yield
    clear()


def test_every_speedup_declares_its_family_what_it_changes_and_the_versions_it_was_verified_with():
    import importlib

    assert tuple(registry.SPEEDUPS) == speedups.ALL
    for name, speedup in registry.SPEEDUPS.items():
        assert speedup.verified and {v.package for v in speedup.verified} <= {"torch", "trl", "transformers",
                                                                              "peft"}, name
        assert all(v.checked_on for v in speedup.verified), name
        assert speedup.changes and speedup.lasts, name
        family = importlib.import_module(f"dragon_ui.speedups.{speedup.family}")
        assert f"``{name}``" in family.__doc__, f"{family.__name__} does not explain {name}"


def test_with_the_installed_libraries_every_speedup_is_on(fresh_registry):
    assert speedups.status() == {"active": list(speedups.ALL), "disabled": {}}


@pytest.mark.parametrize("name", speedups.ALL)
def test_a_library_outside_the_verified_versions_turns_the_speedup_off_with_the_reason(name, fresh_registry,
                                                                                       monkeypatch, caplog):
    moved = registry.SPEEDUPS[name].verified[0].package
    real = registry.library_version
    monkeypatch.setattr(registry, "library_version", lambda package: "99.0" if package == moved else real(package))
    with caplog.at_level("INFO", logger=speedups.__name__):
        assert not speedups.enabled(name)
        speedups.enabled(name)  # asked again: said once
    reason = speedups.status()["disabled"][name]
    assert moved in reason and "found 99.0" in reason and "self-check has not run" in reason
    assert [r.getMessage() for r in caplog.records].count(
        f"Speed-up {name} is off ({reason}); the libraries' own code runs instead.") == 1
    others = [other for other, speedup in registry.SPEEDUPS.items()
              if moved not in {v.package for v in speedup.verified}]
    assert all(speedups.enabled(other) for other in others)


def test_a_local_build_tag_counts_as_its_release(fresh_registry, monkeypatch):
    real = registry.library_version
    monkeypatch.setattr(registry, "library_version", lambda package: "2.13.0+cu128" if package == "torch"
                        else real(package))
    assert speedups.enabled("lean_adapter_layers")


# ---------------------------------------------------------------------------------------------------------------
# The self-checks: each speed-up's identity, checked again on the libraries this machine has.


def test_every_self_check_passes_on_the_installed_libraries_and_is_kept(fresh_registry):
    results = selfcheck.run()
    assert set(results) == set(speedups.ALL) == set(selfcheck.CHECKS)
    assert {name for name, result in results.items() if not result["passed"]} == set(), results
    assert all(result["why"] is None and result["seconds"] >= 0 for result in results.values())
    kept = json.loads((registry.cache_dir() / registry.CHECKS_FILE).read_text())
    assert kept[registry.stack_key()]["results"] == results
    assert kept[registry.stack_key()]["versions"]["torch"] == registry.library_version("torch")


def _wrong_logprob_head(lm_head_module):
    """The lean head, off by a factor of 1.01 in its temperature: close, but not the same numbers."""
    right = lm_head_module.lean_logprob_head_class()

    class Off:
        @staticmethod
        def apply(hidden, weight, targets, factor, entropy):
            return right.apply(hidden, weight, targets, factor * 1.01, entropy)

    return lambda: Off


@pytest.mark.parametrize("name, owner, attribute, wrong, says", [
    ("inverse_cdf_sampling", sampling, "inverse_cdf_multinomial",
     lambda input, num_samples, *args, torch_multinomial, **kwargs: input.argmax(-1, keepdim=True), "distribution"),
    ("sparse_dropout", lora_layers, "dropped_positions",
     lambda size, p: torch.arange(0, size, 2), "drops 0.500 of the inputs"),
    ("lean_logprob_head", lm_head, "lean_logprob_head_class", _wrong_logprob_head(lm_head), "log-probs"),
    ("merged_sampling", lora_layers, "MERGED_SAMPLING_MEMORY_SHARE", 0.0, "were not merged"),
])
def test_a_self_check_fails_a_speedup_that_computes_something_else(name, owner, attribute, wrong, says,
                                                                   fresh_registry, monkeypatch):
    monkeypatch.setattr(owner, attribute, wrong)
    result = selfcheck.run((name,))[name]
    assert not result["passed"] and says in result["why"], result
    monkeypatch.undo()
    monkeypatch.setenv("DRAGON_UI_CACHE", str(registry.cache_dir()))
    assert not speedups.enabled(name)
    assert speedups.status()["disabled"][name] == f"its self-check failed on this machine's libraries: {result['why']}"


def test_a_self_check_that_raises_fails_with_the_error_in_a_sentence(fresh_registry, monkeypatch):
    def moved():
        raise AttributeError("'LlamaModel' object has no attribute 'embed_tokens'")

    monkeypatch.setitem(selfcheck.CHECKS, "shared_prompts", moved)
    result = selfcheck.run(("shared_prompts",))["shared_prompts"]
    assert result["why"] == "it raised AttributeError: 'LlamaModel' object has no attribute 'embed_tokens'"
    assert not speedups.enabled("shared_prompts") and speedups.enabled("completion_logprobs")


def _torch_release(monkeypatch, version: str) -> None:
    real = registry.library_version
    monkeypatch.setattr(registry, "library_version", lambda package: version if package == "torch" else real(package))
    registry.outside_verified.cache_clear()
    registry.stack_key.cache_clear()


def test_a_speedup_outside_the_verified_versions_is_on_once_its_self_check_passed_here(fresh_registry,
                                                                                       monkeypatch):
    _torch_release(monkeypatch, "2.99.0")
    torch_bound = [name for name, s in registry.SPEEDUPS.items() if "torch" in {v.package for v in s.verified}]
    assert not any(speedups.enabled(name) for name in torch_bound)
    assert speedups.enabled("completion_logprobs")  # TRL alone: inside its versions
    assert set(selfcheck.missing()) == set(speedups.ALL)
    selfcheck.ensure()
    assert selfcheck.missing() == () and speedups.status() == {"active": list(speedups.ALL), "disabled": {}}
    row = next(row for row in registry.table() if row["name"] == "lean_adapter_layers")
    assert row["on"] and "found 2.99.0; its self-check passed on this machine" in row["why"]


def test_self_checks_run_once_per_set_of_versions(fresh_registry, monkeypatch):
    ran = []
    for name, check in list(selfcheck.CHECKS.items()):
        monkeypatch.setitem(selfcheck.CHECKS, name, lambda check=check, name=name: ran.append(name) or check())
    selfcheck.ensure()
    assert sorted(ran) == sorted(speedups.ALL)
    registry._checks.clear()  # a new process: it reads the results kept on disk
    selfcheck.ensure()
    assert len(ran) == len(speedups.ALL)
    _torch_release(monkeypatch, "2.14.9")  # a new torch: checked again, the old results kept beside the new
    assert set(selfcheck.missing()) == set(speedups.ALL)
    selfcheck.ensure()
    assert len(ran) == 2 * len(speedups.ALL)
    assert len(json.loads((registry.cache_dir() / registry.CHECKS_FILE).read_text())) == 2


def test_a_cache_folder_that_cannot_be_written_still_gets_the_checks_for_this_process(fresh_registry, monkeypatch,
                                                                                      tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("DRAGON_UI_CACHE", str(blocked / "cache"))
    _torch_release(monkeypatch, "2.99.0")
    with caplog.at_level("WARNING", logger=speedups.__name__):
        selfcheck.ensure()
    assert selfcheck.missing() == () and speedups.enabled("lean_adapter_layers")
    assert any("could not be kept" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("kept", ['[1, 2]', '{"KEY": "nonsense"}', '{"KEY": {"results": {"shared_prompts": 1}}}',
                                  '{"KEY": {"results": {"shared_prompts": {"passed": "yes"}}}}', 'not json'])
def test_a_damaged_results_file_counts_as_not_checked_and_is_checked_again(kept, fresh_registry, monkeypatch):
    _torch_release(monkeypatch, "2.99.0")
    path = registry.cache_dir() / registry.CHECKS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(kept.replace("KEY", registry.stack_key()))
    assert set(selfcheck.missing()) == set(speedups.ALL) and not speedups.enabled("shared_prompts")
    selfcheck.ensure()
    assert selfcheck.missing() == () and speedups.enabled("shared_prompts")


def test_the_checks_run_in_the_background_while_a_model_loads_and_apply_waits_for_them(fresh_registry,
                                                                                        tiny_model_dir, monkeypatch):
    import threading

    release, threads = threading.Event(), []

    def slow_check():
        threads.append(threading.current_thread().name)
        release.wait(10)

    for name in speedups.ALL:
        monkeypatch.setitem(selfcheck.CHECKS, name, slow_check)
    speedups.start_checking()
    speedups.start_checking()  # a second start joins the first
    model = _tiny(tiny_model_dir)
    assert selfcheck.missing()  # still checking
    threading.Timer(0.3, release.set).start()
    speedups.apply_to_loaded_model(model)
    assert not selfcheck.missing() and set(threads) == {"dragon-speedup-checks"}


def test_the_self_checks_leave_the_random_numbers_and_the_libraries_as_they_found_them(fresh_registry):
    from trl.trainer import utils

    own = (torch.multinomial, utils._use_triton, utils._ChunkedLogProbFunction)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    selfcheck.run()
    assert torch.equal(torch.rand(3), expected)
    assert (torch.multinomial, utils._use_triton, utils._ChunkedLogProbFunction) == own


class _BrokenModel:
    """What a model looks like to a speed-up after a library moved: the attribute it relies on raises."""

    def __getattr__(self, name):
        raise AttributeError(f"'{name}' moved in this release")

    def modules(self):
        raise RuntimeError("modules() moved in this release")


@pytest.mark.parametrize("install, names", [
    (lm_head.contiguous_lm_head_input, ["contiguous_lm_head"]),
    (attention.short_sequence_attention, ["short_sequence_attention"]),
    (lora_layers.sparse_adapter_dropout, ["sparse_dropout"]),
    (lora_layers.lean_adapter_layers, ["lean_adapter_layers"]),
])
def test_an_installer_that_raises_switches_its_speedup_off_and_the_run_goes_on(install, names, fresh_registry,
                                                                               caplog):
    with caplog.at_level("WARNING", logger=speedups.__name__):
        assert install(_BrokenModel()) is None  # no exception reaches the run
    for name in names:
        assert not speedups.enabled(name)
        assert speedups.status()["disabled"][name].startswith(("it raised AttributeError", "it raised RuntimeError"))
    assert any("is off from now on" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("owner, attribute, names", [
    ("torch", "multinomial", ["inverse_cdf_sampling"]),
    ("trl.trainer.utils", "_use_triton", ["completion_logprobs"]),
    ("trl.trainer.utils", "_ChunkedLogProbFunction", ["cache_sized_logprob_tiles", "lean_logprob_head"]),
])
def test_a_library_function_that_moved_switches_its_speedup_off_and_the_step_runs(owner, attribute, names,
                                                                                  tiny_model_dir, fresh_registry,
                                                                                  monkeypatch):
    import importlib

    monkeypatch.delattr(importlib.import_module(owner), attribute)  # a release without it
    model = _tiny(tiny_model_dir)
    ran = []
    with speedups.sampling_mode(model), speedups.scoring_mode(model, prompt_length=3):
        ran.append(True)
    assert ran
    disabled = speedups.status()["disabled"]
    assert set(disabled) == set(names) and all(disabled[name].startswith("it raised AttributeError") for name in names)


def test_a_model_whose_attributes_moved_samples_without_the_speedups_that_read_them(fresh_registry):
    with speedups.sampling_mode(_BrokenModel()):
        pass
    assert set(speedups.status()["disabled"]) == {"sampling_without_dropout", "merged_sampling"}


def test_what_a_step_raises_is_the_steps_and_switches_nothing_off(tiny_model_dir, fresh_registry):
    model = _tiny(tiny_model_dir)
    with pytest.raises(KeyError), speedups.sampling_mode(model), speedups.scoring_mode(model, prompt_length=3):
        raise KeyError("a reward failed")
    assert speedups.status()["disabled"] == {}


def test_a_shared_prompt_pass_that_raises_falls_back_to_every_row_its_own(tiny_model_dir, fresh_registry,
                                                                          monkeypatch):
    model = _tiny(tiny_model_dir).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]] * 2 + [[5, 6, 7, 10, 11]] * 2)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits

    def moved(*args, **kwargs):
        raise TypeError("DynamicCache.batch_select_indices() got an unexpected keyword argument")

    monkeypatch.setattr(shared_prompts, "forward_sharing_prompts", moved)
    with torch.no_grad(), shared_prompts.scoring_shared_prompts(model, prompt_length=3):
        logits = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(logits, expected)
    assert speedups.status()["disabled"]["shared_prompts"].startswith("it raised TypeError")


def _tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_completion_only_logprobs_equal_the_all_positions_ones_with_their_gradients(tiny_model_dir, monkeypatch):
    from trl.kernels import chunked_logprob
    from trl.trainer import utils
    from trl.trainer.utils import add_fused_lm_head

    assert utils._use_triton is chunked_logprob._use_triton  # TRL's own: no earlier block left it replaced
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
    with lm_head.completion_tokens_only():
        assert utils._use_triton(torch.device("cpu"))
        completions_only = logprobs_and_grads()
    assert utils._use_triton is chunked_logprob._use_triton  # TRL's own again after the block
    torch.testing.assert_close(completions_only[0], all_positions[0])
    torch.testing.assert_close(completions_only[1], all_positions[1])
    for got, want in zip(completions_only[2], all_positions[2], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not chunked_logprob._use_triton(torch.device("cpu"))  # the kernel choice is TRL's, untouched


def _trl_logprob_function():
    """TRL's own fused log-prob function, as every test finds it: no earlier block left it replaced."""
    from trl import kernels
    from trl.trainer import utils

    assert utils._ChunkedLogProbFunction is kernels.ChunkedLogProbFunction
    return utils._ChunkedLogProbFunction


def test_cache_sized_logprob_tiles_give_the_same_logprobs_and_gradients(tiny_model_dir, monkeypatch):
    from trl.trainer import utils
    from trl.trainer.utils import add_fused_lm_head

    trl_function = _trl_logprob_function()
    widths = []
    original_apply = trl_function.apply

    def recording_apply(hidden, weight, bias, targets, temperature, chunk_size, *rest):
        widths.append(chunk_size)
        return original_apply(hidden, weight, bias, targets, temperature, chunk_size, *rest)

    monkeypatch.setattr(trl_function, "apply", recording_apply)
    model = _tiny(tiny_model_dir)
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    input_ids = torch.randint(5, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(4))

    def logprobs_and_grads():
        model.zero_grad()
        out = model(input_ids=input_ids, labels=input_ids, fused_lm_head=True)
        (out.log_probs.sum() + out.entropy.sum()).backward()
        return out.log_probs.detach(), out.entropy.detach(), model.lm_head.weight.grad.clone()

    one_tile = logprobs_and_grads()  # TRL's width is wider than the tiny vocabulary
    monkeypatch.setattr(lm_head, "CPU_LOGPROB_TILE", 7)  # many tiles, the last one partly filled
    with lm_head.cpu_logprob_head(), lm_head.cpu_logprob_head():  # nested blocks share one replacement
        many_tiles = logprobs_and_grads()  # a trained LM head: TRL's function with Dragon's tiles, not the lean head
    assert utils._ChunkedLogProbFunction is trl_function
    assert widths == [utils._CHUNKED_LOGPROB_CHUNK_SIZE, 7] and model.config.vocab_size % 7
    for got, want in zip(many_tiles, one_tile, strict=True):  # summed in another order: float32 rounding apart
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype, entropy_trained", [
    (torch.float32, False), (torch.float32, True), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_the_lean_logprob_head_matches_trls_log_probs_entropy_and_gradients(monkeypatch, dtype, entropy_trained):
    trl_function = _trl_logprob_function()
    monkeypatch.setattr(lm_head, "CPU_LOGPROB_TILE", 16)  # several tiles, the last one partly filled
    monkeypatch.setattr(lm_head, "LOGIT_GRADIENT_BLOCK_BYTES", 7 * 50 * 2)  # row blocks of 7, the last of 5
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(50, 24, generator=generator).to(dtype)  # frozen, as under LoRA
    hidden = torch.randn(19, 24, generator=generator).to(dtype)
    targets = torch.randint(0, 50, (19,), generator=generator)
    loss_weights = torch.randn(19, generator=generator)

    def head(function, *inputs):
        x = hidden.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logprobs, entropy = function(x, *inputs)[:2]
        loss = (logprobs * loss_weights).sum() + (entropy.sum() * 0.3 if entropy_trained else 0)
        loss.backward()
        return logprobs.detach(), entropy.detach(), x.grad

    want = head(lambda x, *a: trl_function.apply(x, weight, None, targets, 0.8, 16, None, 1.0, ("log_probs", "entropy")))
    got = head(lambda x: lm_head.lean_logprob_head_class().apply(x, weight, targets, 1 / 0.8, True))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # the same operations on the same numbers
    # TRL sums the gradient in float32 and rounds to bf16 once; the lean head's matmul does too, in another order
    tolerance = {"rtol": 1e-5, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-6}
    torch.testing.assert_close(got[2], want[2], **tolerance)


def test_the_lean_logprob_head_trains_a_model_like_trl_and_leaves_other_cases_to_it(tiny_model_dir, monkeypatch):
    from trl.trainer.utils import add_fused_lm_head

    _trl_logprob_function()
    model = _tiny(tiny_model_dir)
    model.lm_head.weight.requires_grad_(False)  # as under LoRA
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    input_ids = torch.randint(5, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(5))
    lean_calls = []
    lean_apply = lm_head.lean_logprob_head_class().apply
    monkeypatch.setattr(lm_head.lean_logprob_head_class(), "apply", lambda *a: lean_calls.append(1) or lean_apply(*a))

    def logprobs_and_grads():
        model.zero_grad()
        out = model(input_ids=input_ids, labels=input_ids, fused_lm_head=True)
        out.log_probs.sum().backward()
        return out.log_probs.detach(), out.entropy.detach(), model.model.norm.weight.grad.clone()

    trls = logprobs_and_grads()
    with lm_head.cpu_logprob_head():
        leans = logprobs_and_grads()
        assert lean_calls == [1]
        for got, want in zip(leans, trls, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

        model.lm_head.weight.requires_grad_(True)  # full fine-tuning trains the head: TRL's function's gradient
        assert logprobs_and_grads()[0].shape == trls[0].shape and lean_calls == [1]
        model.lm_head.weight.requires_grad_(False)
        speedups.choose("cache_sized_logprob_tiles")  # read on each call, in a running process
        torch.testing.assert_close(logprobs_and_grads()[0], trls[0])
        assert lean_calls == [1]


def test_the_lean_logprob_head_scores_an_empty_batch():
    weight = torch.randn(30, 8)
    hidden = torch.zeros(0, 8, requires_grad=True)
    logprobs, entropy = lm_head.lean_logprob_head_class().apply(hidden, weight, torch.zeros(0, dtype=torch.long), 1.0,
                                                                 True)
    logprobs.sum().backward()
    assert logprobs.shape == entropy.shape == (0,) and hidden.grad.shape == (0, 8)


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
        lm_head.contiguous_lm_head_input(model)
        lm_head.contiguous_lm_head_input(model)  # a second call adds nothing
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
    speedups.choose("none")
    model = _tiny(tiny_model_dir).train()
    with speedups.sampling_mode(model):
        assert model.training


def _draw_counts(probs: torch.Tensor, draws: int) -> torch.Tensor:
    """How often each token was drawn, in ``draws`` calls of generation's ``torch.multinomial(probs, num_samples=1)``."""
    rows = probs.expand(draws, -1)
    tokens = torch.multinomial(rows, num_samples=1)
    assert tokens.shape == (draws, 1) and tokens.dtype == torch.int64
    return torch.bincount(tokens.squeeze(1), minlength=probs.shape[-1])


def test_inverse_cdf_sampling_draws_from_the_same_distribution_as_torch(tiny_model_dir):
    probs = torch.softmax(torch.randn(1, 50, generator=torch.Generator().manual_seed(0)) * 2, dim=-1)
    probs[0, [3, 17, 49]] = 0.0  # filtered by top-k/top-p, including the last token: never to be drawn
    probs /= probs.sum()
    draws = 200_000
    torch.manual_seed(0)
    with speedups.sampling_mode(_tiny(tiny_model_dir)):
        assert torch.multinomial.__name__ == "multinomial"  # wrapped, so it still reads as torch's function
        counts = _draw_counts(probs, draws)
        one_row = torch.multinomial(probs[0], num_samples=1)
        assert one_row.shape == (1,)
    assert counts[[3, 17, 49]].sum() == 0
    expected = probs[0] * draws
    kept = expected > 0
    chi_square = (((counts - expected)[kept] ** 2) / expected[kept]).sum().item()
    assert chi_square < 100, chi_square  # 46 degrees of freedom: the 1-in-a-million bound is about 100
    torch_counts = _draw_counts(probs, draws)  # outside sampling_mode: torch's own sampler, the same frequencies
    assert (counts - torch_counts).abs().max().item() < 5 * (draws * probs.max().item()) ** 0.5


def test_torch_multinomial_is_replaced_only_while_something_samples(tiny_model_dir):
    """Not for good: a process that trained once must call torch's own multinomial again afterwards."""
    torchs = torch.multinomial
    model = _tiny(tiny_model_dir)
    with speedups.sampling_mode(model):
        assert torch.multinomial is not torchs
        with speedups.sampling_mode(model):  # nested (or another thread's) block: still replaced
            pass
        assert torch.multinomial is not torchs
    assert torch.multinomial is torchs
    with pytest.raises(KeyError), speedups.sampling_mode(model):
        raise KeyError("a failing generate")
    assert torch.multinomial is torchs and not getattr(sampling._sampling, "active", False)


def test_inverse_cdf_sampling_leaves_other_calls_and_invalid_tables_to_torch(tiny_model_dir):
    probs = torch.tensor([[0.2, 0.3, 0.5]])
    with speedups.sampling_mode(_tiny(tiny_model_dir)):
        assert torch.multinomial(probs, num_samples=3).sort().values.tolist() == [[0, 1, 2]]  # without replacement
        with pytest.raises(RuntimeError, match="probability tensor contains"):
            torch.multinomial(torch.tensor([[float("nan"), 1.0]]), num_samples=1)
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.zeros(1, 3), num_samples=1)
        drawn_elsewhere = []
        thread = __import__("threading").Thread(
            target=lambda: drawn_elsewhere.append(getattr(sampling._sampling, "active", False)))
        thread.start()
        thread.join()
        assert drawn_elsewhere == [False]  # only the thread that samples completions uses the inverse CDF
    assert not getattr(sampling._sampling, "active", False)


def test_sparse_dropout_drops_each_element_independently_at_the_set_rate():
    dropout = lora_layers.sparse_dropout_class()(0.3).train()
    x = torch.ones(400, 500)
    out = dropout(x)
    dropped = (out == 0).float()
    assert abs(dropped.mean().item() - 0.3) < 0.005
    assert abs(dropped.mean(0).std().item() - (0.3 * 0.7 / 400) ** 0.5) < 0.01  # columns vary as binomials do
    flat = dropped.flatten()
    assert abs((flat[1:] * flat[:-1]).mean().item() - 0.09) < 0.005  # neighbours independent: 0.3 x 0.3
    kept = out[out != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.7))  # the survivors scaled as nn.Dropout does


@pytest.mark.parametrize("p", [0.05, 0.5, 0.99])
def test_dropped_positions_cover_the_whole_range_whatever_the_rate(p):
    torch.manual_seed(1)
    positions = lora_layers.dropped_positions(10_000, p)
    assert positions.dtype == torch.int64
    assert positions.min().item() >= 0 and positions.max().item() < 10_000
    assert torch.equal(positions, positions.unique())  # sorted and distinct
    assert abs(len(positions) / 10_000 - p) < 5 * (p * (1 - p) / 10_000) ** 0.5
    assert positions.max().item() > 9_000  # no part of the range is left undrawn


def test_sparse_dropout_at_rate_zero_keeps_every_element():
    dropout = lora_layers.sparse_dropout_class()(0.1)
    dropout.p = 0.0  # e.g. a rate lowered after the swap
    x = torch.randn(4, 32)
    assert torch.equal(dropout(x), x)


def test_sparse_dropout_backward_zeroes_exactly_the_dropped_positions():
    dropout = lora_layers.sparse_dropout_class()(0.2).train()
    x = (torch.rand(6, 7, 9) + 0.5).transpose(0, 2).requires_grad_(True)  # not contiguous, as a slice can be
    weights = torch.randn(9, 7, 6)
    out = dropout(x)
    (out * weights).sum().backward()
    torch.testing.assert_close(x.grad, torch.where(out == 0, 0.0, weights / 0.8))
    assert dropout.eval()(x) is x  # eval mode: nothing dropped, nothing copied


def test_a_peft_model_gets_sparse_dropout_with_the_same_rate_and_the_same_adapter_file(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny(tiny_model_dir), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                                             target_modules="all-linear"))
    keys_before = set(model.state_dict())
    lora_layers.sparse_adapter_dropout(model)
    dropouts = [d for m in model.modules() if isinstance(getattr(m, "lora_dropout", None), torch.nn.ModuleDict)
                for d in m.lora_dropout.values()]
    assert dropouts and all(type(d) is lora_layers.sparse_dropout_class() and d.p == 0.1 for d in dropouts)
    assert set(model.state_dict()) == keys_before
    model.train()
    input_ids = torch.randint(5, model.config.vocab_size, (2, 8))
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("setting, sampled_in_training_mode, dropout_class", [
    ("all", False, "SparseDropout"), ("none", True, "Dropout")])
def test_a_run_samples_its_completions_in_eval_mode(tiny_config_dict, monkeypatch, setting, sampled_in_training_mode,
                                                     dropout_class):
    """End to end: what the trainer's model looks like each time transformers' generate runs during a real run."""
    from transformers import GenerationMixin

    from dragon_ui.config import RunConfig
    from dragon_ui.engine import training

    speedups.choose(setting)
    modes, dropouts = [], set()
    original = GenerationMixin.generate

    def recording_generate(self, *args, **kwargs):
        modes.append(self.training)
        dropouts.update(type(m).__name__ for m in self.modules() if isinstance(m, torch.nn.Dropout))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", recording_generate)
    tiny_config_dict["data"]["eval_frac"] = 0.0  # only the trainer generates
    tiny_config_dict["training"]["max_steps"] = 1
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    assert modes and all(mode == sampled_in_training_mode for mode in modes)
    assert dropouts == {dropout_class}
    row = run.read_progress()[0]
    assert row["completion_len"] is not None and row["clipped_ratio"] is not None  # TRL filed them as training metrics


def _attention_pair(tiny_model_dir, dtype=torch.bfloat16):
    """The tiny model twice with the same weights: on transformers' SDPA, and through short_sequence_attention."""
    from transformers import AutoModelForCausalLM

    sdpa = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    routed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    assert sdpa.config._attn_implementation == "sdpa"
    attention.short_sequence_attention(routed)
    assert routed.config._attn_implementation == attention.SHORT_ATTENTION
    return sdpa, routed


@pytest.fixture
def eager_calls(monkeypatch):
    """The query length of every call to the tiny (Llama) model's own eager attention."""
    from transformers.models.llama import modeling_llama

    calls, original = [], modeling_llama.eager_attention_forward

    def spy(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return original(module, query, *args, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", spy)
    return calls


def test_short_bf16_sequences_take_eager_attention_with_the_same_logits_and_gradients(tiny_model_dir, eager_calls):
    sdpa, routed = _attention_pair(tiny_model_dir)
    input_ids = torch.randint(5, sdpa.config.vocab_size, (3, 10), generator=torch.Generator().manual_seed(2))
    padded = torch.ones_like(input_ids)
    padded[0, :4] = 0  # left padding, as in a GRPO batch
    for attention_mask in (None, padded):  # no mask: SDPA's mask helper leaves the causal mask to the kernel
        eager_calls.clear()
        results = []
        for model in (sdpa, routed):
            model.zero_grad()
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
            logits.float().square().mean().backward()
            results.append((logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()))
        assert eager_calls == [10, 10]  # both layers of the routed model, none of the SDPA one
        keep = slice(None) if attention_mask is None else attention_mask.bool()
        torch.testing.assert_close(results[1][0][keep], results[0][0][keep], rtol=0.02, atol=0.02)
        torch.testing.assert_close(results[1][1], results[0][1], rtol=0.05, atol=1e-3)


def test_decoding_float32_and_long_batches_stay_on_sdpa(tiny_model_dir, eager_calls, monkeypatch):
    from transformers.integrations import sdpa_attention

    sdpa, routed = _attention_pair(tiny_model_dir)
    sdpa_masks, original = [], sdpa_attention.sdpa_attention_forward

    def spy(module, query, key, value, attention_mask, **kwargs):
        sdpa_masks.append((query.shape[2], None if attention_mask is None else attention_mask.dtype))
        return original(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", spy)
    input_ids = torch.randint(5, sdpa.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        generated = routed.generate(input_ids=input_ids, max_new_tokens=4, do_sample=False,
                                    return_dict_in_generate=True, output_scores=True)
        reference = sdpa(input_ids=generated.sequences).logits[:, 5:-1].float()
    assert eager_calls == [6, 6]  # the prompt's forward only; each new token is decoded by SDPA ...
    assert sdpa_masks == [(1, torch.bool)] * 6  # ... given a mask, its fast path in bf16
    torch.testing.assert_close(torch.stack(generated.scores, dim=1), reference, rtol=0.02, atol=0.02)
    eager_calls.clear()
    monkeypatch.setattr(attention, "EAGER_MAX_SCORES", 2 * 2 * 6 * 6 - 1)  # batch x heads x queries x keys
    with torch.no_grad():
        routed(input_ids=input_ids)
    assert eager_calls == []
    _, float32 = _attention_pair(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        float32(input_ids=input_ids)
    assert eager_calls == []  # SDPA is as fast as eager in float32 on the CPU


def test_a_model_that_chose_its_attention_keeps_it_and_saved_configs_never_name_dragons(tiny_model_dir, tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")
    attention.short_sequence_attention(eager)
    assert eager.config._attn_implementation == "eager"
    _, routed = _attention_pair(tiny_model_dir)
    routed.save_pretrained(tmp_path)
    assert "dragon" not in json.dumps(json.loads((tmp_path / "config.json").read_text()))


def test_dropped_positions_are_geometric_gaps_apart():
    torch.manual_seed(4)
    gaps = torch.diff(lora_layers.dropped_positions(2_000_000, 0.05))
    assert gaps.min().item() >= 1
    assert abs((gaps == 1).float().mean().item() - 0.05) < 0.005  # P(gap = 1) = p
    assert abs((gaps > 20).float().mean().item() - 0.95 ** 20) < 0.01  # P(gap > k) = (1 - p)^k
    assert abs(gaps.float().mean().item() - 20) < 0.5  # mean 1 / p


def _lora_pair(tiny_model_dir, dtype, dropout=0.1, sparse=True, alpha=8, **lora_kwargs):
    """A PEFT LoRA model (non-zero B, as after some training) and an identical copy with lean adapter layers; the
    default alpha / r = 2 takes the lean layer's power-of-two path."""
    import copy

    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny(tiny_model_dir).to(dtype),
                           LoraConfig(r=4, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear", **lora_kwargs))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5, generator=torch.Generator().manual_seed(len(name)))
    if sparse:
        lora_layers.sparse_adapter_dropout(model)
    lean = copy.deepcopy(model)
    lora_layers.lean_adapter_layers(lean)
    return model, lean


def _forward_backward(model, input_ids, seed, autocast):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks for both models
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=input_ids).logits
    logits.float().square().mean().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype, autocast, sparse, alpha", [
    (torch.bfloat16, True, True, 8),  # a bf16 CPU run: the input dropped out in bf16, without the fp32 round trip
    (torch.bfloat16, True, False, 8),  # torch's own dropout draws its mask per dtype, so the round trip stays
    (torch.float32, False, True, 8),
    (torch.float32, False, False, 8),
    (torch.bfloat16, True, True, 2),  # scaling 0.5: still a power of two, scaled in the rank-r middle
    (torch.bfloat16, True, True, 6),  # scaling 1.5: scaled on the output, as PEFT does
    (torch.float32, False, True, 6),
])
def test_lean_adapter_layers_give_bit_identical_logits_and_gradients(tiny_model_dir, dtype, autocast, sparse, alpha):
    peft_model, lean = _lora_pair(tiny_model_dir, dtype, sparse=sparse, alpha=alpha)
    assert type(lean.base_model.model.model.layers[0].self_attn.q_proj) is lora_layers.lean_lora_class()
    input_ids = torch.randint(5, peft_model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    for model in (peft_model, lean):
        model.train()
    (logits, grads), (lean_logits, lean_grads) = (_forward_backward(m, input_ids, 7, autocast) for m in (peft_model, lean))
    assert torch.equal(logits, lean_logits)
    assert grads.keys() == lean_grads.keys() and len(grads) == 2 * 7 * 2  # A and B of 7 layers in each of 2 blocks
    assert all(torch.equal(grads[name], lean_grads[name]) for name in grads)


def test_lean_adapter_layers_sample_and_score_the_reference_like_peft(tiny_model_dir):
    peft_model, lean = _lora_pair(tiny_model_dir, torch.bfloat16)
    input_ids = torch.randint(5, peft_model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    outputs = []
    for model in (peft_model, lean):
        with torch.no_grad():
            model.eval()  # sampling: no autocast, fp32 adapters on bf16 inputs
            torch.manual_seed(3)
            sampled = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                                     max_new_tokens=5, min_new_tokens=5, pad_token_id=0)
            with torch.autocast("cpu", dtype=torch.bfloat16), model.disable_adapter():  # TRL's reference pass
                reference = model(input_ids=input_ids).logits
            adapted = model(input_ids=input_ids).logits
        outputs.append((sampled, reference, adapted))
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
    assert not torch.equal(outputs[1][1], outputs[1][2])  # the adapters do change the logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_sampling_samples_the_adapted_weights_and_drops_them_after(tiny_model_dir, dtype):
    _, lean = _lora_pair(tiny_model_dir, dtype)
    input_ids = torch.randint(5, lean.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    layers = [module for module in lean.modules() if type(module) is lora_layers.lean_lora_class()]

    def logits(**switches):
        with torch.set_grad_enabled(switches.get("grad", False)):
            if switches.get("base"):
                with lean.disable_adapter():
                    return lean(input_ids=input_ids).logits.detach()
            return lean(input_ids=input_ids).logits.detach()

    for round_ in range(2):  # the second time with changed adapters, as after an optimizer step
        lean.eval()
        unmerged, base = logits(), logits(base=True)
        lean.train()
        with speedups.sampling_mode(lean):
            assert len(layers) == 14 and all(layer.sampling_weight is not None for layer in layers)
            merged, merged_base, scored = logits(), logits(base=True), logits(grad=True)
        assert lean.training and all(layer.sampling_weight is None for layer in layers)
        assert torch.equal(merged_base, base) and torch.equal(scored, unmerged)  # only sampling uses the merge
        # the same policy up to rounding (float32's, or bf16's in the merged weights): far from the base model's
        if dtype == torch.float32:
            torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)
        assert (merged - unmerged).abs().max() < 0.1 * (unmerged - base).abs().max()
        with torch.no_grad():
            for layer in layers:
                layer.lora_B["default"].weight.mul_(-1)


def test_merged_sampling_needs_the_memory_and_its_speedups(tiny_model_dir, monkeypatch):
    _, lean = _lora_pair(tiny_model_dir, torch.float32)

    def merged_layers():
        with speedups.sampling_mode(lean):
            return sum(getattr(module, "sampling_weight", None) is not None for module in lean.modules())

    assert merged_layers() == 14
    monkeypatch.setattr(lora_layers, "MERGED_SAMPLING_MEMORY_SHARE", 1e-9)
    assert merged_layers() == 0
    monkeypatch.setattr(lora_layers, "MERGED_SAMPLING_MEMORY_SHARE", 0.25)
    monkeypatch.setattr(lora_layers, "system_memory_gb", lambda: None)  # a platform that does not say
    assert merged_layers() == 0
    monkeypatch.undo()
    speedups.choose(",".join(name for name in speedups.ALL if name != "merged_sampling"))
    assert merged_layers() == 0
    speedups.choose("merged_sampling")  # sampling in training mode: dropout must apply
    assert merged_layers() == 0


def test_unusual_lora_layers_go_through_peft(tiny_model_dir):
    _, dora = _lora_pair(tiny_model_dir, torch.float32, use_dora=True)
    _, lean = _lora_pair(tiny_model_dir, torch.float32)
    x = torch.randn(2, 3, lean.config.hidden_size)
    layer = lean.base_model.model.model.layers[0].mlp.up_proj
    assert layer._lean_applies(x)
    assert not dora.base_model.model.model.layers[0].mlp.up_proj._lean_applies(x)  # DoRA: PEFT's variant code
    handle = layer.base_layer.register_forward_hook(lambda *args: None)
    assert not layer._lean_applies(x)  # hooks must run, so PEFT calls the module
    handle.remove()
    layer.merge()
    assert not layer._lean_applies(x)
    layer.unmerge()
    assert layer._lean_applies(x) and not layer._lean_applies(x.to("meta"))


def test_lean_adapter_layers_keep_the_adapter_file_and_can_be_turned_off(tiny_model_dir, monkeypatch, tmp_path):
    peft_model, lean = _lora_pair(tiny_model_dir, torch.float32)
    assert lean.state_dict().keys() == peft_model.state_dict().keys()
    lean.save_pretrained(tmp_path / "lean")
    peft_model.save_pretrained(tmp_path / "peft")
    configs = [json.loads((tmp_path / name / "adapter_config.json").read_text()) for name in ("lean", "peft")]
    for config in configs:
        config["target_modules"] = sorted(config["target_modules"])  # saved from a set, in any order
    assert configs[0] == configs[1]
    speedups.choose("none")
    _, untouched = _lora_pair(tiny_model_dir, torch.float32)
    assert not any(type(m) is lora_layers.lean_lora_class() for m in untouched.modules())


def _grouped_batch(vocab_size: int, prompt_len=9, completion_len=5, groups=2, group_size=3, seed=0):
    """A GRPO batch: ``groups`` left-padded prompts, each repeated for ``group_size`` completions (one cut short)."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, vocab_size, (groups, prompt_len), generator=generator)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[0, :3] = 0
    rows = groups * group_size
    input_ids = torch.cat([prompts.repeat_interleave(group_size, 0),
                           torch.randint(5, vocab_size, (rows, completion_len), generator=generator)], dim=1)
    attention_mask = torch.cat([prompt_mask.repeat_interleave(group_size, 0),
                                torch.ones(rows, completion_len, dtype=torch.long)], dim=1)
    attention_mask[1, -2:] = 0  # a completion that ended early
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :prompt_len] = -100
    return input_ids, attention_mask, labels


def _record_sharing(monkeypatch, name: str) -> list[bool]:
    """Each call of ``shared_prompts.<name>``: True where it shared prompts, False where it left the rows alone
    (None)."""
    calls = []
    original = getattr(shared_prompts, name)

    def recording(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(shared_prompts, name, recording)
    return calls


@pytest.fixture
def sharing_calls(monkeypatch):
    return _record_sharing(monkeypatch, "forward_sharing_prompts")


def _fused_tiny(tiny_model_dir, lora_dropout=None):
    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    model = _tiny(tiny_model_dir)
    add_fused_lm_head(model, temperature=0.8, outputs=("log_probs", "entropy"))
    if lora_dropout is not None:
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=lora_dropout, task_type="CAUSAL_LM",
                                                 target_modules="all-linear"))
        speedups.apply_to_trainer_model(model)
        model.train()
    return model


def _score(model, batch, prompt_len, shared, grad):
    """Log-probs, entropies and parameter gradients of the completions, as TRL's passes compute them."""
    input_ids, attention_mask, labels = batch
    model.zero_grad()
    with torch.set_grad_enabled(grad), lm_head.completion_tokens_only(), \
            (shared_prompts.scoring_shared_prompts(model, prompt_len) if shared else contextlib.nullcontext()):
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
    completion = slice(prompt_len, None)
    if grad:
        (out.log_probs.sum() + out.entropy[:, completion].sum()).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return out.log_probs[:, completion].detach(), out.entropy[:, completion].detach(), grads


@pytest.mark.parametrize("grad, lora_dropout, adapters", [
    (False, None, True), (True, None, True), (True, 0.0, True), (False, 0.1, False)])
def test_shared_prompts_score_completions_like_full_rows_with_the_same_gradients(tiny_model_dir, sharing_calls, grad,
                                                                                  lora_dropout, adapters):
    """Without a model, with dropout-free adapters, and with dropping adapters switched off (TRL's reference pass)."""
    model = _fused_tiny(tiny_model_dir, lora_dropout)
    batch = _grouped_batch(model.config.vocab_size)
    with contextlib.nullcontext() if adapters else model.disable_adapter():
        full = _score(model, batch, 9, shared=False, grad=grad)
        shared = _score(model, batch, 9, shared=True, grad=grad)
    assert sharing_calls == [True]
    torch.testing.assert_close(shared[0], full[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shared[1], full[1], rtol=1e-5, atol=1e-6)
    assert bool(shared[2]) == grad
    for got, want in zip(shared[2], full[2], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert "forward" not in vars(shared_prompts._backbone_of(model))  # the backbone's own forward is back


def test_shared_prompts_leave_alone_distinct_prompts_dropout_checkpointing_and_a_switched_off_speedup(
        tiny_model_dir, sharing_calls, monkeypatch):
    model = _fused_tiny(tiny_model_dir, lora_dropout=0.1)
    input_ids, attention_mask, labels = _grouped_batch(model.config.vocab_size)
    model.eval()
    distinct = (input_ids[::3], attention_mask[::3], labels[::3])  # one completion per prompt
    torch.testing.assert_close(_score(model, distinct, 9, shared=True, grad=False)[0],
                               _score(model, distinct, 9, shared=False, grad=False)[0])
    assert sharing_calls == [False]
    model.train()
    for grad in (False, True):  # each copy of a prompt draws dropout masks of its own
        _score(model, (input_ids, attention_mask, labels), 9, shared=True, grad=grad)
    undropped = _fused_tiny(tiny_model_dir, lora_dropout=0.0)
    undropped.base_model.model.gradient_checkpointing_enable()  # it would drop the prompts' cache in the backward
    undropped.train()
    _score(undropped, (input_ids, attention_mask, labels), 9, shared=True, grad=True)
    model.eval()
    speedups.choose("none")
    _score(model, (input_ids, attention_mask, labels), 9, shared=True, grad=False)
    assert sharing_calls == [False]


def test_a_run_shares_prompts_and_leaves_the_libraries_as_it_found_them(tiny_config_dict, sharing_calls,
                                                                        prefill_calls):
    """End to end: sampling and TRL's reference pass (beta > 0, adapters off) read each prompt once; afterwards
    torch and TRL run their own functions again."""
    from trl.trainer import utils

    from dragon_ui.config import RunConfig
    from dragon_ui.engine import training

    libraries_own = (torch.multinomial, utils._use_triton, utils._ChunkedLogProbFunction)
    tiny_config_dict["training"]["max_steps"] = 1
    tiny_config_dict["grpo"]["beta"] = 0.04
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    assert True in sharing_calls and True in prefill_calls
    assert (torch.multinomial, utils._use_triton, utils._ChunkedLogProbFunction) == libraries_own


@pytest.fixture
def prefill_calls(monkeypatch):
    return _record_sharing(monkeypatch, "prefill_sharing_prompts")


def _generate(model, input_ids, attention_mask, shared, do_sample, **kwargs):
    torch.manual_seed(1)
    with torch.no_grad(), shared_prompts.sampling_shared_prompts(model) if shared else contextlib.nullcontext():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8, do_sample=do_sample,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True, **kwargs)
    return out.sequences, torch.stack(out.scores)


@pytest.mark.parametrize("do_sample", [False, True])
def test_shared_prompt_prefill_generates_what_full_prompts_generate(tiny_model_dir, prefill_calls, do_sample):
    model = _tiny(tiny_model_dir)
    speedups.apply_to_loaded_model(model)
    input_ids, attention_mask, _ = _grouped_batch(model.config.vocab_size)
    prompts, prompt_mask = input_ids[:, :9], attention_mask[:, :9]  # left-padded, three rows per prompt
    full_tokens, full_scores = _generate(model, prompts, prompt_mask, shared=False, do_sample=do_sample)
    shared_tokens, shared_scores = _generate(model, prompts, prompt_mask, shared=True, do_sample=do_sample)
    assert prefill_calls == [True]
    assert torch.equal(shared_tokens, full_tokens)
    torch.testing.assert_close(shared_scores, full_scores, rtol=1e-5, atol=1e-6)  # -inf where top-k cut alike
    assert "generate" not in vars(model)


@pytest.mark.parametrize("do_sample", [False, True])
def test_the_apps_own_replies_read_each_prompt_once_and_sample_as_the_trainer(tiny_model_dir, prefill_calls,
                                                                              do_sample):
    """speedups.generate (the playground's groups, the held-out scoring) hands generate a cache of each distinct
    prompt instead of replacing the model's generate, so two threads can use one model at once; sampled, it draws
    tokens by inverse CDF as the trainer does. The tokens are those of a plain generate drawing the same way."""
    torchs = torch.multinomial
    model = _tiny(tiny_model_dir)
    speedups.apply_to_loaded_model(model)
    input_ids, attention_mask, _ = _grouped_batch(model.config.vocab_size)
    inputs = {"input_ids": input_ids[:, :9], "attention_mask": attention_mask[:, :9], "max_new_tokens": 8,
              "do_sample": do_sample, "pad_token_id": 0}
    torch.manual_seed(1)
    with torch.no_grad(), sampling.inverse_cdf_sampler() if do_sample else contextlib.nullcontext():
        expected = model.generate(**inputs)
    torch.manual_seed(1)
    with torch.no_grad():
        assert torch.equal(speedups.generate(model, do_sample, **inputs), expected)
    assert prefill_calls == [True] and "generate" not in vars(model)
    assert torch.multinomial is torchs
    if not do_sample:  # two threads at once on one model each get the same replies (sampled, they share a seed)
        with concurrent.futures.ThreadPoolExecutor(2) as pool, torch.no_grad():
            replies = list(pool.map(lambda _: speedups.generate(model, False, **inputs), range(2)))
        assert all(torch.equal(reply, expected) for reply in replies) and "generate" not in vars(model)


def test_shared_prompt_prefill_leaves_alone_distinct_prompts_dropout_and_chosen_caches(tiny_model_dir, prefill_calls):
    from peft import LoraConfig, get_peft_model

    model = _tiny(tiny_model_dir)
    input_ids, attention_mask, _ = _grouped_batch(model.config.vocab_size)
    prompts, prompt_mask = input_ids[:, :9], attention_mask[:, :9]
    _generate(model, prompts[::3], prompt_mask[::3], shared=True, do_sample=False)
    assert prefill_calls == [False]  # every prompt is different
    _generate(model, prompts, prompt_mask, shared=True, do_sample=False, cache_implementation="static")
    assert prefill_calls == [False]  # a cache the caller chose
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, task_type="CAUSAL_LM",
                                             target_modules="all-linear"))
    model.train()  # sampling with dropout, as TRL does without sampling_without_dropout
    _generate(model, prompts, prompt_mask, shared=True, do_sample=False)
    assert prefill_calls == [False]
