"""What each page and each network address has in gradio's queue: its events waiting, running, or answered but not
yet read, and the memory they hold. gradio's queue takes any number of events, each holding its parsed inputs until
it has run and its answer until the page reads it; a public demo lets an event in only within its page's count
(``Limits.waiting_per_session``) and its address's memory (``Limits.waiting_mb_per_address``), as estimated here.
"""

from __future__ import annotations

import collections
import contextlib
import json

from ...public import Limits
from ...studio.draft import KEPT_DRAFT_VALUES, OTHER_SETTINGS_VALUES

# The most JSON values one event's inputs may hold: a page load's, the largest a page sends, holds a kept draft and
# the form's other fields. Bytes do not bound what a waiting event holds: a body of empty objects takes 30 times its
# size once parsed.
EVENT_VALUES = KEPT_DRAFT_VALUES + OTHER_SETTINGS_VALUES
# What a waiting event holds, measured with events waiting behind a pre-flight (public mode, 2 vCPU): 2.2 KB for one
# with no inputs to speak of, 325 KB for one text of 400 KB, 2.5 MB for 11,000 empty objects (232 bytes each).
HELD_PER_EVENT, HELD_PER_VALUE, HELD_PER_BYTE = 4096, 240, 1


def held_bytes(body: bytes, values: int) -> int:
    """What an event sent as ``body``, its inputs holding ``values`` JSON values, holds while it waits: an estimate
    above the measured."""
    return HELD_PER_EVENT + HELD_PER_VALUE * values + HELD_PER_BYTE * len(body)


class Waiting:
    """The events each session and each network address has in gradio's queue, and what they hold; for one server's
    event loop (not thread-safe, and never awaiting between a check and a count)."""

    def __init__(self) -> None:
        self._joining: collections.Counter = collections.Counter()  # session -> events let in, not yet queued
        self._joining_bytes: collections.Counter = collections.Counter()  # address -> what those hold
        self._held: dict[str, dict[str, tuple[str, int]]] = {}  # address -> event id -> (session, bytes held)

    def refusal(self, pending: dict[str, set], session: str, address: str | None, cost: int,
                limits: Limits) -> str | None:
        """Why an event of ``session`` from ``address``, holding ``cost`` bytes, may not join the queue now (gradio's
        ``pending`` event ids by session); None when it may."""
        if len(pending.get(session, ())) + self._joining[session] >= limits.waiting_per_session:
            return (f"This page has {limits.waiting_per_session} events waiting in the server's queue already, the "
                    "most one page may have in this public demo; wait for them to finish.")
        if address is not None and self._held_by(address, pending) + cost > limits.waiting_mb_per_address * 2**20:
            return (f"The events from your network address waiting in the server's queue already hold "
                    f"{limits.waiting_mb_per_address:g} MB, the most one network address may have in this public "
                    "demo; wait for them to finish.")
        return None

    @contextlib.contextmanager
    def joining(self, session: str, address: str | None, cost: int):
        """Count an event on its way into the queue; the block calls what it yields with gradio's answer (its body),
        which names the event once it is queued."""
        self._joining[session] += 1
        self._joining_bytes[address] += cost

        def answered(body: bytes) -> None:
            try:
                event_id = json.loads(body).get("event_id")
            except (ValueError, AttributeError):
                return
            if address is not None and isinstance(event_id, str):
                self._held.setdefault(address, {})[event_id] = (session, cost)

        try:
            yield answered
        finally:
            for counter, key, amount in ((self._joining, session, 1), (self._joining_bytes, address, cost)):
                counter[key] -= amount
                if counter[key] <= 0:
                    del counter[key]

    def _held_by(self, address: str, pending: dict[str, set]) -> int:
        """What ``address``'s events hold, those gone from the queue (read, or dropped) forgotten."""
        held = self._held.get(address, {})
        for event_id, (session, _) in list(held.items()):
            if event_id not in pending.get(session, ()):
                del held[event_id]
        if not held:
            self._held.pop(address, None)
        return sum(cost for _, cost in held.values()) + self._joining_bytes[address]
