"""Proof by attack, for the server's queue, turns, routes and disk: one visitor cannot fill the machine. The real app
in public mode, as tests/test_public_attacks.py starts it (its fixtures and checks: after each attack nothing leaked,
and a bystander's page, /config and a queued event were answered within a second), with a playground time limit of
20 s, four pre-flights an hour and ten files on the disk per address; then the rules behind the attacks.

The findings (issue 53): one session queued 600 events of empty JSON objects behind a pre-flight, and the server grew
by 2.2 GB; an HTTP pre-flight held the one-model turn 143 s after its client left; a bystander's preview of a bundled
file waited 72 s behind three slow spreadsheets; each export wrote its data twice more; one upload request carried
1,000 files; gradio's own routes answered anyone. Each attack comes from network addresses of its own
(X-Forwarded-For, which uvicorn takes from a local proxy), so that they do not spend each other's shares.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import test_public_attacks as attacks
from raw_gradio import RawVisitor
from test_public_attacks import (DRAFT_STORE, LIMITS, TOKEN_STORE, another_visitor_answered_within,
                                 assert_nothing_leaked, base_draft, expect_refusal, resident_mb)

from dragon_ui import public
from dragon_ui.studio.draft import KEPT_DRAFT_VALUES, json_shape
from dragon_ui.ui import guard
from dragon_ui.ui.guard import requests as guard_requests

demo, victim, no_training = attacks.demo, attacks.victim, attacks.no_training  # its fixtures, used here by name
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
PREFLIGHTS = 4
DISK_FILES = 10
WAITING_PER_SESSION, WAITING_MB_PER_ADDRESS = public.Limits.waiting_per_session, public.Limits.waiting_mb_per_address


@pytest.fixture(scope="module")
def demo_limits() -> dict:
    return {**LIMITS, "DRAGON_UI_MAX_SAMPLING_SECONDS": "20", "DRAGON_UI_MAX_PREFLIGHTS_PER_HOUR": str(PREFLIGHTS),
            "DRAGON_UI_MAX_DISK_FILES": str(DISK_FILES)}


@pytest.fixture
def attacked(demo, victim, no_training):
    """The demo with nothing training (a training's own load is not an attack); after the attack, nothing leaked."""
    yield demo
    assert_nothing_leaked(demo, victim)


def new_address() -> str:
    return f"10.{secrets.randbelow(250)}.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}"


def from_address(address: str) -> dict:
    return {"x-forwarded-for": address}


def visitor_at(demo, address: str | None = None, **kept) -> RawVisitor:
    """A new visitor from a network address of its own, whose page opened with ``kept`` in its storage; its answers
    are searched for secrets after the attack."""
    visitor = RawVisitor(demo.app, headers=from_address(address or new_address()))
    assert visitor.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24), **kept}).ok
    demo.attackers.append(visitor)
    return visitor


def slow_preflight(tiny_model_dir) -> dict:
    """A pre-flight that samples until the playground's time limit: long replies, many prompts."""
    draft = base_draft(tiny_model_dir)
    return {**draft, "grpo": {"group_size": 8, "max_new_tokens": 256}}


def results(visitor: RawVisitor, count: int, timeout: float = 120) -> list[dict]:
    """Read the session's stream of results until ``count`` of its events have completed."""
    done = []
    with httpx.stream("GET", f"{visitor.app.url}/gradio_api/queue/data", params={"session_hash": visitor.session},
                      timeout=timeout, headers=visitor.headers) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and (message := json.loads(line[5:])).get("msg") == "process_completed":
                done.append(message)
                if len(done) == count:
                    break
    return done


def models_turn_held(demo, tiny_model_dir, seconds: float) -> list[threading.Thread]:
    """Other visitors' slow pre-flights, one after another, holding the one-model turn for about ``seconds`` (each
    samples until the playground's time limit, 20 s)."""
    blockers = []
    for _ in range(max(1, round(seconds / 20))):
        blocker = RawVisitor(demo.app, headers=from_address(new_address()))
        blockers.append(threading.Thread(target=blocker.call, args=("preflight", slow_preflight(tiny_model_dir), 256),
                                         daemon=True))
        blockers[-1].start()
        time.sleep(0.5)
    time.sleep(3)  # the first has the turn, and is loading the model or sampling
    return blockers


def queue_size(demo) -> int:
    return httpx.get(f"{demo.app.url}/gradio_api/queue/status", timeout=30).json()["queue_size"]


# ----------------------------------------------------------------------------------------------------------------
# The queue.


def test_a_page_has_only_a_few_events_waiting(attacked):
    """Finding 1: gradio's queue took any number of events from one session. Events answered but not read count
    too: they are held for their page until it reads them. Once read, the page may send more."""
    demo = attacked
    recipe = demo.app.api("recipe")["id"]
    page = RawVisitor(demo.app, headers=from_address(new_address()))
    with another_visitor_answered_within(demo):
        statuses = [page.join(recipe, ["arithmetic"]).status_code for _ in range(WAITING_PER_SESSION + 1)]
        assert statuses == [200] * WAITING_PER_SESSION + [429]
        refused = page.join(recipe, ["arithmetic"])
        assert f"This page has {WAITING_PER_SESSION} events waiting" in refused.json()["detail"]
        assert len(results(page, WAITING_PER_SESSION)) == WAITING_PER_SESSION  # the page reads its answers...
        assert page.join(recipe, ["arithmetic"]).status_code == 200  # ...and may go on
    results(page, 1)


def test_events_of_empty_objects_behind_a_preflight_cost_the_server_little(attacked, tiny_model_dir):
    """Finding 1: with a pre-flight holding the one-model turn, 600 events of 118 KB of empty JSON objects grew the
    server by 2.2 GB, which it never gave back, and another visitor's model event waited 188 s. Now such a body is
    refused at the door (more values than any page sends), and an address's events wait within its share of memory
    (64 MB, as guard.waiting estimates what each holds)."""
    demo, address = attacked, new_address()
    preflight = demo.app.api("preflight")["id"]
    before = resident_mb(demo.pid)
    blockers = models_turn_held(demo, tiny_model_dir, 20)
    peak = before
    empty_objects = [{} for _ in range(39_000)]  # 118 KB of JSON
    most = [{"rewards": [{} for _ in range(guard.EVENT_VALUES - 10)]}, 1]  # as many values as an event may hold
    sent = json.dumps({"data": most, "fn_index": preflight, "trigger_id": None, "session_hash": "0" * 16,
                       "event_data": None}, separators=(",", ":")).encode()  # as RawVisitor.join sends it
    fit = int(WAITING_MB_PER_ADDRESS * 2**20 // guard.held_bytes(sent, json_shape(most)[0]))
    with another_visitor_answered_within(demo):
        refused = RawVisitor(demo.app, headers=from_address(address)).join(preflight, [{"rewards": empty_objects}, 1])
        assert refused.status_code == 413 and f"at most {guard.EVENT_VALUES:,} values" in refused.json()["detail"]
        answers = []
        for _ in range(fit + 10):  # a page each, as a page may send a few
            answers.append(RawVisitor(demo.app, headers=from_address(address)).join(preflight, most))
            peak = max(peak, resident_mb(demo.pid))
    assert [answer.status_code for answer in answers] == [200] * fit + [429] * 10
    assert f"already hold {WAITING_MB_PER_ADDRESS:g} MB" in answers[-1].json()["detail"]
    assert RawVisitor(demo.app, headers=from_address(new_address())).join(preflight, most).status_code == 200
    assert peak - before < 200, (before, peak)
    for blocker in blockers:
        blocker.join(120)
    deadline = time.monotonic() + 60
    while resident_mb(demo.pid) - before >= 200:  # the attack's events have ended (each refused as it ran)
        assert time.monotonic() < deadline, (before, resident_mb(demo.pid))
        time.sleep(1)


def test_a_page_that_has_gone_leaves_no_event_waiting(attacked, tiny_model_dir):
    """A session whose page has gone (no heartbeat, no stream of results) is no longer in use 30 s after its last
    event: its waiting events are dropped, and never run."""
    demo = attacked
    blockers = models_turn_held(demo, tiny_model_dir, 60)
    gone = RawVisitor(demo.app, headers=from_address(new_address()))
    assert gone.join(demo.app.api("preflight")["id"], [base_draft(tiny_model_dir), 1]).status_code == 200
    deadline = time.monotonic() + 60
    while queue_size(demo) > 0:  # the other blockers, then the event, waiting
        assert time.monotonic() < deadline, "the event waited on"
        time.sleep(1)
    assert blockers[-1].is_alive()  # the turn is still held: the event was dropped, not run
    for blocker in blockers:
        blocker.join(120)


def test_an_api_preflight_stops_when_its_client_leaves_and_counts_against_the_hour(attacked, tiny_model_dir):
    """Finding 3: an HTTP pre-flight held the one-model turn 143 s after its client had left, and any number could
    be asked for. Now it stops within a token of its client leaving, so the next visitor's model event starts at
    once; and each counts against its address's pre-flights an hour."""
    demo, address = attacked, new_address()
    leaver = RawVisitor(demo.app, headers=from_address(address))
    assert leaver.join(demo.app.api("preflight")["id"], [slow_preflight(tiny_model_dir), 256]).status_code == 200
    with httpx.stream("GET", f"{demo.app.url}/gradio_api/queue/data", params={"session_hash": leaver.session},
                      timeout=60, headers=leaver.headers) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_starts":
                break
        time.sleep(2)  # sampling; then the client leaves
    left = time.monotonic()
    with another_visitor_answered_within(demo):
        answer = RawVisitor(demo.app, headers=from_address(new_address())).call("preflight", base_draft(tiny_model_dir), 1)
    assert answer.ok, answer.error
    assert time.monotonic() - left < 10  # the leaver's pre-flight would have sampled 20 s
    asker = RawVisitor(demo.app, headers=from_address(address))
    answers = [asker.call("preflight", base_draft(tiny_model_dir), 1) for _ in range(PREFLIGHTS)]
    assert all(answer.ok for answer in answers[:-1]), [answer.error for answer in answers]
    expect_refusal(answers[-1], f"{PREFLIGHTS} pre-flights were asked for from your network address in the last hour")


def test_the_model_goes_next_to_the_address_served_longest_ago(attacked, tiny_model_dir):
    """Finding 4: the one-model turn was first come, first served: one visitor's three pre-flights put another's
    behind all three. Now the bystander's goes next after the one running."""
    demo, address = attacked, new_address()
    finished: list[str] = []

    def ask(who: str, config: dict, prompts: int, address: str) -> None:
        visitor = RawVisitor(demo.app, headers=from_address(address))
        assert visitor.join(demo.app.api("preflight")["id"], [config, prompts]).status_code == 200
        results(visitor, 1)
        finished.append(who)

    with ThreadPoolExecutor(4) as askers, another_visitor_answered_within(demo):
        for number in range(3):
            askers.submit(ask, f"attacker {number}", slow_preflight(tiny_model_dir), 256, address)
            time.sleep(0.5)
        askers.submit(ask, "bystander", base_draft(tiny_model_dir), 1, new_address())
    assert finished.index("bystander") == 1, finished


def slow_spreadsheet(path: Path) -> Path:
    """An .xlsx of 10,000 rows of 1,000 numbers (1 MB), which takes seconds to read."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr("[Content_Types].xml", '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
                      '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                      '<Default Extension="xml" ContentType="application/xml"/><Override PartName="/xl/workbook.xml" '
                      'ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
                      '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/'
                      'vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/></Types>')
        book.writestr("_rels/.rels", '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                      '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
                      'relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>')
        book.writestr("xl/workbook.xml", '<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
                      'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets>'
                      '<sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>')
        book.writestr("xl/_rels/workbook.xml.rels", '<Relationships xmlns="http://schemas.openxmlformats.org/package/'
                      '2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/'
                      'officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/></Relationships>')
        rows = ("<row>" + "".join(f"<c><v>{column}</v></c>" for column in range(1000)) + "</row>").encode() * 100
        with book.open("xl/worksheets/sheet1.xml", "w") as sheet:
            sheet.write(b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>')
            for _ in range(100):
                sheet.write(rows)
            sheet.write(b"</sheetData></worksheet>")
    return path


def test_a_bystanders_preview_never_waits_for_anothers_slow_files(attacked, tmp_path):
    """Finding 4: the Data tab's source, preview and upload events shared one first-come turn, so a bystander's
    preview of a bundled file waited 72 s behind three slow spreadsheets. Now each page's data events take turns
    with that page's alone."""
    demo, address = attacked, new_address()
    book = slow_spreadsheet(tmp_path / "slow.xlsx")
    reading = []

    def upload_and_read() -> None:
        page = visitor_at(demo, address)
        sent = page.upload(book)
        reading.append(time.monotonic())
        page.fire("data-upload", "upload", **{"data-upload": sent})

    bystander = visitor_at(demo)
    with ThreadPoolExecutor(3) as readers, another_visitor_answered_within(demo):
        for _ in range(3):
            readers.submit(upload_and_read)
        while len(reading) < 3:
            time.sleep(0.1)
        time.sleep(1)  # the first is being read, the others wait for it
        preview = bystander.fire("data-source", "submit", **{"data-source": "arithmetic.csv", "data-prompt": "question"})
        assert preview.ok and preview.seconds < 1, (preview.error, preview.seconds)


# ----------------------------------------------------------------------------------------------------------------
# The disk.


def test_an_export_is_made_once_as_one_zip_and_counts_against_the_disk_share(attacked, tiny_model_dir, tmp_path):
    """Finding 2: each distinct export wrote a copy of the visitor's data, a zip of it and gradio's copy of the zip,
    kept for an hour, with no limit: 49 MB a click with a 19 MB upload. Now an export is one zip in the server's
    cache, made once per settings and size, and counted against its address's share of the disk (ten files here)."""
    demo = attacked
    data = tmp_path / "mine.csv"
    data.write_text("question,answer,notes\n" + "".join(f"What is {n} + 2?,{n + 2},{secrets.token_hex(400)}\n"
                                                        for n in range(2000)))
    exporter = visitor_at(demo, **{DRAFT_STORE: {"draft": base_draft(tiny_model_dir)}})
    uploaded = exporter.fire("data-upload", "upload", **{"data-upload": exporter.upload(data)})
    assert uploaded.ok, uploaded.error
    shown = {"data-source": "uploads/mine.csv", "data-prompt": "question", "data-reference": "answer"}
    before = demo.gradio_files()
    with another_visitor_answered_within(demo):
        answers = [exporter.fire("model-export", **shown, **{"model-export-gpus": gpus}) for gpus in range(1, 12)]
        again = exporter.fire("model-export", **shown, **{"model-export-gpus": 1})
    made = [answer for answer in answers if answer.ok and "Unzip it on the GPU machine" in answer.text()]
    assert len(made) == DISK_FILES - 1  # the upload took one file of the share
    expect_refusal(answers[len(made)], f"share of {DISK_FILES} files per 10 minutes")
    assert again.ok and again.data[0]["path"] == made[0].data[0]["path"]  # the same zip, not made again
    new = {path: size for path, size in demo.gradio_files().items() if path not in before}
    assert sorted(path.suffix for path in new) == [".zip"] * len(made), sorted(new)
    assert sum(new.values()) < len(made) * data.stat().st_size  # a zip each, compressed, and nothing else


def test_an_upload_carries_one_file_and_identical_uploads_stay_two(attacked, tmp_path):
    """Findings 5 and 9: one request carried 1,000 files, each in a folder of its own, which gradio's hourly clean-up
    left behind; two visitors' identical uploads shared one folder, and the first one's upload event took the other's
    file away ("That file was not uploaded here")."""
    demo = attacked
    before = set((demo.folder.parent / "gradio").rglob("*"))
    many = [("files", (f"part{n}.csv", b"question,answer\n1,1\n")) for n in range(1000)]
    refused = httpx.post(f"{demo.app.url}/gradio_api/upload", files=many, headers=from_address(new_address()),
                         timeout=60)
    assert refused.status_code == 400 and "carries 1 file" in refused.json()["detail"]
    assert set((demo.folder.parent / "gradio").rglob("*")) == before  # not a folder left
    same = tmp_path / "same.csv"
    same.write_text("question,answer\n" + "".join(f"What is {n} + 3?,{n + 3}\n" for n in range(30)))
    alice, bob = visitor_at(demo), visitor_at(demo)
    sent = [alice.upload(same), bob.upload(same)]
    assert sent[0]["path"] != sent[1]["path"]
    for visitor, upload in zip((alice, bob), sent, strict=True):
        answer = visitor.fire("data-upload", "upload", **{"data-upload": upload})
        assert answer.ok and answer.data[0] == "uploads/same.csv", answer.error


# ----------------------------------------------------------------------------------------------------------------
# gradio's own routes, and what a page load may bring.


CLOSED = [("GET", "/monitoring"), ("GET", "/monitoring/summary"), ("GET", "/gradio_api/run-history/buckets"),
          ("GET", "/gradio_api/run-history/records"), ("POST", "/gradio_api/run-history/connect"),
          ("GET", "/gradio_api/runs"), ("GET", "/gradio_api/profiling/summary"), ("GET", "/gradio_api/deep_link"),
          ("GET", "/gradio_api/proxy=http://127.0.0.1:1/x"), ("GET", "/gradio_api/vibe-code"),
          ("POST", "/gradio_api/vibe-edit"), ("POST", "/gradio_api/process_recording"),
          ("POST", "/gradio_api/run/recipe"), ("POST", "/gradio_api/api/recipe")]


def test_gradios_own_routes_are_closed_and_its_history_is_off(attacked):
    """Finding 7 and 9: gradio's run history was on, and with a x-gradio-history-bucket header a call from the
    machine itself made the server try to create a bucket with its HF_TOKEN; /monitoring/summary showed every
    visitor's requests to anyone."""
    demo = attacked
    for method, path in CLOSED:
        answer = httpx.request(method, f"{demo.app.url}{path}", timeout=30,
                               json={"session_hash": secrets.token_hex(8)} if method == "POST" else None)
        assert answer.status_code == 404 and "answers only what its page and gradio_client ask for" in answer.text, \
            (path, answer.status_code, answer.text[:200])
    assert httpx.get(f"{demo.app.url}/config", timeout=30).json()["run_history"] is False
    caller = visitor_at(demo)
    joined = caller.join(demo.app.api("recipe")["id"], ["arithmetic"], headers={"x-gradio-history-bucket": "mine"})
    assert joined.status_code == 200 and results(caller, 1)[0]["success"]


def test_an_event_names_only_files_uploaded_here(attacked, tiny_model_dir):
    """The review: gradio fetches a file an event names by its web address into memory before the app sees it,
    whatever its size, and serves any file of its cache to whoever names it; and an event's other fields (its
    event_data) were held unmeasured."""
    demo = attacked
    page = visitor_at(demo)
    elsewhere = [f"https://{secrets.token_hex(4)}.example/10GB.iso", "/etc/passwd",
                 str(demo.folder.parent / "gradio" / "dragon-downloads" / "x" / "theirs.zip")]
    with another_visitor_answered_within(demo):
        for path in elsewhere:
            named = page.fire("data-upload", "upload", **{"data-upload": {"path": path, "orig_name": "a.csv",
                                                                          "meta": {"_type": "gradio.FileData"}}})
            expect_refusal(named, "An event may name only files uploaded to this public demo")
        flood = page.join(demo.app.api("recipe")["id"], ["arithmetic"])
        assert flood.status_code == 200
        results(page, 1)
        body = {"data": ["arithmetic"], "fn_index": demo.app.api("recipe")["id"], "session_hash": page.session,
                "event_data": [{} for _ in range(170_000)]}
        held = httpx.post(f"{demo.app.url}/gradio_api/queue/join", json=body, headers=page.headers, timeout=30)
        assert held.status_code == 413 and "request holds at most" in held.json()["detail"]
        relay = httpx.get(f"{demo.app.url}/gradio_api/file=https://example.com/slow", timeout=30)
        assert relay.status_code == 404
        for path in ("/gradio_api/heartbeat/x=y", f"/gradio_api/upload_progress?upload_id={'u' * 10_000}"):
            assert httpx.get(f"{demo.app.url}{path}", timeout=30).status_code in (400, 404), path


def test_a_kept_draft_of_empty_objects_is_refused_by_what_it_costs(attacked):
    """Finding 6: a kept draft just under the byte cap, made of empty JSON objects, was held as 2.3 MB per open page.
    Now its values are counted: past what any page sends, the door refuses the page load; past what the form makes,
    the page opens with the default recipe."""
    demo = attacked
    objects = {"draft": {"name": "x", "notes": [{} for _ in range(38_000)]}}  # 114 KB of JSON
    refused = RawVisitor(demo.app).open_page(**{TOKEN_STORE: secrets.token_urlsafe(24), DRAFT_STORE: objects})
    expect_refusal(refused, f"at most {guard.EVENT_VALUES:,} values")
    over = {"draft": {"name": "x", "notes": [{} for _ in range(KEPT_DRAFT_VALUES)]}}
    before = resident_mb(demo.pid)
    with another_visitor_answered_within(demo):
        pages = [RawVisitor(demo.app) for _ in range(40)]
        opened = [page.open_page(**{TOKEN_STORE: secrets.token_urlsafe(24), DRAFT_STORE: over}) for page in pages]
    assert all(answer.ok for answer in opened)
    assert all(f"they hold more than {KEPT_DRAFT_VALUES:,} values" in answer.text() for answer in opened)
    assert resident_mb(demo.pid) - before < 40 * 1.5  # a page's own copy, not 2.3 MB of draft besides


# ----------------------------------------------------------------------------------------------------------------
# The rules, table by table.


ADDRESSES = {  # (proxies, X-Forwarded-For, the connection's address) -> the address that counts
    "no proxy: the connection": (0, "1.2.3.4", "5.6.7.8", "5.6.7.8"),
    "a Space: the address its proxy appended": (1, "1.2.3.4, 9.9.9.9", "10.0.0.1", "9.9.9.9"),
    "a Space: what the client wrote is ignored": (1, "1.2.3.5, 9.9.9.9", "10.0.0.1", "9.9.9.9"),
    "two proxies: the outer one's": (2, "1.2.3.4, 9.9.9.9, 8.8.8.8", "10.0.0.1", "9.9.9.9"),
    "a header shorter than the proxies": (2, "9.9.9.9", "10.0.0.1", "10.0.0.1"),
    "no header": (1, None, "10.0.0.1", "10.0.0.1"),
    "IPv6: one subscriber's /64": (0, None, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    "IPv6: the same /64 from another host": (0, None, "2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"),
    "IPv4 mapped into IPv6": (0, None, "::ffff:10.0.0.1", "10.0.0.1"),
}


@pytest.mark.parametrize("proxies, forwarded, connection, counted", ADDRESSES.values(), ids=ADDRESSES.keys())
def test_the_address_is_the_one_the_outermost_proxy_saw(proxies, forwarded, connection, counted):
    """Finding 8: on a Space the first X-Forwarded-For entry counted, which the client writes: every request could
    be a new visitor to every limit."""
    policy = public.Policy(limits=public.Limits(), proxies=proxies)
    assert policy.network_address(forwarded, connection) == public.key_of(f"address:{counted}")


def test_repeated_forwarded_for_headers_read_as_one_list_of_hops():
    """The review: the guards read the last of repeated X-Forwarded-For headers, the app the first; a proxy that adds
    a header of its own rather than appending would have let the client choose the app's."""
    from dragon_ui.ui.guard.answers import forwarded_for

    scope = {"headers": [(b"x-forwarded-for", b"1.2.3.4"), (b"host", b"x"), (b"X-Forwarded-For", b"9.9.9.9")]}
    assert forwarded_for(scope) == "1.2.3.4, 9.9.9.9"
    policy = public.Policy(limits=public.Limits(), proxies=1)
    assert policy.network_address(forwarded_for(scope), "10.0.0.1") == public.key_of("address:9.9.9.9")


def test_a_session_holds_a_few_streams_open():
    from dragon_ui.errors import BusyError
    from dragon_ui.studio.visitors import STREAMS_PER_SESSION, Visitors

    visitors = Visitors()
    for _ in range(STREAMS_PER_SESSION):
        visitors.heartbeat_opened("page", "a")
    with pytest.raises(BusyError, match=f"{STREAMS_PER_SESSION} connections open"):
        visitors.heartbeat_opened("page", "a")
    visitors.heartbeat_closed("page")
    visitors.heartbeat_opened("page", "a")


def test_downloads_lie_in_folders_nobody_can_guess(tmp_path):
    files = public_files(tmp_path)
    made = files.new_download("a.zip")
    assert len(made.parent.name) == 32 and made.parent.parent == files.downloads_dir
    assert files.download_name("settings") == files.download_name("settings") != public_files(tmp_path).download_name(
        "settings")  # the same while the app runs, and nothing anyone could work out


@pytest.mark.parametrize("setting, refusal", [("x", "must be a whole number from 0 to 10"),
                                              ("11", "must be a whole number from 0 to 10")])
def test_the_number_of_proxies_is_checked_when_the_app_starts(monkeypatch, setting, refusal):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv(public.PROXIES_ENV, setting)
    with pytest.raises(public.ConfigError, match=refusal):
        public.Policy.from_env(Path("runs"))


def test_a_space_counts_one_proxy_unless_told(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/demo")
    monkeypatch.delenv(public.PROXIES_ENV, raising=False)
    assert public.Policy.from_env(Path("runs")).proxies == 1
    monkeypatch.setenv(public.PROXIES_ENV, "2")
    assert public.Policy.from_env(Path("runs")).proxies == 2


def test_a_stalled_upload_is_cut_and_leaves_nothing(tmp_path, monkeypatch):
    """Finding 9: an upload that stopped sending kept its part on disk for as long as its connection stayed open."""
    monkeypatch.setattr(guard_requests, "UPLOAD_IDLE_S", 0.2)
    files = public_files(tmp_path)
    limits = guard.RequestLimits(None, files=files, policy=files.policy)
    boundary = secrets.token_hex(8)
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="a.csv"\r\n'
            "Content-Type: text/csv\r\n\r\n").encode()
    sent, pending = [], [{"type": "http.request", "body": head + b"x" * 1000, "more_body": True}]

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)  # the client sends nothing more, and stays

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "query_string": b"", "app": None,
             "headers": [(b"content-type", f"multipart/form-data; boundary={boundary}".encode())],
             "client": ("10.0.0.1", 1)}
    started = time.monotonic()
    asyncio.run(limits(scope, receive, send))
    assert time.monotonic() - started < 5 and sent[0]["status"] == 408
    assert b"sends something every 0.2 s" in sent[1]["body"] and list(files.arrivals.iterdir()) == []


def public_files(tmp_path: Path):
    from dragon_ui.studio.files import Files

    files = Files(tmp_path / "runs", policy=public.Policy(limits=public.Limits()))
    files.serve_from(tmp_path / "cache")
    return files


def test_a_kept_draft_is_measured_by_its_values():
    from dragon_ui.studio.draft import kept_draft_refusal

    assert json_shape({"a": [1, {"b": "c"}]}) == (5, 3)
    assert json_shape([[] for _ in range(100)], 10)[0] == 11  # the count stops past its most
    assert kept_draft_refusal({"draft": {"rewards": [{"kind": "numeric"}] * 20}}) is None
    assert "hold more than" in kept_draft_refusal({"draft": {"notes": [0] * KEPT_DRAFT_VALUES}})
    assert guard.EVENT_VALUES > KEPT_DRAFT_VALUES


def fair_queue(limits: dict[str, int]):
    """A FairQueue of gradio's, its groups limited as ``limits`` says, telling an event's address by its request."""
    import gradio as gr
    from gradio.queueing import EventQueue

    with gr.Blocks() as blocks:
        pass
    queue = guard.take_turns_fairly(blocks._queue, lambda event: event.request.client.host)
    queue.active_jobs = [None] * 8
    for group, limit in limits.items():
        queue.event_queue_per_concurrency_id[group] = EventQueue(group, limit)
    return queue


def event(group: str, address: str, page: str, name: str):
    from gradio.queueing import Event

    request = SimpleNamespace(client=SimpleNamespace(host=address), headers={})
    made = Event(page, SimpleNamespace(concurrency_id=group, batch=False), request, None)
    made.name = name
    return made


PAGE_GROUP = guard.in_page_order("data-source")["concurrency_id"]
TURNS = {  # (group, limit, [(address, page, name) waiting, in the order sent], running (page), the order they run)
    "one address: first come, first served": (
        "models", 1, [("a", "a1", "first"), ("a", "a2", "second"), ("a", "a1", "third")], [],
        ["first", "second", "third"]),
    "the address served longest ago goes next": (
        "models", 1, [("a", "a1", "a's 1st"), ("a", "a2", "a's 2nd"), ("a", "a3", "a's 3rd"), ("b", "b1", "b's")],
        [], ["a's 1st", "b's", "a's 2nd", "a's 3rd"]),
    "two addresses alternate": (
        "models", 1, [("a", "a1", "a1"), ("a", "a1", "a2"), ("b", "b1", "b1"), ("b", "b1", "b2")], [],
        ["a1", "b1", "a2", "b2"]),
    "a page's events in its order, one at a time, others' beside them": (
        PAGE_GROUP, 4, [("a", "p", "p's 1st"), ("a", "p", "p's 2nd"), ("a", "q", "q's"), ("b", "r", "r's")], ["p"],
        ["q's", "r's", "p's 1st", "p's 2nd"]),
}


@pytest.mark.parametrize("group, limit, waiting, running, order", TURNS.values(), ids=TURNS.keys())
def test_whose_event_runs_next(group, limit, waiting, running, order):
    """The queue picks while it can; when it cannot, the event running longest ends."""
    queue = fair_queue({group: limit})
    waiting_line = queue.event_queue_per_concurrency_id[group]
    waiting_line.queue = [event(group, *sent) for sent in waiting]
    runs, ran = [], []

    def start(job: list) -> None:
        queue.active_jobs[queue.active_jobs.index(None)] = job
        waiting_line.current_concurrency += 1
        runs.append(job)

    for page in running:
        start([event(group, "a", page, f"{page} running")])
    while True:
        picked = queue.get_events()
        if picked is not None:
            job, batch, picked_group = picked
            assert not batch and picked_group == group and len(job) == 1
            start(job)
            ran.append(job[0].name)
        elif runs:
            queue.active_jobs[queue.active_jobs.index(runs.pop(0))] = None
            waiting_line.current_concurrency -= 1
        else:
            break
    assert ran == order


def test_a_fair_queue_takes_no_batched_event():
    import gradio as gr

    with gr.Blocks() as blocks:
        gr.Button().click(lambda values: [values], gr.Textbox(), gr.Textbox(), batch=True)
    with pytest.raises(TypeError, match="may not be batched"):
        guard.take_turns_fairly(blocks._queue, lambda event: "")
