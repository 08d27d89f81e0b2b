"""Zero-byte tiers for the trace simulator: they keep each page's size and nothing else.

``SizeTier`` is a real ``Tier`` (capacity, footprints, refusal when full, idempotent puts, removal)
whose pages hold no bytes, so ``TieredStore`` runs over it unchanged and a replay of 100k+ pages of
64 MiB needs no memory. ``SizedPage`` is the page it is handed: one segment that only has a size,
and ``SizeStaging`` gives the store such pages when it moves a page between tiers itself.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence

from ..api import PageKey, PageView, PutResult, Tier, TierCapabilities, TierKind, TierUsage, page_nbytes
from ..store.staging import Staging


class SizedSegment:
    """A page segment with a size and no bytes (``page_nbytes`` reads only ``nbytes``)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def sized_page(nbytes: int) -> PageView:
    return [SizedSegment(nbytes)]  # type: ignore[list-item]


class SizeStaging(Staging):
    """Staging pages that hold no bytes, so a move is never split into memory-bounded batches (each
    batch makes room below separately, which would change the victims chosen)."""

    def __init__(self) -> None:
        super().__init__(batch_bytes=1 << 62)

    def pages(self, purpose: Hashable, sizes: Sequence[int]) -> list[PageView]:
        return [sized_page(n) for n in sizes]


class SizeTier(Tier):
    """A tier of ``capacity`` bytes that records page sizes only."""

    kind = TierKind.HOST
    capabilities = TierCapabilities()

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"tier {name}: capacity must not be negative, got {capacity}")
        self.name = name
        self._capacity = capacity
        self._used = 0
        self._pages: dict[PageKey, int] = {}
        self._lock = threading.Lock()

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        pages = self._pages
        return [k in pages for k in keys]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        stored = self._pages
        return [stored.get(k) == page_nbytes(p) for k, p in zip(keys, pages)]

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *,
                 soft_pin: Sequence[bool] | None = None) -> PutResult:
        out = []
        with self._lock:
            stored = self._pages
            for k, p in zip(keys, pages):
                if k in stored:
                    out.append(True)
                    continue
                n = page_nbytes(p)
                if self._used + n > self._capacity:
                    out.append(False)
                    continue
                stored[k] = n
                self._used += n
                out.append(True)
        return PutResult.written(out)

    def remove(self, keys: Sequence[PageKey]) -> int:
        removed = 0
        with self._lock:
            for k in keys:
                n = self._pages.pop(k, None)
                if n is not None:
                    self._used -= n
                    removed += 1
        return removed

    def usage(self) -> TierUsage:
        return TierUsage(self._capacity, self._used, len(self._pages))

    def page_size_of(self, key: PageKey) -> int | None:
        return self._pages.get(key)

    def scan(self) -> Iterator[tuple[PageKey, int]]:
        with self._lock:
            return iter(list(self._pages.items()))
