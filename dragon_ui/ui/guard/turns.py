"""Whose event runs next: gradio's queue, handing each free place to the waiting event of the network address served
longest ago, not to whoever sent the most first.

gradio runs the events of each concurrency group first come, first served: one visitor who queues forty events for the
one-at-a-time model, or three slow file reads, puts every other visitor behind all of them. Here each group hands its
next place to the address whose event in that group ran longest ago (first come among equals), so a visitor who holds
a turn waits behind the others; on your own machine everyone is one address, and the order is gradio's.

A group named by ``in_page_order`` runs one event of a page at a time, in the order the page sent them, and other
pages' beside it: the order a page's edits need, without one page's slow read holding up everyone's.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable

from gradio.queueing import Event, Queue

PAGE_ORDER = "page-order:"  # the start of a concurrency group's name whose events run one per page at a time
PAGES_AT_ONCE = 4  # pages whose events of one such group may run side by side


def in_page_order(group: str) -> dict:
    """An event's options: its page's events of ``group`` run one at a time, in the order they joined the queue,
    and other pages' beside them (up to PAGES_AT_ONCE). Each event is its own request, so two a page sends within
    milliseconds may join in either order."""
    return {"concurrency_id": PAGE_ORDER + group, "concurrency_limit": PAGES_AT_ONCE}


class FairQueue(Queue):
    """gradio's Queue, choosing fairly (see the module). Made from the queue gradio built (``take_turns_fairly``),
    with ``asker`` telling an event's network address from its request."""

    asker: Callable[[Event], str]
    askers: weakref.WeakKeyDictionary[Event, str]  # each waiting event's, worked out once
    served: dict[str, dict[str, int]]  # group -> asker -> when it was last served (a count of events served)
    count: int

    def get_events(self) -> tuple[list[Event], bool, str] | None:
        """The next event to run and its group, as gradio's own (which also takes batches: the app has none);
        called under the queue's delete_lock, as gradio's is."""
        groups = list(self.event_queue_per_concurrency_id.items())
        random.shuffle(groups)  # as gradio's: no group goes first always
        for group, waiting in groups:
            if not waiting.queue or (waiting.concurrency_limit is not None
                                     and waiting.current_concurrency >= waiting.concurrency_limit):
                continue
            event = self._fairest(group, waiting.queue)
            if event is None:
                continue
            waiting.queue.remove(event)
            self.count += 1
            askers = {self._asker(other) for other in waiting.queue}
            self.served[group] = {asker: last for asker, last in self.served.get(group, {}).items() if asker in askers}
            self.served[group][self._asker(event)] = self.count
            return [event], False, group
        return None

    def compute_analytics_summary(self, records):
        """gradio's monitoring summary, which a pandas table of up to 10,000 events made anew after every event, on
        the server's threads: the app serves no monitoring (app.serving_options), so none is made."""
        return self.cached_event_analytics_summary

    def _fairest(self, group: str, queue: list[Event]) -> Event | None:
        """The event of ``queue`` whose asker was served longest ago, the first sent among equals; in a group in page
        order, only the first of each page with none running."""
        if group.startswith(PAGE_ORDER):
            busy = {event.session_hash for job in self.active_jobs if job for event in job
                    if event.concurrency_id == group}
            firsts: dict[str, Event] = {}
            for event in queue:
                firsts.setdefault(event.session_hash, event)
            queue = [event for session, event in firsts.items() if session not in busy]
        served = self.served.get(group, {})
        return min(queue, key=lambda event: served.get(self._asker(event), 0), default=None)

    def _asker(self, event: Event) -> str:
        """The event's network address, worked out once."""
        if event not in self.askers:
            self.askers[event] = self.asker(event)
        return self.askers[event]


def take_turns_fairly(queue: Queue, asker: Callable[[Event], str]) -> FairQueue:
    """Make gradio's queue a FairQueue, before it has taken any event; ``asker`` tells an event's network address.
    Its blocks must have no batched event, which a FairQueue would run one event at a time."""
    if any(fn.batch for fn in queue.blocks.fns.values()):
        raise TypeError("A FairQueue runs one event at a time: the app's events may not be batched.")
    queue.__class__ = FairQueue
    assert isinstance(queue, FairQueue)  # the same queue, of its new class
    queue.asker, queue.askers, queue.served, queue.count = asker, weakref.WeakKeyDictionary(), {}, 0
    return queue
