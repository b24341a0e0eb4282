"""A visitor of a served gradio app that speaks gradio's own wire protocol, as a browser's page does, but sends
whatever it likes: any event by its fn_index (hidden ones included), with any inputs, in its own session.

gradio keeps a session's ``gr.State`` values on the server, so a State input is sent as null and the server uses
its own; every other input (``gr.BrowserState`` too: it comes from the browser's storage) is the sender's to choose.
Everything the server answers is kept in ``answers``, with what was sent for it, so a test can search it all for
what must never leak (and tell a secret from the sender's own words echoed back).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class Answer:
    """One event's outcome: its output values, or gradio's error message; ``seconds`` from sending to the end."""

    ok: bool
    data: list = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    def text(self) -> str:
        return json.dumps(self.data, default=str) if self.ok else self.error


class App:
    """The served app's address and its config (components and events), read once."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.config = httpx.get(f"{self.url}/config", timeout=30).raise_for_status().json()
        self.components = {component["id"]: component for component in self.config["components"]}
        self.events = self.config["dependencies"]

    def component_id(self, elem_id: str) -> int:
        (found,) = [cid for cid, component in self.components.items()
                    if component.get("props", {}).get("elem_id") == elem_id]
        return found

    def event(self, elem_id: str, trigger: str, sets: str | None = None) -> dict:
        """The event fired by ``trigger`` ("click", "upload", ...) of the component with this elem_id; ``sets``:
        the one among several that sets the component with that elem_id."""
        target = self.component_id(elem_id)
        found = [event for event in self.events if [target, trigger] in [list(t) for t in event["targets"]]]
        if sets is not None:
            found = [event for event in found if self.component_id(sets) in event["outputs"]]
        (event,) = found
        return event

    def api(self, name: str) -> dict:
        """The event with this api_name (the HTTP API's /recipe, /check, /start, ...)."""
        (found,) = [event for event in self.events if event.get("api_name") == name]
        return found

    def output(self, event: dict, answer: Answer, elem_id: str):
        """What ``answer`` to ``event`` set the component with this elem_id to."""
        assert answer.ok, answer.error
        return answer.data[event["outputs"].index(self.component_id(elem_id))]

    def page_load(self) -> dict:
        """demo.load: the event a page fires when it opens (its targets name the app itself)."""
        (found,) = [event for event in self.events if any(t[1] == "load" for t in event["targets"])
                    and any(self.components.get(i, {}).get("type") == "browserstate" for i in event["inputs"])]
        return found


class RawVisitor:
    """One session of the app: sends events by fn_index with inputs it chooses, and keeps every answer."""

    def __init__(self, app: App, session: str | None = None, headers: dict | None = None) -> None:
        self.app = app
        self.session = secrets.token_hex(8) if session is None else session
        self.headers = headers or {}  # sent with every request (an X-Forwarded-For: another network address)
        self.answers: list[tuple[str, str]] = []  # (what was sent, what came back)

    def inputs(self, event: dict, values: dict) -> list:
        """The event's inputs: a State is null (the server has it), a BrowserState its storage key's value in
        ``values``, another component its elem_id's value in ``values``, else the value it was built with."""
        data = []
        for cid in event["inputs"]:
            component = self.app.components[cid]
            props = component.get("props", {})
            if component["type"] == "state":
                data.append(None)
            elif component["type"] == "browserstate":
                data.append(values.get(props.get("storage_key")))
            else:
                data.append(values.get(props.get("elem_id"), props.get("value")))
        return data

    def fire(self, elem_id: str, trigger: str = "click", sets: str | None = None, **values) -> Answer:
        """Fire the event of a component, as a page would, with the inputs ``values`` (by elem_id) overrides."""
        event = self.app.event(elem_id, trigger, sets)
        return self.send(event["id"], self.inputs(event, values), trigger_id=self.app.component_id(elem_id))

    def call(self, api_name: str, *args) -> Answer:
        """A named endpoint of the HTTP API, in this session: ``args`` fill its inputs that are not States."""
        event, given = self.app.api(api_name), iter(args)
        data = [None if self.app.components[cid]["type"] == "state" else next(given) for cid in event["inputs"]]
        return self.send(event["id"], data)

    def open_page(self, **kept) -> Answer:
        """The page load, with what this browser's storage keeps (by storage key): its token, its draft, ..."""
        event = self.app.page_load()
        return self.send(event["id"], self.inputs(event, kept))

    def join(self, fn_index: int, data: list, trigger_id: int | None = None, timeout: float = 120,
             headers: dict | None = None) -> httpx.Response:
        """Put one event in gradio's queue by its fn_index, as the page's client does, without reading its result."""
        body = {"data": data, "fn_index": fn_index, "trigger_id": trigger_id, "session_hash": self.session,
                "event_data": None}
        return httpx.post(f"{self.app.url}/gradio_api/queue/join", json=body, timeout=timeout,
                          headers={**self.headers, **(headers or {})})

    def send(self, fn_index: int, data: list, trigger_id: int | None = None, timeout: float = 120) -> Answer:
        """One event by its fn_index, through gradio's queue, as the page's client sends it."""
        started = time.monotonic()
        joined = self.join(fn_index, data, trigger_id, timeout)
        if joined.status_code != 200:
            answer = Answer(False, error=f"HTTP {joined.status_code}: {joined.text}")
        else:
            answer = self._result(joined.json()["event_id"], timeout)
        answer.seconds = time.monotonic() - started
        self.answers.append((json.dumps(data, default=str), answer.text()))
        return answer

    def _result(self, event_id: str, timeout: float) -> Answer:
        with httpx.stream("GET", f"{self.app.url}/gradio_api/queue/data", params={"session_hash": self.session},
                          timeout=timeout, headers=self.headers) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") not in (None, event_id) or message.get("msg") != "process_completed":
                    continue
                output = message.get("output") or {}
                if message.get("success"):
                    return Answer(True, data=output.get("data", []))
                return Answer(False, error=str(output.get("error") or output))
        return Answer(False, error="the stream ended without an answer")

    def upload(self, path: Path) -> dict:
        """Upload a file as a page does (gradio's upload route); the FileData an upload event then sends."""
        with open(path, "rb") as handle:
            response = httpx.post(f"{self.app.url}/gradio_api/upload", files={"files": (path.name, handle)},
                                  timeout=60, headers=self.headers)
        (stored,) = response.raise_for_status().json()
        return file_data(stored, path.name)


def file_data(path: str, name: str) -> dict:
    """A gr.File value as a page sends it."""
    return {"path": path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}
