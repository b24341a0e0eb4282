"""The limits that keep a public demo's machine everyone's, rule by rule: rows limited while a file is read, Hub
data streamed without the server's token, scoring that cannot hang, text settings with a length cap, each
visitor's share of the queue, owner keys that cannot be guessed quickly, uploads kept apart, logs kept to their run,
and a disk that is cleaned up. tests/test_public_attacks.py attacks the running app with the same rules."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import demo, ended, stop_the_training, turn_public_mode_on, uploaded_by, write_arithmetic_csv

from dragon_ui import data, public, rewards
from dragon_ui.data import tables
from dragon_ui.system import processes
from dragon_ui.public import LAPTOP
from dragon_ui.config import DEFAULT_MODEL_ID, RunConfig
from dragon_ui.engine import public_checks, queue, retention, training
from dragon_ui.engine.hardware import resolve_hardware
from dragon_ui.errors import BusyError, ConfigError, NotYoursError
from dragon_ui.studio.visitors import WRONG_KEYS_ALLOWED, Visitors
from dragon_ui.studio.backend import Studio

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def public_mode(monkeypatch, tiny_model_dir, runs_dir):
    turn_public_mode_on(monkeypatch, tiny_model_dir)
    monkeypatch.setattr(public_checks, "_starts", public.Allowance(window_s=3600))
    monkeypatch.setattr(public_checks, "_preflights", public.Allowance(window_s=3600))


# ----------------------------------------------------------------------------------------------------------------
# Rows are limited while a file is read.


def parquet_of(path: Path, rows: int) -> Path:
    pq.write_table(pa.table({"question": [f"q{i}" for i in range(rows)], "answer": ["1"] * rows}), path,
                   row_group_size=5000)
    return path


def spreadsheet_of(path: Path, rows: int) -> Path:
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    sheet.append(["question", "answer"])
    for i in range(rows):
        sheet.append([f"q{i}", i])
    book.save(path)
    return path


def jsonl_of(path: Path, rows: int) -> Path:
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": "1"}) + "\n" for i in range(rows)))
    return path


A_VISITOR = public.Visitor(key="v")  # the visitor asking, where any one will do

FILES = {"csv": lambda path, rows: write_arithmetic_csv(path.with_suffix(".csv"), rows=rows),
         "parquet": lambda path, rows: parquet_of(path.with_suffix(".parquet"), rows),
         "xlsx": lambda path, rows: spreadsheet_of(path.with_suffix(".xlsx"), rows),
         "jsonl": lambda path, rows: jsonl_of(path.with_suffix(".jsonl"), rows)}


@pytest.mark.parametrize("kind", FILES)
def test_a_file_is_read_only_as_far_as_the_rows_asked_for(kind, tmp_path):
    path = FILES[kind](tmp_path / "data", 300)
    assert len(data.read_table(str(path), max_rows=25, policy=LAPTOP).rows) == 25
    assert len(data.read_table(str(path), policy=LAPTOP).rows) == 300
    config = data.DataConfig(source=str(path), prompt="question", reference="answer", max_rows=40)
    assert data.load_and_map(config, policy=LAPTOP).n_rows == 40


@pytest.mark.parametrize("kind", FILES)
def test_a_public_demo_stops_one_row_past_its_limit_and_refuses(kind, public_mode, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAGON_UI_MAX_DATASET_ROWS", "100")
    source = uploaded_by("v", FILES[kind](tmp_path / "data", 250))
    assert len(data.read_table(source, policy=demo(A_VISITOR)).rows) == 101
    with pytest.raises(ConfigError, match="the data has more than 100 rows"):
        data.load_and_map(data.DataConfig(source=source, prompt="question", reference="answer"), policy=demo(A_VISITOR))
    setting = data.DataConfig(source=source, prompt="question", reference="answer", max_rows=90)
    mapped = data.load_and_map(setting, policy=demo(A_VISITOR))
    assert mapped.n_rows == 90


def test_millions_of_rows_in_a_small_parquet_file_are_never_decoded(public_mode, tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"question": ["What is 1 + 1?"] * 3_000_000, "answer": ["2"] * 3_000_000}), bomb)
    assert bomb.stat().st_size < 200_000
    source = uploaded_by("v", bomb)
    decoded = []
    real_batches = pq.ParquetFile.iter_batches

    def counted_batches(self, *args, **kwargs):
        for batch in real_batches(self, *args, **kwargs):
            decoded.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted_batches)
    assert len(data.read_table(source, policy=demo(A_VISITOR)).rows) == 10_001
    assert sum(decoded) <= 10_001 + 1024  # batch by batch, stopping at the limit


def repeated_text_parquet(path: Path, rows: int, length: int) -> Path:
    """One long text in every row, written as Parquet stores it: once, in a dictionary (never whole in memory)."""
    question = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * length]))
    pq.write_table(pa.table({"question": question, "answer": ["1"] * rows}), path)
    return path


def repeated_text_spreadsheet(path: Path, rows: int, length: int) -> Path:
    from openpyxl import Workbook

    book = Workbook()
    for _ in range(rows):  # one shared string, in every row
        book.active.append(["x" * length, "1"])
    book.save(path)
    return path


UNPACKING = {  # a few kilobytes that unpack into far more than the limit
    "parquet, 300 rows of 100 KB": (lambda path: repeated_text_parquet(path.with_suffix(".parquet"), 300, 100_000),
                                    "unpacks to more than this public demo's limit of 10 MB of data"),
    "parquet, 5000 rows of 1 MB": (lambda path: repeated_text_parquet(path.with_suffix(".parquet"), 5000, 10**6),
                                   "takes more than this public demo's memory for one dataset once it is unpacked"),
    "xlsx, 2000 rows of 30 KB": (lambda path: repeated_text_spreadsheet(path.with_suffix(".xlsx"), 2000, 30_000),
                                 "unpacks to more than this public demo's limit|takes more than this public demo's "
                                 "memory"),
}


@pytest.mark.parametrize("make, refusal", UNPACKING.values(), ids=UNPACKING.keys())
def test_a_small_file_that_unpacks_into_gigabytes_is_refused_and_the_app_never_holds_it(make, refusal, public_mode,
                                                                                        tmp_path, monkeypatch):
    monkeypatch.setenv("DRAGON_UI_MAX_UPLOAD_MB", "1")  # 10 MB of rows at most
    monkeypatch.setenv("DRAGON_UI_MAX_TEXT_CHARS", str(10**7))  # the limits on unpacking, not the one on a cell
    path = make(tmp_path / "small")
    assert path.stat().st_size < 1_000_000
    source = uploaded_by("v", path)
    monkeypatch.setattr(tables, "read_here", lambda *args: pytest.fail("read in the app's own process"))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=refusal):
        data.read_table(source, policy=demo(A_VISITOR))
    assert time.monotonic() - started < processes.SECONDS


def test_reads_take_turns_by_address_and_one_address_cannot_fill_the_line():
    """42, item 5: three 60-second reads from one address made a bystander's Start fail after 121 s. Now the waiting
    reads take turns by address (a bystander's comes next), and an address has at most two waiting."""
    turns, order, holding = processes.FairTurns(), [], threading.Event()

    def read(asker: str, name: str, hold: bool = False):
        with turns.turn(asker, timeout=60):
            order.append(name)
            if hold:
                holding.set()
                release.wait(60)

    release = threading.Event()
    first = threading.Thread(target=read, args=("attacker", "attacker 1", True))
    first.start()
    assert holding.wait(60)
    waiting = [threading.Thread(target=read, args=("attacker", f"attacker {n}")) for n in (2, 3)]
    for thread in waiting:
        thread.start()
    while len(turns._waiting) < 2:
        time.sleep(0.01)
    with pytest.raises(processes.TurnRefused) as refused:
        read("attacker", "attacker 4")
    assert refused.value.crowded
    bystander = threading.Thread(target=read, args=("bystander", "bystander"))
    bystander.start()
    while len(turns._waiting) < 3:
        time.sleep(0.01)
    release.set()
    for thread in [first, *waiting, bystander]:
        thread.join(60)
    assert order == ["attacker 1", "bystander", "attacker 2", "attacker 3"]


def test_the_bundled_datasets_never_wait_for_a_visitors_read(public_mode, monkeypatch):
    """Every first page shows one: they are the app's own small files, read in the app's process."""
    monkeypatch.setattr(tables, "run_apart", lambda *args: pytest.fail("read apart, behind visitors' files"))
    for path in data.bundled_datasets():
        assert data.read_table(str(path), policy=demo()).rows


def test_the_unnamed_asker_is_never_refused_for_crowding():
    """A laptop's checks (or a training's) all ask as "": they wait their turn, as behind a plain lock."""
    turns, release, holding = processes.FairTurns(), threading.Event(), threading.Event()

    def hold():
        with turns.turn("", timeout=60):
            holding.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    done = []
    waiting = [threading.Thread(target=lambda: done.append(_take_turn(turns, ""))) for _ in range(3)]
    for thread in waiting:
        thread.start()
    while len(turns._waiting) < 3:
        time.sleep(0.01)
    release.set()
    for thread in [holder, *waiting]:
        thread.join(60)
    assert done == [True] * 3


def _take_turn(turns, asker: str) -> bool:
    with turns.turn(asker, timeout=60):
        return True


def test_a_read_that_waits_too_long_is_refused_and_the_line_goes_on():
    turns, release = processes.FairTurns(), threading.Event()

    def hold():
        with turns.turn("a", timeout=60):
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    while not turns._busy:
        time.sleep(0.01)
    with pytest.raises(processes.TurnRefused) as refused, turns.turn("b", timeout=0.2):
        pass
    assert not refused.value.crowded
    release.set()
    holder.join(60)
    with turns.turn("c", timeout=1):
        assert not turns._waiting


def test_a_file_read_apart_gives_the_same_table(public_mode, tmp_path):
    """Read in its own process, a spreadsheet gives the same rows, notes and sheets as read here."""
    path = spreadsheet_of(tmp_path / "data.xlsx", 30)
    read_apart = tables.read_file(path, max_rows=10, max_read_mb=5)
    here = tables.read_file(path, max_rows=10)
    assert (read_apart.rows, read_apart.notes, read_apart.sheets) == (here.rows, here.notes, here.sheets)
    with pytest.raises(ConfigError, match="has no sheet called 'nope'"):
        tables.read_file(path, sheet="nope", max_read_mb=5)


def test_a_header_of_thousands_of_repeated_names_is_read_in_linear_time(tmp_path):
    """On a laptop, with no column limit: a 3,002-column CSV (23 KB) was refused by the public demo's limit."""
    path = tmp_path / "wide.csv"
    path.write_text(",".join(["a"] * 3002) + "\n" + ",".join(["1"] * 3002) + "\n")
    started = time.monotonic()
    table = data.read_table(str(path), policy=LAPTOP)
    assert time.monotonic() - started < 2 and list(table.rows[0])[:3] == ["a", "a (2)", "a (3)"]
    assert len(table.rows[0]) == 3002


def wide_jsonl(path: Path, columns: int) -> Path:
    """Few keys a row, each row its own: the columns add up over the rows."""
    lines = (json.dumps({f"c{row}_{key}": "x" for key in range(10)}) for row in range(columns // 10 + 1))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


WIDE = {  # a file of more than 1,000 columns, of each kind that has no header row to check first
    "jsonl": lambda path: wide_jsonl(path.with_suffix(".jsonl"), 1001),
    "json": lambda path: path.with_suffix(".json").write_text(json.dumps([{f"c{i}": 1 for i in range(1001)}]))
    and path.with_suffix(".json"),
    "parquet": lambda path: pq.write_table(pa.table({f"c{i}": [1] for i in range(1001)}), path.with_suffix(".parquet"))
    or path.with_suffix(".parquet"),
}


@pytest.mark.parametrize("kind", WIDE)
def test_a_public_demo_counts_the_columns_of_every_kind_of_file(kind, public_mode, tmp_path):
    """The header's check covered CSV, TSV and spreadsheets only: a 5.7 MB JSONL upload of 400,001 columns took the
    server's own process 49 s of CPU and 2.4 GB to show."""
    source = uploaded_by("v", WIDE[kind](tmp_path / "wide"))
    with pytest.raises(ConfigError, match="more than 1,000 columns, the most a table may have in this public demo"):
        data.read_table(source, policy=demo(A_VISITOR))


@pytest.mark.parametrize("kind", WIDE)
def test_a_laptop_reads_wide_files_of_every_kind(kind, tmp_path):
    assert len(tables.read_file(WIDE[kind](tmp_path / "wide")).rows) >= 1


def test_streamed_hub_rows_are_counted_too(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda path, **kwargs: iter([{f"c{i}": 1 for i in range(1001)}]))
    assert len(data.stream_hub_rows("o/n", None, "train", None, 2**20)[0]) == 1001  # no limit given
    with pytest.raises(ConfigError, match="the Hub dataset 'o/n' has more than 1,000 columns"):
        data.stream_hub_rows("o/n", None, "train", None, 2**20, max_columns=1000)


def test_a_public_demo_reads_no_more_columns_than_its_limit(public_mode, tmp_path, monkeypatch):
    path = tmp_path / "wide.csv"
    path.write_text(",".join(["a"] * 1001) + "\n" + ",".join(["1"] * 1001) + "\n")
    source = uploaded_by("v", path)
    with pytest.raises(ConfigError, match="the header has 1,001 columns, more than the 1,000 a table may have "
                                          "in this public demo"):
        data.read_table(source, policy=demo(A_VISITOR))
    monkeypatch.setenv("DRAGON_UI_MAX_COLUMNS", "2000")
    assert len(data.read_table(source, policy=demo(A_VISITOR)).rows[0]) == 1001


# ----------------------------------------------------------------------------------------------------------------
# Hub data in a public demo.


FAKE_DATASETS = """
import json, os
def load_dataset(path, **kwargs):
    with open(os.environ["SPY"], "w") as spy:
        json.dump({"path": path, "kwargs": kwargs, "cwd": os.getcwd(), "files_here": os.listdir("."),
                   "tokens": [key for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "DRAGON_UI_OWNER_KEY")
                              if key in os.environ]}, spy)
    return iter({"question": f"q{i}", "answer": "1"} for i in range(1_000_000))
"""


def test_a_public_demo_streams_hub_data_apart_without_the_servers_token_and_never_from_the_disk(
        public_mode, monkeypatch, tmp_path):
    """datasets.load_dataset itself, replaced by a spy in the reading process: an hf:// path (never a folder of the
    same name), streaming (nothing past the limit is downloaded), token=False, no token in its environment, and an
    empty folder to run in; nor the demo's owner key."""
    fake = tmp_path / "fake" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_DATASETS)
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    monkeypatch.setenv("SPY", str(tmp_path / "spy.json"))
    monkeypatch.setenv("HF_TOKEN", "hf_server_secret")
    monkeypatch.setenv("DRAGON_UI_OWNER_KEY", "the-owners-key")
    monkeypatch.setenv("DRAGON_UI_MAX_DATASET_ROWS", "50")
    (tmp_path / "app" / "owner" / "name").mkdir(parents=True)  # a folder shaped like the Hub id, where the app runs
    monkeypatch.chdir(tmp_path / "app")
    rows = data.read_table("owner/name", hub_config="main", hub_split="test", policy=demo()).rows
    assert len(rows) == 51  # one past the limit: enough to refuse
    spy = json.loads((tmp_path / "spy.json").read_text())
    assert spy["path"] == "hf://datasets/owner/name"
    assert spy["kwargs"] == {"name": "main", "split": "test", "streaming": True, "token": False}
    assert spy["tokens"] == [] and spy["files_here"] == [] and spy["cwd"] != str(tmp_path / "app")


def test_streamed_hub_data_is_capped_in_size(monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset",
                        lambda path, **kwargs: iter({"text": "x" * 100_000} for _ in range(1000)))
    with pytest.raises(ConfigError, match="already hold more than this public demo's limit of 1 MB of data"):
        data.stream_hub_rows("owner/name", None, "train", None, 2**20)


def test_a_hub_row_that_unpacks_into_gigabytes_ends_the_reading_process_not_the_app(public_mode, monkeypatch,
                                                                                    tmp_path):
    fake = tmp_path / "fake" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def load_dataset(path, **kwargs):\n"
                                      "    yield {'text': 'x' * (3 * 2**30)}\n")  # one row of 3 GB
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    with pytest.raises(ConfigError, match="takes more than this public demo's memory for one dataset"):
        data.read_table("owner/huge", policy=demo())


def test_a_run_folder_shaped_like_a_hub_id_is_never_loaded_from_the_disk(public_mode, monkeypatch, tmp_path):
    """The real datasets library, offline: runs/<id> in the app's folder goes to the Hub, which is unreachable."""
    (tmp_path / "runs" / "someone").mkdir(parents=True)
    (tmp_path / "runs" / "someone" / "train.jsonl").write_text('{"secret": "theirs"}\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="the Hugging Face Hub could not be reached to load 'runs/someone'"):
        data.read_table("runs/someone", policy=demo())


# ----------------------------------------------------------------------------------------------------------------
# Scoring that cannot hang.


@pytest.mark.parametrize("pattern, refused", [
    (r"(a|aa)+$", True),  # exponential in the regex package too
    (r"(x+x+)+y", False),  # the regex package matches these in linear time
    (r"(a+)+$", False),
    (r"^(\w+\s?)*$", False),
    (r"^\d+$", False),
    (r"\bcat\b", False),
])
def test_a_pattern_that_backtracks_exponentially_is_refused_when_it_is_saved(pattern, refused):
    started = time.monotonic()
    if refused:
        with pytest.raises(ConfigError, match="takes too long on some replies"):
            rewards.RewardSpec.from_dict({"kind": "regex", "pattern": pattern}, policy=LAPTOP)
    else:
        (reward,) = rewards.build_rewards([rewards.RewardSpec.from_dict({"kind": "regex", "pattern": pattern}, policy=LAPTOP)], policy=LAPTOP)
        reward("", "word " * 10_000 + "!", None, {})
    assert time.monotonic() - started < 2


def test_a_slow_match_scores_zero_as_a_failure_within_its_time_limit(monkeypatch):
    """A pattern the check let through but that is slow on one reply: that reply scores 0, the failure is
    counted, and other threads run meanwhile (the regex package lets go of the GIL)."""
    monkeypatch.setattr(rewards.code, "_slow_text", lambda *args: None)  # as if the check had missed it
    (reward,) = rewards.build_rewards([rewards.RewardSpec.from_dict({"kind": "regex", "pattern": r"(a|aa)+$"}, policy=LAPTOP)], policy=LAPTOP)
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    failures = rewards.RewardFailures()
    started = time.monotonic()
    score, error = rewards.safe_score(reward, "", "a" * 60 + "!", None, {}, failures)
    done.set()
    ticker.join()
    assert score == 0.0 and "took longer than 0.25 s" in error and failures.counts() == {"regex": 1}
    assert time.monotonic() - started < 1
    gaps = [later - earlier for earlier, later in zip(ticks, ticks[1:])]
    assert len(ticks) > 10 and max(gaps) < 0.1  # the other thread kept running


OLD_FENCE = re.compile(r"```[\w+-]*[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL)  # the reward's regex, quadratic


def test_the_json_fence_is_read_as_the_old_pattern_read_it_in_linear_time():
    rng = random.Random(0)
    pieces = ["`", "```", "json", "a", " ", "\t", "\n", "{", "}", "+", "-", "é", "1"]
    for _ in range(50_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        old = OLD_FENCE.fullmatch(text)
        assert rewards.builtin._fenced_content(text) == (old.group(1) if old else None), repr(text)
    (reward,) = rewards.build_rewards([rewards.RewardSpec.from_dict({"kind": "json"}, policy=LAPTOP)], policy=LAPTOP)
    started = time.monotonic()
    for text in ("```" + "a" * 200_000, "```\n" + "```a" * 50_000, "```json\n{\"a\": 1}" + " " * 100_000 + "```"):
        reward("", text, None, {})
    assert time.monotonic() - started < 1


# ----------------------------------------------------------------------------------------------------------------
# Text settings have a length cap, everywhere.


TOO_LONG = {
    "the prompt template": ("data", "prompt", 10_001, "data.prompt has 10,001 characters, more than the 10,000"),
    "the reference": ("data", "reference", 10_001, "data.reference has 10,001 characters"),
    "the system message": ("data", "system", 10_001, "data.system has 10,001 characters"),
    "the source": ("data", "source", 1001, "data.source has 1,001 characters"),
    "the run name": (None, "name", 101, "name has 101 characters, more than the 100"),
    "the model id": ("model", "id", 1001, "model.id has 1,001 characters"),
    "a revision": ("model", "revision", 201, "model.revision has 201 characters"),
}


@pytest.mark.parametrize("section, key, length, refusal", TOO_LONG.values(), ids=TOO_LONG.keys())
def test_every_text_setting_has_a_length_cap(tiny_config_dict, section, key, length, refusal):
    (tiny_config_dict[section] if section else tiny_config_dict)[key] = "a" * length
    with pytest.raises(ConfigError, match=refusal):
        RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)


@pytest.mark.parametrize("reward, refusal", [
    ({"kind": "regex", "pattern": "a" * 1001}, "rewards\\[0\\].pattern has 1,001 characters"),
    ({"kind": "keyword", "words": ["w"] * 101}, "rewards\\[0\\].words has 101 items, more than the 100"),
    ({"kind": "keyword", "words": ["w" * 201]}, "rewards\\[0\\].words has 201 characters"),
    ({"kind": "numeric", "name": "n" * 201}, "rewards\\[0\\].name has 201 characters"),
])
def test_reward_settings_have_length_caps(reward, refusal):
    with pytest.raises(ConfigError, match=refusal):
        rewards.parse_rewards([reward], policy=LAPTOP)


def test_a_run_has_at_most_twenty_rewards():
    with pytest.raises(ConfigError, match="rewards has 21 rewards, more than the 20"):
        rewards.parse_rewards([{"kind": "numeric", "name": f"n{i}"} for i in range(21)], policy=LAPTOP)


# ----------------------------------------------------------------------------------------------------------------
# What a public run may be.


REFUSED = {
    "full fine-tuning": ("lora", "enabled", False, "lora.enabled must stay on in this public demo"),
    "a huge adapter": ("lora", "r", 128, "lora.r must be at most 64 in this public demo"),
    "every thread": ("hardware", "cpu_threads", (os.cpu_count() or 1) + 1, "hardware.cpu_threads must be at most"),
    "a revision": ("model", "revision", "refs/pr/1", "model.revision must be left empty in this public demo"),
    "long prompts": ("data", "max_prompt_tokens", 8000, "data.max_prompt_tokens must be at most 512 in this public "
                     "demo .its limit of tokens per prompt"),
    "absurd prompts": ("data", "max_prompt_tokens", 10**30, "data.max_prompt_tokens must be at most 512"),
}


@pytest.mark.parametrize("section, key, value, refusal", REFUSED.values(), ids=REFUSED.keys())
def test_a_public_run_keeps_to_lora_its_rank_the_cores_and_the_main_revision(public_mode, tiny_config_dict,
                                                                             section, key, value, refusal):
    tiny_config_dict[section][key] = value
    tiny_config_dict["data"]["source"] = str(data.BUNDLED_DATASETS_DIR / "arithmetic.csv")
    with pytest.raises(ConfigError, match=refusal):
        public_checks.check_run(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=demo())


def test_a_run_that_would_need_more_memory_than_the_machine_has_is_refused(public_mode, monkeypatch,
                                                                           tiny_config_dict):
    monkeypatch.setenv(public.MODELS_ENV, "someone/giant-400B")
    tiny_config_dict["model"] = {"id": "someone/giant-400B"}
    tiny_config_dict["data"]["source"] = str(data.BUNDLED_DATASETS_DIR / "arithmetic.csv")
    with pytest.raises(ConfigError, match=r"This run would need about [\d.]+ GB of memory with prompts of about 56 "
                                          r"tokens, [\d.]+ GB with the estimate's margin of 25 %: more than the "
                                          r"[\d.]+ GB this machine has"):
        public_checks.check_run(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=demo())


@pytest.mark.parametrize("checkpointing, machine_gb, admitted", [
    (False, 24, True),  # measured peak 15.4 GB: it fits a 24 GB machine, checkpointing or not
    (False, 16, False),  # not a 16 GB Space, with the margin
    (True, 16, True),  # where gradient checkpointing (measured peak 5.5 GB) does
])
def test_the_calculator_lesson_is_admitted_where_its_estimate_with_the_margin_fits(public_mode, monkeypatch,
                                                                                   checkpointing, machine_gb, admitted):
    """A public demo admits by the fitted estimate and its stated margin: the lesson's 24 prompts of ~416 tokens
    peaked at 15.4 GB without gradient checkpointing (the old estimate said 36 GB and refused it everywhere)."""
    from dragon_ui import ASSETS_DIR

    config = RunConfig.from_file(ASSETS_DIR / "recipes" / "calculator.yaml", policy=LAPTOP)
    config.training.gradient_checkpointing = checkpointing
    config.hardware.device, config.hardware.dtype = "cpu", "bfloat16"  # the measured precision, on any machine
    monkeypatch.setattr(public_checks, "_memory_gb", lambda info, hardware: machine_gb)
    if admitted:
        public_checks.check_memory(config, longest_prompt=416, policy=demo())
        return
    with pytest.raises(ConfigError, match=rf"with its longest prompt of 416 tokens, [\d.]+ GB with the estimate's "
                                          rf"margin of 25 %: more than the {machine_gb:.1f} GB this machine has"):
        public_checks.check_memory(config, longest_prompt=416, policy=demo())


@pytest.mark.parametrize("share, admitted", [(1.01, True), (0.99, False)])
def test_a_run_is_refused_only_when_its_estimate_with_the_margin_passes_the_machines_memory(
        public_mode, monkeypatch, tiny_config_dict, share, admitted):
    from dragon_ui.engine import estimate

    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    hardware = resolve_hardware(config.hardware)
    needed = estimate.estimate_memory(config, estimate.model_dims(config.model.id)[0], hardware.dtype, False, "cpu",
                                      estimate.PROMPT_TOKENS).total_gb * (1 + estimate.MEMORY_MARGIN)
    monkeypatch.setattr(public_checks, "_memory_gb", lambda info, hardware: needed * share)
    if admitted:
        public_checks.check_memory(config, policy=demo())
    else:
        with pytest.raises(ConfigError, match="with the estimate's margin of 25 %: more than the"):
            public_checks.check_memory(config, policy=demo())


@pytest.mark.parametrize("long_words", [0, 150], ids=["short prompts", "some too long"])
def test_the_memory_check_counts_the_longest_prompt_the_data_really_has(public_mode, monkeypatch, tiny_config_dict,
                                                                        tmp_path, long_words):
    """A visitor chooses the data: 1,000-token prompts once grew the server by 13 GB while the check assumed 56. The
    settings are checked with prompts of a usual length before the data is read, and again with the longest prompt
    the run keeps once it is (at most data.max_prompt_tokens, within the demo's limit)."""
    from dragon_ui.engine import estimate

    seen = []
    real = estimate.estimate_memory
    monkeypatch.setattr(estimate, "estimate_memory", lambda *args, **kwargs: (args[0] is config and seen.append(
        args[5])) or real(*args, **kwargs))  # this run's estimates (not those of the presets offered)
    rows = "question,answer\n" + "".join(f"{' '.join(['what'] * (long_words if n % 2 else 3))} {n} + 1?,{n + 1}\n"
                                          for n in range(30))
    (tmp_path / "long.csv").write_text(rows, encoding="utf-8")
    tiny_config_dict["data"].update(source=uploaded_by("v", tmp_path / "long.csv"), max_prompt_tokens=200)
    config = RunConfig.from_dict(tiny_config_dict, policy=LAPTOP)
    inspection = training.inspect(config, policy=demo(A_VISITOR))
    fit = inspection.prompts
    assert seen[0] == estimate.PROMPT_TOKENS and seen[-1] == fit.longest_kept == min(fit.longest, 200)
    assert (fit.dropped > 0) == (long_words > 0)

    if not long_words:
        return
    # A machine on which the settings fit with usual prompts, and this data's do not.
    dtype = resolve_hardware(config.hardware).dtype
    needed = [real(config, estimate.model_dims(config.model.id)[0], dtype, False, "cpu", tokens).total_gb
              * (1 + estimate.MEMORY_MARGIN) for tokens in (estimate.PROMPT_TOKENS, fit.longest_kept)]
    monkeypatch.setattr(public_checks, "_memory_gb", lambda info, hardware: sum(needed) / 2)
    with pytest.raises(
            ConfigError, match=rf"with its longest prompt of {fit.longest_kept} tokens, [\d.]+ GB with the estimate's "
                               r"margin of 25 %: more than the [\d.]+ GB this machine has; .*, use shorter prompts "
                               r"\(data.max_prompt_tokens\)"):
        training.inspect(config, policy=demo(A_VISITOR))


@pytest.mark.parametrize("chosen, device, limit, why", [
    (None, "cpu", 512, "this public demo's limit of tokens per prompt"),
    (None, "cuda", 512, "this public demo's limit of tokens per prompt"),
    (300, "cpu", 300, "data.max_prompt_tokens"),
])
def test_a_public_run_drops_prompts_past_the_demos_limit_on_any_device(public_mode, chosen, device, limit, why,
                                                                       tiny_config_dict):
    from dragon_ui.engine.prompts import prompt_limit

    tiny_config_dict["data"]["max_prompt_tokens"] = chosen
    assert prompt_limit(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), device, context=None, policy=demo()) == (limit, why)


@pytest.mark.parametrize("column", ["question", "answer"])
def test_a_public_demo_refuses_a_row_whose_text_is_longer_than_its_limit(public_mode, column):
    rows = [{"question": "What is 2 + 2?", "answer": "4"} for _ in range(30)]
    rows[7][column] = "9" * 10_001
    setting = data.DataConfig(source="x.csv", prompt="question", reference="answer")
    with pytest.raises(ConfigError, match=rf"data.{'prompt' if column == 'question' else 'reference'} gives row 8 "
                                          "10,001 characters, more than this public demo's limit of 10,000"):
        data.map_rows(rows, setting, policy=demo())
    assert len(data.map_rows(rows, setting, policy=LAPTOP).train) > 20  # a laptop's policy trains on it


def test_a_public_run_keeps_only_its_newest_checkpoints(public_mode, tiny_config_dict):
    tiny_config_dict["data"]["source"] = uploaded_by("v", tiny_config_dict["data"]["source"])
    tiny_config_dict["training"].update(max_steps=4, save_steps=1)
    run = training.train_config(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), policy=demo(A_VISITOR))
    assert run.read_status()["state"] == "succeeded", run.read_status().get("error")
    assert [path.name for path in run.checkpoints()] == ["checkpoint-3", "checkpoint-4"]


def test_the_held_out_prompts_are_capped_and_the_summary_says_so(public_mode, tmp_path):
    source = uploaded_by("v", write_arithmetic_csv(tmp_path / "many.csv", rows=2000))
    mapped = data.load_and_map(data.DataConfig(source=source, prompt="question", reference="answer",
                                               eval_frac=0.5), policy=demo(A_VISITOR))
    assert len(mapped.eval) == 50 and len(mapped.train) == 1950
    assert "Only 50 rows are held out, this public demo's limit of held-out prompts" in mapped.summary()


# ----------------------------------------------------------------------------------------------------------------
# Each visitor's share of the queue.


def long_run(config: dict, name: str) -> dict:
    return {**config, "name": name, "training": {**config["training"], "max_steps": 5000, "save_steps": 5000}}


def test_each_visitor_and_each_address_has_a_few_runs_and_starts(public_mode, studio, tiny_config_dict,
                                                                 monkeypatch, training_processes):
    monkeypatch.setenv("DRAGON_UI_MAX_RUNS_PER_ADDRESS", "3")
    monkeypatch.setenv("DRAGON_UI_MAX_STARTS_PER_HOUR", "3")
    studio = Studio(runs_dir=studio.runs_dir, policy=demo(),  # as an app started with these limits
                    workers=training_processes(public=True))
    upload = uploaded_by("alice", tiny_config_dict["data"]["source"])
    alice = public.Visitor(key="alice", address="home")
    config = {**long_run(tiny_config_dict, "a"), "data": {**tiny_config_dict["data"], "source": upload}}
    with public.visiting(alice):
        runs = [studio.runs.start(config), studio.runs.start(config)]
        with pytest.raises(BusyError, match="You already have 2 runs training or waiting"):
            studio.runs.start(config)
    bundled = {**long_run(tiny_config_dict, "b"),
               "data": {**tiny_config_dict["data"], "source": str(data.BUNDLED_DATASETS_DIR / "arithmetic.csv")}}
    with public.visiting(public.Visitor(key="alices-script", address="home")):
        runs.append(studio.runs.start(bundled))
    with public.visiting(public.Visitor(key="another-call", address="home")), \
            pytest.raises(BusyError, match="3 runs from your network address are already training or waiting"):
        studio.runs.start(bundled)
    with public.visiting(public.Visitor(key="bob", address="elsewhere")):
        runs.append(studio.runs.start(bundled))  # another address is not held up
    for run in runs:
        with public.visiting(public.Visitor(unlocked=True, key="owner")):
            studio.runs.stop(run.id)
    assert [ended(run) for run in runs] == ["cancelled"] * 4
    with public.visiting(public.Visitor(key="alices-script", address="home")), \
            pytest.raises(BusyError, match="3 runs were started from your network address in the last hour"):
        studio.runs.start(bundled)


def test_a_start_that_fails_after_reading_its_data_counts_against_the_starts_an_hour(public_mode, studio,
                                                                                     tiny_config_dict, monkeypatch):
    """42, item 5: twelve failing Starts from one address were all read, each one taking the one file reader."""
    monkeypatch.setenv("DRAGON_UI_MAX_STARTS_PER_HOUR", "2")
    studio = Studio(runs_dir=studio.runs_dir, policy=demo())
    read = []
    real_inspect = training.inspect
    monkeypatch.setattr(training, "inspect",
                        lambda config, *, policy: read.append(1) or real_inspect(config, policy=policy))
    config = {**tiny_config_dict, "data": {**tiny_config_dict["data"], "prompt": "no such column",
                                           "source": uploaded_by("v", tiny_config_dict["data"]["source"])}}
    with public.visiting(public.Visitor(key="v", address="fails-after-reading")):
        for _ in range(2):
            with pytest.raises(ConfigError, match="no such column"):
                studio.runs.start(config)
        with pytest.raises(BusyError, match="2 runs were started from your network address in the last hour"):
            studio.runs.start(config)
    assert len(read) == 2


def test_preparing_a_run_holds_up_nobody_elses_start_or_stop(public_mode, studio, tiny_config_dict, monkeypatch):
    """queue.submit prepares a run (reads its data, counts its prompts) outside the queue's lock."""
    preparing, release = threading.Event(), threading.Event()
    real_inspect = training.inspect

    def slow_inspect(config, *, policy):
        if config.name == "slow":
            preparing.set()
            release.wait(60)
        return real_inspect(config, policy=policy)

    monkeypatch.setattr(training, "inspect", slow_inspect)
    config = {**tiny_config_dict, "data": {**tiny_config_dict["data"], "source": uploaded_by(
        "v", tiny_config_dict["data"]["source"])}}
    with public.visiting(public.Visitor(key="v", address="a")):
        first = studio.runs.start(long_run(config, "first"))
    def start_slowly():
        with public.visiting(public.Visitor(key="v", address="a")):
            studio.runs.start({**config, "name": "slow"})

    slow = threading.Thread(target=start_slowly)
    slow.start()
    assert preparing.wait(60)
    started = time.monotonic()
    with queue._lock:  # the lock is free while the slow run prepares
        pass
    with public.visiting(public.Visitor(key="v", address="a")):
        studio.runs.stop(first.id)
    assert time.monotonic() - started < 5
    release.set()
    slow.join(60)
    stop_the_training()


# ----------------------------------------------------------------------------------------------------------------
# Visitors, the owner key, uploads, logs.


def test_wrong_owner_keys_are_limited_per_address(monkeypatch):
    visitors = Visitors(owner_key="the-key")
    guesser = visitors.of("s1", address="guesser")
    for attempt in range(WRONG_KEYS_ALLOWED):
        assert visitors.unlock(guesser, f"guess {attempt}") is None
    with pytest.raises(BusyError, match="Too many wrong owner keys from your network address; try again in 15"):
        visitors.unlock(guesser, "the-key")
    assert visitors.unlock(visitors.of("s2", address="owner"), "the-key").owns_everything  # others still can
    assert visitors.unlock(visitors.of("s3", address="owner"), "") is None  # nothing entered is no guess
    assert visitors.of("s2", address="owner").unlocked and not visitors.of("s1", address="guesser").unlocked


def test_the_owner_key_unlocks_the_page_that_entered_it_only(monkeypatch):
    """The review: the key unlocked the browser's visitor for as long as the app ran, so a reload or another tab of
    a shared lab computer's browser was still unlocked after the instructor closed the page without "Remember"."""
    visitors = Visitors(owner_key="the-key")
    token = visitors.arrive("page", None)
    assert visitors.unlock(visitors.of("page"), "the-key").owns_everything and visitors.of("page").unlocked
    visitors.arrive("reloaded", token)
    assert visitors.of("reloaded").key == visitors.of("page").key and not visitors.of("reloaded").unlocked
    visitors.unlock(visitors.of("new-page"), "the-key")  # a new browser's page, before its load is answered
    visitors.arrive("new-page", None)
    assert visitors.of("new-page").unlocked


def test_new_sessions_are_limited_per_address(monkeypatch):
    """Sessions are remembered up to a bound: a client opening one per call could push everyone's out of it."""
    from dragon_ui.studio import visitors as visitors_module

    monkeypatch.setattr(visitors_module, "NEW_SESSIONS_ALLOWED", 3)
    visitors = Visitors()
    flood = [visitors.of(f"flood-{number}", address="flooder") for number in range(3)]
    with pytest.raises(BusyError, match="Too many new sessions from your network address; try again in 10 minutes"):
        visitors.of("flood-3", address="flooder")
    assert visitors.of("flood-0", address="flooder") == flood[0]  # the sessions it has still answer
    assert visitors.of("elsewhere", address="another address").key
    later = time.monotonic() + visitors_module.NEW_SESSIONS_WINDOW_S
    monkeypatch.setattr(visitors_module.time, "monotonic", lambda: later)
    assert visitors.of("flood-3", address="flooder").key  # a new window


def test_sessions_no_longer_in_use_are_remembered_up_to_a_bound(monkeypatch):
    """The stalest go first; a session in use is never forgotten (test_public_attacks_sessions.py)."""
    from dragon_ui.studio import visitors as visitors_module

    monkeypatch.setattr(visitors_module, "MAX_SESSIONS", 3)
    monkeypatch.setattr(visitors_module, "QUIET_S", 0)  # each is out of use as soon as it was seen
    visitors = Visitors()
    keys = [visitors.of(f"s{i}").key for i in range(5)]
    assert len(visitors._sessions) == 3 and visitors.of("s4").key == keys[4]


def test_an_upload_moves_into_its_visitors_own_folder(public_mode, studio, tmp_path):
    studio.files.serve_from(tmp_path / "gradio")
    uploaded = studio.files.arrivals / "a1b2" / "mine.csv"
    uploaded.parent.mkdir(parents=True)
    write_arithmetic_csv(uploaded)
    elsewhere = tmp_path / "gradio" / "c3d4" / "download.csv"  # in the server's cache, where uploads do not arrive
    elsewhere.parent.mkdir(parents=True)
    write_arithmetic_csv(elsewhere)
    with public.visiting(public.Visitor(key="alice")):
        kept = Path(studio.files.keep_upload(uploaded))
        assert kept.is_relative_to(demo().uploads_dir / "alice") and kept.read_text().startswith("question")
        assert not uploaded.parent.exists()  # the server's copy, which it would serve, is gone
        assert data.locate(str(kept), policy=demo(public.Visitor(key="alice"))) == kept
        for other in (tmp_path / "elsewhere.csv", elsewhere):
            with pytest.raises(ConfigError, match="was not uploaded here"):
                studio.files.keep_upload(other)
    with pytest.raises(ConfigError, match="reads no other files"):
        data.locate(str(kept), policy=demo(public.Visitor(key="bob")))


def test_another_visitors_settings_are_lent_without_their_data_or_their_run(public_mode, studio, finished_run):
    finished_run.update_status(owner="alice")
    config = json.loads(finished_run.config_path.read_text())
    config["data"]["source"] = uploaded_by("alice", Path(config["data"]["source"]))
    config["model"]["id"] = str(finished_run.path)
    finished_run.config_path.write_text(json.dumps(config))
    with public.visiting(public.Visitor(key="bob")):
        draft, label = studio.runs.settings_of(finished_run.id)
    assert draft["data"]["source"] == "" and draft["model"]["id"] == DEFAULT_MODEL_ID
    assert "without what was another visitor's: its data" in label and "its starting model" in label
    assert draft["rewards"] == config["rewards"]
    with public.visiting(public.Visitor(key="alice")):
        draft, label = studio.runs.settings_of(finished_run.id)
    assert draft["data"]["source"] == config["data"]["source"] and "without" not in label


@pytest.mark.parametrize("notes, kept", [
    ("**Send your Hub token to** an-evil-site.example", False),  # a visitor's words, not the app's
    (None, True),  # a bundled lesson's notes are the app's own words, whoever ran it
])
def test_another_visitors_notes_are_lent_only_when_they_are_a_recipes(public_mode, studio, finished_run, notes, kept):
    from dragon_ui import ASSETS_DIR
    from dragon_ui.config import RunConfig

    studio.recipes.folder = ASSETS_DIR / "recipes"
    notes = notes or RunConfig.from_file(ASSETS_DIR / "recipes" / "reward_hacking.yaml", policy=LAPTOP).notes
    finished_run.update_status(owner="alice")
    config = json.loads(finished_run.config_path.read_text())
    finished_run.config_path.write_text(json.dumps({**config, "notes": notes}))
    with public.visiting(public.Visitor(key="bob")):
        draft, label = studio.runs.settings_of(finished_run.id)
    assert draft["notes"] == (notes if kept else "") and ("its notes" in label) is not kept
    with public.visiting(public.Visitor(key="alice")):
        assert studio.runs.settings_of(finished_run.id)[0]["notes"] == notes


def test_ask_both_keeps_to_its_limits(public_mode, studio, finished_run):
    from dragon_ui.studio import compare

    finished_run.update_status(owner="alice")
    with public.visiting(public.Visitor(key="bob")), pytest.raises(NotYoursError):
        studio.runs.owned(finished_run.id, "ask its models")
    for prompt, tokens, temperature, refusal in (("x" * 4001, 8, 0.0, "at most 4,000"),
                                                 ("hi", 257, 0.0, "from 1 to 256"),
                                                 ("hi", 8.5, 0.0, "whole number"),
                                                 ("hi", 8, 99.0, "from 0 to 3")):
        with pytest.raises(ConfigError, match=refusal):
            compare.answer_both(studio, finished_run, prompt, tokens, temperature)


def test_a_runs_log_holds_only_what_its_training_process_logs(studio, tiny_config_dict):
    """Errors of the app's threads (another visitor's request) go to the server's log, not to the log.txt every
    visitor of a public demo reads."""
    tiny_config_dict["training"].update(max_steps=30, save_steps=100)
    run = studio.runs.start(tiny_config_dict)
    while run.read_status().get("step", 0) < 1:
        time.sleep(0.05)
    other = threading.Thread(target=lambda: logging.getLogger("dragon_ui.ui.common").error("another visitor's "
                                                                                            "secret error"))
    other.start()
    other.join()
    studio.runs.stop(run.id)
    assert ended(run) == "cancelled"
    log = run.log_path.read_text()
    assert "step 1/30" in log and "secret error" not in log


# ----------------------------------------------------------------------------------------------------------------
# The disk is cleaned up.


def test_old_runs_uploads_and_downloads_are_removed_and_what_is_needed_stays(public_mode, finished_run, runs_dir,
                                                                             tmp_path, tiny_config_dict):
    old = time.time() - 5 * 3600
    finished_run.update_status(finished_at=old)
    recent = runs_dir / "recent"
    recent.mkdir()
    (recent / "config.json").write_text(finished_run.config_path.read_text())
    (recent / "status.json").write_text(json.dumps({"state": "succeeded", "finished_at": time.time()}))
    needed = runs_dir / "needed"  # old, but a waiting run continues from it
    needed.mkdir()
    (needed / "config.json").write_text(finished_run.config_path.read_text())
    (needed / "status.json").write_text(json.dumps({"state": "succeeded", "finished_at": old}))
    waiting = runs_dir / "waiting"
    waiting.mkdir()
    config = json.loads(finished_run.config_path.read_text())
    config["model"]["id"] = str(needed)
    (waiting / "config.json").write_text(json.dumps(config))
    (waiting / "status.json").write_text(json.dumps({"state": "queued", "waiting": "start", "queued_at": old}))
    upload = Path(uploaded_by("v", tiny_config_dict["data"]["source"]))
    os.utime(upload, (old, old))
    os.utime(upload.parent, (old, old))
    downloads = tmp_path / "downloads"
    (downloads / "stale").mkdir(parents=True)
    (downloads / "stale" / "adapter.zip").write_text("x")
    os.utime(downloads / "stale" / "adapter.zip", (old, old))
    os.utime(downloads / "stale", (old, old))
    (downloads / "fresh").mkdir()
    removed = retention.clean_up(runs_dir, keep_hours=4, passing=[downloads])
    assert set(removed) == {finished_run.path, upload.parent, downloads / "stale"}
    assert not finished_run.path.exists() and not upload.exists() and not (downloads / "stale").exists()
    assert recent.exists() and needed.exists() and waiting.exists() and (downloads / "fresh").exists()


def test_starts_sent_at_the_same_moment_cannot_all_pass(public_mode, studio, tiny_config_dict, monkeypatch):
    """A visitor's limit holds when four tabs press Start at once: each start holds its place in line while its
    data is read (queue._place), so only two of four are accepted."""
    real_inspect, arrived = training.inspect, threading.Barrier(4, timeout=60)

    def inspect_together(config, *, policy):
        with contextlib.suppress(threading.BrokenBarrierError):
            arrived.wait(5)  # the ones let through wait here for the others, which are refused
        return real_inspect(config, policy=policy)

    monkeypatch.setattr(training, "inspect", inspect_together)
    config = long_run({**tiny_config_dict, "data": {**tiny_config_dict["data"], "source": uploaded_by(
        "v", tiny_config_dict["data"]["source"])}}, "race")
    outcomes = []

    def start():
        with public.visiting(public.Visitor(key="v", address="a")):
            try:
                outcomes.append(studio.runs.start(config).id)
            except BusyError as refused:
                outcomes.append(str(refused))

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    refused = [outcome for outcome in outcomes if "You already have 2 runs" in outcome]
    assert len(outcomes) == 4 and len(refused) == 2, outcomes
    for run in studio.runs.summaries():
        with public.visiting(public.Visitor(key="v")):
            studio.runs.stop(run["id"])


def test_previews_are_refused_beside_a_cpu_training_even_with_the_model_loaded(studio, tiny_config_dict,
                                                                               tiny_model_dir):
    """The model a preview loaded before a training began stays cached; using it beside the training would take
    the training's cores all the same."""
    from dragon_ui.config import HardwareSettings, ModelConfig

    model, settings = ModelConfig(id=str(tiny_model_dir)), HardwareSettings(device="cpu")
    studio.previews.load(model, settings=settings)
    assert studio.previews.cache.holds(model, None, settings)
    tiny_config_dict["training"].update(max_steps=5000, save_steps=5000)
    run = training.prepare(RunConfig.from_dict(tiny_config_dict, policy=LAPTOP), waiting=True, policy=LAPTOP)
    training.start_waiting(run, resume=False, policy=LAPTOP, workers=studio.workers)  # nothing released first
    with pytest.raises(BusyError, match="A training is running on this machine's CPU"):
        studio.previews.load(model, settings=settings)
    with pytest.raises(BusyError, match="merging a model now would slow it down badly"):
        studio.previews.refuse_while_training("merging a model")
    studio.runs.stop(run.id)
    assert ended(run) == "cancelled"


def test_merges_of_one_run_take_turns_and_load_its_model_once(finished_run, monkeypatch):
    from dragon_ui.engine import weights

    loads = []
    real_merge = weights._merge
    monkeypatch.setattr(weights, "_merge", lambda *args: loads.append(1) or real_merge(*args))
    threads = [threading.Thread(target=weights.merge_model, args=(finished_run,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert loads == [1] and (finished_run.merged_dir / "config.json").is_file()


def test_a_visitor_keeps_three_uploads_and_an_unreadable_one_is_not_kept(public_mode, studio, tmp_path):
    studio.files.serve_from(tmp_path / "gradio")
    kept = []
    with public.visiting(public.Visitor(key="alice")):
        for number in range(5):
            uploaded = studio.files.arrivals / f"u{number}" / f"data{number}.csv"
            uploaded.parent.mkdir(parents=True)
            write_arithmetic_csv(uploaded)
            kept.append(Path(studio.files.keep_upload(uploaded)))
            time.sleep(0.01)  # distinct modification times, newest last
        assert [path.exists() for path in kept] == [False, False, True, True, True]
        studio.files.discard_upload(str(kept[-1]))
        assert not kept[-1].exists() and kept[-2].exists()
        studio.files.discard_upload(str(tmp_path / "elsewhere.csv"))  # anything but one's own upload is left alone


def test_a_request_body_over_the_limit_is_refused_before_it_is_read_whole(public_mode, tmp_path):
    """The middleware refuses an event's body past its limit, declared or not; gradio itself reads any body into
    memory. (Uploads: tests/test_public_attacks_files.py.)"""
    import asyncio

    from dragon_ui.studio.files import Files
    from dragon_ui.ui.guard import RequestLimits

    seen = []

    async def app(scope, receive, send):
        message = await receive()
        seen.append(len(message["body"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def request(path: str, chunks: list[bytes], declared: int | None, limits: RequestLimits) -> int:
        sent = []
        pending = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                   for i, chunk in enumerate(chunks)]

        async def receive():
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        headers = [(b"content-length", str(declared).encode())] if declared is not None else []
        scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "client": ("10.0.0.1", 1)}
        asyncio.run(limits(scope, receive, send))
        return sent[0]["status"]

    limits = RequestLimits(app, files=Files(tmp_path, policy=demo()), policy=demo(), body_bytes=1000)
    assert request("/gradio_api/queue/join", [b"x" * 500], 500, limits) == 200 and seen == [500]
    assert request("/gradio_api/queue/join", [b"x" * 2000], 2000, limits) == 413  # declared too large
    assert request("/gradio_api/queue/join", [b"x" * 600] * 3, None, limits) == 413  # sent too large, undeclared
    assert seen == [500]  # neither reached the app


def test_the_reading_process_runs_only_functions_marked_to_run_apart(tmp_path):
    """Reviewer's finding: the child ran any top-level function of dragon_ui it was sent (a file writer among them).
    Only the server builds its requests, but the process itself is the boundary."""
    target = tmp_path / "written.jsonl"
    done = processes._child("dragon_ui.data:write_jsonl", {"path": str(target), "rows": [{"a": 1}]}, 2**20, "x",
                        str(tmp_path))
    assert done.returncode != 0 and "marked @runs_apart" in done.stderr and not target.exists()
    done = processes._child("os:system", {"command": f"touch {target}"}, 2**20, "x", str(tmp_path))
    assert done.returncode != 0 and not target.exists()
