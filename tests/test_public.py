"""Public mode (a Space, a workshop's shared machine): hostile settings are refused with one sentence each, through
the engine, the command line and the app's HTTP API, and nothing is read, written or started."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import gradio as gr
import pytest
import yaml

from conftest import demo, ended, stop_the_training, turn_public_mode_on, uploaded_by
from dragon_ui import data, public
from dragon_ui.data import mapping
from dragon_ui.cli import main
from dragon_ui.config import DEFAULT_MODEL_ID, RunConfig
from dragon_ui.engine import public_checks, training
from dragon_ui.errors import ConfigError
from dragon_ui.public import LAPTOP

MAKE_RUN = "on your own machine (make run)"


@pytest.fixture
def public_mode(monkeypatch, tiny_model_dir):
    """DRAGON_UI_PUBLIC=1, with the tiny test model on the allow-list (as an owner would add a model)."""
    turn_public_mode_on(monkeypatch, tiny_model_dir)


@pytest.fixture
def public_config(tiny_config_dict) -> dict:
    """The tiny run on a bundled dataset: a config a public demo accepts from anyone."""
    tiny_config_dict["data"]["source"] = str(data.BUNDLED_DATASETS_DIR / "arithmetic.csv")
    return tiny_config_dict


@pytest.fixture
def nothing_is_read(monkeypatch):
    """Every data reader fails the test if it is called: a refused source must be refused before it is opened."""
    def read(*args, **kwargs):
        raise AssertionError(f"a data file was read: {args[:1]}")

    for reader in ("read_file", "_load_hub"):  # every local file, and the Hub
        monkeypatch.setattr(mapping, reader, read)


def with_setting(config: dict, dotted: str, value) -> dict:
    changed = copy.deepcopy(config)
    *parents, leaf = dotted.split(".")
    target = changed
    for part in parents:
        target = target[part]
    target[leaf] = value
    return changed


SECRET = "/etc/passwd"

# (setting, value, what the refusal says): each one a visitor could send to a public demo.
HOSTILE = {
    "remote code": ("model.trust_remote_code", True, "model.trust_remote_code is turned off in this public demo"),
    "a big model": ("model.id", "Qwen/Qwen2.5-7B-Instruct", "'Qwen/Qwen2.5-7B-Instruct' is not offered in this public demo"),
    "a server path as model": ("model.id", "/root/.cache", "is not offered in this public demo"),
    "a server file": ("data.source", SECRET, "this public demo reads no other files on the server"),
    "a server csv": ("data.source", "/var/lib/secret/customers.csv", "reads no other files on the server"),
    "a relative escape": ("data.source", "../../../etc/hosts.csv", "reads no other files on the server"),
    "a bundled-looking escape": ("data.source", str(data.BUNDLED_DATASETS_DIR / ".." / ".." / "README.md"),
                                 "reads no other files on the server"),
    "all the rows": ("data.max_rows", 10_000_000, "data.max_rows must be at most 10,000 in this public demo"),
    "days of tokens": ("grpo.max_new_tokens", 32768, "grpo.max_new_tokens must be at most 256 in this public demo"),
    "a huge step": ("training.batch_size", 64, "more than this public demo's limit of 32"),
    "a vLLM server": ("generation", {"backend": "vllm-server", "vllm_server_url": "http://169.254.169.254"},
                      "vllm-server is turned off in this public demo"),
    "runs elsewhere": ("runs_dir", "/tmp/elsewhere", "runs_dir must be left empty in this public demo"),
    "custom code": ("rewards", [{"kind": "custom", "code": "def reward(completion, **kw):\n    return 1.0"}],
                    "custom Python rewards are turned off in this public demo"),
    "a command": ("rewards", [{"kind": "command", "command": "cat /etc/passwd"}],
                  "command rewards are turned off in this public demo"),
}


@pytest.mark.parametrize("setting, value, refusal", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_engine_refuses_a_hostile_run_before_reading_or_writing_anything(public_mode, nothing_is_read,
                                                                             public_config, runs_dir, setting,
                                                                             value, refusal):
    hostile = with_setting(public_config, setting, value)
    with pytest.raises(ConfigError, match=refusal) as raised:
        training.train_config(RunConfig.from_dict(hostile, policy=demo()), policy=demo())
    assert MAKE_RUN in str(raised.value) and "\n" not in str(raised.value)
    assert not training.active_runs()
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


@pytest.mark.parametrize("setting, value, refusal", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_command_line_refuses_it_too(public_mode, nothing_is_read, public_config, runs_dir, tmp_path, capsys,
                                        setting, value, refusal):
    config_file = tmp_path / "hostile.yaml"
    config_file.write_text(yaml.safe_dump(with_setting(public_config, setting, value)), encoding="utf-8")
    assert main(["train", str(config_file)]) == 2
    assert refusal.replace("\\", "") in capsys.readouterr().err
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_a_public_run_of_allowed_settings_trains(public_mode, tiny_config_dict):
    """The same checks let an ordinary run through: the visitor's own upload and a model on the allow-list."""
    tiny_config_dict["data"]["source"] = uploaded_by("someone", tiny_config_dict["data"]["source"])
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP),
                                policy=demo(public.Visitor(key="someone")))
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")


def test_uploads_are_the_uploaders_own(public_mode, nothing_is_read, tiny_config_dict):
    """An upload lies in its visitor's own folder (Files.keep_upload): nobody else may name it, and a path that
    climbs out of one's own folder into another's is another's."""
    upload = uploaded_by("alice", tiny_config_dict["data"]["source"])
    tiny_config_dict["data"]["source"] = upload
    for who, source in (("bob", upload), ("", upload),
                        ("bob", str(demo().uploads_dir / "bob" / ".." / "alice" / "test-upload" / "arithmetic.csv"))):
        tiny_config_dict["data"]["source"] = source
        with pytest.raises(ConfigError, match="reads no other files on the server"):
            training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP),
                                  policy=demo(public.Visitor(key=who)))
    assert data.locate(upload, policy=demo(public.Visitor(key="alice"))) == Path(upload)


def test_bundled_datasets_and_hub_ids_are_allowed_without_looking_at_the_disk(public_mode, monkeypatch):
    for bundled in data.bundled_datasets():
        assert data.locate(str(bundled), policy=demo()) == bundled
    assert data.locate("openai/gsm8k", policy=demo()) == data.HubDataset("openai/gsm8k")
    monkeypatch.chdir("/")
    assert data.locate("etc/passwd", policy=demo()) == data.HubDataset("etc/passwd")  # shaped like a Hub id
    assert not data.is_hub_dataset_id("etc/passwd")  # looking on the disk, the same text is a local path
    fetched = []
    monkeypatch.setattr(mapping, "_load_hub", lambda source, *args, policy: fetched.append(source) or [{"q": "1"}])
    rows = data.read_table("etc/passwd", policy=demo()).rows
    assert rows == [{"q": "1"}] and fetched == ["etc/passwd"]  # the Hub's, not /etc's


def test_too_many_rows_are_refused_with_the_limit(public_mode, tmp_path, monkeypatch):
    csv = tmp_path / "many.csv"
    csv.write_text("question,answer\n" + "".join(f"{i}+1,{i + 1}\n" for i in range(30)), encoding="utf-8")
    monkeypatch.setenv("DRAGON_UI_MAX_DATASET_ROWS", "20")
    config = data.DataConfig(source=uploaded_by("v", csv), prompt="question", reference="answer")
    visitor = public.Visitor(key="v")
    with pytest.raises(ConfigError, match="data.max_rows must be at most 20 here: the data has more than 20 rows"):
        data.load_and_map(config, policy=demo(visitor))
    assert len(data.load_and_map(data.DataConfig(**{**vars(config), "max_rows": 20}), policy=demo(visitor)).train) > 0


def test_the_owner_sets_the_limits_and_a_bad_value_is_refused_at_start(monkeypatch):
    monkeypatch.setenv("DRAGON_UI_MAX_NEW_TOKENS", "512")
    monkeypatch.setenv("DRAGON_UI_MAX_RUN_MINUTES", "2.5")
    limits = public.Limits.from_env()
    assert limits.max_new_tokens == 512 and limits.run_minutes == 2.5 and limits.completions_per_step == 32
    for bad in ("0", "-3", "lots", "1.5"):
        monkeypatch.setenv("DRAGON_UI_MAX_QUEUE", bad)
        with pytest.raises(ConfigError, match="DRAGON_UI_MAX_QUEUE must be a whole number above 0"):
            public.Limits.from_env()


def test_the_policy_is_read_from_the_environment_once_and_only_in_public_mode(monkeypatch):
    for name in (public.PUBLIC_ENV, "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(public.OWNER_KEY_ENV, " key ")
    monkeypatch.setenv(public.MODELS_ENV, "a/b, c/d")
    monkeypatch.setenv(public.CLASSIFIERS_ENV, "e/f")
    monkeypatch.setenv("DRAGON_UI_MAX_COLUMNS", "5")
    assert public.Policy.from_env(Path("runs")) is public.LAPTOP  # a laptop gets none of a demo's limits or keys
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    demo_policy = public.Policy.from_env(Path("runs"))
    assert demo_policy.public and demo_policy.limits.columns == 5 and demo_policy.owner_key == "key"
    assert demo_policy.models == ("a/b", "c/d") and demo_policy.classifiers == ("e/f",)
    assert "key" not in repr(demo_policy)  # the owner key never reaches a log line


def test_a_public_demo_runs_no_code_of_a_visitors_reward_wherever_it_is_read(tmp_path, tiny_config_dict):
    """Checking a custom reward runs its code (to find its function); a public demo refuses it before that, in
    every place a visitor's draft is read: the settings, the Rewards tab's list and its problem line, the draft
    comparison."""
    from dragon_ui.rewards import parse_rewards
    from dragon_ui.studio.draft import same_settings
    from dragon_ui.ui import rewards_tab

    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'w').close()\ndef reward(prompt, completion, reference, row):\n    return 1.0\n"
    rewards = [{"kind": "custom", "code": code}]
    draft = {**tiny_config_dict, "rewards": rewards}
    demo_policy = public.Policy(limits=public.Limits())
    with pytest.raises(ConfigError, match="custom Python rewards are turned off"):
        RunConfig.from_dict(draft, policy=demo_policy)
    with pytest.raises(ConfigError, match="custom Python rewards are turned off"):
        parse_rewards(rewards, policy=demo_policy)
    assert "turned off in this public demo" in rewards_tab.rewards_problem(rewards, policy=demo_policy)
    typed = [code if setting == "code" else None for setting in rewards_tab.SETTINGS]
    assert "turned off" in rewards_tab.add_reward([], "custom", "mine", 1.0, *typed, policy=demo_policy)[3]
    rewards_tab.rewards_table(rewards, policy=demo_policy)
    same_settings(draft, draft, policy=demo_policy)
    assert not ran.exists()
    parse_rewards(rewards, policy=LAPTOP)  # the laptop runs it: what the refusals above kept from happening
    assert ran.exists()


def test_a_run_made_outside_the_demo_lends_no_code_and_reading_it_runs_none(public_mode, studio, finished_run,
                                                                             tmp_path):
    """A runs folder a laptop trained in, later served as a public demo: reading a run's settings runs no reward
    code, and its settings are not lent with a reward the demo refuses."""
    import json

    ran = tmp_path / "ran"
    config = json.loads(finished_run.config_path.read_text(encoding="utf-8"))
    config["rewards"] = [{"kind": "custom", "name": "mine",
                          "code": f"open({str(ran)!r}, 'w').close()\ndef reward(prompt, completion, reference, row):"
                                  "\n    return 1.0\n"}]
    finished_run.config_path.write_text(json.dumps(config), encoding="utf-8")
    assert finished_run.read_config().rewards[0].kind == "custom" and not ran.exists()
    with public.visiting(public.Visitor(key="bob")), \
            pytest.raises(ConfigError, match=f"The settings of run {finished_run.id} cannot be used here: "
                                             r"rewards\[0\]\.kind: custom Python rewards are turned off"):
        studio.runs.settings_of(finished_run.id)
    assert not ran.exists()


def test_an_app_built_without_a_backend_takes_the_environments_policy(public_mode):
    from dragon_ui.ui import build_app

    assert build_app().studio.policy == demo() and demo().public


def test_the_allow_list_has_the_bundled_model_fitting_presets_and_the_owners_additions(monkeypatch):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv(public.MODELS_ENV, "my-org/tiny-model, other/model")
    allowed = public_checks.allowed_models(policy=demo())
    assert allowed[0] == DEFAULT_MODEL_ID and allowed[-2:] == ["my-org/tiny-model", "other/model"]
    assert not {"google/gemma-3-1b-it", "meta-llama/Llama-3.2-1B-Instruct"} & set(allowed)  # gated: need a login


def test_outside_public_mode_nothing_is_refused(monkeypatch, tiny_config_dict):
    monkeypatch.delenv(public.PUBLIC_ENV, raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    config = RunConfig.from_dict(with_setting(tiny_config_dict, "grpo.max_new_tokens", 32768), policy=LAPTOP)
    assert demo() is public.LAPTOP
    public_checks.check_run(config, policy=demo())
    assert public.LAPTOP.owns("anyone") and public.LAPTOP.asked_by(public.NOBODY).owns("anyone")


def test_the_laptop_reads_a_file_wider_than_a_public_demos_column_limit(monkeypatch, tmp_path):
    """3,002 columns, 23 KB: a public demo's limit of 1,000 columns is a public demo's alone."""
    monkeypatch.delenv(public.PUBLIC_ENV, raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    wide = tmp_path / "wide.csv"
    names = ["question", "answer", *(f"c{index}" for index in range(3000))]
    wide.write_text(",".join(names) + "\n" + ",".join(["1+1", "2", *("x" * 3000)]) + "\n", encoding="utf-8")
    setting = data.DataConfig(source=str(wide), prompt="question", reference="answer")
    assert len(data.load_and_map(setting, policy=demo()).columns) == 3002
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    with pytest.raises(ConfigError, match="more than the 1,000"):
        data.read_table(uploaded_by("v", wide), policy=demo(public.Visitor(key="v")))


# ----------------------------------------------------------------------------------------------------------------
# Visitors own their runs; the time limit.


def test_each_browser_and_api_session_is_its_own_visitor_and_keeps_its_token(monkeypatch):
    from dragon_ui.studio.visitors import Visitors

    visitors = Visitors(owner_key="s3cret")
    token = visitors.arrive("page-1", None)
    assert visitors.arrive("page-2", token) == token  # the same browser, reloaded: the same visitor
    assert visitors.of("page-1") == visitors.of("page-2") != visitors.of("api-client")
    assert visitors.of("api-client") == visitors.of("api-client")
    assert token not in visitors.of("page-1").key  # status.json keeps a hash: it cannot be replayed as a token
    assert visitors.of(None) is public.NOBODY
    assert visitors.unlock(visitors.of("api-client"), "guess") is None
    assert visitors.unlock(visitors.of("api-client"), "s3cret").owns_everything


def test_a_page_that_acts_before_its_load_is_answered_stays_the_visitor_it_acted_as():
    """The chance failure: an upload answered before the page's load was kept for the session's own visitor, and
    the load then made the page its new browser's visitor, to whom the file was not theirs. A new browser now takes
    the visitor its page acted as; only once, so a second load in that session (anyone who knows the session's
    name) gets a token of its own, not the first one's."""
    from dragon_ui.studio.visitors import Visitors

    visitors = Visitors()
    early = visitors.of("page-1")  # an upload, before the load
    token = visitors.arrive("page-1", None)
    assert visitors.of("page-1") == early and visitors.arrive("page-2", token) == token  # the load, a reload
    assert visitors.of("page-2") == early
    assert visitors.arrive("page-1", None) != token and visitors.of("page-1") != early
    kept = visitors.arrive("page-3", None)  # a browser that kept its token is itself, whatever its page did before
    visitors.of("page-4")
    assert visitors.arrive("page-4", kept) == kept and visitors.of("page-4") == visitors.of("page-3")
    assert visitors.of("api-1") != visitors.of("api-2")  # sessions no page loaded in are visitors apart


def test_a_visitor_cannot_stop_resume_or_download_anothers_run(public_mode, studio, public_config):
    from dragon_ui.errors import NotYoursError
    from dragon_ui.studio.visitors import Visitors
    from dragon_ui.ui import compare_tab

    alice, bob = public.Visitor(key="alice"), public.Visitor(key="bob")
    public_config["training"].update(max_steps=500, save_steps=1)
    with public.visiting(alice):
        run = studio.runs.start(public_config)
    assert run.read_status()["owner"] == "alice"
    with public.visiting(bob):
        assert studio.runs.whose({"owner": "alice"}) == "another visitor's"
        with pytest.raises(NotYoursError, match="belongs to another visitor: only the browser that started it can "
                                                "stop it"):
            studio.runs.stop(run.id)
        with pytest.raises(gr.Error, match="belongs to another visitor"):
            compare_tab.download_adapter(studio, run.id)
    with public.visiting(Visitors(owner_key="s3cret").unlock(public.Visitor(key="teacher"), "s3cret")):
        assert studio.runs.whose({"owner": "alice"}) == "yours"
    with public.visiting(alice):
        assert studio.runs.whose({"owner": "alice"}) == "yours"
        studio.runs.stop(run.id)
    assert ended(run) == "cancelled"
    with public.visiting(bob), pytest.raises(NotYoursError, match="can resume it"):
        studio.runs.resume(run.id)


def limit_reached_when(monkeypatch, reached):
    """The public time limit (Training.out_of_time) reached as soon as ``reached(status)`` holds for the run's
    status: the moment it strikes is chosen by what the run is doing, not by a clock."""
    monkeypatch.setattr(training.Training, "out_of_time", lambda job: reached(job.run.read_status()))


def test_the_time_limit_ends_a_step_within_a_forward_pass_and_keeps_the_last_whole_step(public_mode, public_config,
                                                                                      monkeypatch):
    limit_reached_when(monkeypatch, lambda status: status.get("step", 0) >= 2)
    public_config["training"].update(max_steps=50, save_steps=100)
    run = training.train_config(RunConfig.from_dict(public_config, policy=LAPTOP), policy=demo())
    assert run.read_status()["state"] == "cancelled"
    status = run.read_status()
    assert status["step"] == 2 and status["latest_checkpoint"] == "checkpoint-2"
    assert [path.name for path in run.checkpoints()] == ["checkpoint-2"]  # step 3 was cut at its first token
    assert [row["step"] for row in run.read_progress()] == [1, 2]
    assert status["stop_reason"].startswith("It reached this public demo's limit of 15 minutes per run (held-out "
                                            "scoring included)")


def test_the_time_limit_counts_the_held_out_scoring(public_mode, public_config, monkeypatch):
    """A limit that strikes while the starting model answers the held-out prompts (after training: a public demo
    trains LoRA adapters, whose starting model is scored with the adapter off) ends the scoring there, within a
    generated token: scoring is part of a run's time. The trained weights are saved by then, so the run is done,
    and Evaluate now scores both models later."""
    limit_reached_when(monkeypatch, lambda status: status.get("phase", "").startswith("scoring the starting model"))
    run = training.train_config(RunConfig.from_dict(public_config, policy=LAPTOP), policy=demo())
    assert run.read_status()["state"] == "succeeded"
    assert run.has_final_weights() and run.read_status()["step"] == public_config["training"]["max_steps"]
    assert "before" not in run.read_eval() and "after" not in run.read_eval()
    assert "held-out scoring of the starting model ended early (the time limit)" in run.log_tail()


def test_a_spaces_persistent_storage_keeps_the_runs(monkeypatch, tmp_path):
    from dragon_ui.system import disk

    monkeypatch.delenv("DRAGON_UI_RUNS_DIR", raising=False)
    monkeypatch.setattr(disk, "SPACE_STORAGE", tmp_path)
    monkeypatch.setenv("SPACE_ID", "someone/dragon")
    assert disk.resolve_runs_dir() == tmp_path / "runs"
    monkeypatch.setattr(disk, "SPACE_STORAGE", tmp_path / "none")  # a Space without persistent storage
    assert disk.resolve_runs_dir() == (disk.Path("runs")).resolve()


def test_every_event_of_the_app_knows_its_visitor(public_mode, studio):
    """Two API clients are two visitors; each event runs as the one that sent it (app.serve_as_visitors)."""
    from gradio_client import Client

    from dragon_ui.ui.app import serve_as_visitors
    from test_app_client import served_app

    with gr.Blocks() as demo:
        def who() -> str:
            return public.visitor().key

        def who_over_time():
            yield public.visitor().key
            yield public.visitor().key

        def who_and_which_page(request: gr.Request) -> str:
            return f"{public.visitor().key} {request.session_hash}"

        gr.api(who, api_name="who")
        gr.Button().click(who_over_time, None, gr.Textbox(), api_name="who_over_time")  # a generator's each step
        gr.Button().click(who_and_which_page, None, gr.Textbox(), api_name="who_and_which_page")
    serve_as_visitors(demo, studio)
    demo.studio = studio  # served as the app is, with a public demo's guards
    with served_app(demo) as url:
        first, second = Client(url, verbose=False), Client(url, verbose=False)
        assert first.predict(api_name="/who") == first.predict(api_name="/who") != second.predict(api_name="/who")
        assert first.predict(api_name="/who_over_time") == first.predict(api_name="/who")
        key, session = first.predict(api_name="/who_and_which_page").split()  # gradio still hands it the request
        assert key == first.predict(api_name="/who") and session == first.session_hash


def test_the_reference_lists_every_limit_with_its_default():
    """The table is made from the limits' own help (make reference): it is never edited by hand."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    reference = (root / "docs" / "reference.md").read_text(encoding="utf-8")
    shown = reference.partition("<!-- limits: begin -->\n")[2].partition("<!-- limits: end -->")[0]
    assert shown == public.Limits.table(), "docs/reference.md's table of limits is out of date: run make reference"
    for env, meaning, default in public.Limits.documented():
        assert f"| `{env}` | {meaning} | {default:g} |" in shown
    readme = (root / "README.md").read_text(encoding="utf-8")
    for name in (public.PUBLIC_ENV, public.MODELS_ENV, public.OWNER_KEY_ENV):
        assert f"`{name}" in readme


def test_a_visitor_continues_from_their_own_finished_run_only(public_mode, finished_run, runs_dir):
    from dragon_ui.config import ModelConfig

    finished_run.update_status(owner="alice")
    public_checks.check_model(ModelConfig(id=str(finished_run.path)), policy=demo(public.Visitor(key="alice")))
    with pytest.raises(ConfigError, match="is not offered"):
        public_checks.check_model(ModelConfig(id=str(finished_run.path)), policy=demo(public.Visitor(key="bob")))


def test_the_row_limit_is_said_in_the_data_tabs_words():
    from dragon_ui.studio.draft import place_problem

    refusal = "data.max_rows must be at most 10,000 here: the data has more than 10,000 rows, this public demo's limit"
    assert place_problem(refusal, {"data.max_rows": "Max rows"}).text.startswith("Max rows must be at most 10,000")


# ----------------------------------------------------------------------------------------------------------------
# The app's HTTP API, as a stranger's script would use it.


@pytest.fixture
def public_client(public_mode, runs_dir, training_processes):
    """A gradio_client of the app served in public mode, and a second client (another visitor)."""
    from gradio_client import Client

    from dragon_ui.studio.backend import Studio
    from dragon_ui.ui import build_app
    from test_app_client import served_app

    studio = Studio(runs_dir=runs_dir, policy=demo(), workers=training_processes(public=True))
    with served_app(build_app(studio)) as url:
        yield studio, Client(url, verbose=False), Client(url, verbose=False)
    stop_the_training()


REFUSED_OVER_HTTP = {name: case for name, case in HOSTILE.items() if case[0] != "runs_dir"}


@pytest.mark.parametrize("setting, value, refusal", REFUSED_OVER_HTTP.values(), ids=REFUSED_OVER_HTTP.keys())
def test_the_http_api_refuses_it_too(public_client, nothing_is_read, public_config, runs_dir, setting, value,
                                     refusal):
    from gradio_client.exceptions import AppError

    studio, client, _ = public_client
    hostile = with_setting(public_config, setting, value)
    hostile.pop("runs_dir")  # the app keeps runs in its own folder anyway
    checked = client.predict(hostile, api_name="/check")
    with pytest.raises(AppError) as started:
        client.predict(hostile, api_name="/start")
    assert re.search(refusal, checked) and re.search(refusal, str(started.value)), (checked, started.value)
    assert not training.active_runs() and studio.runs.summaries() == []


def test_the_http_apis_check_reads_no_data_in_a_public_demo(public_client, nothing_is_read, public_config):
    """A check would read a visitor's data as often as they ask, in the demo's one reading slot, counted against
    nothing: Start reads it, and counts."""
    _, client, _ = public_client
    assert client.predict(public_config, api_name="/check") == "valid"


def test_the_readmes_api_flow_works_whatever_runs_folder_the_app_was_given(public_client, public_config, tmp_path):
    """/recipe names no runs folder, and a draft naming one is trained in the demo's: the app never reads a draft's
    runs_dir."""
    studio, client, _ = public_client
    recipe = client.predict("arithmetic", api_name="/recipe")
    assert recipe["runs_dir"] == ""  # the demo keeps runs in its own folder, which it shows to nobody
    elsewhere = tmp_path / "elsewhere"
    for runs_dir in (recipe["runs_dir"], str(elsewhere)):
        assert client.predict({**public_config, "runs_dir": runs_dir}, api_name="/check") == "valid"
    run_id = client.predict({**public_config, "runs_dir": str(elsewhere)}, api_name="/start")
    assert (studio.runs_dir / run_id / "config.json").is_file() and not elsewhere.exists()
    studio.runs.get(run_id).request_stop()


def test_over_the_api_one_visitor_cannot_stop_anothers_run(public_client, public_config):
    from gradio_client.exceptions import AppError

    studio, alice, bob = public_client
    public_config["training"].update(max_steps=500, save_steps=1)
    public_config.pop("runs_dir")
    run_id = alice.predict(public_config, api_name="/start")
    bob.predict(api_name="/train_runs")  # the run list, as the Train tab's Refresh shows it, then Open
    bob.predict(run_id, api_name="/train_open")
    with pytest.raises(AppError, match="belongs to another visitor"):
        bob.predict(api_name="/train_stop")
    assert studio.runs.get(run_id).read_status()["state"] in ("queued", "running")
    alice.predict(api_name="/train_runs")
    alice.predict(run_id, api_name="/train_open")
    assert "Stopping: the step under way ends at once" in alice.predict(api_name="/train_stop")
    for handle in training.active_runs():  # none when the stop came while it still waited for its turn
        handle.wait(120)
    assert studio.runs.get(run_id).read_status()["state"] == "cancelled"


def test_uploads_are_capped_at_the_limit(public_mode, monkeypatch, runs_dir):
    from dragon_ui.studio.backend import Studio
    from dragon_ui.ui import guard
    from dragon_ui.ui.app import serving_options

    monkeypatch.setenv("DRAGON_UI_MAX_UPLOAD_MB", "5")
    options = serving_options(Studio(runs_dir=runs_dir, policy=demo()))
    assert options["max_file_size"] == "5mb" and "allowed_paths" not in options  # the runs folder is not served
    assert not options["run_history"] and not options["enable_monitoring"]
    routes, limits, door, pages = options["app_kwargs"]["middleware"]
    assert (routes.cls, limits.cls, door.cls, pages.cls) == (guard.OpenRoutes, guard.RequestLimits, guard.SessionDoor,
                                                             guard.PageCache)
    (pages,) = serving_options(Studio(runs_dir=runs_dir, policy=LAPTOP))["app_kwargs"]["middleware"]
    assert pages.cls is guard.PageCache  # every app's server makes its page once


def test_the_data_preview_reads_no_server_path(public_mode, nothing_is_read):
    from dragon_ui.studio.playground import preview_data

    preview = preview_data(data.DataConfig(source=SECRET, prompt="question"), policy=demo())
    assert preview.error_field == "source" and "reads no other files on the server" in preview.error
    assert preview.rows == [] and preview.columns == []
