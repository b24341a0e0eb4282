"""A class arriving at once: a workshop's visitors all open a public demo in the same second while a run trains.

The app is started as `make run` starts it (`python app.py`, its default recipe and model), but public
(``DRAGON_UI_PUBLIC=1``) and with a temporary runs folder. One visitor starts a run of the default recipe through the
HTTP API (/recipe, then /start, as gradio_client does), and once its status file says it trains, waves of visitors
arrive: each visitor, in a session of its own, asks at the same moment for

- the page (``/``, the HTML that holds the app's config),
- ``/config`` (gradio's config route, which a page or gradio_client reads),
- ``/check`` (the HTTP API's check of a configuration: an event through gradio's queue, joined and read as a
  client does, from joining to its answer),

and with ``--load-event`` also its page's load event (what a browser sends once the page is painted: the visitor it
is, the runs, the running run's banner; through the queue), and each is timed from sending to its last byte (its
answer, for an event). Every visitor of a wave is let go at once;
the next wave comes a few seconds after the last answer. It reports p50 / p95 / max per route, and the errors (a
status other than 200, a /check answer other than "valid", a connection that failed).

    python bench/class_arrival.py [--visitors 25] [--waves 4] [--load-event] [--app FOLDER --name NAME]

``--app`` runs another checkout's app.py (``git worktree add /tmp/before REV``), for a before/after in one sitting.

It reports; it does not assert. Run it on an otherwise idle machine: two cores are easily disturbed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from common import REPO, percentile, table, write_result
from dragon_ui.studio.recipes import DEFAULT_RECIPE
from page_latency import free_port

ROUTES = ("page", "/config", "/check")
LOAD_EVENT = "page's load event"
TRAINING_WAIT_S = 600  # from Start to the status file saying it trains, at most (a cold start loads the model)


def serve(app_dir: Path, runs_dir: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """`python app.py` as `make run` starts it, in public mode; (process, address) once it answers."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", DRAGON_UI_PUBLIC="1", GRADIO_TEMP_DIR=str(runs_dir.parent / "gradio"))
    for name in ("SPACE_ID", "DRAGON_UI_OWNER_KEY", "DRAGON_UI_RUNS_DIR"):
        env.pop(name, None)
    process = subprocess.Popen([sys.executable, "app.py", "--no-browser", "--port", str(port), "--runs-dir",
                                str(runs_dir)], cwd=app_dir, stdout=subprocess.DEVNULL,
                               stderr=log_path.open("w", encoding="utf-8"), env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"The app did not answer: {log_path.read_text(encoding='utf-8')[-2000:]}")
        time.sleep(0.1)


class Api:
    """The HTTP API's events by name, through gradio's queue, as gradio_client calls them (raw, with httpx)."""

    def __init__(self, url: str) -> None:
        self.url = url
        config = httpx.get(f"{url}/config", timeout=60).raise_for_status().json()
        self.events = {event.get("api_name"): event for event in config["dependencies"] if event.get("api_name")}
        kinds = {component["id"]: component["type"] for component in config["components"]}
        # demo.load's event that opens the page (its inputs, what the browser keeps: its token, draft, owner key)
        self.events[LOAD_EVENT] = next(event for event in config["dependencies"]
                                       if any(target[1] == "load" for target in event["targets"])
                                       and any(kinds.get(cid) == "browserstate" for cid in event["inputs"]))

    async def call(self, client: httpx.AsyncClient, name: str, *args, session: str | None = None) -> tuple[bool, list | str]:
        """(whether it succeeded, its output values or its error) of one call in ``session`` (a new one if None)."""
        session = session or secrets.token_hex(8)
        body = {"data": list(args), "fn_index": self.events[name]["id"], "trigger_id": None, "session_hash": session,
                "event_data": None}
        joined = await client.post(f"{self.url}/gradio_api/queue/join", json=body)
        if joined.status_code != 200:
            return False, f"HTTP {joined.status_code}: {joined.text[:200]}"
        event_id = joined.json()["event_id"]
        async with client.stream("GET", f"{self.url}/gradio_api/queue/data",
                                 params={"session_hash": session}) as stream:
            async for line in stream.aiter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") not in (None, event_id) or message.get("msg") != "process_completed":
                    continue
                output = message.get("output") or {}
                if message.get("success"):
                    return True, output.get("data", [])
                return False, str(output.get("error") or output)[:200]
        return False, "the stream ended without an answer"


async def timed_get(client: httpx.AsyncClient, url: str) -> tuple[float, str | None, int]:
    """(seconds to the last byte, the error or None, bytes) of a GET."""
    started = time.perf_counter()
    try:
        answer = await client.get(url)
    except httpx.HTTPError as exc:
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}", 0
    seconds = time.perf_counter() - started
    return seconds, None if answer.status_code == 200 else f"HTTP {answer.status_code}", len(answer.content)


async def timed_check(client: httpx.AsyncClient, api: Api, config: dict) -> tuple[float, str | None, int]:
    started = time.perf_counter()
    try:
        ok, said = await api.call(client, "check", config)
    except httpx.HTTPError as exc:
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}", 0
    seconds = time.perf_counter() - started
    return seconds, None if ok and said == ["valid"] else f"check said {said}", 0


async def timed_load(client: httpx.AsyncClient, api: Api) -> tuple[float, str | None, int]:
    """A new browser's page load event: it keeps no token, no owner key and no draft."""
    started = time.perf_counter()
    try:
        ok, said = await api.call(client, LOAD_EVENT, *[None] * len(api.events[LOAD_EVENT]["inputs"]))
    except httpx.HTTPError as exc:
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}", 0
    return time.perf_counter() - started, None if ok else f"the load said {said}", 0


async def wave(api: Api, config: dict, visitors: int, routes: tuple[str, ...] = ROUTES
               ) -> dict[str, list[tuple[float, str | None, int]]]:
    """One wave: ``visitors`` visitors, each asking for each of ``routes`` at the same moment."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)  # a connection each, as browsers
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        asked = [(route, asyncio.ensure_future(
            timed_get(client, f"{api.url}/") if route == "page" else timed_get(client, f"{api.url}/config")
            if route == "/config" else timed_check(client, api, config) if route == "/check"
            else timed_load(client, api)))
            for _ in range(visitors) for route in routes]
        await asyncio.gather(*(future for _, future in asked))
    found: dict[str, list] = {route: [] for route in routes}
    for route, future in asked:
        found[route].append(future.result())
    return found


def training_status(runs_dir: Path) -> dict:
    for path in runs_dir.glob("*/status.json"):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError:  # caught halfway through a write
            continue
    return {}


def steps_done(runs_dir: Path) -> int:
    return sum(1 for path in runs_dir.glob("*/progress.jsonl") for line in path.read_text("utf-8").splitlines()
               if line.endswith("}"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--visitors", type=int, default=25, help="visitors arriving at once in each wave")
    parser.add_argument("--waves", type=int, default=4, help="waves of visitors, one after the other")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between a wave's last answer and the next")
    parser.add_argument("--load-event", action="store_true", help="each visitor's page also sends its load event")
    parser.add_argument("--app", type=Path, default=REPO, help="the checkout whose app.py is measured")
    parser.add_argument("--name", default="class-arrival", help="the results file's name")
    args = parser.parse_args()

    routes = (*ROUTES, LOAD_EVENT) if args.load_event else ROUTES
    found: dict[str, list] = {route: [] for route in routes}
    notes: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir, log_path = Path(tmp) / "runs", Path(tmp) / "app.log"
        process, url = serve(args.app.resolve(), runs_dir, log_path)
        try:
            api = Api(url)

            async def start() -> dict:
                async with httpx.AsyncClient(timeout=600) as client:
                    session = secrets.token_hex(8)
                    ok, recipe = await api.call(client, "recipe", DEFAULT_RECIPE, session=session)
                    assert ok, recipe
                    config = recipe[0]
                    ok, started = await api.call(client, "start", config, session=session)
                    assert ok, started
                    return config

            config = asyncio.run(start())
            deadline = time.monotonic() + TRAINING_WAIT_S
            while not str(training_status(runs_dir).get("phase", "")).startswith("training"):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit(f"The run never trained: {training_status(runs_dir)}\n"
                                     f"{log_path.read_text(encoding='utf-8')[-2000:]}")
                time.sleep(0.2)
            time.sleep(args.pause)  # past the start's own burst of work in the server
            notes["steps done before the first wave"] = steps_done(runs_dir)
            for number in range(args.waves):
                if number:
                    time.sleep(args.pause)
                for route, answers in asyncio.run(wave(api, config, args.visitors, routes)).items():
                    found[route].extend(answers)
            status = training_status(runs_dir)
            notes["phase after the last wave"] = status.get("phase")
            notes["steps done after the last wave"] = steps_done(runs_dir)
        finally:
            process.terminate()
            process.wait(timeout=60)

    rows = {}
    for route, answers in found.items():
        seconds = [answer[0] for answer in answers]
        errors = [answer[1] for answer in answers if answer[1]]
        rows[route] = {"n": len(seconds), "p50_s": percentile(seconds, 0.5), "p95_s": percentile(seconds, 0.95),
                       "max_s": max(seconds) if seconds else float("nan"), "errors": len(errors),
                       "error_examples": sorted(set(errors))[:5], "bytes": max((a[2] for a in answers), default=0),
                       "all_s": seconds}
    path = write_result(args.name, {"settings": {**vars(args), "app": str(args.app)}, "rows": rows, "notes": notes})
    print(table([[route, row["n"], row["p50_s"], row["p95_s"], row["max_s"], row["errors"]]
                 for route, row in rows.items()], ["route", "n", "p50 s", "p95 s", "max s", "errors"]))
    print(f"{notes}  ->  {path}")


if __name__ == "__main__":
    main()
