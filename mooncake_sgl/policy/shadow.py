"""Miniature simulations that rate eviction experts online (SHARDS: Waldspurger et al., "Cache Modeling
and Optimization using Miniature Simulations", USENIX ATC 2017).

A tier of ``C`` pages is modelled by caches of ``R * C`` pages that see only the pages whose key hash
falls in a fraction ``R`` of the hash space (spatial sampling: a sampled page is seen on every one of
its accesses, so reuse distances shrink by ``R`` along with the cache). One ``ShadowCache`` per expert
runs that expert alone on the sampled stream; ``Tournament`` keeps each one's recent prefix hits and
names the leader the real tier follows.

Prefix hits in a shadow: a request's sampled pages keep their chain order, and a sampled page counts
as a hit when it and every sampled page before it in the request are resident, as SGLang counts the
leading run. Pages past the first miss are written back, as the store does.

Memory: each shadow holds ``R * C`` pages (plus its expert's ghosts), so four shadows cost
``4 * R`` of one expert's metadata; ``R`` is ``SAMPLE_RATE`` for large tiers and rises for small ones
until a shadow holds ``MIN_SHADOW_PAGES`` (a miniature of a few dozen pages says little).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Container, Sequence
from collections.abc import Set as AbstractSet

import xxhash

from ..api import PageKey
from .experts import Expert

# Fraction of the key space the shadows of a large tier sample. SHARDS reports accurate miss ratio
# curves at 0.1-1 % on traces of millions of keys; 1/16 keeps enough samples for tiers of thousands of
# pages while the four shadows together cost a quarter of one expert's memory. Arbitrary.
SAMPLE_RATE = 1 / 16
# Smallest shadow, in pages: below it the sample rate rises (up to 1: a full-size shadow). SHARDS
# sizes samples to estimate a miss ratio curve; here they must decide between experts a few percent
# apart, and every sampled-out hit is evidence lost: with 4,096 pages, tiers of 16k pages sampled at
# 1/4 and never saw significant 3-4 % leads over 12,000 requests (docs/replay_hit_ratio.md). The price
# is memory: four shadows of up to this many pages per tier, about 25 MiB of Python objects.
MIN_SHADOW_PAGES = 16384
# Prefix hits are compared over an exponentially decayed window of this many cache turnovers
# (sampled page lookups / shadow pages): long enough to average out noise, short enough to follow a
# workload that changes. Arbitrary.
WINDOW_TURNOVERS = 32
# The leader changes only when another expert's shadow leads it by this many standard deviations of
# the difference, under any of three noise models, each wrong in one way: hits as independent
# Poisson events (variance = the two counts; it ignores that a chain's pages hit together, so it
# calls a few long chains significant early); paired by request (variance = the sum of squared
# per-request differences: it sees that two shadows mostly hit the same pages, but a request that
# differs by a whole document weighs as its square); and McNemar's test on the pages where the two
# differ (variance = those discordant pages: two shadows' hits in one request are prefixes of the
# same pages, so they differ by ``|d|`` pages, all one way). McNemar's is the most powerful of the
# three and, like Poisson's, blind to chains, so it only counts once the two differ on many requests
# (below). Three standard deviations rather than the customary two: the tests are repeated for three
# challengers after every request, and a false change of leader costs hits. Not fitted.
SWITCH_SIGMAS = 3.0
# ... and only once the challenger has this many (decayed) hits, and for the paired and McNemar
# tests the two differ on this many (decayed) requests: a normal approximation needs a few dozen
# events (the customary 30).
MIN_EVIDENCE = 30.0
# ... and only by a lead of at least this share of the leader's hits: a change of leader costs a
# transition (the tier refills towards the new expert's pages), which a lead of a percent or two,
# however certain, does not pay back within the window; between near-equal experts (chat sessions
# at 9 %: LRU, ARC, LFU-DA within 0.4 points) a switch left the tier below LRU. Chosen once, not
# swept (docs/replay_hit_ratio.md).
MIN_LEAD = 0.03


def key_hash(key: PageKey) -> int:
    """Uniform 64-bit hash of a page key, stable across processes (sampling must be reproducible)."""
    return xxhash.xxh3_64_intdigest(key)


def prefix_hits(keys: Sequence[PageKey], resident: Container[PageKey]) -> int:
    """How many of a lookup's pages, from its first, ``resident`` holds (the leading run of hits,
    as SGLang counts it)."""
    for i, key in enumerate(keys):
        if key not in resident:
            return i
    return len(keys)


def sample_rate(capacity_pages: int) -> float:
    """Fraction of the key space sampled for a tier of ``capacity_pages`` pages."""
    return min(1.0, max(SAMPLE_RATE, MIN_SHADOW_PAGES / max(1, capacity_pages)))


def elect(leader: int, score: Sequence[float],
          pair: Callable[[int, int], tuple[float, float, float]]) -> int:
    """The expert to follow after ``leader``: the challenger ahead by most, if its lead is large
    enough to pay for the change and any noise model calls it real. ``score`` is each expert's
    (decayed) prefix hits; ``pair(i, leader)`` the (decayed) requests where the two differ, the sum
    of their squared differences, and of the absolute ones. ``Tournament`` and the capacity
    curves' model of the adaptive policy (``curve``) both elect with it."""
    best, margin = leader, 0.0
    lead = score[leader]
    floor = MIN_LEAD * lead
    for i, s in enumerate(score):
        gap = s - lead
        if gap <= margin or gap < floor or s < MIN_EVIDENCE:
            continue
        differ, spread, discord = pair(i, leader)
        many = differ >= MIN_EVIDENCE
        if (gap > SWITCH_SIGMAS * math.sqrt(s + lead)
                or (many and gap > SWITCH_SIGMAS * math.sqrt(spread))
                or (many and gap > SWITCH_SIGMAS * math.sqrt(discord))):
            best, margin = i, gap
    return best


class ShadowCache:
    """One expert alone on a miniature cache of ``capacity_pages`` pages; keeps no data.

    ``real`` is the resident set of the tier it models: ``outcast`` keeps, oldest first, the sampled
    pages the real tier holds and this shadow does not (it evicted them, or never took them). They are
    the first victims when this shadow's expert leads, so the real tier converges to what the expert
    alone would hold, including pages the expert keeps for a long time and another leader dropped.
    """

    __slots__ = ("expert", "capacity", "resident", "hits", "lookups", "real", "outcast", "head_first")

    def __init__(self, expert: Expert, real: Container[PageKey] = frozenset(), head_first: bool = False):
        """``head_first``: a chain's pages are touched and added head first, so its tail ends most
        recent (``LruPolicy``'s order); by default tail first, as the store's own policies do."""
        self.expert = expert
        self.head_first = head_first
        self.capacity = expert.capacity
        self.resident: set[PageKey] = set()
        self.hits = 0
        self.lookups = 0
        self.real = real
        self.outcast: OrderedDict[PageKey, None] = OrderedDict()

    def access(self, keys: Sequence[PageKey]) -> int:
        """A request's sampled pages, in chain order; returns its prefix hits in this shadow."""
        resident, expert = self.resident, self.expert
        run = prefix_hits(keys, resident)
        for i in (range(run) if self.head_first else range(run - 1, -1, -1)):
            expert.hit(keys[i])
        fresh = [k for k in keys[run:] if k not in resident]
        if fresh:
            over = len(resident) + len(fresh) - self.capacity
            if over > 0:
                self._evict(over, frozenset(keys))
            fits = max(0, self.capacity - len(resident))
            outcast = self.outcast
            kept = fresh[:fits]  # the store writes a batch in order: its tail is lost
            for key in (kept if self.head_first else reversed(kept)):
                resident.add(key)
                expert.add(key)
                outcast.pop(key, None)
        self.hits += run
        self.lookups += len(keys)
        return run

    def _evict(self, count: int, protected: AbstractSet[PageKey]) -> None:
        chosen: list[PageKey] = []
        it = self.expert.candidates()
        try:
            for key in it:
                if key not in protected:
                    chosen.append(key)
                    if len(chosen) == count:
                        break
        finally:
            it.close()
        real = self.real
        for key in chosen:
            self.resident.discard(key)
            self.expert.drop(key)
            if key in real:
                self.outcast[key] = None

    def real_added(self, key: PageKey) -> None:
        """A sampled page became resident in the real tier."""
        if key not in self.resident:
            self.outcast[key] = None

    def real_removed(self, key: PageKey) -> None:
        self.outcast.pop(key, None)

    def entries(self) -> int:
        return len(self.resident) + self.expert.entries() + len(self.outcast)


class Tournament:
    """Shadows of every expert class for one tier, and which of them leads.

    Args:
        experts: one fresh expert per candidate, sized for the shadow (``sample_rate`` of the tier).
        rate: the sampled fraction of the key space.
        leader: index of the expert followed before there is evidence.
        real: the modelled tier's resident pages (the record's), read only.
    """

    def __init__(self, experts: Sequence[Expert], rate: float, leader: int = 0,
                 real: Container[PageKey] = frozenset()):
        if not experts:
            raise ValueError("a tournament needs at least one expert")
        self.shadows = [ShadowCache(e, real) for e in experts]
        self.threshold = int(rate * (1 << 64))
        self.rate = rate
        self.score = [0.0] * len(experts)  # decayed prefix hits of each shadow
        n = len(experts)
        # Paired by request, decayed like ``score``: ``spread[i][j]`` sums the squares of shadow i's
        # prefix hits minus shadow j's, ``discord[i][j]`` their absolute values (pages hit by one
        # of the two only), ``differ[i][j]`` counts the requests where they differ.
        self.spread = [[0.0] * n for _ in range(n)]
        self.discord = [[0.0] * n for _ in range(n)]
        self.differ = [[0.0] * n for _ in range(n)]
        self.leader = leader
        self.switches = 0
        window = WINDOW_TURNOVERS * max(s.capacity for s in self.shadows)
        self._log_keep = math.log1p(-1.0 / window)  # decay per sampled page looked up

    def sampled(self, keys: Sequence[PageKey], hashes: Sequence[int]) -> list[PageKey]:
        threshold = self.threshold
        return [k for k, h in zip(keys, hashes) if h < threshold]

    def observe(self, keys: Sequence[PageKey]) -> None:
        """A request's sampled pages: every shadow replays them; the leader may change."""
        if not keys:
            return
        keep = math.exp(self._log_keep * len(keys))
        runs = [shadow.access(keys) for shadow in self.shadows]
        score, spread, discord, differ = self.score, self.spread, self.discord, self.differ
        for i, run in enumerate(runs):
            score[i] = score[i] * keep + run
            si, ci, di = spread[i], discord[i], differ[i]
            for j, other in enumerate(runs):
                d = run - other
                si[j] = si[j] * keep + d * d
                ci[j] = ci[j] * keep + abs(d)
                di[j] = di[j] * keep + (d != 0)
        self._elect()

    def _elect(self) -> None:
        """``elect`` over this tournament's sums, counting a change of leader."""
        spread, discord, differ = self.spread, self.discord, self.differ
        best = elect(self.leader, self.score,
                     lambda i, lead: (differ[i][lead], spread[i][lead], discord[i][lead]))
        if best != self.leader:
            self.leader = best
            self.switches += 1

    def is_sampled(self, key: PageKey) -> bool:
        return key_hash(key) < self.threshold

    def real_added(self, key: PageKey) -> None:
        for shadow in self.shadows:
            shadow.real_added(key)

    def real_removed(self, key: PageKey) -> None:
        for shadow in self.shadows:
            shadow.real_removed(key)

    def outcasts(self) -> OrderedDict[PageKey, None]:
        """Sampled pages of the real tier the leader's shadow does not hold, oldest first."""
        return self.shadows[self.leader].outcast

    def entries(self) -> int:
        return sum(s.entries() for s in self.shadows)
