"""The app trains each run in a process of its own (engine/workers.py): a Start hands the run to a warm worker that
has its model loaded, and a worker killed mid-run (as the out-of-memory killer does) or crashing leaves the app
answering and the run failed, with its checkpoints, to be resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from dragon_ui.config import HardwareSettings, ModelConfig, RunConfig
from dragon_ui.engine import training, workers
from dragon_ui.engine.workers import TrainingProcess
from dragon_ui.studio.backend import Studio
from dragon_ui.public import LAPTOP
from conftest import ended, environment_of, stop_the_training
from test_app_client import served_app
from test_queue import long_config, wait_for


@pytest.fixture
def apart_studio(runs_dir, tiny_config_dict):
    """The app's backend as `make run` builds it: each run trains in a worker process; a worker warming the tiny
    model is started at once."""
    studio = Studio(runs_dir=runs_dir, policy=LAPTOP)
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    studio.workers.warm((config.model, config.hardware))
    yield studio
    stop_the_training()
    studio.close()
    assert not training.active_runs()


def test_a_start_trains_in_a_warm_worker_process_that_already_holds_the_model(apart_studio, tiny_config_dict):
    run = apart_studio.runs.start(tiny_config_dict)
    (handle,) = training.active_runs()
    assert isinstance(handle, TrainingProcess) and handle.run.id == run.id
    assert handle.wait(240) == "succeeded", run.read_status().get("error")
    status = run.read_status()
    assert status["pid"] == handle.process.pid != os.getpid()  # trained in the worker, which has ended
    assert handle.process.returncode == 0 and "The model was loaded already" in run.log_tail()
    assert [row["step"] for row in run.read_progress()] == [1, 2] and "after" in run.read_eval()


def test_stop_saves_the_last_step_and_resume_continues_in_the_next_worker(apart_studio, tiny_config_dict):
    run = apart_studio.runs.start(long_config(tiny_config_dict, "long"))
    wait_for(lambda: len(run.read_progress()) >= 2, what="two steps")
    apart_studio.runs.stop(run.id)
    assert ended(run) == "cancelled"
    stopped_at = run.read_status()["step"]
    assert run.latest_checkpoint().name == f"checkpoint-{stopped_at}"
    apart_studio.runs.resume(run.id)
    wait_for(lambda: run.read_status().get("step", 0) > stopped_at, what="a step after the resume")
    apart_studio.runs.stop(run.id)
    assert ended(run) == "cancelled"


def test_a_worker_killed_mid_run_leaves_the_app_answering_and_the_run_failed_with_its_checkpoints(
        apart_studio, tiny_config_dict):
    """SIGKILL is what the kernel's out-of-memory killer sends: no Python code of the worker runs after it."""
    from gradio_client import Client

    from dragon_ui.ui import build_app

    run = apart_studio.runs.start(long_config(tiny_config_dict, "doomed"))
    (handle,) = training.active_runs()
    wait_for(lambda: run.latest_checkpoint() is not None and len(run.read_progress()) >= 2, what="a checkpoint")
    os.kill(handle.process.pid, signal.SIGKILL)
    assert handle.wait(60) == "failed"
    status = run.read_status()
    assert status["error"].startswith("The training process was killed (SIGKILL), most often by the system because "
                                      "the machine ran out of memory")
    checkpoint = run.latest_checkpoint()
    assert status["error"].endswith(f"Resume continues from its {checkpoint.name}.")
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "trainer_state.json").is_file()
    assert not training.active_runs()
    with served_app(build_app(apart_studio)) as url:  # the app still serves, and shows the run as failed
        client = Client(url, verbose=False)
        runs = client.predict(api_name="/train_runs")
        assert run.id in json.dumps(runs) and "failed" in json.dumps(runs)
    apart_studio.runs.resume(run.id)  # from that checkpoint, in the next worker
    wait_for(lambda: run.read_status().get("state") == "running" and run.read_status().get("step", 0)
             > int(checkpoint.name.split("-")[1]), what="a step after the resume")
    apart_studio.runs.stop(run.id)
    assert ended(run) == "cancelled"


def test_a_worker_that_raises_out_of_memory_marks_its_run_failed_in_words(apart_studio, tiny_config_dict, tmp_path):
    """An out-of-memory error that Python sees (torch's, on a GPU) ends the run as any failure does, in the worker;
    the app is untouched."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent("""
        import torch.nn

        def forward(self, *args, **kwargs):
            raise MemoryError()

        torch.nn.Module.__call__ = forward
    """), encoding="utf-8")
    apart_studio.workers.close()  # the warm one was started without the hook
    apart_studio.runs.workers = type(apart_studio.workers)(env={"PYTHONPATH": os.pathsep.join(
        [str(hook), os.environ.get("PYTHONPATH", "")])})
    run = apart_studio.runs.start(tiny_config_dict)
    assert ended(run, 240) == "failed"
    assert "out of memory" in run.read_status()["error"].lower()
    assert apart_studio.runs.summaries()[0]["state"] == "failed"  # the app's own process carries on


def test_a_training_stops_with_its_last_step_when_the_app_dies(runs_dir, tiny_config_dict, tmp_path):
    """The app killed mid-run: its worker notices and stops as Stop does, so nothing trains on unseen."""
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import yaml
        from dragon_ui.public import LAPTOP
        from dragon_ui.studio.backend import Studio
        studio = Studio(runs_dir={str(runs_dir)!r}, policy=LAPTOP)
        run = studio.runs.start(yaml.safe_load(open({str(tmp_path / "config.yaml")!r})))
        print(run.path, flush=True)
        time.sleep(600)
    """), encoding="utf-8")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(long_config(tiny_config_dict, "orphan")), encoding="utf-8")
    app = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        from dragon_ui.runstore import RunDir

        run = RunDir(Path(app.stdout.readline().strip()))
        wait_for(lambda: len(run.read_progress()) >= 1, what="a step")
    finally:
        app.kill()
        app.wait()
    wait_for(lambda: run.read_status().get("state") == "cancelled", timeout=120, what="the worker to stop")
    assert run.latest_checkpoint() is not None


def test_closing_the_app_lets_the_warm_worker_go_and_no_worker_holds_the_owner_key(runs_dir, tiny_config_dict,
                                                                                   monkeypatch):
    from dragon_ui import public

    monkeypatch.setenv(public.OWNER_KEY_ENV, "the-owners-key")
    studio = Studio(runs_dir=runs_dir, policy=LAPTOP)
    studio.workers.warm((ModelConfig(id=tiny_config_dict["model"]["id"]), HardwareSettings(device="cpu")))
    waiting = studio.workers._warm
    environment = environment_of(waiting.pid)
    assert b"PATH=" + os.environ["PATH"].encode() in environment  # the app's environment...
    assert not any(entry.startswith(public.OWNER_KEY_ENV.encode()) for entry in environment)  # ...but the key
    started = time.monotonic()
    studio.close()
    assert waiting.poll() is not None and time.monotonic() - started < 2  # ended mid-warm-up, not after it


def test_a_training_that_never_stops_is_ended_and_the_queue_moves_on(apart_studio, tiny_config_dict, tmp_path,
                                                                     monkeypatch):
    """A reward that never returns: a stop acts at the next forward pass or reward, so the run never hears it, and
    held the queue forever. Once the grace has passed the app ends its worker: the run is stopped with its last
    checkpoint, and the run waiting behind it starts."""
    monkeypatch.setattr(workers, "WATCHDOG_GRACE_S", 3)
    hang, hung = tmp_path / "hang", tmp_path / "hung"
    stuck = long_config(tiny_config_dict, "stuck")
    stuck["rewards"] = [*stuck["rewards"], {"kind": "custom", "name": "stuck", "code": (
        "import pathlib, time\n"
        "def reward(prompt, completion, reference, row):\n"
        f"    if pathlib.Path({str(hang)!r}).exists():\n"
        f"        pathlib.Path({str(hung)!r}).touch()\n"
        "        time.sleep(10 ** 6)\n"
        "    return 1.0\n")}]
    scheduler = apart_studio.runs.start_queue()
    run = apart_studio.runs.start(stuck)
    wait_for(lambda: run.latest_checkpoint() is not None, what="a checkpoint")
    waiting = apart_studio.runs.start({**tiny_config_dict, "name": "next"})
    hang.touch()
    wait_for(lambda: hung.exists(), what="the reward to hang")
    checkpoint = run.latest_checkpoint()
    apart_studio.runs.stop(run.id)
    assert ended(run, 60) == "cancelled"
    status = run.read_status()
    assert status["stop_reason"] == ("It did not stop within 3 s of being asked to (a reward or a library that never "
                                     "returned), so its training process was ended. Resume continues from its "
                                     f"{checkpoint.name}.")
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "trainer_state.json").is_file()
    try:
        wait_for(lambda: waiting.read_status().get("state") != "queued", timeout=60, what="the next run to start")
        assert ended(waiting, 240) == "succeeded"
    finally:
        scheduler.stop()


def test_a_public_demos_worker_has_no_hub_token(runs_dir, tiny_config_dict, monkeypatch):
    """The review: the training worker inherited the server's HF_TOKEN, which no visitor's run needs."""
    from dragon_ui import public

    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv("HF_TOKEN", "hf_the_servers_token")
    studio = Studio(runs_dir=runs_dir, policy=public.Policy.from_env(runs_dir))
    studio.workers.warm((ModelConfig(id=tiny_config_dict["model"]["id"]), HardwareSettings(device="cpu")))
    try:
        environment = environment_of(studio.workers._warm.pid)
        assert not any(entry.startswith((b"HF_TOKEN", public.OWNER_KEY_ENV.encode())) for entry in environment)
        assert b"HF_HUB_DISABLE_IMPLICIT_TOKEN=1" in environment  # nor a login's token on the disk
    finally:
        studio.close()
