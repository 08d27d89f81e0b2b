"""``Counters``: one component's named event counts, safe to bump from many threads.

A plain ``dict[str, int]`` updated with ``+=`` from several threads loses increments (the read,
add and store are separate bytecodes). Each component (the pool server, its index, the pool tier)
owns one ``Counters`` and is the only writer of its names; readers take a consistent snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Counters:
    """Fixed set of names, each an integer that only grows."""

    def __init__(self, names: Iterable[str]):
        self._lock = threading.Lock()
        self._values: dict[str, int] = dict.fromkeys(names, 0)

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to ``name``; ``KeyError`` for a name this component never declared."""
        with self._lock:
            self._values[name] += n

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {k: float(v) for k, v in self._values.items()}
