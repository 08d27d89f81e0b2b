"""Buffers the store copies pages through when it moves them between tiers itself (demotion of a
victim, promotion on the mover), reused instead of allocated per page.

A page moved by the store is read from one tier into a staging page and written into another. The
memory is one arena per (thread, purpose) that grows to the largest batch seen and is then reused:
a fresh ``bytearray`` per victim costs an allocation and a page-fault pass over every byte. Nested
moves (a demotion whose write must first make room below, demoting further) use different purposes,
so an inner move never overwrites the pages an outer one still holds.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence

from ..api import PageView

# Arbitrary: the most bytes one staged batch holds; a larger move is split into batches this big
# (a single page larger than this is staged alone).
STAGING_BYTES = 256 << 20


class Staging:
    """Per-thread, per-purpose reusable page buffers."""

    def __init__(self, batch_bytes: int = STAGING_BYTES) -> None:
        self.batch_bytes = batch_bytes
        self._local = threading.local()

    def batches(self, sizes: Sequence[int]) -> Iterator[list[int]]:
        """Indices of ``sizes`` grouped into batches of at most ``batch_bytes`` (at least one page)."""
        batch: list[int] = []
        used = 0
        for i, n in enumerate(sizes):
            if batch and used + n > self.batch_bytes:
                yield batch
                batch, used = [], 0
            batch.append(i)
            used += n
        if batch:
            yield batch

    def pages(self, purpose: Hashable, sizes: Sequence[int]) -> list[PageView]:
        """One single-segment page per size, valid until this thread asks for ``purpose`` again."""
        arenas = getattr(self._local, "arenas", None)
        if arenas is None:
            arenas = self._local.arenas = {}
        total = sum(sizes)
        arena = arenas.get(purpose)
        if arena is None or len(arena) < total:
            arena = arenas[purpose] = memoryview(bytearray(total))
        out: list[PageView] = []
        off = 0
        for n in sizes:
            out.append([arena[off:off + n]])
            off += n
        return out
