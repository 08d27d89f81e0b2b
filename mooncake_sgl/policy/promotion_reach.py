"""``PromotionReach``: is a page found below tier 0 reused soon enough for tier 0 to keep it.

A promotion copies a page up and evicts another to make room, so it pays only if the page is read
again before tier 0 turns over. Measured (``scripts/bench_regimes.py``, memory pressure, chat
conversations taking turns): every page read from the LMDB tier was promoted into a host tier a
quarter of the working set (531 pages per run) and 5 of them were read there again, because a
conversation's prefix came back only after every other conversation had written its turn. The
copies, re-reads and evictions ran on the mover beside SGLang's scheduler: per run, 6.0-7.2 s of
prefill forwards and 15.8 s queued, against 4.6-5.2 s and 10.3-13.2 s with DRAM for everything.

The test is the page's own recent reuse distance, as LIRS ranks pages by theirs: the bytes that
arrived in tier 0 (writes and promotions) since the page was last used, against tier 0's capacity
times ``REACH``. A page used within less than that would still be in tier 0 under recency order, so
its next use probably comes as soon; one used longer ago would have been evicted before. A page's
first read after it was written and left tier 0 is therefore not promoted (it left because tier 0
turned over since), and its second read is, if it came soon: a hot page pays one slow read; a
cyclic or scanning stream pays nothing. The distance regulates itself: promotions advance the clock
too, so while tier 0 turns over faster than the reuse comes back, fewer pages qualify.

Uses are writes into tier 0, lookups that found the page in tier 0, and the reads this object
judges. Lookups of a page below tier 0 are not uses: the read that follows is judged against the
use before it. The record is bounded: a stamp older than the reach can never qualify again and is
dropped as the clock passes it, and at most ``MAX_TRACKED`` stamps are kept.

Not thread-safe: its owner (``store.Residency``) calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from ..api import PageKey

# Arbitrary, 1: the distance at which recency order would just still hold the page.
REACH = 1.0
# Stamps kept at most (a long stretch of reads with no arrival in tier 0 does not move the clock).
MAX_TRACKED = 1 << 20


class PromotionReach:
    """Reuse distances of pages against tier 0's capacity (see the module docstring).

    Args:
        capacity_bytes: tier 0's capacity.
        reach: the share of it a page's reuse distance may reach and still be promoted.
        max_tracked: stamps kept at most.
    """

    __slots__ = ("_reach", "_max", "_clock", "_stamps")

    def __init__(self, capacity_bytes: int, reach: float = REACH, max_tracked: int = MAX_TRACKED):
        if capacity_bytes <= 0:
            raise ValueError(f"tier 0's capacity must be positive, got {capacity_bytes}")
        if reach <= 0:
            raise ValueError(f"reach must be positive, got {reach}")
        self._reach = int(capacity_bytes * reach)
        self._max = max_tracked
        self._clock = 0  # bytes that arrived in tier 0
        self._stamps: OrderedDict[PageKey, int] = OrderedDict()  # oldest use first

    def arrived(self, keys: Sequence[PageKey], footprints: Sequence[int]) -> None:
        """Pages became resident in tier 0 (written or promoted): each is used now, and the clock
        moves on by their bytes."""
        self._clock += sum(footprints)
        self.used(keys)
        self._forget_old()

    def used(self, keys: Sequence[PageKey]) -> None:
        stamps, now = self._stamps, self._clock
        for k in keys:
            stamps.pop(k, None)
            stamps[k] = now
        while len(stamps) > self._max:
            stamps.popitem(last=False)

    def judge(self, key: PageKey) -> bool:
        """A read found ``key`` below tier 0: is it worth promoting. The read is a use."""
        last = self._stamps.get(key)
        ok = last is not None and self._clock - last < self._reach
        self.used((key,))
        return ok

    def tracked(self) -> int:
        return len(self._stamps)

    def _forget_old(self) -> None:
        stamps, oldest = self._stamps, self._clock - self._reach
        while stamps:
            key, at = next(iter(stamps.items()))
            if at > oldest:
                return
            del stamps[key]
