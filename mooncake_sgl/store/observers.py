"""``EventHub``: the store's events (``api.StoreEvent``), handed to its observers in commit order.

``Residency`` posts an event while it holds its lock (a deque append, numbered), and calls
``deliver`` once the lock is released. Delivery is one thread at a time without waiting: a thread
that finds another delivering leaves its events to that thread, which loops until the queue is
empty, so a storage thread never blocks on an observer another thread is running, and events reach
every observer in the order they were committed. An observer added while events are queued gets
only those posted after it (and, if asked, a snapshot of the record taken at that moment first). An
observer that raises is logged (one line per half minute, ``FailureLog``) and keeps receiving.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..api import ReportingObserver, StoreEvent, StoreObserver
from ..failure_log import FailureLog

logger = logging.getLogger(__name__)


@dataclass
class _Subscription:
    observer: StoreObserver
    since: int  # the number of the first event it receives
    first: list[StoreEvent] = field(default_factory=list)  # the snapshot it receives before those


class EventHub:
    """Queued events and the observers they go to (see the module docstring)."""

    def __init__(self) -> None:
        self._subs: list[_Subscription] = []
        self._queue: deque[tuple[int, StoreEvent]] = deque()
        self._posted = 0
        self._delivering = threading.Lock()
        self._failures = FailureLog(logger)

    def add(self, observer: StoreObserver, first: Sequence[StoreEvent] = ()) -> None:
        """Send ``observer`` ``first``, then every event posted from now on. The caller holds the
        record's lock, so nothing is posted between the snapshot ``first`` and this call."""
        # Copied, not appended: delivery reads the list without a lock.
        self._subs = [*self._subs, _Subscription(observer, self._posted, list(first))]

    @property
    def observed(self) -> bool:
        """Whether any observer listens (events posted with none are dropped anyway)."""
        return bool(self._subs)

    @property
    def reporting(self) -> list[ReportingObserver]:
        """The observers that add a section to the store's ``stats()``."""
        return [s.observer for s in self._subs  # type: ignore[misc]
                if hasattr(s.observer, "section") and hasattr(s.observer, "stats")]

    def post(self, event: StoreEvent) -> None:
        """Queue ``event`` (the caller holds the record's lock, which orders the queue)."""
        if self._subs:
            self._queue.append((self._posted, event))
            self._posted += 1

    def deliver(self) -> None:
        """Hand every queued event to the observers, unless another thread is doing so already."""
        while self._queue or any(s.first for s in self._subs):
            if not self._delivering.acquire(blocking=False):
                return  # that thread re-checks the queue after it lets go
            try:
                self._deliver_queued()
            finally:
                self._delivering.release()

    def _deliver_queued(self) -> None:
        queue = self._queue
        while True:
            batch = [queue.popleft() for _ in range(len(queue))]
            pending = [s for s in self._subs if s.first]
            if not batch and not pending:
                return
            for sub in self._subs:
                events = [e for n, e in batch if n >= sub.since]
                if sub.first:
                    events, sub.first = sub.first + events, []
                if events:
                    self._send(sub.observer, events)

    def _send(self, observer: StoreObserver, events: Sequence[StoreEvent]) -> None:
        try:
            observer.on_events(events)
        except Exception as e:  # noqa: BLE001 - an observer must not fail the store
            self._failures.report(f"store observer {type(observer).__name__}", e)
