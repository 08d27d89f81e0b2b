"""Reference policies for the simulator only: ARC, LIRS and LFU-DA as ``PlacementPolicy``s, and
Belady's offline bound.

Each reference runs one expert of ``policy.experts`` (the algorithm itself, shared with the adaptive
policy's shadows) alone in every tier, under the write-through rules of the LRU baseline
(``policy.rules``).
ARC (Megiddo & Modha, FAST'03): T1 (seen once) and T2 (seen again) with ghost lists B1/B2 and the
adaptive target ``p`` for T1. Adapted to the event contract: the store asks for victims *before* it
inserts the page that needs room, so REPLACE runs with the current ``p`` and ``p`` is adapted when
the page then arrives (ARC's order is the reverse within one miss). Chains are touched and inserted
tail first, so a chain's head is its most recent page and tails leave first.

Belady (MIN with bypass) needs the future, so it is a function over the whole trace rather than a
policy: on a miss the page is cached only if its next use comes before the furthest next use among
the cached pages, which is then evicted. It maximises page hits; prefix hits are then counted as
SGLang counts them (the leading run of a request), which Belady does not optimise directly, so it
is the customary bound rather than a proven optimum of the prefix metric.

Two more classics, for the same reason as ARC (heat must be judged against strong online policies,
not only LRU): LIRS (Jiang & Zhang, SIGMETRICS'02), which ranks pages by inter-reference recency and
is the classic answer to reuse distances longer than the cache, and LFU-DA (Arlitt et al., 2000),
frequency with dynamic aging. Both run per tier and write-through, like ARC.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..api import PageKey, PolicyReport
from ..policy.experts import ArcExpert, Expert, LfuDaExpert, LirsExpert
from ..policy.rules import WriteThrough
from ..policy.shadow import prefix_hits
from .trace import Request


def _hits_tail_first(keys: Sequence[PageKey], tiers: Sequence[int | None]) -> Iterator[tuple[PageKey, int]]:
    """(key, tier) of a lookup's leading run of hits, tail first, so a chain's head ends most recent."""
    run = next((i for i, t in enumerate(tiers) if t is None), len(tiers))
    for i in range(run - 1, -1, -1):
        yield keys[i], tiers[i]


class _ExpertPolicy(WriteThrough):
    """One textbook expert (``policy.experts``) alone in each tier, under the write-through rules
    (``policy.rules``). The adaptive policy's shadows run the same expert classes, so what they rate
    is what this replays. Sizes are the record's (``api.ResidencyView``); the expert keeps order."""

    expert: type[Expert]

    def __init__(self, capacities: Sequence[int | None]):
        super().__init__(len(capacities))
        self._caps = list(capacities)
        self._experts: list[Expert | None] = [None] * self.ntiers  # sized by the first page

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        for key, tier in _hits_tail_first(keys, tiers):
            if key in self.residency.pages(tier):
                self._experts[tier].hit(key)

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        for key, n in zip(reversed(keys), reversed(nbytes)):  # tail first: tails leave first
            if self._experts[tier] is None:
                cap = self._caps[tier]
                self._experts[tier] = self.expert(max(2, cap // n) if cap else 1 << 30)
            self._experts[tier].add(key)

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        expert = self._experts[tier]
        for key in keys:
            expert.drop(key)

    def victims(self, tier: int, nbytes: int) -> list[PageKey] | None:
        view = self.residency
        sizes, held, expert = view.pages(tier), view.held(), self._experts[tier]
        if nbytes <= 0:
            return []
        if expert is None or view.used(tier) - view.held_bytes(tier) < nbytes:
            return None
        chosen: list[PageKey] = []
        freed = 0
        it = expert.candidates()
        try:
            for key in it:
                n = sizes.get(key)
                if n is not None and key not in held:  # only the record's pages can be victims
                    chosen.append(key)
                    freed += n
                    if freed >= nbytes:
                        break
        finally:
            it.close()
        self.on_remove(chosen, tier)
        return chosen


@dataclass(frozen=True)
class ArcTierReport:
    p: float | None  # ARC's target size of T1, in pages; None before the tier's first page


@dataclass(frozen=True)
class ArcReport(PolicyReport):
    tiers: tuple[ArcTierReport, ...]  # fastest first: ``tier{i}_p``


class ArcPolicy(_ExpertPolicy):
    """ARC per tier."""

    name = "arc"
    expert = ArcExpert

    def stats(self) -> ArcReport:
        return ArcReport(tuple(ArcTierReport(None if e is None else e.p) for e in self._experts))


class LirsPolicy(_ExpertPolicy):
    """LIRS per tier: LIR pages (short inter-reference recency) are protected; victims come from the
    small queue of resident HIR pages, whose non-resident ghosts in the stack turn LIR when they return
    sooner than the oldest LIR page was last used."""

    name = "lirs"
    expert = LirsExpert


class LfuDaPolicy(_ExpertPolicy):
    """LFU with dynamic aging per tier: priority = L + references while resident, where L rises to
    each victim's priority, so pages that were popular long ago age out."""

    name = "lfuda"
    expert = LfuDaExpert


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
        run = prefix_hits(keys, cached)
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
