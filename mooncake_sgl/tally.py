"""``Tally``: one component's typed event counts, safe to bump from any thread.

A component declares the shape of its counts once, as a frozen dataclass of ``int`` fields (its
stats type), and owns one ``Tally`` of that shape; ``snapshot()`` is an instance of the shape, so a
reader (the store's ``stats()`` report, a tier's, the exporter) gets named, typed fields, never a
dict it must know the keys of. SGLang calls us from several daemon threads at once and an unlocked
``+=`` on shared ints loses increments, hence the lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

S = TypeVar("S")


class Tally(Generic[S]):
    """Monotonic integer counts with the fields of ``shape``.

    Args:
        shape: a frozen dataclass whose fields are all ``int`` counts defaulting to 0; adding to a
            name it lacks is a ``KeyError`` (a typo would otherwise create a count no dashboard
            knows about).
    """

    __slots__ = ("_shape", "_lock", "_values")

    def __init__(self, shape: type[S]) -> None:
        self._shape = shape
        self._lock = threading.Lock()
        self._values = {f.name: 0 for f in dataclasses.fields(shape)}  # type: ignore[arg-type]

    def add(self, **deltas: int) -> None:
        """Add each delta to its count, all under one lock (a reader sees all or none)."""
        with self._lock:
            values = self._values
            if not deltas.keys() <= values.keys():
                unknown = ", ".join(sorted(deltas.keys() - values.keys()))
                raise KeyError(f"{self._shape.__name__} has no count {unknown}; known: {', '.join(values)}")
            for name, delta in deltas.items():
                values[name] += delta

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._values[name]

    def snapshot(self) -> S:
        """A consistent copy of every count, as the shape."""
        with self._lock:
            return self._shape(**self._values)

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as ``{field: count}``, for a reader that reports plain dicts (the pool
        server's wire stats, the router announcer's section)."""
        with self._lock:
            return dict(self._values)


def plain_number(d: Mapping[str, Any], name: str) -> float:
    """``d[name]`` of a report read back from its JSON form (the counter file): 0 where the field is
    missing or not a number, as a damaged or older file may have it."""
    v = d.get(name, 0)
    return float(v) if isinstance(v, (int, float)) else 0.0
