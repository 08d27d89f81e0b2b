"""``InlineMover``: a ``mover.Mover`` that runs every task on the calling thread.

Every task runs at once, on the caller: the trace simulator needs deterministic replays (Caffeine's
simulator runs its product policy with a same-thread executor for the same reason), and it is the
"before" of ``scripts/bench_mover_latency.py``. A task that raises is logged and counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ..tally import Tally
from .stats import MoverStats

logger = logging.getLogger(__name__)

T = TypeVar("T")


class InlineMover:
    """Runs each task at once on the caller's thread (simulator, baselines)."""

    background = False

    def __init__(self) -> None:
        self.counters = Tally(MoverStats)

    def submit(self, fn: Callable[..., Any], *args: Any, urgent: bool = False) -> bool:
        self.counters.add(submitted=1)
        self._run(fn, args)
        return True

    def call(self, fn: Callable[..., T], *args: Any, default: T, timeout: float) -> T:
        self.counters.add(submitted=1)
        return self._run(fn, args, default)

    def on_mover_thread(self) -> bool:
        return True

    def yield_now(self) -> None:
        """Nobody to yield to on the caller's thread, and a yield on a loaded machine costs
        milliseconds."""

    def drain(self, timeout: float = 30.0) -> bool:
        return True

    def close(self) -> int:
        """Nothing runs after the caller returns, so nothing to stop or drop."""
        return 0

    def _run(self, fn: Callable[..., Any], args: tuple, default: Any = None) -> Any:
        try:
            out = fn(*args)
        except Exception:
            logger.exception("placement task %s failed", getattr(fn, "__name__", fn))
            self.counters.add(failed=1)
            return default
        self.counters.add(completed=1)
        return out
