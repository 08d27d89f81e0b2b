"""``Counters``: one component's named event counts, safe to bump from any thread.

SGLang calls the store from several daemon threads at once, and the mover adds one more; an
unlocked ``+=`` on shared ints loses increments. Each source of counts (the store, each tier's
store-side view, the mover) owns one ``Counters``, and ``TieredStore.stats`` nests them under the
source's name, so two sources can use the same counter name without one overwriting the other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Counters:
    """Monotonic integer counters with a fixed set of names.

    Args:
        names: every counter this source has; bumping any other name is a ``KeyError`` (a typo
            would otherwise create a counter no dashboard knows about).
    """

    __slots__ = ("_lock", "_values")

    def __init__(self, names: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(names, 0)

    def add(self, **deltas: int) -> None:
        """Add each delta to its counter, all under one lock (a reader sees all or none)."""
        with self._lock:
            values = self._values
            if not deltas.keys() <= values.keys():
                unknown = ", ".join(sorted(deltas.keys() - values.keys()))
                raise KeyError(f"no counter {unknown}; known: {', '.join(values)}")
            for name, delta in deltas.items():
                values[name] += delta

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def snapshot(self) -> dict[str, int]:
        """A consistent copy of every counter."""
        with self._lock:
            return dict(self._values)


# The mover's counters, the same for both movers (``mover``, ``inline_mover``).
MOVER_COUNTERS = ("submitted", "completed", "dropped", "failed", "waits", "timeouts")
