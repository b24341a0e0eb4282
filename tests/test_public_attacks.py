"""Proof by attack: the real app in public mode, started as an owner starts it (an owner key and a Hugging Face
token in its environment, ``--runs-dir`` a folder relative to where it runs), attacked the way a browser can attack
it: every event sent by its fn_index with inputs of the attacker's choosing (raw_gradio), hidden events included.

Each attack checks the sentence it is refused with (or that its outcome is harmless); and after each one, that no
secret (the owner key, the token, a file outside the demo, another visitor's data) appears in anything the server
answered, in a file it handed out, or in a run's log that every visitor reads, and that the server opened no file
outside the demo (an audit hook in the server process records every open of a watched path). The attacks that used
to freeze the server are sent while another visitor's requests, page and /config are timed: each is answered within
a second.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import write_arithmetic_csv
from raw_gradio import Answer, App, RawVisitor, file_data

from dragon_ui.data import BUNDLED_DATASETS_DIR

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

OWNER_KEY = f"owner-key-{secrets.token_hex(8)}"
HF_TOKEN = f"hf_{secrets.token_hex(12)}"
OUTSIDE_MARK = f"CANARY-OUTSIDE-{secrets.token_hex(4)}"  # in files outside the demo
VICTIM_MARK = f"VICTIM-NOTE-{secrets.token_hex(4)}"  # in a column of the victim's data that no run shows
TOKEN_STORE, DRAFT_STORE, OWNER_STORE = ("dragon-grpo-studio-visitor", "dragon-grpo-studio-draft",
                                         "dragon-grpo-studio-owner-key")
ARITHMETIC = str(BUNDLED_DATASETS_DIR / "arithmetic.csv")
LIMITS = {"DRAGON_UI_MAX_RUNS_PER_ADDRESS": "3", "DRAGON_UI_MAX_STARTS_PER_HOUR": "40"}

# The server: an audit hook first, which writes every open (or listing) of a watched path to a file, then the app.
SERVER = """
import os, sys
watched = [os.path.realpath(p) for p in os.environ["ATTACK_WATCHED"].split(os.pathsep)]
watched.append(os.path.realpath("/proc/self/environ"))  # this process's environment: the owner key, the token
opened = os.open(os.environ["ATTACK_OPENED"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def spy(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes)):
        path = os.fsdecode(args[0])
        if "environ" in path or "outside-the-demo" in path:
            path = os.path.realpath(path)
            if any(path == w or path.startswith(w + os.sep) for w in watched):
                os.write(opened, (event + " " + path + "\\n").encode())
sys.addaudithook(spy)
from dragon_ui.ui.app import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class Demo:
    """The served app and what the tests know about it."""

    app: App
    folder: Path  # where the app runs; its runs folder is folder/"runs"
    outside: Path  # a folder outside the demo, with canary files
    opened: Path  # what the audit hook saw
    pid: int
    attackers: list[RawVisitor]

    @property
    def runs(self) -> Path:
        return self.folder / "runs"

    def attacker(self, **kept) -> RawVisitor:
        """A new visitor (its own session and browser token) whose page opened with ``kept`` in its storage."""
        visitor = RawVisitor(self.app)
        visitor.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24), **kept})
        self.attackers.append(visitor)
        return visitor

    def gradio_files(self) -> dict[Path, int]:
        """Every file in the server's gradio cache (its GRADIO_TEMP_DIR) and its size.

        The server deletes refused and abandoned uploads, and their folders, while this walks the tree: an entry that
        goes between being listed and being read is gone, not an error (os.walk skips a folder that vanished)."""
        found = {}
        for folder, _, names in os.walk(self.folder.parent / "gradio"):
            for name in names:
                path = Path(folder) / name
                try:
                    found[path] = path.stat().st_size
                except FileNotFoundError:
                    continue
        return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def demo_limits() -> dict:
    """The limits the demo is started with (environment variables); a module of attacks may start it with others."""
    return LIMITS


@pytest.fixture(scope="module")
def demo(tmp_path_factory, tiny_model_dir, demo_limits):
    root = tmp_path_factory.mktemp("attacks")
    folder, outside = root / "app", root / "outside-the-demo"
    folder.mkdir()
    outside.mkdir()
    (outside / "secret.yaml").write_text(f"name: {OUTSIDE_MARK}\nmodel: x\ndata: {{source: a.csv, prompt: q}}\n"
                                         "rewards: [{kind: numeric}]\n")
    (outside / "secret.csv").write_text(f"question,answer\n{OUTSIDE_MARK},1\n")
    opened = root / "opened.log"
    port = free_port()
    env = {**os.environ, "DRAGON_UI_PUBLIC": "1", "DRAGON_UI_OWNER_KEY": OWNER_KEY, "HF_TOKEN": HF_TOKEN,
           "DRAGON_UI_PUBLIC_MODELS": f"{tiny_model_dir},someone/giant-400B", "HF_HUB_OFFLINE": "1",
           "GRADIO_TEMP_DIR": str(root / "gradio"), "DRAGON_UI_RUNS_DIR": str(root / "not-the-demos-runs"),
           "ATTACK_WATCHED": str(outside), "ATTACK_OPENED": str(opened), **demo_limits}
    env.pop("SPACE_ID", None)
    log = open(root / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-c", SERVER, "--no-browser", "--port", str(port), "--runs-dir",
                               "runs"], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(f"{url}/config", timeout=5).raise_for_status()
            break
        except httpx.HTTPError:
            assert server.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()
            time.sleep(0.5)
    try:
        yield Demo(App(url), folder, outside, opened, server.pid, [])
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def base_draft(model_dir) -> dict:
    """A draft the demo accepts: the tiny model on a bundled dataset (what a page keeps in its browser storage)."""
    return {"name": "visitor", "model": {"id": str(model_dir)},
            "data": {"source": ARITHMETIC, "prompt": "question", "reference": "answer", "eval_frac": 0.1},
            "rewards": [{"kind": "numeric"}], "grpo": {"group_size": 2, "max_new_tokens": 8},
            "training": {"batch_size": 2, "max_steps": 2000, "save_steps": 1000, "learning_rate": 0.01},
            "lora": {"r": 4, "alpha": 8}, "hardware": {"device": "cpu", "cpu_threads": 1}}


@dataclass
class Victim:
    visitor: RawVisitor
    upload: str  # the file their upload became on the server (the page shows it as uploads/private.csv)
    gradio_copy: str  # where gradio first stored the upload
    run_id: str


@pytest.fixture(scope="module")
def victim(demo, tiny_model_dir, tmp_path_factory) -> Victim:
    """A visitor who uploads their own data and trains on it through the README's API flow (/recipe, /check,
    /start), in the runs folder the app was started with: it keeps training while the attacks run."""
    data = tmp_path_factory.mktemp("victim") / "private.csv"
    # Visitors see each other's runs (prompts and replies); the column no run shows is the victim's alone.
    data.write_text("question,answer,private_note\n" + "".join(f"What is {i} + 1?,{i + 1},{VICTIM_MARK}\n"
                                                                for i in range(60)))
    visitor = RawVisitor(demo.app)
    visitor.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24), DRAFT_STORE: {"draft": base_draft(tiny_model_dir)}})
    sent = visitor.upload(data)
    uploaded = visitor.fire("data-upload", "upload", **{"data-upload": sent})
    assert uploaded.ok, uploaded.error
    source = uploaded.data[0]
    assert source == "uploads/private.csv" and not Path(sent["path"]).exists()
    (kept,) = demo.runs.glob(".uploads/*/*/private.csv")
    config = visitor.call("recipe", "arithmetic").data[0]
    assert config["runs_dir"] == ""  # the app's own runs folder, which it shows to nobody
    config.update({key: value for key, value in base_draft(tiny_model_dir).items() if key != "rewards"})
    config["data"] = {**config["data"], "source": source, "prompt": "question", "reference": "answer"}
    assert visitor.call("check", config).data == ["valid"]
    started = visitor.call("start", config)
    assert started.ok, started.error
    run_id = started.data[0]
    assert (demo.runs / run_id / "config.json").is_file()  # the folder of --runs-dir, not $DRAGON_UI_RUNS_DIR
    return Victim(visitor, str(kept), sent["path"], run_id)


def leaks(text: str, victim: Victim | None = None) -> list[str]:
    """The secrets found in ``text``: the owner key, the token, a canary of a file outside the demo, and (for
    anyone but the victim) the victim's data or the private path of their upload."""
    secrets_ = [OWNER_KEY, HF_TOKEN, OUTSIDE_MARK]
    if victim is not None:
        secrets_ += [VICTIM_MARK, victim.upload]
    return [secret for secret in secrets_ if secret in text]


@pytest.fixture(autouse=True)
def nothing_leaks(demo, victim):
    yield
    assert_nothing_leaked(demo, victim)


def assert_nothing_leaked(demo: Demo, victim: Victim) -> None:
    """After every attack: no attacker was answered a secret, no run's log (which every visitor reads) holds one or
    another thread's error, and nothing outside the demo was opened."""
    for attacker in demo.attackers:
        for sent, answer in attacker.answers:  # what the attacker sent itself may be echoed back
            found = [secret for secret in leaks(answer, victim) if secret not in sent]
            assert not found, (found, answer[:300])
    for log in demo.runs.glob("*/log.txt"):
        text = log.read_text(errors="replace")
        assert not leaks(text) and "unexpected error" not in text and "Traceback" not in text, log
    opened = demo.opened.read_text() if demo.opened.exists() else ""
    assert opened == "", f"the server opened files outside the demo:\n{opened}"


def expect_refusal(answer: Answer, words: str) -> None:
    text = answer.error if not answer.ok else answer.text()
    assert re.search(words, text), (words, text[:500])


# ----------------------------------------------------------------------------------------------------------------
# Secrets and other people's files.


def test_the_export_never_reads_a_path_the_draft_names(demo, tiny_model_dir):
    """Issue item 1: a kept draft's base_dir and a source shaped like a Hub id used to put /proc/self/environ
    (the owner key, the token) into the launch folder's zip."""
    for base_dir, source in (("/proc", "self/environ"), (str(demo.outside), "secret.csv"),
                             ("/", str(demo.outside / "secret.csv"))):
        draft = {**base_draft(tiny_model_dir), "base_dir": base_dir}
        attacker = demo.attacker(**{DRAFT_STORE: {"draft": draft, "pristine": draft}})
        attacker.fire("rewards-add")
        answer = attacker.fire("model-export", **{"data-source": source, "data-prompt": "question"})
        assert answer.ok, answer.error
        archive, said = answer.data
        if source == "self/environ":  # a Hub id: the cluster downloads it, nothing of the server's is copied
            assert "Unzip it on the GPU machine" in said
            zipped = httpx.get(archive["url"], timeout=30).raise_for_status().content
            with zipfile.ZipFile(io.BytesIO(zipped)) as files:
                contents = b"".join(files.read(name) for name in files.namelist()).decode("utf-8", "replace")
            assert not leaks(contents) and "data/environ" not in files.namelist()
        else:
            assert "this public demo reads no other files on the server" in said


def test_another_visitors_upload_cannot_be_read_or_claimed(demo, victim, tiny_model_dir):
    """Item 2: their settings are lent without their upload; gradio no longer serves the file; naming its new
    path, or sending it to the upload event, is refused."""
    attacker = demo.attacker(**{DRAFT_STORE: {"draft": base_draft(tiny_model_dir)}})
    loaded = attacker.fire("compare-load-settings", **{"compare-run": victim.run_id})
    assert loaded.ok, loaded.error
    shown = demo.app.output(demo.app.event("compare-load-settings", "click"), loaded, "data-source")
    assert shown == "", shown  # the Data tab shows no source
    assert "without what was another visitor's: its data" in " ".join(map(str, loaded.data))
    served = httpx.get(f"{demo.app.url}/gradio_api/file={victim.gradio_copy}", timeout=30)
    assert served.status_code in (403, 404) and VICTIM_MARK not in served.text
    claimed = attacker.fire("data-upload", "upload", **{"data-upload": file_data(victim.upload, "private.csv")})
    assert not claimed.ok or "was not uploaded here" in claimed.text()
    named = attacker.fire("data-source", "submit", **{"data-source": victim.upload, "data-prompt": "question"})
    expect_refusal(named, "this public demo reads no other files on the server")
    config = {**base_draft(tiny_model_dir), "data": {"source": victim.upload, "prompt": "question"}}
    expect_refusal(attacker.call("start", config), "this public demo reads no other files on the server")


def test_a_run_folder_is_never_read_as_a_hub_dataset(demo, victim):
    """Item 3: runs/<id> is shaped like a Hub id, and the runs folder lies in the app's folder: it goes to the Hub
    (unreachable here), never to that folder."""
    attacker = demo.attacker()
    for source, refusal in ((f"runs/{victim.run_id}", "the Hugging Face Hub could not be reached"),
                            ("runs/.uploads", "this public demo reads no other files on the server")):
        answer = attacker.fire("data-source", "submit", **{"data-source": source, "data-prompt": "question"})
        expect_refusal(answer, refusal)


def test_recipes_are_only_the_bundled_ones(demo):
    """Item 4: /recipe joined its name to the recipes folder unchecked."""
    attacker = demo.attacker()
    for name in ("../../outside-the-demo/secret", str(demo.outside / "secret"), "../datasets/arithmetic", "x" * 10**5):
        expect_refusal(attacker.call("recipe", name), "There is no recipe called .*; choose one of: arithmetic")


def test_ask_both_is_only_for_ones_own_runs(demo, victim):
    """Item 5."""
    attacker = demo.attacker()
    answer = attacker.fire("compare-ask", **{"compare-run": victim.run_id, "compare-prompt": "x" * 50_000,
                                             "compare-max-tokens": 4096})
    expect_refusal(answer, "belongs to another visitor|maximum")


def test_a_call_without_a_session_is_refused(demo, tiny_model_dir):
    """Item 6: off Spaces a REST call without a session ran as one shared visitor, who owned every run started
    from the command line."""
    posted = httpx.post(f"{demo.app.url}/gradio_api/call/start", json={"data": [base_draft(tiny_model_dir)]},
                        timeout=30)
    assert posted.status_code == 400 and "only calls made within a session" in posted.json()["detail"], posted.text
    assert not leaks(posted.text)


@pytest.mark.parametrize("route", ["run", "api"])
def test_no_event_skips_the_queue(demo, route):
    """The review: off Spaces gradio answers /gradio_api/run/<api name> (and /api/) at once, outside the queue and its
    turns, so one client could run any number of events side by side. A public demo closes those routes."""
    asked = httpx.post(f"{demo.app.url}/gradio_api/{route}/train_runs", timeout=30,
                       json={"data": [], "session_hash": secrets.token_hex(8)})
    assert asked.status_code == 404 and "answers only what its page and gradio_client ask for" in asked.text, asked.text


def test_a_session_with_a_huge_name_is_refused(demo):
    """The review: every session's name is remembered (up to 50,000 of them), so names of up to 2 MB each (the most a request could carry then) could
    fill the server's memory."""
    flooder = RawVisitor(demo.app, session="s" * 10_000)
    demo.attackers.append(flooder)
    expect_refusal(flooder.call("recipe", "arithmetic"), "A session_hash has at most 100 characters")
    assert RawVisitor(demo.app, session="s" * 100).call("recipe", "arithmetic").ok


def test_the_owner_key_is_kept_only_when_asked_and_guessing_is_slowed(demo):
    """Item 7: the key stayed in a shared lab computer's browser and unlocked it for the next person; wrong keys
    were never limited. The storage key gradio encodes what a browser keeps with is in every page's config, so
    nothing secret is kept there."""
    owner = RawVisitor(demo.app)
    owner.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24)})
    kept, said, _ = owner.fire("owner-unlock", **{"owner-key": OWNER_KEY, "owner-remember": False}).data
    assert kept == "" and "this page (until it is closed)" in said
    kept, said, _ = owner.fire("owner-unlock", **{"owner-key": OWNER_KEY, "owner-remember": True}).data
    assert kept == OWNER_KEY and "this browser" in said
    guesser = demo.attacker()
    answers = [guesser.fire("owner-unlock", **{"owner-key": f"guess-{n}"}) for n in range(6)]
    assert all("That is not this demo's owner key" in a.text() for a in answers[:5])
    expect_refusal(answers[5], "Too many wrong owner keys from your network address")
    expect_refusal(guesser.fire("owner-unlock", **{"owner-key": OWNER_KEY}), "Too many wrong owner keys")


# ----------------------------------------------------------------------------------------------------------------
# Settings that would take the machine.


def hostile(tiny_model_dir, dotted: str, value) -> dict:
    config = base_draft(tiny_model_dir)
    *parents, leaf = dotted.split(".")
    target = config
    for part in parents:
        target = target.setdefault(part, {})
    target[leaf] = value
    return config


MACHINE_TAKERS = {  # item 11, 14: (setting, value, the sentence)
    "full fine-tuning": ("lora.enabled", False, "lora.enabled must stay on in this public demo"),
    "a huge adapter": ("lora.r", 1024, "lora.r must be at most 64 in this public demo"),
    "every thread": ("hardware.cpu_threads", 1024, "hardware.cpu_threads must be at most"),
    "more memory than the machine": ("model.id", "someone/giant-400B", "more than the .* GB this machine has"),
    "a 20,000-character prompt template": ("data.prompt", "q" * 20_000, "data.prompt has 20,000 characters"),
    "a 200,000-character reference": ("data.reference", "r" * 200_000, "data.reference has 200,000 characters"),
    "a 1,000-character run name": ("name", "n" * 1000, "name has 1,000 characters"),
    # Larger bodies do not reach the app: the server refuses them before reading them whole (ui/guard.py).
    "a 4 MB prompt template": ("data.prompt", "q" * 4_000_000, "takes requests of at most 512 KB"),
    "a 20 MB reference": ("data.reference", "r" * 20_000_000, "takes requests of at most 512 KB"),
    "a 20 MB run name": ("name", "n" * 20_000_000, "takes requests of at most 512 KB"),
    "a pull request's weights": ("model.revision", "refs/pr/1", "model.revision must be left empty"),
    # 42, item 1: the memory check assumed 56-token prompts; 1,000-token ones grew the server by 13 GB.
    "8,000-token prompts": ("data.max_prompt_tokens", 8000, "data.max_prompt_tokens must be at most 512 in this "
                            "public demo"),
}


@pytest.mark.parametrize("setting, value, refusal", MACHINE_TAKERS.values(), ids=MACHINE_TAKERS.keys())
def test_settings_that_would_take_the_machine_are_refused(demo, tiny_model_dir, setting, value, refusal):
    attacker = demo.attacker()
    config = hostile(tiny_model_dir, setting, value)
    expect_refusal(attacker.call("check", config), refusal)
    expect_refusal(attacker.call("preflight", config, 16), refusal)
    expect_refusal(attacker.call("start", config), refusal)


def test_a_huge_request_is_refused_before_the_server_reads_it(demo):
    """Reviewer's finding: 400 MB JSON bodies were read into memory (8 GB after four) and copied into the log."""
    before = resident_mb(demo.pid)
    body = b'{"data": ["' + b"x" * (200 * 2**20) + b'"], "fn_index": 0, "session_hash": "abc"}'
    answer = httpx.post(f"{demo.app.url}/gradio_api/queue/join", content=body,
                        headers={"content-type": "application/json"}, timeout=120)
    assert answer.status_code == 413 and "takes requests of at most 512 KB" in answer.text
    assert resident_mb(demo.pid) - before < 100


def test_a_header_of_repeated_names_cannot_tie_up_the_server(demo, tmp_path):
    """Reviewer's finding: renaming repeated column names was cubic in the header, in the app's own process (a
    4 KB header took 22 s). Now it is linear, and a public demo reads every file in a process of its own."""
    attacker = demo.attacker()
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(["a"] * 1000) + "\n" + ",".join(["1"] * 1000) + "\n")
    answer = attacker.fire("data-upload", "upload", **{"data-upload": attacker.upload(wide)})
    assert answer.ok and answer.seconds < 10, (answer.error, answer.seconds)
    wider = tmp_path / "wider.csv"
    wider.write_text(",".join(["a"] * 10_000) + "\n")
    expect_refusal(attacker.fire("data-upload", "upload", **{"data-upload": attacker.upload(wider)}),
                   "the header has 10,000 columns, more than the 1,000")


def test_each_visitor_and_each_address_gets_a_small_share_of_the_queue(demo, victim, tiny_model_dir):
    """Item 12: one client filled the whole queue, a new session per call. The victim's run trains; one attacker
    queues two runs, its third is refused; a new session from the same address is refused too (3 from it)."""
    attacker = demo.attacker()
    queued = [attacker.call("start", base_draft(tiny_model_dir)) for _ in range(2)]
    assert all(answer.ok for answer in queued), [answer.error for answer in queued]
    expect_refusal(attacker.call("start", base_draft(tiny_model_dir)),
                   "You already have 2 runs training or waiting")
    expect_refusal(demo.attacker().call("start", base_draft(tiny_model_dir)),
                   "3 runs from your network address are already training or waiting")
    for answer in queued:  # out of the queue again, by their owner
        stop(attacker, answer.data[0])


def stop(visitor: RawVisitor, run_id: str) -> None:
    """Stop a run as its page does: refresh the runs list, open the run, press Stop."""
    visitor.call("train_runs")
    assert visitor.call("train_open", run_id).ok
    stopped = visitor.call("train_stop")
    assert stopped.ok and "Stopping" in stopped.text() or "out of the queue" in stopped.text(), stopped


# ----------------------------------------------------------------------------------------------------------------
# One visitor must not freeze everyone: with no training running (a training's own load is not an attack), another
# visitor's requests are answered within a second while each of these runs.


@contextlib.contextmanager
def another_visitor_answered_within(demo, seconds: float = 1.0):
    """While the attack runs, a bystander's page keeps asking: its run list (an event through the queue) every 50 ms,
    and the page itself and its /config every 250 ms (gradio makes them once: guard.PageCache). Each must be
    answered within ``seconds``."""
    bystander = RawVisitor(demo.app)
    events: list[float] = []
    pages: list[tuple[float, str]] = []
    done = threading.Event()

    def keep_asking_events():
        while not done.is_set():
            events.append(bystander.call("train_runs").seconds)
            time.sleep(0.05)

    def keep_opening_the_page():
        while not done.is_set():
            for path in ("/", "/config"):
                started = time.monotonic()
                httpx.get(f"{demo.app.url}{path}", timeout=30).raise_for_status()
                pages.append((time.monotonic() - started, path))
            time.sleep(0.25)

    askers = [threading.Thread(target=ask, daemon=True) for ask in (keep_asking_events, keep_opening_the_page)]
    for asker in askers:
        asker.start()
    deadline = time.monotonic() + 30
    while not (events and pages):  # the bystander is answered before the attack begins, so it measures the attack
        assert time.monotonic() < deadline, "the bystander was never answered"
        time.sleep(0.05)
    try:
        yield
    finally:
        done.set()
        for asker in askers:
            asker.join(30)
    assert max(events) < seconds, sorted(events)[-5:]
    assert max(pages)[0] < seconds, sorted(pages)[-5:]


@pytest.fixture
def no_training(demo, victim):
    """The victim stops their run (a training takes the CPU for its own good reasons)."""
    status = demo.runs / victim.run_id / "status.json"
    if '"cancelled"' not in status.read_text():
        stop(victim.visitor, victim.run_id)
    deadline = time.monotonic() + 120
    while '"cancelled"' not in status.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.5)


PLAYGROUND_DATA = {"data-source": ARITHMETIC, "data-prompt": "question", "data-reference": "answer"}


def with_rewards(demo, tiny_model_dir, rewards: list[dict]) -> RawVisitor:
    """An attacker whose session holds ``rewards`` (as its kept draft's, filled into the Rewards tab by the page
    load, unchecked), with the playground's rows of the arithmetic data listed."""
    draft = {**base_draft(tiny_model_dir), "rewards": rewards}
    attacker = demo.attacker(**{DRAFT_STORE: {"draft": draft}})
    assert attacker.fire("form-edits", "change", sets="model-check", **PLAYGROUND_DATA).ok
    return attacker


@pytest.mark.usefixtures("no_training")
def test_a_preflight_is_bounded_like_the_playground(demo, tiny_model_dir):
    """The pre-flight samples groups as the playground does: as many prompts as anyone may ask for (256), with the
    model's turns and the playground's time limit, while a bystander is answered; more is refused. (It stops the
    victim's run, so it comes after the queue's attacks, which need that run training.)"""
    attacker = demo.attacker()
    deadline = time.monotonic() + 60
    while "A training is running" in attacker.call("preflight", base_draft(tiny_model_dir), 1).error:
        assert time.monotonic() < deadline  # the stopped run's process ends a little after its status says so
        time.sleep(0.5)
    with another_visitor_answered_within(demo):
        answer = attacker.call("preflight", base_draft(tiny_model_dir), 256)
    assert answer.ok, answer.error
    assert "% of groups" in answer.data[0]["verdict"] and len(answer.data[0]["prompts"]) <= 256
    expect_refusal(attacker.call("preflight", base_draft(tiny_model_dir), 257), "a whole number from 1 to 256")


def test_a_regex_that_backtracks_forever_is_refused_at_once(demo, tiny_model_dir, no_training):
    """Item 8: Python's re held the GIL on (a+)+$-like patterns; now patterns run in the regex package (which lets
    go of the GIL and takes a timeout) and one that backtracks exponentially is refused when it is saved."""
    attacker = with_rewards(demo, tiny_model_dir, [{"kind": "numeric"}])
    with another_visitor_answered_within(demo):
        added = attacker.fire("rewards-add", **{"rewards-kind": "regex", "rewards-name": "greedy",
                                                "rewards-settings-pattern": "(a|aa)+$"})
        expect_refusal(added, "takes too long on some replies")
        for pattern in (r"(a|aa)+$", r"^(\w+\s?)*$"):
            scored = with_rewards(demo, tiny_model_dir, [{"kind": "regex", "pattern": pattern}]).fire(
                "rewards-score", **{"rewards-row": 1, "rewards-completion": "a" * 5000 + "!", **PLAYGROUND_DATA})
            assert scored.seconds < 5, scored.seconds
            if pattern.startswith("(a|aa)"):
                expect_refusal(scored, "takes too long on some replies")


def test_a_long_fenced_reply_is_scored_in_linear_time(demo, tiny_model_dir, no_training):
    """Item 9: the json reward's fence regex took 20 s on a 40 000-character reply. The playground caps a typed
    reply, and a capped one is scored at once."""
    attacker = with_rewards(demo, tiny_model_dir, [{"kind": "json"}])
    typed = {"rewards-row": 1, **PLAYGROUND_DATA}
    with another_visitor_answered_within(demo):
        scored = attacker.fire("rewards-score", **typed, **{"rewards-completion": "```" + "a" * 19_990})
        assert scored.ok and scored.seconds < 2, (scored.error, scored.seconds)
        expect_refusal(attacker.fire("rewards-score", **typed, **{"rewards-completion": "```" + "a" * 40_000}),
                       "score one of at most 20,000")


def test_a_tiny_file_of_millions_of_rows_is_refused_while_it_is_read(demo, no_training, tmp_path):
    """Item 11: a 110 KB Parquet file expanded to 3 million rows (2.2 GB) because rows were limited only after
    the whole file was read. Now reading stops one row past the limit."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bomb = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"question": ["What is 1 + 1?"] * 3_000_000, "answer": ["2"] * 3_000_000}), bomb)
    assert bomb.stat().st_size < 200_000
    attacker = demo.attacker()
    before = resident_mb(demo.pid)
    with another_visitor_answered_within(demo):
        answer = attacker.fire("data-upload", "upload", **{"data-upload": attacker.upload(bomb)})
    expect_refusal(answer, "data has more than 10,000 rows")
    assert resident_mb(demo.pid) - before < 300


def test_references_of_megabytes_are_refused_before_the_app_holds_them(demo, tiny_model_dir, no_training, tmp_path):
    """42, item 3: a 1.3 KB Parquet file held 40 references of 4 MB; every step wrote them all into rollouts.jsonl
    (62.5 MB a step) and every view of the run parsed the whole file. Now a row's text has a size cap."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bomb = tmp_path / "references.parquet"
    pq.write_table(pa.table({"question": [f"What is {n} + 1?" for n in range(40)], "answer": ["7" * 4 * 2**20] * 40}),
                   bomb, compression="zstd")
    assert bomb.stat().st_size < 50_000
    attacker = demo.attacker(**{DRAFT_STORE: {"draft": base_draft(tiny_model_dir)}})
    before = resident_mb(demo.pid)
    with another_visitor_answered_within(demo):
        uploaded = attacker.fire("data-upload", "upload", **{"data-upload": attacker.upload(bomb)})
    expect_refusal(uploaded, "row 1 of references.parquet has 4,194,304 characters in the column 'answer', more "
                             "than this public demo's limit of 10,000 characters in one row's prompt, reference answer "
                             "or system message")
    assert resident_mb(demo.pid) - before < 100


CUSTOM_CODE = {
    "custom": "def tool(x: str) -> str:\n    return x\n",
    "environment": "class Environment:\n    def reset(self, **row):\n        pass\n\n    def echo(self, x: str) -> str:\n"
                   "        \"\"\"Echo.\n\n        Args:\n            x: Text.\n        \"\"\"\n        return x\n",
}


@pytest.mark.parametrize("kind", list(CUSTOM_CODE))
def test_custom_tools_are_refused_everywhere_before_their_code_runs(demo, tiny_model_dir, no_training, tmp_path,
                                                                    kind):
    """44, public mode: only the built-in tools and environments. A custom tool or environment sent through the
    API, the Tools section's Add or a kept draft is refused in words, and its code never runs."""
    marker = demo.folder / f"custom-{kind}-ran"
    code = f"open({str(marker)!r}, 'w').close()\n" + CUSTOM_CODE[kind]
    config = {**base_draft(tiny_model_dir), "tools": [{"kind": kind, "code": code}],
              "rewards": [{"kind": "numeric"}, *([{"kind": "environment"}] if kind == "environment" else [])]}
    attacker = demo.attacker(**{DRAFT_STORE: {"draft": config}})
    for api in ("check", "start"):
        expect_refusal(attacker.call(api, config),
                       "custom Python tools and environments are turned off in this public demo")
    added = attacker.fire("tools-add", **{"tools-kind": kind, "tools-code": code})
    # gradio refuses a kind the menu does not offer; past it, the handler does (tests/test_ui_tools.py)
    offered = "calculator, convert, lookup, search, guess_number, arithmetic"
    expect_refusal(added, "not in the list of choices: \\[" + ", ".join(f"'{k}'" for k in offered.split(", ")) +
                   f"\\]|Choose a kind of tool: {offered}")
    name = "tool" if kind == "custom" else "Environment"
    tried = attacker.fire("tools-try", **{"tools-chosen": name, "tools-arguments": '{"x": "1"}', **PLAYGROUND_DATA})
    # gradio refuses a tool the list does not offer; answered, the handler says there is none
    assert not tried.ok or re.search("Add a tool first|no tool named", tried.text()), tried.text()[:300]
    assert not marker.exists()


def test_a_tools_answer_is_cut_and_a_slow_call_is_refused_at_once(demo, tiny_model_dir, no_training, tmp_path):
    """44, public mode: a lookup over cells of 10,000 characters hands back 1,000 of them, and arithmetic that
    would take the machine is refused in a sentence, while a bystander is answered."""
    facts = tmp_path / "facts.csv"
    facts.write_text("question,answer\n" + "".join(f"k{n},{'y' * 10_000}\n" for n in range(30)))
    tools = [{"kind": "calculator"}, {"kind": "lookup", "name": "fact", "key_column": "question",
                                      "value_column": "answer"}]
    attacker = demo.attacker(**{DRAFT_STORE: {"draft": {**base_draft(tiny_model_dir), "tools": tools}}})
    uploaded = attacker.fire("data-upload", "upload", **{"data-upload": attacker.upload(facts)})
    assert uploaded.ok, uploaded.error
    data = {"data-source": uploaded.data[0], "data-prompt": "question", "data-reference": "answer"}
    with another_visitor_answered_within(demo):
        answer = attacker.fire("tools-try", **{"tools-chosen": "fact", "tools-arguments": '{"key": "k3"}', **data})
        assert answer.ok and "(cut: the answer had 10,000 characters)" in answer.text(), answer.text()[:300]
        assert answer.text().count("y") < 1100
        for expression in ("9 ** 9 ** 9 ** 9", "(10 ** 99) * (10 ** 99)", "1" * 201):
            slow = attacker.fire("tools-try", **{"tools-chosen": "calculator", **data,
                                                 "tools-arguments": json.dumps({"expression": expression})})
            assert slow.ok and slow.seconds < 2 and "error: " in slow.text(), (slow.seconds, slow.text()[:300])


def resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def test_the_held_out_set_is_capped(demo, tiny_model_dir, tmp_path):
    """Item 10: eval_frac 0.5 on 10 000 rows scored 5 000 prompts on each side, outside the time limit. Now a run
    holds out at most 50 (and its time limit counts their scoring: tests/test_public.py)."""
    many = write_arithmetic_csv(tmp_path / "many.csv", rows=10_000)
    attacker = demo.attacker(**{DRAFT_STORE: {"draft": base_draft(tiny_model_dir)}})
    answer = attacker.fire("data-upload", "upload", **{"data-upload": attacker.upload(many)})
    assert answer.ok, answer.error
    config = {**base_draft(tiny_model_dir), "data": {"source": answer.data[0], "prompt": "question",
                                                     "reference": "answer", "eval_frac": 0.5}}
    started = attacker.call("start", config)
    assert started.ok, started.error
    status = (demo.runs / started.data[0] / "status.json").read_text()
    assert '"n_eval": 50' in status and "this public demo's limit of held-out prompts" in status
    stop(attacker, started.data[0])


# ----------------------------------------------------------------------------------------------------------------
# Every event, with inputs no page would send.

HOSTILE_TEXTS = ("/proc/self/environ", "../../outside-the-demo/secret.csv", "runs/.uploads", "x" * 100_000)


def hostile_value(component: dict, text: str):
    """What a hostile page sends for a component: ``text`` wherever gradio takes any text, the extreme a number
    field allows, a kept draft whose folder is /proc; what gradio itself refuses (a choice not offered, a file not
    uploaded) would only stop the event before the app's handler runs, so those keep their own value."""
    kind, props = component["type"], component.get("props", {})
    if kind in ("textbox", "code") or (kind == "dropdown" and props.get("allow_custom_value")):
        return text
    if kind in ("number", "slider"):
        return props.get("maximum") if props.get("maximum") is not None else 1e15
    if kind == "browserstate":
        draft = {"base_dir": "/proc", "data": {"source": "self/environ", "prompt": text}, "rewards": [{"kind": "json"}]}
        return {"draft": draft, "pristine": draft, "auto_name": text}
    if kind == "checkbox":
        return True
    return props.get("value")


def test_every_event_survives_inputs_no_page_would_send(demo, victim):
    """Each event of the app, by its fn_index, with hostile text in every input that takes text (and the extreme
    in every number): the server answers each (a refusal, or a harmless result), opens nothing outside the demo,
    leaks nothing, and logs no unexpected error of the app's own."""
    attacker = demo.attacker()
    for event in demo.app.events:
        for text in HOSTILE_TEXTS:
            data = [None if demo.app.components[cid]["type"] == "state" else
                    hostile_value(demo.app.components[cid], text) for cid in event["inputs"]]
            attacker.send(event["id"], data, timeout=120)
    assert httpx.get(f"{demo.app.url}/config", timeout=30).status_code == 200
    server_log = (demo.folder.parent / "server.log").read_text(errors="replace")
    assert "unexpected error in the UI" not in server_log, server_log[-3000:]



def test_a_kept_draft_of_any_shape_still_opens_the_page(demo, tiny_model_dir):
    """The page fills every tab from the draft its browser kept in one answer: a part no tab can show (sent by
    anyone) leaves that tab as it was and says so; the other tabs and the form still show."""
    draft = {**base_draft(tiny_model_dir), "grpo": "nonsense", "lora": {"target_modules": 7},
             "rewards": [{"kind": "numeric", "name": "kept_reward"}]}
    visitor = RawVisitor(demo.app)
    opened = visitor.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24),
                                  DRAFT_STORE: {"draft": draft, "pristine": 3, "auto_name": ["x"]}})
    page_load = demo.app.page_load()
    assert demo.app.output(page_load, opened, "form-opening") == ""  # the page shows the form
    assert "Some settings could not be shown" in demo.app.output(page_load, opened, "recipe-status")
    assert "kept_reward" in json.dumps(demo.app.output(page_load, opened, "rewards-table"))
    # The form's own values replace the broken parts: its watchers, Check and loading a recipe all work.
    watched = visitor.fire("form-edits", "change", sets="model-check", **PLAYGROUND_DATA)
    assert watched.ok and "Something went wrong" not in watched.text(), watched.text()[:300]
    said = demo.app.output(demo.app.event("form-edits", "change", "model-check"), watched, "model-check")
    assert said.startswith(("✅", "❌", "⚠️")), said  # the form's own values checked, in the screen's words
    recipe = visitor.fire("load-recipe", recipe="arithmetic")
    assert recipe.ok and "Loaded the arithmetic recipe" in recipe.text(), recipe.text()[:300]
