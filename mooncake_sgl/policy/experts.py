"""Eviction experts: textbook rankings of one cache's pages, each kept over a resident set it does
not own.

An expert is told which pages become resident (``add``), are referenced while resident (``hit``) and
leave (``drop``), whoever chose to evict them, and answers one question: in which order would it
evict the resident pages (``candidates``). ``AdaptivePolicy`` keeps one of each over every tier's
real pages and lets the expert its shadow caches currently rate best choose the victims; the others
keep learning from the same events (ghost lists, aging), so a change of leader costs no warm-up.
``ShadowCache`` runs the same classes alone on a sampled miniature cache to rate them.

- ``LruExpert``   recency.
- ``ArcExpert``   ARC (Megiddo & Modha, FAST'03): T1 (seen once) and T2 (seen again) with ghost lists
                  B1/B2 steering the target size ``p`` of T1.
- ``LirsExpert``  LIRS (Jiang & Zhang, SIGMETRICS'02): pages with a short inter-reference recency
                  (LIR) are protected; victims come from a small queue of resident HIR pages, whose
                  ghosts in the recency stack become LIR when they return before the oldest LIR page
                  was last used: the classic answer to reuse distances longer than the cache.
- ``LfuDaExpert`` LFU with dynamic aging (Arlitt et al., 2000): priority = L + references, L rising to
                  the priority of what it evicts, so once-popular pages age out.

Every operation is O(1) amortised: ordered dicts; LFU-DA's heap drops stale entries lazily and is
rebuilt when half of it is stale. Capacities are in pages (a tier holds pages of one size).
``candidates`` is a lazy iterator: the caller must not change the expert while it iterates, and must
``close()`` it (LFU-DA puts back what it took from its heap then).
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from typing import ClassVar

from ..api import PageKey

# Share of a LIRS cache for resident HIR pages (the paper's 1 %).
LIRS_HIR_SHARE = 0.01
# Non-resident HIR entries LIRS's stack may hold, as a multiple of the cache's pages (the paper leaves
# it unbounded; a bound keeps memory proportional to the cache). Arbitrary.
LIRS_STACK_PAGES = 3


class Expert(ABC):
    """One eviction ranking over a resident set kept by someone else."""

    name: ClassVar[str]

    def __init__(self, capacity_pages: int):
        if capacity_pages < 1:
            raise ValueError(f"an expert needs a capacity of at least one page, got {capacity_pages}")
        self.capacity = capacity_pages

    @abstractmethod
    def hit(self, key: PageKey) -> None:
        """A resident page was referenced."""

    @abstractmethod
    def add(self, key: PageKey) -> None:
        """A page that was not resident became resident."""

    @abstractmethod
    def drop(self, key: PageKey) -> None:
        """A resident page left (chosen by this expert or not)."""

    @abstractmethod
    def candidates(self) -> Iterator[PageKey]:
        """Resident pages, the one this expert would evict first first."""

    @abstractmethod
    def entries(self) -> int:
        """Keys held, ghosts included (for memory accounting)."""


class LruExpert(Expert):
    name = "lru"

    def __init__(self, capacity_pages: int):
        super().__init__(capacity_pages)
        self._order: OrderedDict[PageKey, None] = OrderedDict()  # oldest first

    def hit(self, key: PageKey) -> None:
        self._order.move_to_end(key)

    def add(self, key: PageKey) -> None:
        self._order[key] = None

    def drop(self, key: PageKey) -> None:
        del self._order[key]

    def candidates(self) -> Iterator[PageKey]:
        yield from self._order

    def entries(self) -> int:
        return len(self._order)


class ArcExpert(Expert):
    name = "arc"

    def __init__(self, capacity_pages: int):
        super().__init__(capacity_pages)
        self.p = 0.0  # target size of T1, in pages
        self._t1: OrderedDict[PageKey, None] = OrderedDict()
        self._t2: OrderedDict[PageKey, None] = OrderedDict()
        self._b1: OrderedDict[PageKey, None] = OrderedDict()
        self._b2: OrderedDict[PageKey, None] = OrderedDict()

    def hit(self, key: PageKey) -> None:
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        else:
            self._t2.move_to_end(key)

    def add(self, key: PageKey) -> None:
        b1, b2 = self._b1, self._b2
        if key in b1:  # T1 was too small: it would have hit with a larger T1
            self.p = min(float(self.capacity), self.p + max(len(b2) / len(b1), 1.0))
            del b1[key]
            self._t2[key] = None
        elif key in b2:
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            del b2[key]
            self._t2[key] = None
        else:
            self._t1[key] = None
        self._bound()

    def drop(self, key: PageKey) -> None:
        if key in self._t1:
            del self._t1[key]
            self._b1[key] = None
        else:
            del self._t2[key]
            self._b2[key] = None
        self._bound()

    def _bound(self) -> None:
        """ARC's directory invariants: |T1| + |B1| <= c and the whole directory <= 2c."""
        c = self.capacity
        b1, b2 = self._b1, self._b2
        # Counted once, not per pop: this runs on every add and drop of every ARC shadow.
        for _ in range(min(len(b1), len(self._t1) + len(b1) - c)):
            b1.popitem(last=False)
        for _ in range(min(len(b2), self.entries() - 2 * c)):
            b2.popitem(last=False)

    def candidates(self) -> Iterator[PageKey]:
        """ARC's REPLACE repeated: T1's oldest while T1 is above its target, else T2's oldest."""
        left1 = len(self._t1)
        it1, it2 = iter(self._t1), iter(self._t2)
        done1 = done2 = False
        while not (done1 and done2):
            use1 = not done1 and (left1 > self.p or done2)
            key = next(it1 if use1 else it2, None)
            if key is None:
                done1, done2 = done1 or use1, done2 or not use1
                continue
            if use1:
                left1 -= 1
            yield key

    def entries(self) -> int:
        return len(self._t1) + len(self._t2) + len(self._b1) + len(self._b2)


class LirsExpert(Expert):
    name = "lirs"

    def __init__(self, capacity_pages: int):
        super().__init__(capacity_pages)
        self._stack: OrderedDict[PageKey, None] = OrderedDict()  # S, bottom (oldest) first
        self._queue: OrderedDict[PageKey, None] = OrderedDict()  # resident HIR pages, oldest first
        self._lir: set[PageKey] = set()
        self._lir_limit = max(1, capacity_pages - max(1, int(capacity_pages * LIRS_HIR_SHARE)))
        # A page has left once: newcomers start as HIR from now on. LIR pages another expert evicts
        # are replaced by HIR pages proving a short reuse, not by newcomers.
        self._warm = False

    def hit(self, key: PageKey) -> None:
        stack = self._stack
        if key in self._lir:
            bottom = next(iter(stack)) == key
            stack.move_to_end(key)
            if bottom:
                self._prune()
        elif key in stack:  # resident HIR referenced again within the LIR span: it becomes LIR
            stack.move_to_end(key)
            del self._queue[key]
            self._lir.add(key)
            if len(self._lir) > self._lir_limit:
                self._demote_bottom()
        else:
            stack[key] = None
            self._queue.move_to_end(key)
            self._prune()
        self._bound()

    def add(self, key: PageKey) -> None:
        stack = self._stack
        if key in stack:  # a non-resident HIR page back within the LIR span
            stack.move_to_end(key)
            self._lir.add(key)
            if len(self._lir) > self._lir_limit:
                self._demote_bottom()
        elif not self._warm and len(self._lir) < self._lir_limit:  # warm-up: the first pages are LIR
            stack[key] = None
            self._lir.add(key)
        else:
            stack[key] = None
            self._queue[key] = None
            self._prune()
        self._bound()

    def drop(self, key: PageKey) -> None:
        self._warm = True
        if key in self._queue:
            del self._queue[key]  # its stack entry stays, as a non-resident HIR page
        else:
            # An LIR page leaves only when another expert evicts it (or every HIR page is
            # protected): its stack entry stays too, so it is LIR again if it returns within the
            # LIR span, as it would be had it stayed.
            self._lir.remove(key)
            self._prune()

    def candidates(self) -> Iterator[PageKey]:
        yield from self._queue
        lir = self._lir
        for key in self._stack:
            if key in lir:
                yield key

    def entries(self) -> int:
        return len(self._stack) + len(self._queue) + len(self._lir)

    def _prune(self) -> None:
        """Stack pruning: the bottom of S is always an LIR page."""
        stack, lir = self._stack, self._lir
        while stack:
            key = next(iter(stack))
            if key in lir:
                return
            del stack[key]

    def _demote_bottom(self) -> None:
        stack = self._stack
        key = next(iter(stack))
        self._lir.remove(key)
        del stack[key]
        self._queue[key] = None
        self._prune()

    def _bound(self) -> None:
        stack = self._stack
        excess = len(stack) - (1 + LIRS_STACK_PAGES) * self.capacity
        if excess <= 0:
            return
        resident = self._lir, self._queue
        drop = [k for k in itertools.islice(stack, excess)
                if k not in resident[0] and k not in resident[1]]
        for key in drop:
            del stack[key]
        self._prune()


class LfuDaExpert(Expert):
    name = "lfuda"

    def __init__(self, capacity_pages: int):
        super().__init__(capacity_pages)
        self.age = 0.0  # L
        self._heap: list[tuple[float, int, PageKey]] = []  # stale entries skipped lazily
        self._prio: dict[PageKey, tuple[float, int]] = {}
        self._count: dict[PageKey, int] = {}
        self._seq = itertools.count()

    def _set(self, key: PageKey, count: int) -> None:
        self._count[key] = count
        entry = (self.age + count, next(self._seq))
        self._prio[key] = entry
        heapq.heappush(self._heap, (*entry, key))
        if len(self._heap) > 2 * len(self._prio) + 64:
            self._heap = [(*e, k) for k, e in self._prio.items()]
            heapq.heapify(self._heap)

    def hit(self, key: PageKey) -> None:
        self._set(key, self._count[key] + 1)

    def add(self, key: PageKey) -> None:
        self._set(key, 1)

    def drop(self, key: PageKey) -> None:
        # L rises to the lowest priority held, the page LFU-DA itself would have evicted: aging goes
        # on at the pace of evictions even while another expert chooses them.
        self.age = max(self.age, self._lowest())
        del self._prio[key], self._count[key]

    def _lowest(self) -> float:
        heap, prio = self._heap, self._prio
        while heap and prio.get(heap[0][2]) != heap[0][:2]:
            heapq.heappop(heap)
        return heap[0][0] if heap else self.age

    def candidates(self) -> Iterator[PageKey]:
        heap, prio = self._heap, self._prio
        taken: list[tuple[float, int, PageKey]] = []
        try:
            while heap:
                entry = heapq.heappop(heap)
                if prio.get(entry[2]) != entry[:2]:
                    continue
                taken.append(entry)
                yield entry[2]
        finally:
            for entry in taken:
                heapq.heappush(heap, entry)

    def entries(self) -> int:
        return len(self._prio) + len(self._heap)


EXPERTS: tuple[type[Expert], ...] = (LruExpert, ArcExpert, LirsExpert, LfuDaExpert)
