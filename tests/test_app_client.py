"""End to end through gradio_client: the real app served on a local port, driven only through its public API.

A client session never runs ``demo.load``, so it starts from an empty draft: the test loads the arithmetic recipe,
points the data at a small CSV and the model at the tiny random Llama with the Data and Model tabs' endpoints, then
starts a run and follows it with the Train tab's tick until it finishes, as a browser would.
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

from conftest import write_arithmetic_csv
from dragon_ui.studio import Studio
from dragon_ui.ui import build_app

pytestmark = pytest.mark.timeout(300)
RUN_TIMEOUT_S = 180


@contextlib.contextmanager
def served_app(demo: gr.Blocks, **launch_options) -> Iterator[str]:
    """Serve a built app on a free local port while the block runs; yields its URL and closes the server after."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo.queue().launch(prevent_thread_lock=True, server_port=port, quiet=True, **launch_options)
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
    return studio.run(run_id).read_status().get("state", "")


def is_skipped(value) -> bool:
    """gr.skip() reaches a client as a bare update with nothing in it."""
    return isinstance(value, dict) and value.get("__type__") == "update"


def plot_traces(plot: dict) -> list[dict]:
    """The traces of a gr.Plot output as the client receives it (plotly JSON inside the payload)."""
    figure = json.loads(plot["plot"]) if isinstance(plot.get("plot"), str) else plot["plot"]
    return figure["data"]


def configure_tiny_run(client: Client, csv_path, model_dir) -> None:
    """The tiny model and sizes, set field by field through the Data and Model tabs' endpoints."""
    client.predict("arithmetic", api_name="/load_recipe")
    data = client.predict(str(csv_path), "", "train", "question", "answer", "", 0.05, api_name="/data_update")
    source_status, counts = data[7], data[10]
    assert source_status == "", source_status
    assert "30 rows" in counts and "2 held out" in counts, counts
    client.predict(str(model_dir), api_name="/model_set_model")
    client.predict("cpu", "auto", False, 1, api_name="/model_set_hardware")
    client.predict(True, 4, 8, 0.05, "all-linear", api_name="/model_set_lora")
    client.predict(2, 0.04, 1.0, 6, "dapo", "group", api_name="/model_set_grpo")
    client.predict(0.01, 1.0, 2, 2, 1, False, api_name="/model_set_training")
    client.predict("client-run", api_name="/model_set_name")


def test_a_client_trains_the_tiny_model_and_compares_it(studio, client, tmp_path, tiny_model_dir):
    configure_tiny_run(client, write_arithmetic_csv(tmp_path / "small.csv"), tiny_model_dir)

    check, _, _, yaml_text, _, _ = client.predict(api_name="/model_preview")
    assert "settings are valid" in check, check
    assert str(tiny_model_dir) in yaml_text and "max_steps: 2" in yaml_text and "group_size: 2" in yaml_text
    assert "device: cpu" in yaml_text

    _, started = client.predict(api_name="/model_start")
    assert "Started" in started, started
    run_id = re.search(r"Started (\S+);", started).group(1)
    assert run_id.endswith("-client-run") and [run["id"] for run in studio.runs()] == [run_id]

    # Follow the run the way the browser's timer does: the tick reads the session's run id and watch state, and
    # returns only what changed (the client gets an empty update for the rest), so keep the latest of each.
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
    assert run_state(studio, run_id) == "succeeded", studio.run(run_id).read_status().get("error")
    assert any("running" in status and run_id in status for status in statuses), statuses
    assert "succeeded" in latest["status"] and "Held-out reward" in latest["status"], latest["status"]
    assert 'aria-valuenow="2"' in latest["progress"] and "Step 2 / 2" in latest["progress"]
    assert {trace["name"] for trace in plot_traces(latest["reward_plot"])} == {"total", "numeric", "length"}
    assert all(trace["x"] == [1, 2] for trace in plot_traces(latest["reward_plot"]))

    picker, summary, *_ = client.predict("", api_name="/compare_runs")  # the Refresh button picks the session's run
    assert picker["value"] == run_id and "before" in summary, (picker, summary)
    summary, chart, table = client.predict(run_id, api_name="/compare_show")
    assert "before" in summary and "after" in summary, summary
    names = {trace["name"] for trace in plot_traces(chart)}
    assert names == {"before training", "after training"}
    for trace in plot_traces(chart):
        assert trace["x"][0] == "total" and {"numeric", "length"} <= set(trace["x"])
        assert all(value is not None for value in trace["y"])
    assert table["headers"][:4] == ["Prompt", "Reference", "Before", "After"]
    assert len(table["data"]) == 2  # the two held-out prompts of a 30-row file
    for prompt, reference, before, after, before_reward, after_reward, _ in table["data"]:
        assert "What is" in prompt and reference
        assert before_reward is not None and after_reward is not None
        assert before.strip() and after.strip()  # a scored side never shows a blank cell, even for an empty reply

    # The Rewards playground scores a typed reply to the first row with the recipe's rewards. The row list is
    # filled by a change of the draft, which a client does not trigger: it asks for the rows itself.
    row, row_text = client.predict(None, api_name="/rewards_rows")
    assert row["value"] == 0 and row["choices"][0][0].startswith("1: What is"), row
    assert "**Reference:**" in row_text, row_text
    reference = row_text.rsplit("**Reference:**", 1)[1].strip()
    scores, total = client.predict(0, reference, api_name="/rewards_score")
    by_name = {line[0]: line for line in scores["data"]}
    assert set(by_name) == {"numeric", "length"}
    assert by_name["numeric"][2] == 1.0 and by_name["length"][2] == 1.0  # the right sum, and short
    assert "Total (weighted sum): 1.300" in total, total
    scores, _ = client.predict(0, "I think it is probably 1000", api_name="/rewards_score")
    wrong = {line[0]: line[2] for line in scores["data"]}
    assert wrong["numeric"] == 0.0 and 0.0 <= wrong["length"] < 1.0, wrong


def test_client_errors_are_sentences(studio, client, tmp_path):
    """A missing data file and an invalid setting come back as readable sentences, not tracebacks."""
    client.predict("arithmetic", api_name="/load_recipe")
    data = client.predict(str(tmp_path / "missing.csv"), "", "train", "question", "answer", "", 0.05,
                          api_name="/data_update")
    assert data[7].startswith("❌") and "missing.csv" in data[7], data[7]

    client.predict(1, 0.04, 1.0, 6, "dapo", "group", api_name="/model_set_grpo")  # group size 1 cannot compare
    check, *_ = client.predict(api_name="/model_preview")
    assert "group_size" in check and "Traceback" not in check, check
    _, started = client.predict(api_name="/model_start")
    assert started.startswith("❌") and "group_size" in started, started
    assert studio.runs() == []
