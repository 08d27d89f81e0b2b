"""``EventHub``: the store's events (``api.StoreEvent``), handed to its observers in commit order.

``Residency`` appends an event while it holds its lock (a deque append), and calls ``deliver``
once the lock is released. Delivery is one thread at a time without waiting: a thread that finds
another delivering leaves its events to that thread, which loops until the queue is empty, so a
storage thread never blocks on an observer another thread is running, and events reach every
observer in the order they were committed. An observer that raises is logged (one line per half
minute, ``FailureLog``) and keeps receiving later events.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence

from ..api import ReportingObserver, StoreEvent, StoreObserver
from ..failure_log import FailureLog

logger = logging.getLogger(__name__)


class EventHub:
    """Queued events and the observers they go to (see the module docstring)."""

    def __init__(self) -> None:
        self._observers: list[StoreObserver] = []
        self._queue: deque[StoreEvent] = deque()
        self._delivering = threading.Lock()
        self._failures = FailureLog(logger)

    def add(self, observer: StoreObserver) -> None:
        """Send ``observer`` every event committed from now on."""
        self._observers = [*self._observers, observer]  # copied: delivery reads it without a lock

    @property
    def reporting(self) -> list[ReportingObserver]:
        """The observers that add a section to the store's ``stats()``."""
        return [o for o in self._observers if hasattr(o, "section") and hasattr(o, "stats")]

    @property
    def active(self) -> bool:
        return bool(self._observers)

    def post(self, event: StoreEvent) -> None:
        """Queue ``event`` (the caller holds the record's lock, which orders the queue)."""
        if self._observers:
            self._queue.append(event)

    def deliver(self) -> None:
        """Hand every queued event to the observers, unless another thread is doing so already."""
        queue = self._queue
        while queue:
            if not self._delivering.acquire(blocking=False):
                return  # that thread re-checks the queue after it lets go
            try:
                while queue:
                    batch: Sequence[StoreEvent] = [queue.popleft() for _ in range(len(queue))]
                    for observer in self._observers:
                        try:
                            observer.on_events(batch)
                        except Exception as e:  # noqa: BLE001 - an observer must not fail the store
                            self._failures.report(f"store observer {type(observer).__name__}", e)
            finally:
                self._delivering.release()
