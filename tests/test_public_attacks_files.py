"""Proof by attack, for files: uploads count against their network address's share as their bytes arrive, and no
answer names a folder of the server's. The real app in public mode, as tests/test_public_attacks.py starts it (its
fixtures and checks: after each attack nothing leaked, and a bystander was answered within a second), with an upload
limit of 2 MB, so that an address's share is 10 MB; then the rules behind the attacks, table by table.

Each upload attack comes from a network address of its own (X-Forwarded-For, which uvicorn takes from a local
proxy), so that they do not spend each other's share.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import secrets
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from raw_gradio import RawVisitor
import test_public_attacks as attacks
from test_public_attacks import (DRAFT_STORE, LIMITS, TOKEN_STORE, Demo, another_visitor_answered_within,
                                 assert_nothing_leaked, base_draft, expect_refusal)

import dragon_ui
from dragon_ui import experiments, public
from dragon_ui.data import BUNDLED_DATASETS_DIR
from dragon_ui.studio.files import Files, real_source, shown_source
from dragon_ui.studio.recipes import Recipes
from dragon_ui.public import key_of
from dragon_ui.ui import guard

demo, victim, no_training = attacks.demo, attacks.victim, attacks.no_training  # its fixtures, used here by name
UPLOAD_MB = 2
SHARE_MB = 10
SHARE = SHARE_MB * 2**20
FILE_BYTES = int(1.9 * 2**20)  # under the upload limit
BOUNDARY = secrets.token_hex(16)
FORM_HEAD = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; filename="part.csv"\r\n'
             "Content-Type: text/csv\r\n\r\n").encode()
FORM_TAIL = f"\r\n--{BOUNDARY}--\r\n".encode()
UPLOADS_IN_A_SHARE = SHARE // (len(FORM_HEAD) + FILE_BYTES + len(FORM_TAIL))
SHARE_SPENT = ("Uploads and downloads from your network address have reached this public demo's share of 10 MB "
               "per 10 minutes")


@pytest.fixture(scope="module")
def demo_limits() -> dict:
    return {**LIMITS, "DRAGON_UI_MAX_UPLOAD_MB": str(UPLOAD_MB), "DRAGON_UI_MAX_DISK_MB": str(SHARE_MB)}


@pytest.fixture
def attacked(demo, victim):
    """The demo; after the attack, test_public_attacks' checks that nothing leaked."""
    yield demo
    assert_nothing_leaked(demo, victim)


def new_address() -> str:
    return f"10.{secrets.randbelow(250)}.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}"


def chunked_upload(demo: Demo, address: str) -> httpx.Response:
    """A file of random bytes (FILE_BYTES) posted to gradio's upload route as a page's form posts it, but from a
    generator: sent chunked, with no Content-Length."""
    def body():
        yield FORM_HEAD
        for start in range(0, FILE_BYTES, 2**16):
            yield os.urandom(min(2**16, FILE_BYTES - start))
        yield FORM_TAIL

    return httpx.post(f"{demo.app.url}/gradio_api/upload", content=body(), timeout=60,
                      headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}", "x-forwarded-for": address})


def declared_upload(demo: Demo, address: str) -> httpx.Response:
    """The same upload with its length declared, as a browser sends it."""
    return httpx.post(f"{demo.app.url}/gradio_api/upload", files={"files": ("part.csv", os.urandom(FILE_BYTES))},
                      headers={"x-forwarded-for": address}, timeout=60)


@pytest.mark.usefixtures("no_training")
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_uploads_that_declare_no_length_count_against_the_address_share(attacked):
    """Finding: the share counted the declared Content-Length, which a chunked upload has none of: after the sixth
    19 MB upload was refused, six more chunked ones were taken. Now their bytes count as they arrive; the upload that
    passes the share is refused part way, and what gradio had written of it is deleted."""
    demo, address = attacked, new_address()
    before = demo.gradio_files()
    with another_visitor_answered_within(demo):
        answers = [chunked_upload(demo, address) for _ in range(UPLOADS_IN_A_SHARE + 2)]
        declared = declared_upload(demo, address)
    assert [answer.status_code for answer in answers] == [200] * UPLOADS_IN_A_SHARE + [429, 429]
    assert all(SHARE_SPENT in answer.json()["detail"] for answer in [*answers[-2:], declared])
    assert declared.status_code == 429
    kept = {path: size for path, size in demo.gradio_files().items() if path not in before}
    assert sorted(kept.values()) == [FILE_BYTES] * UPLOADS_IN_A_SHARE, kept  # no part of a refused one
    assert chunked_upload(demo, new_address()).status_code == 200  # each address has a share of its own


@pytest.mark.usefixtures("no_training")
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_uploads_sent_side_by_side_draw_on_one_share(attacked):
    """Several uploads at once from one address: none may pass the check before the others' bytes are counted."""
    demo, address = attacked, new_address()
    side_by_side = UPLOADS_IN_A_SHARE + 3
    before = demo.gradio_files()
    with another_visitor_answered_within(demo), ThreadPoolExecutor(side_by_side) as senders:
        statuses = [answer.status_code for answer in senders.map(lambda _: chunked_upload(demo, address),
                                                                  range(side_by_side))]
    assert 429 in statuses and set(statuses) <= {200, 429}, statuses
    kept = {path: size for path, size in demo.gradio_files().items() if path not in before}
    assert sorted(kept.values()) == [FILE_BYTES] * statuses.count(200), kept
    assert sum(kept.values()) <= SHARE


@pytest.mark.usefixtures("no_training")
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_upload_abandoned_part_way_leaves_nothing_behind(attacked):
    """The review: gradio keeps what it wrote of an upload whose client leaves part way (until the hourly clean-up),
    so clients that send most of a file and hang up fill the disk outside every share. Now the part is deleted."""
    demo = attacked
    before = demo.gradio_files()
    host, port = demo.app.url.removeprefix("http://").split(":")
    with another_visitor_answered_within(demo):
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(f"POST /gradio_api/upload HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
                             f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n".encode())
                for part in [FORM_HEAD, *[os.urandom(2**16)] * 16]:
                    sock.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                deadline = time.monotonic() + 30
                while not set(demo.gradio_files()) - set(before):  # gradio is writing it
                    assert time.monotonic() < deadline, "the upload was never written"
                    time.sleep(0.05)
            # the client hangs up here, without the file's end
    deadline = time.monotonic() + 30
    while set(demo.gradio_files()) - set(before):
        assert time.monotonic() < deadline, set(demo.gradio_files()) - set(before)
        time.sleep(0.1)


def as_the_page_does(visitor: RawVisitor, event: dict, shown: dict, trigger: str | None = None) -> None:
    """Send ``event``, then every event the page chains after it (``.then``), each with what the page shows by then:
    ``shown`` (values by elem_id, and by storage key for what the browser keeps), updated from every answer."""
    trigger_id = visitor.app.component_id(trigger) if trigger else None
    answer = visitor.send(event["id"], visitor.inputs(event, shown), trigger_id=trigger_id)
    assert answer.ok, answer.error
    for component_id, value in zip(event["outputs"], answer.data, strict=True):
        elem_id = visitor.app.components[component_id].get("props", {}).get("elem_id")
        if isinstance(value, dict) and value.get("__type__") == "update":
            if "value" not in value:
                continue
            value = value["value"]
        if elem_id:
            shown[elem_id] = value
    for then in visitor.app.events:
        if then.get("trigger_after") == event["id"] and then.get("backend_fn"):
            as_the_page_does(visitor, then, shown)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_answer_names_a_folder_of_the_server(attacked, tiny_model_dir, tmp_path):
    """Finding: /recipe and the first page showed the app's folder and the runs folder, and an upload showed its
    uploader the path .uploads/<visitor key>/… on the server. Every answer of the first page, a page load, /recipe
    and an upload (with the events the page chains after them) is searched for the app's folder, the runs folder,
    the uploads folder, the visitor's key and the folder of the app's code; the server still reads the real file
    behind what it shows."""
    demo = attacked
    first_page = [httpx.get(f"{demo.app.url}{path}", timeout=30).text for path in ("/", "/config")]
    token = secrets.token_urlsafe(24)
    visitor = RawVisitor(demo.app)
    demo.attackers.append(visitor)  # test_public_attacks' checks search its answers for secrets too
    kept_draft = {**base_draft(tiny_model_dir), "data": {"source": "arithmetic.csv", "prompt": "question"}}
    shown = {TOKEN_STORE: token, DRAFT_STORE: {"draft": kept_draft}}
    as_the_page_does(visitor, demo.app.page_load(), shown)
    assert shown["data-source"] == "arithmetic.csv"
    recipe = visitor.call("recipe", "arithmetic")
    assert recipe.ok and recipe.data[0]["runs_dir"] == recipe.data[0]["base_dir"] == ""
    mine = tmp_path / "mine.csv"
    mine.write_text("question,answer\n" + "".join(f"What is {n} + 2?,{n + 2}\n" for n in range(30)))
    shown["data-upload"] = visitor.upload(mine)
    as_the_page_does(visitor, demo.app.event("data-upload", "upload"), shown, trigger="data-upload")
    assert shown["data-source"] == "uploads/mine.csv" and "Your file mine.csv" in shown["data-source-status"]
    key = key_of(token)
    assert [path.name for path in (demo.runs / ".uploads" / key).glob("*/mine.csv")]  # where it is kept

    # What it shows stands for that file: the page previews it, and the API checks a config naming it.
    as_the_page_does(visitor, demo.app.event("data-source", "submit"), shown, trigger="data-source")
    assert "30 rows" in shown["data-counts"], shown["data-counts"]
    config = {**base_draft(tiny_model_dir), "data": {"source": "uploads/mine.csv", "prompt": "question"}}
    assert visitor.call("check", config).data == ["valid"]

    code = str(Path(dragon_ui.__file__).parent)
    folders = {"the app's folder": str(demo.folder), "the runs folder": str(demo.runs),
               "the uploads folder": public.UPLOADS_FOLDER, "the visitor's key": key, "the app's code": code}
    answers = first_page + [answer for _, answer in visitor.answers]
    recipe_answer = recipe.text()
    found = {(what, number) for number, answer in enumerate(answers) for what, folder in folders.items()
             if folder in answer and not (answer == recipe_answer and what == "the app's code")}
    assert not found, found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_recipe_names_no_folder_of_the_apps_code(attacked):
    recipe = attacked.attacker().call("recipe", "arithmetic")
    assert recipe.ok and str(Path(dragon_ui.__file__).parent) not in recipe.text()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_anothers_upload_cannot_be_named_as_it_is_shown(attacked, victim, tiny_model_dir):
    """uploads/<name> stands for the asking visitor's own upload only: the victim's, by the name shown to them, is
    refused to anyone else."""
    attacker = attacked.attacker(**{DRAFT_STORE: {"draft": base_draft(tiny_model_dir)}})
    named = attacker.fire("data-source", "submit", **{"data-source": "uploads/private.csv", "data-prompt": "question"})
    expect_refusal(named, "this public demo reads no other files on the server")
    config = {**base_draft(tiny_model_dir), "data": {"source": "uploads/private.csv", "prompt": "question"}}
    expect_refusal(attacker.call("check", config), "this public demo reads no other files on the server")


# ----------------------------------------------------------------------------------------------------------------
# The rules, table by table.


SHARE_BYTES = 5000  # a file's bytes that fit an address's share in the rules below, besides two forms' head and tail
FORM_BYTES = len(FORM_HEAD) + len(FORM_TAIL)


@pytest.fixture
def share_of(tmp_path, monkeypatch):
    """RequestLimits of a public demo whose addresses' share of the disk fits SHARE_BYTES of files in two uploads,
    and the folder its uploads arrive in."""
    monkeypatch.setattr(public, "time", FakeTime())
    limits = public.Limits(disk_mb=(SHARE_BYTES + 2 * FORM_BYTES) / 2**20)
    files = Files(tmp_path / "runs", policy=public.Policy(limits=limits))
    files.serve_from(tmp_path / "cache")
    return guard.RequestLimits(None, files=files, policy=files.policy), files.arrivals


class FakeTime:
    """public.py's time, its clock moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def upload_through(limits: guard.RequestLimits, declared: int | None, chunks: list[int],
                         address: str = "10.0.0.1") -> tuple[int, str]:
    """(status, answer) of an upload of one file sent in ``chunks`` (their sizes) after the form's head, declaring
    ``declared`` bytes of file besides the form (None: chunked); each chunk lets the other uploads run, as a
    connection's arrivals do."""
    parts = [FORM_HEAD, *[b"x" * size for size in chunks], FORM_TAIL]
    pending = [{"type": "http.request", "body": part, "more_body": at < len(parts) - 1}
               for at, part in enumerate(parts)]
    sent = []

    async def receive():
        await asyncio.sleep(0)
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())]
    if declared is not None:
        headers.append((b"content-length", str(declared + FORM_BYTES).encode()))
    received = set()
    app = SimpleNamespace(get_blocks=lambda: SimpleNamespace(upload_file_set=received))
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "headers": headers,
             "client": (address, 1), "query_string": b"", "app": app}
    await limits(scope, receive, send)
    return sent[0]["status"], b"".join(message.get("body", b"") for message in sent[1:]).decode()


def arrived(folder: Path) -> list[int]:
    """The sizes of the files that arrived, each in a folder of its own."""
    return sorted(path.stat().st_size for path in folder.glob("*/*"))


SHARE_CASES = {  # uploads (declared length, chunk sizes) one after another from one address (share_of)
    "chunked: counted as it arrives": ([(None, [1000] * 3), (None, [1000] * 3)], [200, 429]),
    "declared: counted at once, then chunked": ([(4000, [4000]), (None, [500] * 4)], [200, 429]),
    "declared past the share: refused unread": ([(6000, [6000]), (None, [1000] * 5)], [429, 200]),
    "more sent than declared: counted as it arrives": ([(1000, [1000] * 4), (None, [1000] * 2)], [200, 429]),
    "exactly the share": ([(None, [2500, 2500]), (None, [1])], [200, 429]),
}


@pytest.mark.parametrize("uploads, statuses", SHARE_CASES.values(), ids=SHARE_CASES.keys())
def test_an_address_share_counts_every_upload_byte_before_it_is_kept(share_of, uploads, statuses):
    limits, folder = share_of
    answers = [asyncio.run(upload_through(limits, declared, chunks)) for declared, chunks in uploads]
    assert [status for status, _ in answers] == statuses
    assert all("reached this public demo's share" in answer for status, answer in answers if status == 429)
    assert sum(arrived(folder)) <= SHARE_BYTES  # nothing of a refused upload is left
    assert asyncio.run(upload_through(limits, None, [5000], address="10.0.0.2"))[0] == 200  # another address's


def test_the_chunks_of_uploads_side_by_side_count_before_they_are_kept(share_of):
    """Eight chunked uploads at once from one address, their chunks interleaved: no byte past the share is kept,
    and those refused are answered 429."""
    limits, folder = share_of

    async def side_by_side():
        return await asyncio.gather(*(upload_through(limits, None, [250] * 8) for _ in range(8)))

    statuses = [status for status, _ in asyncio.run(side_by_side())]
    assert 429 in statuses and set(statuses) <= {200, 429}
    assert arrived(folder) == [2000] * statuses.count(200) and sum(arrived(folder)) <= SHARE_BYTES


def test_the_share_is_whole_again_after_the_window(share_of):
    limits, _ = share_of
    assert asyncio.run(upload_through(limits, None, [4000]))[0] == 200
    public.time.now += public.SHARE_WINDOW_S - 1
    assert asyncio.run(upload_through(limits, None, [2000]))[0] == 429
    public.time.now += 1
    assert asyncio.run(upload_through(limits, None, [4000]))[0] == 200


def test_an_upload_carries_one_file_and_identical_ones_stay_two(share_of):
    """Findings: one request carried 1,000 files, each in a folder of its own that gradio's hourly clean-up left
    behind; and two visitors' identical uploads shared gradio's one folder, so the first one's upload event took
    the other's file away. Now a request of two files is refused with nothing kept, and identical bytes arrive
    twice, each in a folder of its own."""
    limits, folder = share_of
    two = FORM_HEAD + b"a" * 10 + f"\r\n--{BOUNDARY}\r\n".encode() + FORM_HEAD.split(b"\r\n", 1)[1] + b"b" * 10 + FORM_TAIL

    async def posted(body: bytes) -> tuple[int, str]:
        sent, pending = [], [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            return pending.pop(0) if pending else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        app = SimpleNamespace(get_blocks=lambda: SimpleNamespace(upload_file_set=set()))
        scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "query_string": b"", "app": app,
                 "headers": [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())],
                 "client": ("10.0.0.3", 1)}
        await limits(scope, receive, send)
        return sent[0]["status"], sent[1]["body"].decode()

    status, answer = asyncio.run(posted(two))
    assert status == 400 and "carries 1 file" in answer and arrived(folder) == []
    same = FORM_HEAD + b"same bytes" + FORM_TAIL
    (first, one), (second, other) = asyncio.run(posted(same)), asyncio.run(posted(same))
    assert first == second == 200 and json.loads(one) != json.loads(other)
    assert [Path(path).read_bytes() for path in [*json.loads(one), *json.loads(other)]] == [b"same bytes"] * 2


CSV_CELLS = {  # what a name is exported as: a text a spreadsheet could run as a formula gets a quote
    "plain": ("plain", "plain"),
    "a formula sign inside": ("a=b+c", "a=b+c"),
    "=": ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"),
    "+": ("+1", "'+1"),
    "-": ("-cmd", "'-cmd"),
    "@": ("@SUM(A1)", "'@SUM(A1)"),
    "a leading space": (" =1+1", "' =1+1"),
    "a leading tab": ("\t=1+1", "'\t=1+1"),
    "a leading line feed": ("\n=1+1", "'\n=1+1"),
    "a leading carriage return": ("\r=1+1", "'\r=1+1"),
    "a leading no-break space": ("\u00a0=1+1", "'\u00a0=1+1"),
    "a leading zero-width space": ("\u200b=1+1", "'\u200b=1+1"),
    "a leading byte-order mark": ("\ufeff=1+1", "'\ufeff=1+1"),
    "a leading NUL": ("\x00=1+1", "'\x00=1+1"),
    "full-width ＝": ("＝1+1", "'＝1+1"),
    "full-width ＋": ("＋1", "'＋1"),
    "full-width －": ("－1", "'－1"),
    "full-width ＠": ("＠SUM(A1)", "'＠SUM(A1)"),
    "small ﹦": ("﹦1+1", "'﹦1+1"),
    "a negative number": (-0.25, "-0.25"),
    "nothing": (None, ""),
}


@pytest.mark.parametrize("value, exported", CSV_CELLS.values(), ids=CSV_CELLS.keys())
def test_the_csv_quotes_what_could_run_as_a_formula(tmp_path, value, exported):
    path = experiments.write_csv(tmp_path / "runs.csv", ["Name"], [[value]])
    with open(path, newline="", encoding="utf-8") as fh:
        assert list(csv.reader(fh)) == [["Name"], [exported]]


@pytest.fixture
def demo_policy(tmp_path) -> public.Policy:
    """A public demo's policy, keeping its runs in tmp_path/runs."""
    return public.Policy(limits=public.Limits(), runs_dir=tmp_path / "runs")


@pytest.fixture
def uploads(demo_policy) -> dict[str, Path]:
    """A public demo's runs folder in which alice uploaded mine.csv twice (the second newer) and bob theirs.csv."""
    files = {}
    for who, folder, name in (("alice", "first", "mine.csv"), ("alice", "second", "mine.csv"),
                              ("bob", "only", "theirs.csv")):
        path = demo_policy.uploads_dir / who / folder / name
        path.parent.mkdir(parents=True)
        path.write_text(folder)
        os.utime(path, (1000 + len(files), 1000 + len(files)))
        files[f"{who} {folder}"] = path
    return files


ARITHMETIC = BUNDLED_DATASETS_DIR / "arithmetic.csv"
SHOWN = {  # (the source, as it is shown in a public demo, what alice's page sends back is read as)
    "a bundled dataset": (lambda _: str(ARITHMETIC), "arithmetic.csv", lambda _: str(ARITHMETIC)),
    "one's newest upload": (lambda f: str(f["alice second"]), "uploads/mine.csv", lambda f: str(f["alice second"])),
    "one's older upload, by the name shown": (lambda f: str(f["alice first"]), "uploads/mine.csv",
                                              lambda f: str(f["alice second"])),
    "another's upload": (lambda f: str(f["bob only"]), "uploads/theirs.csv", lambda _: "uploads/theirs.csv"),
    "another's upload, by a path through one's own": (
        lambda f: str(f["alice first"].parents[1] / ".." / "bob" / "only" / "theirs.csv"), "uploads/theirs.csv",
        lambda _: "uploads/theirs.csv"),
    "a Hub dataset": (lambda _: "openai/gsm8k", "openai/gsm8k", lambda _: "openai/gsm8k"),
    "a path typed": (lambda _: "/proc/self/environ", "/proc/self/environ", lambda _: "/proc/self/environ"),
    "nothing": (lambda _: "", "", lambda _: ""),
}


@pytest.mark.parametrize("source, shown, read", SHOWN.values(), ids=SHOWN.keys())
def test_a_public_demo_shows_a_source_by_its_name_and_reads_the_file_it_stands_for(uploads, demo_policy, source, shown,
                                                                                   read):
    alice = demo_policy.asked_by(public.Visitor(key="alice"))
    assert shown_source(source(uploads), policy=alice) == shown
    assert real_source(shown, policy=alice) == read(uploads)
    # Your own machine shows a bundled dataset by its name too (no folder of the package in a screenshot), and
    # every other path whole.
    on_laptop = shown if shown == ARITHMETIC.name else source(uploads)
    assert shown_source(source(uploads), policy=public.LAPTOP) == on_laptop
    assert real_source(on_laptop, policy=public.LAPTOP) == (read(uploads) if shown == ARITHMETIC.name else on_laptop)


def test_your_own_file_named_like_a_bundled_dataset_is_read_on_your_own_machine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert real_source(ARITHMETIC.name, policy=public.LAPTOP) == str(ARITHMETIC)
    (tmp_path / ARITHMETIC.name).write_text("question,answer\n", encoding="utf-8")
    assert real_source(ARITHMETIC.name, policy=public.LAPTOP) == ARITHMETIC.name


@pytest.mark.parametrize("sent", ["uploads/../bob/only/theirs.csv", "uploads/..", "uploads/", "uploads/*.csv",
                                  "uploads/second/mine.csv", " uploads/nothing.csv"])
def test_only_a_plain_name_in_uploads_stands_for_an_upload(uploads, demo_policy, sent):
    assert real_source(sent, policy=demo_policy.asked_by(public.Visitor(key="alice"))) == sent
    # a visitor nobody could tell apart has no uploads
    assert real_source("uploads/mine.csv", policy=demo_policy.asked_by(public.NOBODY)) == "uploads/mine.csv"


def test_the_draft_a_browser_keeps_names_no_folder_and_comes_back_whole(uploads, demo_policy):
    from dragon_ui.studio.files import real_draft, shown_draft

    draft = {"name": "mine", "data": {"source": str(uploads["alice second"]), "prompt": "question"}}
    alice = demo_policy.asked_by(public.Visitor(key="alice"))
    kept = shown_draft(draft, policy=alice)
    assert kept["data"] == {"source": "uploads/mine.csv", "prompt": "question"}
    assert real_draft(kept, policy=alice) == draft and draft["data"]["source"] == str(uploads["alice second"])
    assert shown_draft(draft, policy=public.LAPTOP) is draft
    assert real_draft({"data": 3}, policy=demo_policy) == {"data": 3}


def test_a_public_recipe_names_no_folder_of_the_servers(demo_policy):
    recipes = Recipes(Path(dragon_ui.__file__).parent / "assets" / "recipes", demo_policy.runs_dir, policy=demo_policy)
    recipe = recipes.load("arithmetic")
    assert recipe["runs_dir"] == recipe["base_dir"] == ""
    laptop = Recipes(recipes.folder, recipes.runs_dir, policy=public.LAPTOP).load("arithmetic")
    assert laptop["runs_dir"] == str(recipes.runs_dir) and laptop["base_dir"] == str(recipes.folder)
