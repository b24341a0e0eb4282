"""End to end through gradio_client: the real app served on a local port, driven only through its public API.

The HTTP API takes whole configurations: ``/recipe`` gives one, the test edits it in Python (a small CSV, the tiny
random Llama, two quick steps), ``/check`` validates it and ``/start`` trains it. A client session never runs
``demo.load``, so it opens the run on the Train tab itself (``/train_open``) and follows it with the tick until it
finishes, as a browser's timer would, then reads the comparison.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator

import gradio as gr
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from conftest import write_arithmetic_csv
from dragon_ui.studio.backend import Studio
from dragon_ui.ui import build_app
from dragon_ui.ui.app import launch

pytestmark = pytest.mark.timeout(300)
RUN_TIMEOUT_S = 180


@contextlib.contextmanager
def served_app(demo: gr.Blocks, **launch_options) -> Iterator[str]:
    """Serve a built app on a free local port, as the app serves itself (app.launch: a public demo with its guards),
    while the block runs; yields its URL and closes the server after."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch(demo, prevent_thread_lock=True, server_port=port, quiet=True, **launch_options)
    try:
        yield demo.local_url
    finally:
        demo.close()


@pytest.fixture
def client(studio) -> Iterator[Client]:
    """A client of the app served over conftest's studio (whose teardown stops any training left behind)."""
    with served_app(build_app(studio)) as url:
        yield Client(url, verbose=False)


def run_state(studio: Studio, run_id: str) -> str:
    return studio.runs.get(run_id).read_status().get("state", "")


def is_skipped(value) -> bool:
    """gr.skip() reaches a client as a bare update with nothing in it."""
    return isinstance(value, dict) and value.get("__type__") == "update"


def plot_traces(plot: dict) -> list[dict]:
    """The traces of a gr.Plot output as the client receives it (plotly JSON inside the payload)."""
    figure = json.loads(plot["plot"]) if isinstance(plot.get("plot"), str) else plot["plot"]
    return figure["data"]


def tiny_config(client: Client, csv_path, model_dir) -> dict:
    """The arithmetic recipe from ``/recipe``, edited in Python: the tiny model, a small CSV and two quick steps."""
    config = client.predict("arithmetic", api_name="/recipe")
    assert isinstance(config, dict) and config["rewards"], config
    config["data"].update(source=str(csv_path), prompt="question", reference="answer", eval_frac=0.05)
    config["model"]["id"] = str(model_dir)
    config["hardware"].update(device="cpu", dtype="auto", load_in_4bit=False, cpu_threads=1)
    config["lora"].update(enabled=True, r=4, alpha=8, dropout=0.05, target_modules="all-linear")
    config["grpo"].update(group_size=2, beta=0.04, temperature=1.0, max_new_tokens=6, loss_type="dapo",
                          scale_rewards="group")
    config["training"].update(learning_rate=0.01, epochs=1.0, max_steps=2, batch_size=2, save_steps=1,
                              gradient_checkpointing=False)
    config["name"] = "client-run"
    return config


def test_the_api_is_whole_configs_and_run_control(client):
    """The UI's own events are private: a client sees /recipe, /check, /preflight, /start and the Train, Compare and
    Experiments endpoints."""
    endpoints = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {"/recipe", "/check", "/preflight", "/start"} <= endpoints
    assert {"/train_tick", "/train_show", "/train_stop", "/train_resume", "/train_open", "/train_runs",
            "/compare_runs", "/compare_show", "/compare_evaluate", "/compare_ask", "/experiments_runs",
            "/experiments_side_by_side", "/experiments_export"} <= endpoints
    others = endpoints - {"/recipe", "/check", "/preflight", "/start"}
    assert all(name.startswith(("/train_", "/compare_", "/experiments_")) for name in others), sorted(others)


def test_a_client_trains_the_tiny_model_and_compares_it(studio, client, tmp_path, tiny_model_dir):
    config = tiny_config(client, write_arithmetic_csv(tmp_path / "small.csv"), tiny_model_dir)
    assert client.predict(config, api_name="/check") == "valid"

    run_id = client.predict(config, api_name="/start")
    assert isinstance(run_id, str) and run_id.endswith("-client-run"), run_id
    assert [run["id"] for run in studio.runs.summaries()] == [run_id]
    trained = studio.runs.get(run_id).read_config()  # the run trains exactly the configuration sent
    assert trained.model.id == str(tiny_model_dir) and trained.training.max_steps == 2
    assert trained.grpo.group_size == 2 and trained.hardware.device == "cpu"
    assert trained.data.source == str(tmp_path / "small.csv")

    # Follow the run the way the browser's timer does: open it in this session (the Train tab's run list, then
    # Open), then tick; the tick reads the session's run id and watch state and returns only what changed (the
    # client gets an empty update for the rest), so keep the latest of each.
    client.predict(api_name="/train_runs")
    client.predict(run_id, api_name="/train_open")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    statuses, latest = [], {}
    while time.monotonic() < deadline:
        status, progress, reward_plot, *_ = client.predict(api_name="/train_tick")
        latest.update({name: value for name, value in
                       (("status", status), ("progress", progress), ("reward_plot", reward_plot))
                       if not is_skipped(value)})
        if not is_skipped(status):
            statuses.append(status)
            if any(state in status for state in ("succeeded", "failed", "cancelled")):
                break
        time.sleep(0.5)
    assert run_state(studio, run_id) == "succeeded", studio.runs.get(run_id).read_status().get("error")
    assert any(run_id in status for status in statuses), statuses
    assert "succeeded" in latest["status"] and "Held-out reward" in latest["status"], latest["status"]
    assert 'aria-valuenow="2"' in latest["progress"] and "Step 2 / 2" in latest["progress"]
    traces = {trace["name"]: trace["x"] for trace in plot_traces(latest["reward_plot"])}
    assert traces == {"total": [1, 2], "numeric": [1, 2], "length": [1, 2], "held-out check (6 prompts)": [0, 1, 2]}

    picker, summary, *_ = client.predict("", api_name="/compare_runs")  # the Refresh button picks the session's run
    assert picker["value"] == run_id and "before" in summary, (picker, summary)
    summary, chart, table, free_prompt = client.predict(run_id, api_name="/compare_show")
    assert "before" in summary and "after" in summary, summary
    assert "Every prompt reads “What is …" in summary and free_prompt["placeholder"].startswith("What is "), (
        summary, free_prompt)
    names = {trace["name"] for trace in plot_traces(chart)}
    assert names == {"before training", "after training"}
    for trace in plot_traces(chart):
        assert trace["x"][0] == "total" and {"numeric", "length"} <= set(trace["x"])
        assert all(value is not None for value in trace["y"])
    assert table["headers"][:4] == ["Prompt", "Reference", "Before", "After"]
    held_out = studio.runs.get(run_id).read_status()
    assert "30 rows" in held_out["data_summary"] and held_out["n_eval"] >= 2, held_out["data_summary"]
    assert len(table["data"]) == held_out["n_eval"]  # one row per held-out prompt
    for prompt, reference, before, after, before_reward, after_reward, _ in table["data"]:
        assert re.fullmatch(r"\d+ [-+*] \d+\?", prompt) and reference  # the part that differs from row to row
        assert before_reward is not None and after_reward is not None
        assert before.strip() and after.strip()  # a scored side never shows a blank cell, even for an empty reply


def test_a_client_asks_whether_a_config_will_learn(client, tmp_path, tiny_model_dir):
    config = tiny_config(client, write_arithmetic_csv(tmp_path / "small.csv"), tiny_model_dir)
    report = client.predict(config, 4, api_name="/preflight")
    assert len(report["prompts"]) == 4 and "% of groups" in report["verdict"]
    assert report["no_spread"] == report["all_fail"] + report["all_pass"]
    assert {reward["name"] for reward in report["rewards"]} == {spec["name"] for spec in config["rewards"]}
    for bad in (0, 10_000, 2.5, "4", True):
        with pytest.raises(AppError, match="The number of prompts to sample must be a whole number from 1 to 256"):
            client.predict(config, bad, api_name="/preflight")


def test_client_errors_are_sentences(studio, client, tmp_path, tiny_model_dir):
    """An unknown recipe, an invalid setting and a missing data file come back as readable sentences, not
    tracebacks, and nothing is started."""
    with pytest.raises(AppError, match="There is no recipe called 'nope'; choose one of: .*arithmetic"):
        client.predict("nope", api_name="/recipe")

    config = tiny_config(client, write_arithmetic_csv(tmp_path / "small.csv"), tiny_model_dir)
    config["grpo"]["group_size"] = 1  # one completion per prompt: nothing to compare
    problem = client.predict(config, api_name="/check")
    assert problem.startswith("grpo.group_size must be between 2 and 64"), problem  # the file's words
    with pytest.raises(AppError, match="grpo.group_size must be between 2 and 64") as started:
        client.predict(config, api_name="/start")
    assert "Traceback" not in str(started.value)

    config["grpo"]["group_size"] = 2
    config["data"]["source"] = str(tmp_path / "missing.csv")
    with pytest.raises(AppError, match="missing.csv") as started:
        client.predict(config, api_name="/start")
    assert "Traceback" not in str(started.value)
    assert studio.runs.summaries() == []


@pytest.mark.parametrize("source", ["someone/their-dataset", "missing.csv"])
def test_check_says_what_dragon_check_says(client, tmp_path, tiny_model_dir, capsys, source):
    """/check reads the data as `dragon check` does: a Hub dataset that cannot be reached (tests run offline) or a
    file that is not there is refused by both, in the same sentence."""
    import yaml

    from dragon_ui.cli import main

    config = tiny_config(client, write_arithmetic_csv(tmp_path / "small.csv"), tiny_model_dir)
    config["data"]["source"] = source if "/" in source else str(tmp_path / source)
    problem = client.predict(config, api_name="/check")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    assert main(["check", str(tmp_path / "config.yaml")]) == 2
    said = capsys.readouterr().err.strip()
    assert said == f"error: {problem}" and "data.source" in problem, (said, problem)


def test_outputs_left_as_they_are_are_answered_as_gradio_answers_them(studio):
    """StudioApp.postprocess_data answers a skipped output without making its component anew (100 ms of the server's
    event loop for every page that opened): what it answers is gradio's own, for the page load's 120 outputs."""
    import asyncio

    from dragon_ui.ui.guard import SessionPage

    demo = build_app(studio)
    (load,) = [fn for fn in demo.fns.values() if fn.name == "on_page_load"]
    markdowns = [at for at, block in enumerate(load.outputs) if isinstance(block, gr.Markdown)]
    stateful = [at for at, block in enumerate(load.outputs) if block.stateful]
    assert len(load.outputs) > 100 and len(markdowns) > 2 and stateful
    given = {"all skipped": [gr.skip()] * len(load.outputs), "one skip for all": gr.skip(),
             "some": [f"**{at}**" if at in markdowns[::2] else "kept" if at in stateful else gr.skip()
                      for at in range(len(load.outputs))],
             "all but one": [f"**{at}**" if at == markdowns[0] else gr.skip() for at in range(len(load.outputs))]}
    for name, predictions in given.items():
        ours = asyncio.run(demo.postprocess_data(load, predictions, SessionPage(demo)))
        gradios = asyncio.run(gr.Blocks.postprocess_data(demo, load, predictions, SessionPage(demo)))
        assert ours == gradios, name
