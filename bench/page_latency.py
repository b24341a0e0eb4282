"""The loop a learner feels, in a real browser: the app as `make run` starts it (`python app.py`, its default
recipe and model), driven by Debian's chromium through Playwright, idle and while the default recipe trains on the
same cores.

Each moment is timed from the click (or the command) to what the person sees:

- app start -> the server answers; and how long its background warm-up (hardware, training libraries, model) takes
  once the first page has opened;
- first page load -> the data preview filled in, cold and on a reload, and the prompts rendered with the model's
  tokenizer;
- a tab switch -> the tab's content visible; scoring a typed reply in the playground -> its total shown
  (idle, and on the page that started the run while it trains);
- the first "Generate a group" -> its first replies shown (as they are sampled), and the whole group scored;
- Start -> the run's status file says it trains (seen from outside the app); -> the Train tab says so; -> step 1's
  completions visible; -> step 1's row written, less that step's own time (what the learner waited beyond the step
  itself);
- a second browser -> the Train tab showing the running run;
- the memory of the app's process, and of it with the processes it started (a training process, a warm one, the
  readers): just before Start, and while the run trains past its first step. Proportional set sizes, so what two
  processes share counts once, as the machine's memory does.

    python bench/page_latency.py [--repeats 12] [--app FOLDER --name page-latency-before]

``--app`` runs another checkout's app.py (``git worktree add /tmp/before REV``), for a before/after in one sitting.

It reports; it does not assert. Run it on an otherwise idle machine: two cores are easily disturbed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import REPO, percentile, table, write_result

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
TABS = ("data", "rewards", "model", "train")
TAB_CONTENT = {"data": "#data-preview", "rewards": "#rewards-table", "model": "#model-start", "train": "#train-status"}
WAIT_MS = 300_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(app_dir: Path, runs_dir: Path, log_path: Path) -> tuple[subprocess.Popen, str, float]:
    """`python app.py` as `make run` starts it; (process, address, seconds until it answered)."""
    import urllib.request

    port = free_port()
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "app.py", "--no-browser", "--port", str(port), "--runs-dir",
                                str(runs_dir)], cwd=app_dir, stdout=subprocess.DEVNULL,
                               stderr=log_path.open("w", encoding="utf-8"), env=dict(os.environ, HF_HUB_OFFLINE="1"))
    url = f"http://127.0.0.1:{port}/"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return process, url, time.perf_counter() - started
        except OSError:
            if process.poll() is not None:
                raise SystemExit(f"The app exited: {log_path.read_text(encoding='utf-8')[-2000:]}")
            time.sleep(0.02)


def warm_up_seconds(log_path: Path, timeout: float = 300) -> float | None:
    """The app's own account of its background warm-up ("Warmed up in 4.2 s: ..."), once it is done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"Warmed up in ([\d.]+) s", log_path.read_text(encoding="utf-8"))
        if found:
            return float(found.group(1))
        time.sleep(0.2)
    return None


def timed(action, wait) -> float:
    started = time.perf_counter()
    action()
    wait()
    return time.perf_counter() - started


# Armed before a click: from the moment the page receives the click to the first frame in which each target
# ``[shown, pattern, changed]`` is visible and its text matches ``pattern`` (and, with ``changed``, differs from what
# it was). Measured in the page, so neither the driver's checks before it clicks nor its polling afterwards (100 ms
# to 1 s apart) count.
ARM_CLICK_TIMER = """([clicked, targets]) => {
    window.dragonLatency = targets.map(() => null);
    const target = document.querySelector(clicked);
    const text = (element) => element?.innerText || element?.textContent || '';  // a table cell's innerText is ''
    const before = targets.map(([shown]) => text(document.querySelector(shown)));
    target.addEventListener('click', () => {
        const start = performance.now();
        const check = () => {
            targets.forEach(([shown, pattern, changed], index) => {
                const element = document.querySelector(shown);
                const now = text(element);
                if (window.dragonLatency[index] === null && element && element.getClientRects().length
                        && new RegExp(pattern).test(now) && (!changed || now !== before[index])) {
                    window.dragonLatency[index] = (performance.now() - start) / 1000;
                }
            });
            if (window.dragonLatency.includes(null)) requestAnimationFrame(check);
        };
        requestAnimationFrame(check);
    }, {capture: true, once: true});
}"""


def click_latencies(page, clicked: str, targets: list[tuple[str, str, bool]]) -> list[float]:
    """Seconds from a click on ``clicked`` until each target (shown, pattern, changed) shows (ARM_CLICK_TIMER)."""
    page.evaluate(ARM_CLICK_TIMER, [clicked, targets])
    page.locator(clicked).click()
    page.wait_for_function("() => !window.dragonLatency.includes(null)", polling="raf", timeout=WAIT_MS)
    return page.evaluate("() => window.dragonLatency")


def click_latency(page, clicked: str, shown: str, pattern: str = "", changed: bool = False) -> float:
    """Seconds from a click on ``clicked`` until ``shown`` shows a text matching ``pattern``, a new one if
    ``changed``."""
    return click_latencies(page, clicked, [(shown, pattern, changed)])[0]


def open_tab(page, tab: str) -> None:
    page.locator(f"#tab-{tab}-button").click()
    page.locator(TAB_CONTENT[tab]).wait_for(state="visible")


def tab_switches(page, repeats: int) -> list[float]:
    """Click through the tabs in turn; each time, until the tab's main element shows."""
    return [click_latency(page, f"#tab-{tab}-button", TAB_CONTENT[tab])
            for tab in itertools.islice(itertools.cycle(TABS), repeats)]


def scored_replies(page, repeats: int) -> list[float]:
    """Score a typed reply in the playground, alternating two replies with different totals; until the new total
    shows (its text, not the queue's or the timer's)."""
    from playwright.sync_api import expect

    open_tab(page, "rewards")
    expect(page.locator("#rewards-row-text")).to_contain_text("Reference:")
    reference = page.locator("#rewards-row-text").inner_text().rsplit("Reference:", 1)[1].strip()
    wrong = "I could not say, sorry."
    page.locator("#rewards-completion textarea").fill(wrong)  # a known total to start from, whatever was shown
    page.locator("#rewards-score").click()
    page.wait_for_timeout(2000)  # its answer may not change the text, so there is nothing to wait for but time
    times = []
    for index in range(repeats):
        page.locator("#rewards-completion textarea").fill(reference if index % 2 == 0 else wrong)
        times.append(click_latency(page, "#rewards-score", "#rewards-total", r"^\s*Total \(weighted sum\)",
                                   changed=True))
    return times


class StartWatch(threading.Thread):
    """Watches the runs folder from outside the app: when the run's status first said it trains (what the Train tab
    is waiting to show, so the page's share of that wait can be told from the training process's), and when the
    first progress row was written, with the step's own time in it."""

    def __init__(self, runs_dir: Path) -> None:
        super().__init__(daemon=True)
        self.runs_dir, self.row, self.seen_at, self.training_at = runs_dir, None, None, None

    def run(self) -> None:
        while self.row is None:
            if self.training_at is None:
                for path in self.runs_dir.glob("*/status.json"):
                    try:
                        phase = json.loads(path.read_text(encoding="utf-8")).get("phase") or ""
                    except ValueError:  # caught halfway through a write
                        continue
                    if phase.startswith("training"):
                        self.training_at = time.perf_counter()
            for path in self.runs_dir.glob("*/progress.jsonl"):
                line = path.read_text(encoding="utf-8").split("\n", 1)[0]
                if line.endswith("}"):
                    self.seen_at, self.row = time.perf_counter(), json.loads(line)
            time.sleep(0.01)


def memory_mb(pid: int) -> dict:
    """The app's proportional set size, alone and with its child processes', in MB."""
    import psutil

    app = psutil.Process(pid)
    own = app.memory_full_info().pss
    family = own
    for child in app.children(recursive=True):
        try:
            family += child.memory_full_info().pss
        except psutil.Error:  # it ended meanwhile
            pass
    return {"app_mb": own / 2**20, "with_children_mb": family / 2**20}


def stats(values: list[float]) -> dict:
    return {"n": len(values), "p50_s": percentile(values, 0.5), "p95_s": percentile(values, 0.95),
            "max_s": max(values) if values else float("nan"), "all_s": values}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=12, help="times each repeated interaction is timed")
    parser.add_argument("--app", type=Path, default=REPO, help="the checkout whose app.py is measured")
    parser.add_argument("--name", default="page-latency", help="the results file's name")
    args = parser.parse_args()

    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)
    rows: dict[str, dict] = {}
    memory: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir, log_path = Path(tmp) / "runs", Path(tmp) / "app.log"
        process, url, answered = serve(args.app.resolve(), runs_dir, log_path)
        try:
            rows["app start → server answers"] = stats([answered])
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(WAIT_MS)
                preview = page.locator("#data-preview")
                opened = time.perf_counter()
                page.goto(url)
                expect(preview).to_contain_text("What is")
                rows["first page load → data preview (cold)"] = stats([time.perf_counter() - opened])
                expect(page.locator("#data-rendered")).to_contain_text("Row 1")  # the model's tokenizer is in
                rows["first page load → prompts rendered (cold)"] = stats([time.perf_counter() - opened])
                warm = warm_up_seconds(log_path)
                rows["background warm-up (from the first page's load)"] = stats([warm] if warm else [])
                rows["page reload → data preview"] = stats(
                    [timed(lambda: page.reload(), lambda: expect(preview).to_contain_text("What is"))])
                rows["tab switch (idle)"] = stats(tab_switches(page, args.repeats))
                rows["score a typed reply (idle)"] = stats(scored_replies(page, args.repeats))
                first_replies, group = click_latencies(page, "#rewards-generate", [
                    ("#rewards-groups tbody tr:first-child td:nth-child(2)", r"\S", False),  # a reply, as it grows
                    ("#rewards-progress", "Sampled", True)])
                rows["first Generate a group → first replies shown"] = stats([first_replies])
                rows["first Generate a group → group scored"] = stats([group])

                open_tab(page, "model")
                expect(page.locator("#model-check")).to_contain_text("The settings are valid")
                memory["idle, before Start"] = memory_mb(process.pid)
                watch = StartWatch(runs_dir)
                watch.start()
                clicked = time.perf_counter()  # for the files' times; the page's are timed in the page
                said_training, completions_shown = click_latencies(page, "#model-start", [
                    ("#train-status", "running · training", False),  # not "press Start training"
                    ("#train-rollouts", "sampled just now|Advantage", False)])
                rows["Start → Train tab says training"] = stats([said_training])
                if watch.training_at is not None:
                    rows["Start → its status file says training"] = stats([watch.training_at - clicked])
                rows["Start → step 1's completions visible"] = stats([completions_shown])
                status, rollouts = page.locator("#train-status"), page.locator("#train-rollouts")
                first_completions_during_step = "sampled just now" in rollouts.inner_text()

                rows["tab switch (training)"] = stats(tab_switches(page, args.repeats))
                rows["score a typed reply (training)"] = stats(scored_replies(page, args.repeats))
                other = browser.new_page(viewport={"width": 1400, "height": 1000})
                other.set_default_timeout(WAIT_MS)
                rows["second browser → Train tab shows the run"] = stats([timed(
                    lambda: (other.goto(url), expect(other.locator("#form-area")).to_be_visible(),
                             other.locator("#tab-train-button").click()),
                    lambda: expect(other.locator("#train-status")).to_contain_text("running"))])
                watch.join(timeout=WAIT_MS / 1000)
                step_time = (watch.row or {}).get("step_time_s")
                if watch.seen_at is not None and step_time is not None:
                    rows["Start → step 1 done, less the step's own time"] = stats(
                        [watch.seen_at - clicked - step_time])
                memory["while training"] = memory_mb(process.pid)
                open_tab(page, "train")
                page.locator("#train-stop").click()
                expect(status).to_contain_text("stopped")
                browser.close()
        finally:
            process.terminate()
            process.wait(timeout=60)

    path = write_result(args.name, {"settings": vars(args), "rows": rows, "memory": memory,
                                         "first_completions_during_step_1": first_completions_during_step})
    print(table([[name, row["n"], row["p50_s"], row["p95_s"], row["max_s"]] for name, row in rows.items()],
                ["moment", "n", "p50 s", "p95 s", "max s"]))
    print(table([[when, used["app_mb"], used["with_children_mb"]] for when, used in memory.items()],
                ["memory", "app MB", "app and its processes MB"]))
    print(f"step 1's completions shown while it ran: {first_completions_during_step}  ->  {path}")


if __name__ == "__main__":
    main()
