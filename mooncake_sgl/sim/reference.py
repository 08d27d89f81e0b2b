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

Two more classics, for the same reason as ARC (heat must be judged against strong online policies,
not only LRU): LIRS (Jiang & Zhang, SIGMETRICS'02), which ranks pages by inter-reference recency and
is the classic answer to reuse distances longer than the cache, and LFU-DA (Arlitt et al., 2000),
frequency with dynamic aging. Both run per tier and write-through, like ARC.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterator, Sequence

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


def _hits_tail_first(keys: Sequence[PageKey], tiers: Sequence[int | None]) -> Iterator[tuple[PageKey, int]]:
    """(key, tier) of a lookup's leading run of hits, tail first, so a chain's head ends most recent."""
    run = next((i for i, t in enumerate(tiers) if t is None), len(tiers))
    for i in range(run - 1, -1, -1):
        yield keys[i], tiers[i]


class _WriteThrough(PlacementPolicy):
    """Reference policies run each tier on its own: every write admitted, a page found below tier 0
    promoted to it, a victim moved one tier down."""

    def admit(self, keys: Sequence[PageKey], tier: int) -> list[bool]:
        return [True] * len(keys)

    def promotion_target(self, key: PageKey, found_tier: int) -> int | None:
        return 0 if found_tier > 0 else None

    def demotion_target(self, key: PageKey, from_tier: int) -> int | None:
        return from_tier + 1 if from_tier + 1 < self._ntiers else None

    def __init__(self, capacities: Sequence[int | None]):
        self._caps = list(capacities)
        self._ntiers = len(self._caps)


class ArcPolicy(_WriteThrough):
    """ARC per tier."""

    def __init__(self, capacities: Sequence[int | None]):
        super().__init__(capacities)
        self._arcs = [_Arc() for _ in capacities]

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        for key, tier in _hits_tail_first(keys, tiers):
            a = self._arcs[tier]
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

    def stats(self) -> dict[str, float]:
        return {f"tier{i}_p": a.p for i, a in enumerate(self._arcs)}


# Share of a LIRS tier for resident HIR pages (the paper's 1 %), and how many non-resident HIR
# entries the stack may hold, as a multiple of the tier's pages (the paper leaves it unbounded).
LIRS_HIR_SHARE = 0.01
LIRS_STACK_PAGES = 3


class _Lirs:
    __slots__ = ("c", "stack", "queue", "lir", "resident", "used", "warm")

    def __init__(self) -> None:
        self.c = 0  # capacity in pages, known once the first page's size is
        self.stack: OrderedDict[PageKey, None] = OrderedDict()  # S, bottom (oldest) first
        self.queue: OrderedDict[PageKey, int] = OrderedDict()  # resident HIR pages, oldest first
        self.lir: dict[PageKey, int] = {}
        self.resident: dict[PageKey, int] = {}
        self.used = 0  # bytes of resident pages
        self.warm = False  # the tier has been full once: no more pages become LIR on arrival

    def lir_limit(self) -> int:
        return self.c - max(1, int(self.c * LIRS_HIR_SHARE))

    def prune(self) -> None:
        """Stack pruning: the bottom of S is always an LIR page."""
        stack = self.stack
        while stack:
            key = next(iter(stack))
            if key in self.lir:
                return
            del stack[key]

    def demote_bottom_lir(self) -> None:
        key = next(iter(self.stack))
        self.queue[key] = self.lir.pop(key)
        del self.stack[key]
        self.prune()

    def bound_stack(self) -> None:
        limit = (1 + LIRS_STACK_PAGES) * self.c
        if len(self.stack) <= limit:
            return
        drop = [k for k in itertools.islice(self.stack, len(self.stack) - limit)
                if k not in self.resident]
        for k in drop:
            del self.stack[k]
        self.prune()

    def access(self, key: PageKey) -> None:
        """A hit on a resident page."""
        if key in self.lir:
            bottom = next(iter(self.stack)) == key
            self.stack.move_to_end(key)
            if bottom:
                self.prune()
        elif key in self.stack:  # resident HIR with a recent previous reference: now LIR
            self.stack.move_to_end(key)
            self.lir[key] = self.queue.pop(key)
            self.demote_bottom_lir()
        else:
            self.stack[key] = None
            self.queue.move_to_end(key)

    def insert(self, key: PageKey, n: int) -> None:
        self.resident[key] = n
        self.used += n
        if key in self.stack:  # non-resident HIR still in S: its IRR beats the oldest LIR page
            self.stack.move_to_end(key)
            self.lir[key] = n
            if len(self.lir) > self.lir_limit():
                self.demote_bottom_lir()
        elif not self.warm and len(self.lir) < self.lir_limit():  # warm-up: the first pages are LIR
            self.stack[key] = None
            self.lir[key] = n
        else:
            self.stack[key] = None
            self.queue[key] = n
        self.bound_stack()

    def evict(self, key: PageKey) -> None:
        self.warm = True
        self.used -= self.resident.pop(key)
        if self.queue.pop(key, None) is None and self.lir.pop(key, None) is not None:
            self.stack.pop(key, None)
            self.prune()


class LirsPolicy(_WriteThrough):
    """LIRS per tier: LIR pages (short inter-reference recency) are protected; victims come from the
    small queue of resident HIR pages, whose non-resident ghosts in the stack turn LIR when they return
    sooner than the oldest LIR page was last used."""

    def __init__(self, capacities: Sequence[int | None]):
        super().__init__(capacities)
        self._lirs = [_Lirs() for _ in capacities]

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        for key, tier in _hits_tail_first(keys, tiers):
            self._lirs[tier].access(key)

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        s = self._lirs[tier]
        for key, n in zip(reversed(keys), reversed(nbytes)):
            if not s.c and self._caps[tier]:
                s.c = max(2, self._caps[tier] // n)
            if key not in s.resident:
                s.insert(key, n)

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        s = self._lirs[tier]
        for key in keys:
            if key in s.resident:
                s.evict(key)

    def victims(self, tier: int, nbytes: int, protected: frozenset[PageKey] = frozenset()
                ) -> list[PageKey] | None:
        s = self._lirs[tier]
        if s.used - sum(s.resident.get(k, 0) for k in protected) < nbytes:
            return None
        chosen: list[PageKey] = []
        freed = 0
        # Resident HIR pages first (oldest first); LIR pages from the stack's bottom only when every
        # resident HIR page is protected.
        for pool in (s.queue, s.lir):
            for key in [k for k in (s.stack if pool is s.lir else pool) if k in pool and k not in protected]:
                if freed >= nbytes:
                    return chosen
                freed += s.resident[key]
                s.evict(key)
                chosen.append(key)
        return chosen

    def stats(self) -> dict[str, float]:
        return {f"tier{i}_lir_pages": float(len(s.lir)) for i, s in enumerate(self._lirs)}


class _LfuDa:
    __slots__ = ("age", "heap", "prio", "count", "size", "used", "seq")

    def __init__(self) -> None:
        self.age = 0.0  # L: the priority of the last victim
        self.heap: list[tuple[float, int, PageKey]] = []  # stale entries skipped lazily
        self.prio: dict[PageKey, tuple[float, int]] = {}
        self.count: dict[PageKey, int] = {}
        self.size: dict[PageKey, int] = {}
        self.used = 0
        self.seq = itertools.count()

    def set(self, key: PageKey, count: int) -> None:
        self.count[key] = count
        entry = (self.age + count, next(self.seq))
        self.prio[key] = entry
        heapq.heappush(self.heap, (*entry, key))


class LfuDaPolicy(_WriteThrough):
    """LFU with dynamic aging per tier: priority = L + references while resident, where L rises to
    each victim's priority, so pages that were popular long ago age out."""

    def __init__(self, capacities: Sequence[int | None]):
        super().__init__(capacities)
        self._tiers = [_LfuDa() for _ in capacities]

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        for key, tier in _hits_tail_first(keys, tiers):
            t = self._tiers[tier]
            t.set(key, t.count[key] + 1)

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        t = self._tiers[tier]
        for key, n in zip(reversed(keys), reversed(nbytes)):  # tail first: equal priority, tail leaves first
            if key not in t.prio:
                t.size[key] = n
                t.used += n
                t.set(key, 1)

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        t = self._tiers[tier]
        for key in keys:
            if t.prio.pop(key, None) is not None:
                t.used -= t.size.pop(key)
                del t.count[key]

    def victims(self, tier: int, nbytes: int, protected: frozenset[PageKey] = frozenset()
                ) -> list[PageKey] | None:
        t = self._tiers[tier]
        if t.used - sum(t.size.get(k, 0) for k in protected) < nbytes:
            return None
        chosen: list[PageKey] = []
        skipped: list[tuple[float, int, PageKey]] = []
        freed = 0
        while freed < nbytes:
            p, s, key = heapq.heappop(t.heap)
            if t.prio.get(key) != (p, s):
                continue
            if key in protected:
                skipped.append((p, s, key))
                continue
            t.age = p
            n = t.size.pop(key)
            freed += n
            t.used -= n
            del t.prio[key], t.count[key]
            chosen.append(key)
        for e in skipped:
            heapq.heappush(t.heap, e)
        return chosen


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
