"""Runs side by side where the machine has room (engine/capacity.py): the rule for cores and for a GPU's memory, on
simulated machines; two queued runs of the tiny model training at once on a machine said to have 8 cores; a paused
queue and stopping everything; and when each waiting run should start with two runs training at a time."""

from __future__ import annotations

import math

import pytest
from conftest import ended, stop_the_training
from test_queue import long_config, place_in_line, wait_for

from dragon_ui.config import HardwareSettings, RunConfig
from dragon_ui.engine import capacity, queue, training
from dragon_ui.engine.capacity import Need, Share
from dragon_ui.engine.estimate import admitted_gb, model_dims
from dragon_ui.engine.hardware import CudaDevice, HardwareInfo, resolve_hardware
from dragon_ui.engine.workers import Workers
from dragon_ui.public import LAPTOP
from dragon_ui.studio.backend import Studio
from dragon_ui.studio.runs import measured_step_s

pytestmark = pytest.mark.timeout(600)

CPU, MPS, UNKNOWN = Need("cpu", gb=1.0), Need("mps"), capacity.UNKNOWN
ROOMY_GB = 512.0  # a machine's memory where cores alone decide


def cores(count: int) -> HardwareInfo:
    """A machine of ``count`` cores and memory enough for any number of runs."""
    return HardwareInfo(cpu_cores=count, memory_gb=ROOMY_GB)


def gpu_machine(total_gb: float) -> HardwareInfo:
    """A machine with one simulated CUDA GPU of ``total_gb`` (nothing asks torch.cuda about it)."""
    return HardwareInfo(cuda=[CudaDevice(0, "Simulated GPU", total_gb, None, True)], cpu_cores=16)


def on_gpu(gb: float | None, gpu: int = 0) -> Need:
    return Need("cuda", gpu, gb)


# --- the rule -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cores, slots, threads", [(1, 1, None), (2, 1, None), (4, 1, None), (7, 1, None),
                                                   (8, 2, 3), (12, 3, 3), (16, 4, 3), (64, 16, 3)])
def test_each_cpu_run_has_at_least_four_cores(cores, slots, threads):
    machine = HardwareInfo(cpu_cores=cores, memory_gb=ROOMY_GB)
    assert capacity.cpu_slots(machine) == slots
    assert [capacity.fits(machine, [CPU] * running, CPU) for running in range(slots + 1)] == [True] * slots + [False]
    # Under 8 cores a run has the machine to itself and picks its threads as it always has (no share).
    assert capacity.share_of(RunConfig(), CPU, machine) == Share(cpu_threads=threads)


@pytest.mark.parametrize("machine", [HardwareInfo(cpu_cores=64, memory_gb=512.0), gpu_machine(80.0)])
def test_on_your_own_machine_runs_train_one_at_a_time_each_with_the_whole_machine(machine):
    """Side by side only where the machine is shared (a public demo, a workshop's): your own run is not held to a
    share while nothing trains beside it."""
    need = CPU if not machine.cuda else on_gpu(4.0)
    assert capacity.fits(machine, [], need, side_by_side=False)
    assert not capacity.fits(machine, [need], need, side_by_side=False)
    assert capacity.share_of(RunConfig(), need, machine, side_by_side=False) == Share()
    assert capacity.expected_starts(machine, [(need, 100.0)], [("a", need, 50.0), ("b", need, 10.0)],
                                    side_by_side=False) == {"a": 100.0, "b": 150.0}


@pytest.mark.parametrize("running, new, fits", [
    ([], Need("cpu", gb=30.0), True),  # alone, a run always trains
    ([Need("cpu", gb=6.0)], Need("cpu", gb=6.0), True),  # 12 of the 16 GB less the app's 2
    ([Need("cpu", gb=6.0), Need("cpu", gb=6.0)], Need("cpu", gb=2.5), False),
    ([Need("cpu", gb=6.0)], Need("cpu", gb=8.5), False),
    ([Need("cpu", gb=1.0)], Need("cpu"), False),  # a model of unknown size trains alone
    ([Need("cpu")], Need("cpu", gb=1.0), False),
])
def test_cpu_runs_share_the_machine_while_their_estimates_fit_its_memory(running, new, fits):
    """Cores alone let four runs of the biggest allowed model start on 16 cores and 16 GB: the memory decides too."""
    assert capacity.fits(HardwareInfo(cpu_cores=16, memory_gb=16.0), running, new) is fits
    assert not capacity.fits(HardwareInfo(cpu_cores=16), [Need("cpu", gb=1.0)], Need("cpu", gb=1.0))  # memory unknown


@pytest.mark.parametrize("asked, given", [(None, 3), (1, 1), (3, 3), (8, 3)])
def test_a_runs_own_threads_above_its_share_are_lowered_to_it(asked, given):
    config = RunConfig()
    config.hardware.cpu_threads = asked
    assert capacity.share_of(config, CPU, cores(8)) == Share(cpu_threads=given)


@pytest.mark.parametrize("total_gb, running, new, fits", [
    (24.0, [], on_gpu(30.0), True),  # alone, a run always trains (as a laptop's only run did)
    (24.0, [on_gpu(10.0)], on_gpu(10.0), True),
    (24.0, [on_gpu(9.0), on_gpu(9.0)], on_gpu(3.0), True),  # exactly full, each with its CUDA context's 1 GB
    (24.0, [on_gpu(9.0), on_gpu(9.0)], on_gpu(3.5), False),
    (80.0, [on_gpu(9.0)] * 7, on_gpu(9.0), True),
    (80.0, [on_gpu(9.0)] * 8, on_gpu(1.0), False),
    (80.0, [on_gpu(10.0)], on_gpu(None), False),  # a model of unknown size trains alone on its GPU
    (80.0, [on_gpu(None)], on_gpu(1.0), False),
    (80.0, [on_gpu(10.0)], CPU, False),  # runs share the machine only on one device
    (80.0, [CPU], on_gpu(1.0), False),
])
def test_runs_share_a_gpu_while_their_estimates_fit_its_memory(total_gb, running, new, fits):
    assert capacity.fits(gpu_machine(total_gb), running, new) is fits


def test_runs_on_two_gpus_count_each_gpus_memory():
    machine = HardwareInfo(cuda=[CudaDevice(0, "A", 24.0, None, True), CudaDevice(1, "B", 24.0, None, True)],
                           cpu_cores=16)
    assert capacity.fits(machine, [on_gpu(20.0, gpu=0)], on_gpu(20.0, gpu=1))
    assert not capacity.fits(machine, [on_gpu(20.0, gpu=0), on_gpu(20.0, gpu=1)], on_gpu(20.0, gpu=1))


@pytest.mark.parametrize("need", [MPS, UNKNOWN])
def test_apple_mps_and_a_run_that_cannot_be_read_train_one_at_a_time(need):
    machine = HardwareInfo(cpu_cores=64, mps=True, memory_gb=ROOMY_GB)
    assert capacity.fits(machine, [], need) and not capacity.fits(machine, [need], need)
    assert not capacity.fits(machine, [CPU], need) and not capacity.fits(machine, [need], CPU)


@pytest.mark.parametrize("total_gb", [24.0, 80.0])
def test_a_runs_need_on_a_gpu_is_its_estimate_with_the_margin_and_its_share_holds_it_there(total_gb):
    """The default recipe's model (its size is known): as many runs as their admitted memory fits on the card."""
    machine, config = gpu_machine(total_gb), RunConfig()
    config.hardware = HardwareSettings(device="auto")
    need = capacity.need_of(config, machine)
    hardware = resolve_hardware(config.hardware, machine)
    assert need == on_gpu(admitted_gb(config, model_dims(config.model.id)[0], hardware))
    fitting = 0
    while capacity.fits(machine, [need] * fitting, need):
        fitting += 1
    assert fitting == max(1, math.floor(total_gb / (need.gb + capacity.CUDA_CONTEXT_GB)))
    assert capacity.share_of(config, need, machine) == Share(gpu_memory_fraction=need.gb / total_gb)
    assert capacity.share_of(config, on_gpu(None), machine) == Share()  # unknown size: alone, uncapped


# --- expected starts ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("machine, training_now, waiting, starts", [
    # One at a time (2 cores): each waits for all before it.
    (cores(2), [(CPU, 100.0)], [("a", CPU, 200.0), ("b", CPU, 50.0)], {"a": 100.0, "b": 300.0}),
    # Two at a time (8 cores): each takes the first slot to free up, in the order of the line.
    (cores(8), [(CPU, 100.0), (CPU, 300.0)], [("a", CPU, 200.0), ("b", CPU, 100.0),
                                                               ("c", CPU, 50.0)],
     {"a": 100.0, "b": 300.0, "c": 300.0}),
    (cores(8), [(CPU, 100.0)], [("a", CPU, 200.0), ("b", CPU, 100.0)], {"a": 0.0, "b": 100.0}),
    # A run of unknown length holds its slot for good; the other slot goes on.
    (cores(8), [(CPU, None), (CPU, 100.0)], [("a", CPU, 50.0), ("b", CPU, None), ("c", CPU, 10.0)],
     {"a": 100.0, "b": 150.0, "c": None}),
    # A big run that does not fit waits, and the small one behind it does not jump it.
    (gpu_machine(24.0), [(on_gpu(16.0), 600.0)], [("big", on_gpu(16.0), 60.0), ("small", on_gpu(4.0), 60.0)],
     {"big": 600.0, "small": 600.0}),
])
def test_expected_starts_play_the_line_forward_by_the_rule(machine, training_now, waiting, starts):
    assert capacity.expected_starts(machine, training_now, waiting) == starts


def test_the_pace_of_a_waiting_run_is_the_latest_measured_on_its_model_and_step_size():
    summaries = [  # newest first, as list_runs gives them
        {"id": "5", "model": "m", "completions_per_step": 8, "step": 0, "elapsed_s": None},  # nothing measured yet
        {"id": "4", "model": "other", "completions_per_step": 8, "step": 10, "elapsed_s": 10.0},
        {"id": "3", "model": "m", "completions_per_step": 16, "step": 10, "elapsed_s": 200.0},
        {"id": "2", "model": "m", "completions_per_step": 8, "step": 10, "elapsed_s": 40.0},
        {"id": "1", "model": "m", "completions_per_step": 8, "step": 10, "elapsed_s": 90.0},
    ]
    assert measured_step_s(summaries, "m", 8) == 4.0
    assert measured_step_s(summaries, "m", 16) == 20.0
    assert measured_step_s(summaries, "m", 4) is None


# --- the queue ----------------------------------------------------------------------------------------------------


@pytest.fixture
def eight_cores(runs_dir):
    """The app's backend on a machine said to have 8 cores (two runs side by side, 3 threads each), with training
    processes of its own (none warm: each run's starts fresh)."""
    workers = Workers(machine=cores(8), side_by_side=True)
    studio = Studio(runs_dir=runs_dir, policy=LAPTOP, workers=workers)
    yield studio
    stop_the_training()
    workers.close()
    assert not training.active_runs()


def test_two_queued_runs_train_at_once_where_the_machine_has_room_and_the_third_waits(eight_cores, tiny_config_dict,
                                                                                       runs_dir):
    studio = eight_cores
    tiny_config_dict["hardware"]["cpu_threads"] = None  # each run takes its share
    queue.pause(runs_dir)  # all three join the queue before any starts
    runs = [studio.runs.start(long_config(tiny_config_dict, name)) for name in ("first", "second", "third")]
    assert [place_in_line(run) for run in runs] == [1, 2, 3]
    assert queue.start_next(runs_dir, policy=LAPTOP, workers=studio.workers) == []  # paused
    assert studio.runs.place(runs[0].id) == "1st in line; the queue is paused"
    queue.resume_queue(runs_dir)

    started = queue.start_next(runs_dir, policy=LAPTOP, workers=studio.workers)
    assert [run.id for run in started] == [run.id for run in runs[:2]]
    assert place_in_line(runs[2]) == 1 and runs[2].read_status()["waiting"] == "start"
    first, second = (run.read_status for run in runs[:2])
    wait_for(lambda: first().get("step", 0) >= 1 and second().get("step", 0) >= 1, timeout=300,
             what="both runs to train a step")
    assert first()["state"] == second()["state"] == "running"  # side by side
    handles = training.active_runs()
    assert [handle.run.id for handle in handles] == [run.id for run in runs[:2]]
    assert len({handle.process.pid for handle in handles}) == 2  # a training process each
    assert first()["cpu_threads"] == second()["cpu_threads"] == 3  # (8 - 1) // 2
    assert "this run's share of the cores" in runs[0].log_tail()
    assert queue.start_next(runs_dir, policy=LAPTOP, workers=studio.workers) == []  # no room for the third
    assert sorted(studio.runs.active_ids()) == sorted(run.id for run in runs[:2])
    assert studio.runs.place(runs[2].id).startswith("1st in line; ")
    assert set(studio.runs.expected_starts()) == {runs[2].id}

    assert sorted(queue.stop_all(runs_dir)) == sorted(run.id for run in runs)
    assert runs[2].read_status()["state"] == "cancelled" and place_in_line(runs[2]) is None
    assert [ended(run) for run in runs[:2]] == ["cancelled", "cancelled"]
    assert all(run.latest_checkpoint() is not None for run in runs[:2])  # each stopped with its last step


def test_a_paused_queue_starts_nothing_until_resumed_and_the_pause_is_kept_in_the_runs_folder(
        studio, tiny_config_dict, runs_dir):
    assert not queue.paused(runs_dir)
    queue.pause(runs_dir)
    assert queue.paused(runs_dir) and (runs_dir / queue.PAUSED_FILE).is_file()  # a restarted app reads it too
    run = studio.runs.start(tiny_config_dict)  # nothing trains, and still it waits
    assert run.read_status()["waiting"] == "start" and not training.active_runs()
    scheduler = queue.Scheduler(runs_dir, interval_s=0.2, policy=LAPTOP, workers=studio.workers).start()
    try:
        looked = scheduler.rounds
        wait_for(lambda: scheduler.rounds >= looked + 2, what="the scheduler to look at the queue twice")
        assert run.read_status()["state"] == "queued"
        queue.resume_queue(runs_dir)
        assert not queue.paused(runs_dir)
        wait_for(lambda: run.read_status()["state"] == "succeeded", timeout=240, what="the run to start and finish")
    finally:
        scheduler.stop()


def test_stop_all_empties_the_queue_and_stops_the_run_training(studio, tiny_config_dict, runs_dir):
    first = studio.runs.start(long_config(tiny_config_dict, "first"))
    waiting = studio.runs.start({**tiny_config_dict, "name": "waiting"})  # 2 cores here: one at a time
    assert place_in_line(waiting) == 1
    assert sorted(queue.stop_all(runs_dir)) == sorted([first.id, waiting.id])
    assert waiting.read_status()["state"] == "cancelled"
    assert "taken out of the queue" in waiting.read_status()["stop_reason"]
    assert ended(first) == "cancelled"
    assert queue.waiting_runs(runs_dir) == [] and queue.training_run_ids(runs_dir) == []
