"""The difficulty filter (data.pass_rates, data.min_pass_rate, data.max_pass_rate): training rows whose pre-flight
pass rate lies outside the range are left out, by their row in the file, after the held-out split; the run folder
says which and why."""

from __future__ import annotations

import json
import shlex

import pytest

from conftest import write_arithmetic_csv
from dragon_ui import data
from dragon_ui.config import RunConfig, apply_overrides
from dragon_ui.engine import training
from dragon_ui.engine.preflight import Fix
from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP


def mapped(tmp_path, **difficulty) -> data.MappedData:
    source = write_arithmetic_csv(tmp_path / "arithmetic.csv")
    return data.load_and_map(data.DataConfig(source=str(source), prompt="question", reference="answer",
                                             eval_frac=0.2, **difficulty), policy=LAPTOP)


def test_the_filter_leaves_out_training_rows_outside_the_range_and_keeps_the_split(tmp_path):
    plain = mapped(tmp_path)
    train = [example["number"] for example in plain.train]
    held_out = [example["number"] for example in plain.eval]
    rates = {str(train[0]): 0.0, str(train[1]): 1.0, str(train[2]): 0.5, str(held_out[0]): 0.0}
    filtered = mapped(tmp_path, pass_rates=rates, min_pass_rate=0.01, max_pass_rate=0.99)
    assert [example["number"] for example in filtered.train] == train[2:]  # row 3 is measured and in range
    assert [example["number"] for example in filtered.eval] == held_out  # the held-out rows are never filtered
    assert filtered.dropped == [
        {"row": train[0], "why": "its pre-flight pass rate 0% (every reply failed) is below 0.01"},
        {"row": train[1], "why": "its pre-flight pass rate 100% (every reply passed) is above 0.99"}]
    assert "2 training rows were dropped by the difficulty filter" in filtered.summary()
    assert mapped(tmp_path, pass_rates=rates).dropped == []  # the default range, 0 to 1, keeps every row


def test_a_filter_that_leaves_nothing_to_train_on_says_so(tmp_path):
    plain = mapped(tmp_path)
    every = {str(example["number"]): 0.0 for example in plain.train}
    with pytest.raises(ConfigError, match="the difficulty filter drops all 24 training rows .* widen the range or "
                                          "clear the filter"):
        mapped(tmp_path, pass_rates=every, min_pass_rate=0.01)


@pytest.mark.parametrize("settings, says", [
    ({"min_pass_rate": -0.1}, "data.min_pass_rate must be a share from 0 to 1, got -0.1"),
    ({"max_pass_rate": 2}, "data.max_pass_rate must be a share from 0 to 1, got 2"),
    ({"min_pass_rate": 0.6, "max_pass_rate": 0.4}, "data.min_pass_rate (0.6) is above data.max_pass_rate (0.4)"),
    ({"pass_rates": {"0": 0.5}}, "data.pass_rates: '0' is not a row number"),
    ({"pass_rates": {"row 3": 0.5}}, "data.pass_rates: 'row 3' is not a row number"),
    ({"pass_rates": {"٣": 0.5}}, "is not a row number"),  # a digit, but not one a row number is written in
    ({"pass_rates": {"3": 1.5}}, "data.pass_rates[3] must be a share from 0 to 1, got 1.5"),
    ({"pass_rates": {"3": "half"}}, "data.pass_rates['3'] must be a number"),
    ({"pass_rates": [0.5]}, "data.pass_rates must be a mapping"),
    ({"pass_rates": {str(n): 0.5 for n in range(1, data.MOST_PASS_RATES + 2)}}, "must map at most 100,000 row numbers"),
])
def test_the_filters_settings_are_checked(settings, says, tiny_config_dict):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        RunConfig.from_dict({**tiny_config_dict, "data": {**tiny_config_dict["data"], **settings}}, policy=LAPTOP)


def test_a_yaml_row_number_is_read_as_the_row(tiny_config_dict):
    config = RunConfig.from_dict({**tiny_config_dict, "data": {**tiny_config_dict["data"], "pass_rates": {3: 1}}}, policy=LAPTOP)
    assert config.data.pass_rates == {"3": 1.0}


def test_the_fixs_command_line_sets_what_its_button_sets(tiny_config_dict):
    fix = Fix("Drop", "why", settings={"data": {"pass_rates": {"3": 0.0, "7": 1.0}, "min_pass_rate": 0.01,
                                                "max_pass_rate": 0.99}})
    overrides = [word for word in shlex.split(fix.as_command_line()) if word != "--set"]
    by_command = RunConfig.from_dict(apply_overrides(json.loads(json.dumps(tiny_config_dict)), overrides), policy=LAPTOP)
    by_button = RunConfig.from_dict(fix.applied_to(tiny_config_dict), policy=LAPTOP)
    assert by_command.data == by_button.data and by_button.data.pass_rates == {"3": 0.0, "7": 1.0}


def test_the_run_folder_records_the_rows_left_out(tiny_config_dict):
    plain = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    first = json.loads(training.prepare(plain, policy=LAPTOP).train_data_path.read_text(encoding="utf-8").splitlines()[0])["number"]
    config = RunConfig.from_dict({**tiny_config_dict, "data": {**tiny_config_dict["data"],
                                                               "pass_rates": {str(first): 1.0}, "max_pass_rate": 0.99}}, policy=LAPTOP)
    run = training.prepare(config, policy=LAPTOP)
    assert json.loads(run.dropped_rows_path.read_text()) == [
        {"row": first, "why": "its pre-flight pass rate 100% (every reply passed) is above 0.99"}]
    assert run.read_status()["n_train"] == 23 and "1 training row was dropped" in run.read_status()["data_summary"]
    assert first not in [json.loads(line)["number"] for line in run.train_data_path.read_text().splitlines()]
    assert run.read_config().data.pass_rates == {str(first): 1.0}  # the rates are in the run's config too
