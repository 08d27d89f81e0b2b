"""``FailureLog``: the one way a failure that became a miss is logged.

A failure is turned into a miss in one place per kind of caller (the store, for every tier call;
the SGLang adapter, for anything the store itself raised) and both report it here: at most one
WARNING per operation per interval, with the count of the similar failures it held back since its
last line. A dead tier fails every call SGLang makes; one line per call would flood SGLang's log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

# Arbitrary: one log line per failing operation per half minute keeps a dead tier from flooding logs.
LOG_INTERVAL_S = 30.0


class FailureLog:
    """At most one warning per operation name per ``interval_s``; counts what it held back.

    Thread-safe. ``clock`` is injectable so the rate limit is testable without sleeping.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held_back: dict[str, int] = {}

    def report(self, op: str, exc: BaseException) -> bool:
        """Log ``op``'s failure unless ``op`` was logged less than ``interval_s`` ago; returns
        whether a line was written."""
        now = self._clock()
        with self._lock:
            last = self._last.get(op)
            if last is not None and now - last < self._interval:
                self._held_back[op] = self._held_back.get(op, 0) + 1
                return False
            self._last[op] = now
            held_back = self._held_back.pop(op, 0)
        self._logger.warning("mooncake_sgl %s failed, answering a miss: %s: %s (%d similar failures "
                             "since the last report)", op, type(exc).__name__, exc, held_back)
        return True
