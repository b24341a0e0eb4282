"""The warm app: what the first Start and the first preview would wait for is loaded once the server answers, and a
Start hands the run to a training process that holds the model already, which trains exactly as a cold start."""

import subprocess
import sys

import pytest
import yaml

from conftest import stop_the_training
from dragon_ui.config import RunConfig
from dragon_ui.engine import models, training
from dragon_ui.engine.hardware import resolve_hardware
from dragon_ui.public import LAPTOP
from dragon_ui.runstore import RunDir
from dragon_ui.studio.backend import Studio


@pytest.fixture
def tiny_studio(tiny_config_dict, tmp_path, runs_dir):
    """A Studio whose default recipe trains the tiny model (in float32, so runs compare number for number), with
    training processes of its own, as the app has."""
    tiny_config_dict["hardware"]["dtype"] = "float32"
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "arithmetic.yaml").write_text(yaml.safe_dump(tiny_config_dict), encoding="utf-8")
    studio = Studio(runs_dir=runs_dir, recipes_dir=recipes, policy=LAPTOP)
    yield studio
    stop_the_training()
    studio.close()
    studio.previews.release()
    models._set_aside = None  # nothing set aside outlives its test


def test_the_warm_up_loads_the_default_model_and_a_training_process_that_holds_it(tiny_studio):
    draft = tiny_studio.recipes.default()
    config = RunConfig.from_dict(draft, policy=LAPTOP)
    tiny_studio.warm_up().join(timeout=240)
    assert tiny_studio.previews.cache.holds(config.model, settings=config.hardware)

    run = tiny_studio.runs.start(draft)
    (handle,) = training.active_runs()
    assert handle is not None and handle.run.id == run.id and handle.wait(240) == "succeeded"
    assert "The model was loaded already" in run.log_tail()  # by the warm training process
    assert not tiny_studio.previews.cache.holds(config.model, settings=config.hardware)  # one copy: the training's
    assert models._set_aside is None
    assert run.read_status()["phase"] == "done" and "before" in run.read_eval()


def test_the_warm_up_leaves_the_cpus_to_an_opening_page_until_its_load_event(tiny_studio, monkeypatch):
    """On 2 CPUs, importing the libraries beside a browser building the page made its first paint 0.7 s later: the
    warm-up waits for the page's load event (Studio.page_opened), or for page_wait_s when no page comes."""
    import time

    from dragon_ui.studio import backend

    started = []

    def import_all():
        started.append(time.monotonic())
        raise RuntimeError("enough: only when it starts matters here")  # the warm-up logs it and ends

    monkeypatch.setattr(backend, "import_all", import_all)
    warming = tiny_studio.warm_up(page_wait_s=600)
    time.sleep(0.3)
    assert not started and warming.is_alive()
    opened = time.monotonic()
    tiny_studio.page_opened()
    warming.join(timeout=30)
    assert not warming.is_alive() and started and started[0] >= opened
    started.clear()
    began = time.monotonic()
    Studio(runs_dir=tiny_studio.runs_dir, policy=LAPTOP).warm_up(page_wait_s=0.2).join(timeout=30)
    assert started and started[0] - began >= 0.2  # no page came: it waited that long, and no longer


def test_a_run_on_the_taken_over_model_trains_exactly_like_one_that_loaded_its_own(tiny_studio):
    """What a warm training process does (engine/worker_main.py): load the model, set it aside, and train on it."""
    config = RunConfig.from_dict(tiny_studio.recipes.default(), policy=LAPTOP)
    cold = training.train_config(config, policy=LAPTOP)
    cache = models.ModelCache()
    cache.load(config.model, settings=config.hardware)
    cache.release(for_training=True)
    warm = training.train_config(config, policy=LAPTOP)
    assert "loaded already" not in cold.log_tail() and "loaded already" in warm.log_tail()
    for read in (RunDir.read_rollouts, RunDir.read_heldout):
        assert [{**row, "seconds": 0} for row in read(cold)] == [{**row, "seconds": 0} for row in read(warm)]
    assert [row["loss"] for row in cold.read_progress()] == [row["loss"] for row in warm.read_progress()]
    assert cold.read_samples() == warm.read_samples()


def test_a_model_set_aside_goes_back_to_the_previews_or_away_when_a_training_needs_another(tiny_studio):
    config = RunConfig.from_dict(tiny_studio.recipes.default(), policy=LAPTOP)
    cache = tiny_studio.previews.cache
    model, _ = cache.load(config.model, settings=config.hardware)
    cache.release(for_training=True)
    assert cache.load(config.model, settings=config.hardware)[0] is model  # asked for again before a training took it

    cache.release(for_training=True)
    source, hardware = models.resolve_model(config.model), resolve_hardware(config.hardware)
    assert models.take_set_aside(source, hardware, "bfloat16") is None  # another precision: loaded anew
    assert models._set_aside is None  # and the copy set aside is not kept beside it
    cache.release(for_training=True)  # nothing held: nothing set aside
    assert models.take_set_aside(source, hardware, "float32") is None


def test_a_start_while_the_app_still_imports_its_libraries_waits_for_them(tiny_studio, tiny_config_dict, tmp_path):
    """transformers imports its parts lazily, which is not thread-safe: a Start's checks (training.inspect) while
    the warm-up imported them left one side with a half-imported module ("cannot import name 'AutoTokenizer' from
    'transformers'"), every time without engine.libraries. In a fresh interpreter, so that nothing is imported yet."""
    script = ("from dragon_ui.studio.backend import Studio\n"
              "from dragon_ui.engine import training\n"
              "from dragon_ui.public import LAPTOP\n"
              f"studio = Studio(runs_dir={str(tmp_path / 'runs')!r}, recipes_dir={str(tiny_studio.recipes.folder)!r}, "
              "policy=LAPTOP)\n"
              "draft = studio.recipes.default()\n"
              "warming = studio.warm_up()\n"
              "inspection = training.inspect(studio.recipes.validate(draft), policy=LAPTOP)\n"
              "warming.join()\n"
              "print(len(inspection.mapped.train), 'prompts')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "prompts" in done.stdout and "Warming up failed" not in done.stderr
