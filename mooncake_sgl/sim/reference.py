"""Reference policies for the simulator only: ARC as a ``PlacementPolicy`` and Belady's offline bound.

ARC (Megiddo & Modha, FAST'03) runs independently in every tier, write-through like the LRU baseline:
T1 (seen once) and T2 (seen again) with ghost lists B1/B2 and the adaptive target ``p`` for T1.
Adapted to the event contract: the store asks for victims *before* it inserts the page that needs
room, so REPLACE runs with the current ``p`` and ``p`` is adapted when the page then arrives (ARC's
order is the reverse within one miss). Chains are touched and inserted tail first, so a chain's head
is its most recent page and tails leave first.

Belady (MIN with bypass) needs the future, so it is a function over the whole trace rather than a
policy: on a miss the page is cached only if its next use comes before the furthest next use among
the cached pages, which is then evicted. It maximises page hits; prefix hits are then counted as
SGLang counts them (the leading run of a request), which Belady does not optimise directly, so it
is the customary bound rather than a proven optimum of the prefix metric.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from ..api import PageKey, PlacementPolicy
from .trace import Request


class _Arc:
    __slots__ = ("c", "p", "t1", "t2", "b1", "b2", "used")

    def __init__(self) -> None:
        self.c = 0  # capacity in pages, known once the first page's size is
        self.p = 0.0
        self.t1: OrderedDict[PageKey, int] = OrderedDict()
        self.t2: OrderedDict[PageKey, int] = OrderedDict()
        self.b1: OrderedDict[PageKey, None] = OrderedDict()
        self.b2: OrderedDict[PageKey, None] = OrderedDict()
        self.used = 0  # bytes in T1 and T2


class ArcPolicy(PlacementPolicy):
    """ARC per tier; admits everywhere, promotes to tier 0, demotes one tier down."""

    def __init__(self, capacities: Sequence[int | None]):
        self._caps = list(capacities)
        self._arcs = [_Arc() for _ in capacities]

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        run = next((i for i, t in enumerate(tiers) if t is None), len(tiers))
        for i in range(run - 1, -1, -1):
            a = self._arcs[tiers[i]]
            key = keys[i]
            n = a.t1.pop(key, None)
            if n is not None:
                a.t2[key] = n
            elif key in a.t2:
                a.t2.move_to_end(key)

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        a = self._arcs[tier]
        for key, n in zip(reversed(keys), reversed(nbytes)):
            if not a.c and self._caps[tier]:
                a.c = max(1, self._caps[tier] // n)
            if key in a.t1 or key in a.t2:
                continue
            a.used += n
            if key in a.b1:
                a.p = min(a.c, a.p + max(len(a.b2) / len(a.b1), 1.0))
                del a.b1[key]
                a.t2[key] = n
            elif key in a.b2:
                a.p = max(0.0, a.p - max(len(a.b1) / len(a.b2), 1.0))
                del a.b2[key]
                a.t2[key] = n
            else:
                a.t1[key] = n
            # Directory bound: |T1|+|B1| <= c and the whole directory <= 2c (ARC's invariants).
            while a.c and len(a.t1) + len(a.b1) > a.c and a.b1:
                a.b1.popitem(last=False)
            while a.c and len(a.t1) + len(a.t2) + len(a.b1) + len(a.b2) > 2 * a.c and a.b2:
                a.b2.popitem(last=False)

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        a = self._arcs[tier]
        for key in keys:
            n = a.t1.pop(key, None)
            if n is None:
                n = a.t2.pop(key, None)
            a.used -= n or 0

    def admit(self, keys: Sequence[PageKey], tier: int) -> list[bool]:
        return [True] * len(keys)

    def victims(self, tier: int, nbytes: int, protected: frozenset[PageKey] = frozenset()
                ) -> list[PageKey] | None:
        a = self._arcs[tier]
        held = sum(a.t1.get(k) or a.t2.get(k) or 0 for k in protected)
        if a.used - held < nbytes:
            return None
        chosen: list[PageKey] = []
        freed = 0
        while freed < nbytes:
            from_t1 = a.t1 and (len(a.t1) > a.p or not a.t2)
            src, ghost = (a.t1, a.b1) if from_t1 else (a.t2, a.b2)
            key = next((k for k in src if k not in protected), None)
            if key is None:  # everything left in this list is protected: take the other list
                src, ghost = (a.t2, a.b2) if from_t1 else (a.t1, a.b1)
                key = next(k for k in src if k not in protected)
            n = src.pop(key)
            freed += n
            a.used -= n
            ghost[key] = None
            chosen.append(key)
        return chosen

    def promotion_target(self, key: PageKey, found_tier: int) -> int | None:
        return 0 if found_tier > 0 else None

    def demotion_target(self, key: PageKey, from_tier: int) -> int | None:
        return from_tier + 1 if from_tier + 1 < len(self._arcs) else None

    def stats(self) -> dict[str, float]:
        return {f"tier{i}_p": a.p for i, a in enumerate(self._arcs)}


def belady_prefix_hits(requests: Sequence[Request], capacity_pages: int) -> tuple[int, int]:
    """(prefix-hit pages, looked-up pages) of Belady's MIN with bypass on one tier of
    ``capacity_pages`` pages."""
    never = len(requests) + 1
    next_use: list[list[float]] = [[]] * len(requests)
    seen: dict[PageKey, int] = {}
    for i in range(len(requests) - 1, -1, -1):
        keys = requests[i].keys
        # Later pages of a request count as used slightly later, so MIN drops chain tails first.
        next_use[i] = [seen.get(k, never) + j * 1e-6 for j, k in enumerate(keys)]
        for k in keys:
            seen[k] = i
    cached: dict[PageKey, float] = {}  # page -> its next use
    heap: list[tuple[float, PageKey]] = []  # (-next use, page); stale entries skipped lazily
    hits = total = 0
    for i, req in enumerate(requests):
        keys = req.keys
        run = 0
        while run < len(keys) and keys[run] in cached:
            run += 1
        hits += run
        total += len(keys)
        for key, nu in zip(keys, next_use[i]):
            if key in cached:
                cached[key] = nu
                heapq.heappush(heap, (-nu, key))
                continue
            if len(cached) >= capacity_pages:
                while cached.get(heap[0][1]) != -heap[0][0]:
                    heapq.heappop(heap)
                if -heap[0][0] <= nu:
                    continue  # bypass: this page is needed later than everything cached
                del cached[heapq.heappop(heap)[1]]
            cached[key] = nu
            heapq.heappush(heap, (-nu, key))
    return hits, total
