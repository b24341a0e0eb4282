"""TRL 1.16's GRPO variants (DAPO's clip-higher and masking, GSPO, GDPO, the entropy options, sampling settings):
TRL's defaults, the checks on nonsense combinations, what reaches TRL, and a tiny run that trains with them."""

from __future__ import annotations

import dataclasses

import pytest
from trl import GRPOConfig

from dragon_ui.config import GRPO_VARIANTS, GRPOSettings, RunConfig
from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("name", GRPO_VARIANTS)
def test_each_variant_defaults_to_trls_own_default(name):
    """A run that sets none of them trains exactly as TRL does by default."""
    trl_default = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}[name]
    assert getattr(GRPOSettings(), name) == trl_default


@pytest.mark.parametrize("settings, problem", [
    ({"importance_sampling_level": "sentence"}, "importance_sampling_level must be one of token, sequence"),
    ({"epsilon": 0.0}, r"epsilon must be between 1e-06 and 1"),
    ({"epsilon": 1.5}, r"epsilon must be between"),
    ({"epsilon_high": 20.0, "num_iterations": 2}, r"epsilon_high must be between 1e-06 and 10"),
    ({"num_iterations": 0}, r"num_iterations must be between 1 and 16"),
    ({"num_iterations": 17}, r"num_iterations must be between 1 and 16"),
    ({"multi_objective_aggregation": "average"}, "must be one of sum_then_normalize, normalize_then_sum"),
    ({"top_entropy_quantile": 0.0}, r"top_entropy_quantile must be between 0.01 and 1"),
    ({"entropy_coef": -0.1}, r"entropy_coef must be between 0 and 1"),
    ({"top_p": 0.0}, r"top_p must be between 0.01 and 1"),
    ({"top_k": -1}, r"top_k must be between 0 and 100000"),
    ({"min_p": 1.0}, r"min_p must be between 0 and 0.99"),
    ({"repetition_penalty": 0.0}, r"repetition_penalty must be between 0.5 and 3"),
    # Combinations TRL only warns about, or that change nothing.
    ({"loss_type": "luspo"}, "luspo scales GSPO's sequence-level loss, so it needs grpo.importance_sampling_level "
                             "sequence"),
    ({"loss_type": "vespo", "importance_sampling_level": "sequence", "num_iterations": 2},
     "vespo computes its sequence weights itself"),
    ({"importance_sampling_level": "sequence", "num_iterations": 2}, r"with grpo.loss_type dapo adds up every "
                                                                     "token's share"),
    ({"importance_sampling_level": "sequence", "loss_type": "cispo", "num_iterations": 2}, "loss_type cispo adds up"),
    ({"importance_sampling_level": "sequence", "loss_type": "grpo"}, r"grpo.importance_sampling_level only changes "
                                                                     "training when each batch is trained on more "
                                                                     "than once"),
    ({"epsilon_high": 0.28}, r"grpo.epsilon_high only changes training when each batch is trained on more than once"),
    ({"epsilon": 0.1, "loss_type": "grpo"}, r"grpo.epsilon only changes training"),
    ({"epsilon": 0.1, "loss_type": "sapo", "num_iterations": 2}, "epsilon is not used by grpo.loss_type sapo"),
    ({"epsilon": 0.1, "loss_type": "cispo", "num_iterations": 2}, "cispo, which caps the ratio at epsilon_high"),
    ({"multi_objective_aggregation": "normalize_then_sum", "scale_rewards": "batch"},
     "scale_rewards batch is not used with grpo.multi_objective_aggregation normalize_then_sum"),
])
def test_out_of_range_and_nonsense_settings_are_refused_with_the_field_named(settings, problem):
    with pytest.raises(ConfigError, match=problem):
        checked(GRPOSettings(**settings))


def checked(grpo: GRPOSettings, backend: str = "transformers") -> None:
    """The checks a run's config makes on its GRPO settings."""
    grpo.validate()
    grpo.check_on_policy(backend)


@pytest.mark.parametrize("backend", ["vllm-colocate", "vllm-server"])
def test_with_vllm_one_update_per_batch_still_clips(backend):
    """vLLM's samples come with their own log-probabilities, so TRL's DAPO setup (clip-higher, one update) acts."""
    checked(GRPOSettings(epsilon_high=0.28), backend)
    checked(GRPOSettings(importance_sampling_level="sequence", loss_type="grpo"), backend)


def test_the_config_checks_the_clip_against_its_generation_backend(tiny_config_dict):
    tiny_config_dict["grpo"]["epsilon_high"] = 0.28
    with pytest.raises(ConfigError, match="only changes training when each batch is trained on more than once"):
        RunConfig.from_dict(tiny_config_dict, policy=LAPTOP).validate()


@pytest.mark.parametrize("settings", [
    {},  # TRL's defaults
    {"num_iterations": 2, "epsilon_high": 0.28, "mask_truncated_completions": True},  # DAPO
    {"num_iterations": 2, "importance_sampling_level": "sequence", "loss_type": "grpo", "beta": 0.0,
     "epsilon": 3e-4, "epsilon_high": 4e-4},  # GSPO as TRL's documentation sets it up
    {"importance_sampling_level": "sequence", "loss_type": "luspo"},
    {"loss_type": "cispo", "epsilon_high": 5.0},  # CISPO's clip acts from the first pass
    {"multi_objective_aggregation": "normalize_then_sum"},  # GDPO
    {"top_entropy_quantile": 0.2, "entropy_coef": 0.01},
    {"top_p": 0.9, "top_k": 50, "min_p": 0.05, "repetition_penalty": 1.1},
    {"num_iterations": 4, "beta": 0.0},  # several updates without a reference model: the clip bounds them
])
def test_the_published_setups_are_accepted(settings):
    checked(GRPOSettings(**settings))


def test_every_variant_reaches_trls_config(tiny_config_dict, tmp_path):
    from dragon_ui.engine import training
    from dragon_ui.engine.hardware import resolve_hardware
    from dragon_ui.runstore import RunDir

    chosen = {"importance_sampling_level": "sequence", "loss_type": "grpo", "epsilon": 0.1, "epsilon_high": 0.3,
              "mask_truncated_completions": True, "num_iterations": 3,
              "multi_objective_aggregation": "normalize_then_sum", "top_entropy_quantile": 0.5, "entropy_coef": 0.02,
              "top_p": 0.8, "top_k": 20, "min_p": 0.1, "repetition_penalty": 1.2}
    tiny_config_dict["grpo"].update(chosen)
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    args = training.grpo_args(config, RunDir(tmp_path / "run"), resolve_hardware(config.hardware), policy=LAPTOP)
    assert {name: getattr(args, name) for name in chosen} == chosen
    assert set(GRPO_VARIANTS) <= set(chosen)


def test_the_yaml_and_the_model_card_show_the_variants_that_differ(tiny_config_dict):
    from dragon_ui.engine import model_card

    tiny_config_dict["grpo"].update(num_iterations=2, epsilon_high=0.28)
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    assert "epsilon_high: 0.28" in config.to_yaml() and "num_iterations: 2" in config.to_yaml()
    assert RunConfig.from_dict(__import__("yaml").safe_load(config.to_yaml()), policy=LAPTOP).grpo == config.grpo
    assert config.grpo.changed_variants() == {"epsilon_high": 0.28, "num_iterations": 2}
    rows = dict(model_card._settings(config, {}))
    assert rows["GRPO variants"] == "epsilon_high 0.28, num_iterations 2"
    assert dict(model_card._settings(RunConfig.from_dict({**tiny_config_dict, "grpo": {}}, policy=LAPTOP), {}))["GRPO variants"] \
        == "TRL's defaults"


def test_the_estimate_samples_once_every_num_iterations_steps(tiny_config_dict):
    from dragon_ui.engine.estimate import DeviceSpeed, estimate_step_time, generic_dims

    speed = DeviceSpeed(description="test", flops=1e11, bandwidth=1e10, layer_latency_s=1e-4, generation_flops=5e10)
    once = estimate_step_time(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), generic_dims(135e6), speed, "float32", False)
    tiny_config_dict["grpo"]["num_iterations"] = 2
    twice = estimate_step_time(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), generic_dims(135e6), speed, "float32", False)
    assert twice.generation_s == pytest.approx(once.generation_s / 2)
    assert twice.reference_s == pytest.approx(once.reference_s / 2)
    assert once.training_s < twice.training_s < 1.5 * once.training_s  # one forward more per sampled batch


def test_a_tiny_run_trains_with_every_variant_and_records_every_step(tiny_config_dict):
    """Two updates per sampled batch: the second step of each pair trains on the same completions, so its row
    carries that batch's rewards (marked reused_batch) and the viewer keeps showing them; GDPO's advantages are
    the ones TRL logged."""
    from dragon_ui.engine import training
    from dragon_ui.studio import explain

    tiny_config_dict["grpo"].update(group_size=3, importance_sampling_level="sequence", loss_type="grpo",
                                    num_iterations=2, epsilon_high=0.28, mask_truncated_completions=True,
                                    top_entropy_quantile=0.5, entropy_coef=0.01,
                                    multi_objective_aggregation="normalize_then_sum", top_p=0.9, top_k=50,
                                    min_p=0.05, repetition_penalty=1.1)
    tiny_config_dict["rewards"][1] = {"kind": "length", "min_chars": 12, "weight": 0.3}
    tiny_config_dict["training"]["max_steps"] = 4
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=LAPTOP)
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    rows = run.read_progress()
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert [bool(row.get("reused_batch")) for row in rows] == [False, True, False, True]
    for sampled, reused in (rows[0:2], rows[2:4]):
        assert reused["reward"] == sampled["reward"] and reused["rewards"] == sampled["rewards"]
        assert reused["loss"] is not None and reused["kl"] is not None
    assert [rollout["step"] for rollout in run.read_rollouts()] == [1, 3]
    assert run.read_status()["step"] == 4
    for rollout in run.read_rollouts():
        for number in range(1, len(rollout["groups"]) + 1):
            explained = explain.explain_run_group(run, rollout["step"], number)
            assert explained.aggregation == "normalize_then_sum" and explained.agrees is True
