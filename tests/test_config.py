"""Tests for dragon_ui.config: reference defaults, one clear ConfigError per bad setting, loading and round trips."""

import copy
import dataclasses
import re
import typing
import json
from pathlib import Path

import pytest
import yaml

from dragon_ui.config import DEFAULT_MODEL_ID, RunConfig, documented_settings, setting_help, settings_table
from dragon_ui.settings import plain
from dragon_ui.system.disk import RUNS_DIR_ENV, resolve_runs_dir
from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "dragon_ui" / "assets" / "recipes" / "arithmetic.yaml"

# The smallest valid config: validation never reads the data file, so it need not exist.
MINIMAL = {
    "data": {"source": "table.csv", "prompt": "question", "reference": "answer"},
    "rewards": [{"kind": "numeric"}],
}


def with_setting(dotted: str, value, base: dict = MINIMAL) -> dict:
    """A copy of ``base`` with one (possibly nested) setting replaced; ``DELETE`` removes it."""
    data = copy.deepcopy(base)
    *sections, key = dotted.split(".")
    target = data
    for section in sections:
        target = target.setdefault(section, {})
    if value is DELETE:
        target.pop(key, None)
    else:
        target[key] = value
    return data


DELETE = object()


# --------------------------------------------------------------------------------------------------- defaults


@pytest.mark.parametrize("attribute, expected", [
    ("grpo.group_size", 4),
    ("grpo.beta", 0.04),
    ("grpo.temperature", 1.0),
    ("grpo.max_new_tokens", 128),
    ("grpo.loss_type", "dapo"),
    ("grpo.scale_rewards", "group"),
    ("training.learning_rate", 1e-5),
    ("training.epochs", 1.0),
    ("training.max_steps", None),
    ("training.batch_size", 4),
    ("training.grad_accum", 1),
    ("training.save_steps", 20),
    ("training.seed", 42),
    ("lora.enabled", True),
    ("lora.r", 16),
    ("lora.alpha", 32),
    ("lora.dropout", 0.05),
    ("lora.target_modules", "all-linear"),
    ("hardware.device", "auto"),
    ("hardware.dtype", "auto"),
    ("hardware.load_in_4bit", False),
    ("hardware.cpu_threads", None),
    ("n_samples", 10),
    ("data.eval_frac", 0.05),
    ("data.seed", 42),
    ("model.id", "HuggingFaceTB/SmolLM2-135M-Instruct"),
])
def test_defaults_match_the_reference_api(attribute, expected):
    value = RunConfig.from_dict(MINIMAL, policy=LAPTOP)
    for part in attribute.split("."):
        value = getattr(value, part)
    assert value == expected
    assert type(value) is type(expected) or isinstance(expected, float)  # 1 == 1.0, but True is not 1


def test_default_model_constant_is_the_reference_model():
    assert DEFAULT_MODEL_ID == "HuggingFaceTB/SmolLM2-135M-Instruct"


# ------------------------------------------------------------------------------------------------- validation

BAD_SETTINGS = [
    # (dotted setting, bad value, text the message must contain)
    ("grpo.group_size", 1, "grpo.group_size"),
    ("grpo.group_size", 65, "grpo.group_size"),
    ("grpo.group_size", "four", "grpo.group_size"),
    ("grpo.beta", -0.1, "grpo.beta"),
    ("grpo.beta", 11, "grpo.beta"),
    ("grpo.beta", [0.1], "grpo.beta"),
    ("grpo.beta", float("nan"), "grpo.beta"),
    ("grpo.temperature", 0, "grpo.temperature"),
    ("grpo.temperature", -1, "grpo.temperature"),
    ("grpo.temperature", 1e-300, "grpo.temperature must be at least 0.01"),
    ("training.learning_rate", 1e-300, "training.learning_rate must be at least 1e-10"),
    ("training.seed", 10**30, "training.seed must be a whole number from 0 to 4,294,967,295"),
    ("training.seed", 1e30, "training.seed"),
    ("training.seed", -1, "training.seed must be a whole number from 0"),
    ("data.seed", 10**30, "data.seed must be a whole number from 0 to 4,294,967,295"),
    ("grpo.max_new_tokens", 0, "grpo.max_new_tokens"),
    ("grpo.loss_type", "foo", "grpo.loss_type"),
    ("grpo.scale_rewards", "maybe", "grpo.scale_rewards"),
    ("training.batch_size", 0, "training.batch_size"),
    ("training.batch_size", 4.5, "training.batch_size"),
    ("training.grad_accum", 0, "training.grad_accum"),
    ("training.save_steps", 0, "training.save_steps"),
    ("training.learning_rate", 0, "training.learning_rate"),
    ("training.learning_rate", "fast", "training.learning_rate"),
    ("training.epochs", 0, "training.epochs"),
    ("training.max_steps", 0, "training.max_steps"),
    ("lora.r", 0, "lora.r"),
    ("lora.dropout", 1.0, "lora.dropout"),
    ("lora.target_modules", ["lm_head"], "lora.target_modules"),
    ("lora.target_modules", [], "lora.target_modules"),
    ("lora.enabled", "yes", "lora.enabled"),
    ("hardware.device", "tpu", "hardware.device"),
    ("hardware.dtype", "int8", "hardware.dtype"),
    ("hardware.cpu_threads", 0, "hardware.cpu_threads"),
    ("n_samples", -1, "n_samples"),
    ("data.eval_frac", 0.9, "data.eval_frac"),
    ("data.prompt", "", "data.prompt"),
    ("data.source", "  ", "data.source"),
    ("model.id", "", "model.id"),
    ("model", "", "model.id"),
    ("rewards", DELETE, "rewards"),
    ("rewards", [], "rewards"),
    ("rewards", {"kind": "numeric"}, "rewards"),
    ("rewards", [{"kind": "numeric", "weight": 0}, {"kind": "length", "max_chars": 5, "weight": 0}], "rewards"),
    ("rewards", [{"kind": "nonsense"}], "rewards[0].kind"),
    ("grpo", None, "grpo"),
]


@pytest.mark.parametrize("dotted, value, expected", BAD_SETTINGS,
                         ids=[f"{d}={v!r}" if v is not DELETE else f"{d} missing" for d, v, _ in BAD_SETTINGS])
def test_bad_setting_raises_config_error_naming_the_field(dotted, value, expected):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(with_setting(dotted, value), policy=LAPTOP)
    assert expected in str(caught.value)


@pytest.mark.parametrize("data, expected", [
    ({**MINIMAL, "colour": "red"}, ("colour",)),
    (with_setting("grpo.bogus", 1), ("grpo", "bogus")),
    (with_setting("lora.rank", 8), ("lora", "rank")),
    (with_setting("training.lr", 1e-5), ("training", "lr")),
])
def test_unknown_settings_are_rejected_by_name(data, expected):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(data, policy=LAPTOP)
    for text in expected:
        assert text in str(caught.value)


def test_load_in_4bit_needs_lora():
    data = with_setting("hardware.load_in_4bit", True, with_setting("lora.enabled", False))
    with pytest.raises(ConfigError, match=r"hardware\.load_in_4bit"):
        RunConfig.from_dict(data, policy=LAPTOP)
    assert RunConfig.from_dict(with_setting("hardware.load_in_4bit", True), policy=LAPTOP).hardware.load_in_4bit is True


@pytest.mark.parametrize("data", [None, [], "rewards: numeric", 3])
def test_non_mapping_config_is_rejected(data):
    with pytest.raises(ConfigError):
        RunConfig.from_dict(data, policy=LAPTOP)


def test_config_error_is_a_value_error_with_one_sentence():
    with pytest.raises(ValueError) as caught:
        RunConfig.from_dict(with_setting("grpo.group_size", 1), policy=LAPTOP)
    message = str(caught.value)
    assert "\n" not in message and message.rstrip().endswith(".")


def test_from_dict_does_not_modify_its_input():
    data = with_setting("model", "some/id")
    before = copy.deepcopy(data)
    RunConfig.from_dict(data, policy=LAPTOP)
    assert data == before


# --------------------------------------------------------------------------------------------------- coercion


@pytest.mark.parametrize("dotted, value, attribute, expected", [
    ("training.learning_rate", "1e-5", "training.learning_rate", 1e-5),  # YAML reads 1e-5 (no dot) as text
    ("training.learning_rate", 1, "training.learning_rate", 1.0),
    ("training.batch_size", 4.0, "training.batch_size", 4),
    ("grpo.group_size", 8.0, "grpo.group_size", 8),
    ("training.epochs", 2, "training.epochs", 2.0),
    ("grpo.temperature", "0.7", "grpo.temperature", 0.7),
    ("training.max_steps", None, "training.max_steps", None),
    ("hardware.cpu_threads", 2.0, "hardware.cpu_threads", 2),
    ("lora.target_modules", ["q_proj", "v_proj"], "lora.target_modules", ["q_proj", "v_proj"]),
    ("model", "some/id", "model.id", "some/id"),
    ("model", {"id": "other/id", "revision": "main"}, "model.revision", "main"),
])
def test_lossless_coercions_are_accepted(dotted, value, attribute, expected):
    result = RunConfig.from_dict(with_setting(dotted, value), policy=LAPTOP)
    for part in attribute.split("."):
        result = getattr(result, part)
    assert result == expected
    assert type(result) is type(expected)


def test_yaml_exponent_without_dot_loads_as_text_and_is_coerced(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(MINIMAL) + "training:\n  learning_rate: 1e-5\n", encoding="utf-8")
    assert isinstance(yaml.safe_load(path.read_text())["training"]["learning_rate"], str)
    assert RunConfig.from_file(path, policy=LAPTOP).training.learning_rate == 1e-5


# ------------------------------------------------------------------------------------------------ from_file


@pytest.mark.parametrize("suffix, dump", [
    (".yaml", yaml.safe_dump),
    (".yml", yaml.safe_dump),
    (".json", json.dumps),
    (".JSON", json.dumps),
])
def test_from_file_reads_yaml_and_json(tmp_path, suffix, dump):
    data = with_setting("grpo.group_size", 8, with_setting("model", "some/id"))
    path = tmp_path / f"run{suffix}"
    path.write_text(dump(data), encoding="utf-8")
    config = RunConfig.from_file(path, policy=LAPTOP)
    assert config.grpo.group_size == 8
    assert config.model.id == "some/id"
    assert config.base_dir == str(tmp_path.resolve())


@pytest.mark.parametrize("name, text, expected", [
    ("broken.yaml", "grpo: [group_size: 4\n", "broken.yaml is not valid YAML"),
    ("broken.yml", "data:\n  source: a\n source: b\n", "broken.yml is not valid YAML"),
    ("broken.json", '{"grpo": {"group_size": 4}', "broken.json is not valid JSON"),
    ("broken.JSON", "{'single': 'quotes'}", "broken.JSON is not valid JSON"),
    ("list.yaml", "- kind: numeric\n", "mapping"),
    ("empty.yaml", "", "rewards"),
])
def test_malformed_files_give_config_error(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_file(path, policy=LAPTOP)
    assert expected in str(caught.value)


def test_file_that_is_not_utf8_gives_config_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"name: \xff\xfe\x00run\n")
    with pytest.raises(ConfigError, match="binary.yaml"):
        RunConfig.from_file(path, policy=LAPTOP)


@pytest.mark.parametrize("make_path", [lambda tmp: tmp / "missing.yaml", lambda tmp: tmp])
def test_missing_file_gives_config_error(tmp_path, make_path):
    with pytest.raises(ConfigError, match="No configuration file"):
        RunConfig.from_file(make_path(tmp_path), policy=LAPTOP)


def test_bundled_arithmetic_recipe_loads():
    config = RunConfig.from_file(RECIPE, policy=LAPTOP)
    assert config.name == "arithmetic"
    assert config.model.id == DEFAULT_MODEL_ID
    assert config.grpo.group_size == 6
    assert config.grpo.max_new_tokens == 16
    # Tuned for a CPU workshop (see the recipe and bench/learning.py), unlike the API defaults 1e-5 / 1.0.
    assert (config.training.learning_rate, config.grpo.temperature) == (1e-4, 0.8)
    assert [spec.kind for spec in config.rewards] == ["numeric", "length"]
    length = config.rewards[1]
    assert (length.max_chars, length.weight) == (12, 0.3)
    assert config.rewards[0].weight == 1.0
    assert config.base_dir == str(RECIPE.parent.resolve())
    assert (Path(config.base_dir) / config.data.source).resolve().is_file()


# ---------------------------------------------------------------------------------------------- round trips

ROUND_TRIP_CASES = [
    MINIMAL,
    {
        **with_setting("model", {"id": "some/id", "revision": "abc", "trust_remote_code": True}),
        "name": "everything",
        "rewards": [{"kind": "numeric", "weight": 2}, {"kind": "length", "max_chars": 12, "weight": 0.3}],
        "grpo": {"group_size": 8, "beta": 0.0, "temperature": 0.7, "max_new_tokens": 64, "loss_type": "grpo",
                 "scale_rewards": "none"},
        "training": {"learning_rate": "2e-6", "epochs": 3, "max_steps": 50, "batch_size": 2, "grad_accum": 4,
                     "save_steps": 5, "warmup_ratio": 0.1, "weight_decay": 0.01, "gradient_checkpointing": True,
                     "seed": 7},
        "lora": {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "hardware": {"device": "cpu", "dtype": "float32", "load_in_4bit": False, "cpu_threads": 2},
        "n_samples": 0,
        "runs_dir": "/tmp/somewhere",
    },
]


@pytest.mark.parametrize("data", ROUND_TRIP_CASES, ids=["minimal", "everything"])
def test_to_dict_round_trips(data, tmp_path):
    config = RunConfig.from_dict(data, base_dir=tmp_path, policy=LAPTOP)
    again = RunConfig.from_dict(config.to_dict(), policy=LAPTOP)
    assert again == config
    assert again.to_dict() == config.to_dict()
    json.dumps(config.to_dict())  # what a run folder stores must be plain JSON


@pytest.mark.parametrize("data", ROUND_TRIP_CASES, ids=["minimal", "everything"])
def test_to_yaml_parses_back(data, tmp_path):
    config = RunConfig.from_dict(data, base_dir=tmp_path, policy=LAPTOP)
    parsed = yaml.safe_load(config.to_yaml())
    assert "base_dir" not in parsed
    again = RunConfig.from_dict(parsed, base_dir=tmp_path, policy=LAPTOP)
    assert again == config


def test_to_yaml_file_loads_with_from_file(tmp_path):
    config = RunConfig.from_file(RECIPE, policy=LAPTOP)
    path = tmp_path / "copy.yaml"
    path.write_text(config.to_yaml(), encoding="utf-8")
    again = RunConfig.from_file(path, policy=LAPTOP)
    assert again.base_dir == str(tmp_path.resolve())
    again.base_dir = config.base_dir
    assert again == config


def test_base_dir_argument_does_not_override_a_stored_one(tmp_path):
    stored = RunConfig.from_dict(MINIMAL, base_dir=tmp_path / "first", policy=LAPTOP).to_dict()
    assert RunConfig.from_dict(stored, base_dir=tmp_path / "second", policy=LAPTOP).base_dir == str((tmp_path / "first").resolve())
    assert RunConfig.from_dict(MINIMAL, policy=LAPTOP).base_dir == ""


# ------------------------------------------------------------------------------------------- derived values


def test_the_entry_points_choose_the_runs_folder_and_a_config_keeps_to_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "from-env"))
    # The command line and the app: --runs-dir, else the environment, else ./runs.
    assert resolve_runs_dir("chosen") == (tmp_path / "chosen").resolve()
    assert resolve_runs_dir() == (tmp_path / "from-env").resolve()
    # A config: its runs_dir (which they fill), else ./runs; the environment is theirs to read, not its.
    assert RunConfig.from_dict(MINIMAL, policy=LAPTOP).resolved_runs_dir() == (tmp_path / "runs").resolve()
    monkeypatch.delenv(RUNS_DIR_ENV)
    assert resolve_runs_dir() == (tmp_path / "runs").resolve()

    config = RunConfig.from_dict({**MINIMAL, "runs_dir": str(tmp_path / "from-config")}, policy=LAPTOP)
    assert config.resolved_runs_dir() == (tmp_path / "from-config").resolve()

    relative = RunConfig.from_dict({**MINIMAL, "runs_dir": "rel"}, policy=LAPTOP)
    assert relative.resolved_runs_dir().is_absolute()
    assert relative.resolved_runs_dir() == (tmp_path / "rel").resolve()


def test_resolved_runs_dir_expands_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = RunConfig.from_dict({**MINIMAL, "runs_dir": "~/my-runs"}, policy=LAPTOP)
    assert config.resolved_runs_dir() == (tmp_path / "my-runs").resolve()


@pytest.mark.parametrize("batch_size, group_size, grad_accum, expected", [
    (4, 4, 1, 16),
    (2, 2, 1, 4),
    (4, 6, 1, 24),
    (3, 8, 2, 48),
    (1, 2, 16, 32),
])
def test_completions_per_step(batch_size, group_size, grad_accum, expected):
    data = {**MINIMAL, "grpo": {"group_size": group_size},
            "training": {"batch_size": batch_size, "grad_accum": grad_accum}}
    assert RunConfig.from_dict(data, policy=LAPTOP).completions_per_step == expected


@pytest.mark.parametrize("override, path, expected", [
    ("data.prompt=Q: {question}", ("data", "prompt"), "Q: {question}"),  # YAML would read a mapping
    ("data.system=You are terse: reply in one word.", ("data", "system"), "You are terse: reply in one word."),
    ("data.reference=", ("data", "reference"), None),  # empty: none, where the setting may be empty
    ("data.reference=007", ("data", "reference"), "007"),  # text as typed, not the number 7
    ("name=yes", ("name",), "yes"),  # not the boolean YAML makes of it
    ("data.hub_split=train[:10%]", ("data", "hub_split"), "train[:10%]"),
    ("training.max_steps=5", ("training", "max_steps"), 5),  # other settings are read as YAML
    ("training.learning_rate=1e-4", ("training", "learning_rate"), 1e-4),
    ("lora.target_modules=[q_proj, v_proj]", ("lora", "target_modules"), ["q_proj", "v_proj"]),
    ("lora.target_modules=all-linear", ("lora", "target_modules"), "all-linear"),
    ("hardware.cpu_threads=null", ("hardware", "cpu_threads"), None),
])
def test_set_takes_text_as_typed_and_reads_other_settings_as_yaml(tiny_config_dict, override, path, expected):
    from dragon_ui.config import apply_overrides

    config = RunConfig.from_dict(apply_overrides(tiny_config_dict, [override]), policy=LAPTOP).to_dict()
    value = config
    for part in path:
        value = value[part]
    assert value == expected


# ----------------------------------------------------------------------------------------------------------------
# Each setting carries its own label and help (the Model tab, `dragon settings` and the reference read them).


def leaf_settings(section: type = RunConfig, prefix: str = "") -> set[str]:
    out = set()
    for spec in dataclasses.fields(section):
        hint = typing.get_type_hints(section)[spec.name]
        out |= leaf_settings(hint, f"{prefix}{spec.name}.") if dataclasses.is_dataclass(hint) else {prefix + spec.name}
    return out


def test_every_setting_a_file_may_hold_carries_a_label_and_help():
    documented = {item.path for item in documented_settings()}
    assert documented == leaf_settings() - {"base_dir"}  # base_dir is where the file was read from, never written


@pytest.mark.parametrize("item", documented_settings(), ids=lambda item: item.path)
def test_each_help_is_sentences_whose_links_work_wherever_it_is_shown(item):
    assert 0 < len(item.label) <= 45 and not item.label.endswith(".")  # a few words, as a form names a field
    assert item.help[0].isupper() or item.help[0] in "`[μ", item.help
    assert item.help.endswith("."), item.help
    assert not re.search(r"\]\((?!https://)", item.help), "the app shows the help too: relative links go in `see`"


@pytest.mark.parametrize("path, shown", [
    ("grpo.beta", "0.04"), ("training.learning_rate", "1e-5"), ("grpo.temperature", "1.0"),
    ("lora.target_modules", "`all-linear`"), ("training.max_steps", "–"), ("logging.report_to", "`[]`"),
    ("training.gradient_checkpointing", "false"), ("lora.enabled", "true"), ("hardware.gpu", "the first"),
    ("data.hub_split", "`train`"),
])
def test_the_reference_states_each_default_as_written(path, shown):
    assert setting_help(path).default == shown


@pytest.mark.parametrize("markdown, shown", [
    ("[GSPO](https://huggingface.co/papers/2507.18071) with `grpo`", "GSPO with grpo"),
    ("`a` and [b](https://x.y) and [c](https://z)", "a and b and c"),
    ("no marks", "no marks"),
])
def test_a_terminal_shows_help_without_markdown(markdown, shown):
    assert plain(markdown) == shown


def test_the_settings_table_has_a_row_per_setting_with_its_reference_link():
    rows = settings_table().splitlines()[2:]
    assert len(rows) == len(documented_settings())
    (dropout,) = [row for row in rows if row.startswith("| `lora.dropout` |")]
    assert dropout.endswith("See [performance](performance.md#the-speed-ups). |")


def test_a_draft_has_the_sections_and_settings_of_a_config():
    """Draft types what the form, a kept browser draft and an API client hold: RunConfig.to_dict's keys."""
    from dragon_ui.config import Draft

    assert set(Draft.__annotations__) == {spec.name for spec in dataclasses.fields(RunConfig)}
    assert set(RunConfig().to_dict()) <= set(Draft.__annotations__)
