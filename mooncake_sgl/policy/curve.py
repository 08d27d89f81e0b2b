"""Capacity curves, online: the prefix hit ratio each tier would have had at sizes around its own.

An operator sizing a tier asks what twice (or half) the capacity would have served. For each
multiple ``m`` of a tier's capacity ``C`` in ``MULTIPLIERS`` a curve reports the prefix hits a tier
of ``m * C`` pages would have had over every page looked up so far (a page hits when it and every
page before it in its lookup are resident, as SGLang counts the leading run).

LRU (``lru``): one pass of ``stack.PrefixStack`` gives every size at once: a page is resident in an
LRU cache of ``C`` pages when fewer than ``C`` pages were used since it was, so a larger cache never
hits less. Exact for LRU touching every page of a lookup head first; ``LruPolicy`` leaves pages
resident past a miss where they were, which differs only for a chain caught across the eviction
boundary or longer than the tier (docs/capacity_curves.md). Tiers whose 8x reaches past half of
``stack.TRACKED_PAGES`` pages are sampled (SHARDS), their positions still exact.

The other policies are no stack algorithm (a page's standing depends on the cache's size), so each
size runs a model of the policy on a sample of the key space (SHARDS' "miniature simulation":
Waldspurger et al., USENIX ATC 2017): the pages whose key hash falls in a fraction ``R_m`` of the
hash space, in a tier of ``R_m * m * C`` pages. ``R_m`` keeps the miniature at
``MINIATURE_PAGES`` pages, which bounds the work per looked-up page whatever the tier's size; a
size of at most that many pages is its own miniature. A sampled miniature alone is biased: hits
are counted on sampled pages only, so a chain whose first page missed still hits in the miniature
past it, and a few shared heads (system prompts, hit by most lookups) swing the count with
whichever the hash drew (docs/capacity_curves.md: up to 5 points on traces of one-off documents
among conversations, or of several tenants). So beside the model runs LRU's miniature
(``LruMiniature``) on the same sample, and the size reports the exact LRU stack's hit ratio plus
the model's lead over LRU's miniature: the sampling errors the two share cancel (a control
variate), what the policy does better or worse than LRU remains.

The models:

- ``heat``: its own decisions (``heat_miniature.HeatMiniature``: heat's segments, links, sketch
  and pins on one tier of one-page pages, fed the lookups and write-backs the store would give
  the policy), with its own config and without a clock (the ``decay`` sketch and pin TTLs do not
  advance); exact where the miniature is the whole tier. What heat sizes by its capacity (sketch,
  ghosts) scales with ``R_m`` as the stream does; its leaves-first victim pass does not, and is
  held back on samples as the tier's chains hold it (``HeatMiniature.owe``).
- ``adaptive``: ``FollowTheLeader``, its four experts alone (the ARC, LIRS and LFU-DA its shadows
  run, and the control for its LRU), its election (``shadow.elect``, as its ``Tournament``), and
  per lookup the hits of the expert it follows. Three times cheaper than a miniature of the policy, whose
  evidence thresholds do not scale with the sample (sampled, it kept LRU long after the policy
  changed leaders); what the policy loses while its tier converges to a new leader is not counted.
- ``arc``, ``lirs``, ``lfuda`` (the simulator's): their expert alone (``shadow.ShadowCache``).

Tiers are modelled as one cache each, fed every lookup: in a write-through store a slower tier holds
what the faster ones evicted, so "found in this tier or a faster one" behaves as one cache of this
tier's size. Counts are cumulative (Prometheus counters; a window is a ``rate()`` away).

Thread context: in a server, in a process of their own (``curve_process``); in the simulator, on
the thread that feeds the store (``policy.curve_feed``), so a replay is deterministic.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..api import PageKey
from ..config import PolicyConfig
from .experts import EXPERTS, ArcExpert, Expert, LfuDaExpert, LirsExpert, LruExpert
from .heat_miniature import HeatMiniature
from .shadow import (
    WINDOW_TURNOVERS,
    ShadowCache,
    elect,
    key_hash,
    prefix_hits,
    sample_rate,
)
from .stack import TRACKED_PAGES, PrefixStack

# Sizes reported, as multiples of the tier's capacity: three halvings and three doublings.
MULTIPLIERS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# Pages of one sampled miniature, by policy: the work per looked-up page is about the sum over
# sizes of ``R_m`` times the model's own work per page, and at least one call per size per lookup
# on a small tier. ``adaptive``'s 24 pages were within 1.7 points of exact replays on every
# generated shape and cost three quarters of 32 (within 1.2); at 16 one shape missed by 2.3, at 8
# by 3.9. The simulator's experts keep 32. Heat's, its leaves held back as the tier's chains hold
# them (``HeatMiniature.owe``): 512 pages were within 1.5 points on every generated shape (4,096
# without it: 3.6 on one-off documents among conversations, at twice the cost on tiers of
# thousands of pages); 256 within 1.8; 64 missed by 3.4 (agent contexts longer than the tier).
MINIATURE_PAGES = {"heat": 512, "adaptive": 24, "arc": 32, "lirs": 32, "lfuda": 32}

@dataclass(frozen=True)
class CurvePoint:
    """One size of one tier's curve, estimated for the whole stream since the tier started."""

    multiplier: float
    capacity_pages: int
    capacity_bytes: int
    lookups: float  # pages looked up
    hits: float  # prefix hits a tier of ``capacity_pages`` would have had

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


class _Model(Protocol):
    """A policy on one sample of the key space (``HeatMiniature``, ``ShadowCache``,
    ``FollowTheLeader``, ``LruMiniature``)."""

    def access(self, keys: Sequence[PageKey]) -> int: ...

    def entries(self) -> int: ...


class LruMiniature:
    """LRU on a miniature of ``capacity_pages`` pages, every page of a lookup touched tail first:
    the model of ``PrefixStack(head_first=False)``, on the same sample as a policy's miniature."""

    __slots__ = ("capacity", "order", "last")

    def __init__(self, capacity_pages: int):
        self.capacity = capacity_pages
        self.order: OrderedDict[PageKey, None] = OrderedDict()
        self.last = 0  # the prefix hits of the request last seen

    def access(self, keys: Sequence[PageKey]) -> int:
        """A request's sampled pages, in chain order; returns its prefix hits in this miniature."""
        order = self.order
        run = prefix_hits(keys, order)
        for key in reversed(keys):
            order[key] = None
            order.move_to_end(key)
        while len(order) > self.capacity:
            order.popitem(last=False)
        self.last = run
        return run

    def entries(self) -> int:
        return len(self.order)


class _Election:
    """The adaptive policy's choice of leader (``shadow.elect``: its tests and thresholds, over the
    same decayed window) over expert miniatures on a sample ``1 / scale`` as large as the one its
    own shadows would see: hits count ``scale`` times, so evidence builds as fast.

    Cheaper than ``shadow.Tournament`` for being kept beside seven sizes: the decay is one factor for
    every sum (``_log``: what they are all to be multiplied by), pairs are counted once, and the
    leader is only reconsidered after a request the experts did not hit alike (equal hits only
    weaken every challenger's case)."""

    __slots__ = ("shadows", "scale", "leader", "score", "spread", "discord", "differ", "_log",
                 "_log_keep")

    def __init__(self, experts: Sequence[Expert], scale: float):
        self.shadows = [ShadowCache(e) for e in experts]
        self.scale = scale
        n = len(experts) + 1  # LRU first, its hits brought by the caller
        self.leader = 0  # LRU, which the policy follows until another expert has evidence
        self.score = [0.0] * n
        # By pair (i < j): sums of the squared differences of their hits, of the absolute ones, and
        # the requests where they differ (``Tournament``'s ``spread``, ``discord``, ``differ``).
        self.spread = [[0.0] * n for _ in range(n)]
        self.discord = [[0.0] * n for _ in range(n)]
        self.differ = [[0.0] * n for _ in range(n)]
        self._log = 0.0
        self._log_keep = math.log1p(-1.0 / (WINDOW_TURNOVERS * max(s.capacity for s in self.shadows)))

    def observe(self, keys: Sequence[PageKey], lru: int) -> list[int]:
        """A request's sampled pages, and LRU's prefix hits on them: every shadow replays them, the
        leader may change; returns each expert's prefix hits, LRU's first."""
        runs = [lru, *(shadow.access(keys) for shadow in self.shadows)]
        self._log += self._log_keep * len(keys)
        if self._log < -600.0:  # fold the factor in before it underflows
            self._fold()
        inflate = math.exp(-self._log)
        scale = self.scale
        weight = scale * inflate
        score = self.score
        for i, run in enumerate(runs):
            score[i] += run * weight
        if min(runs) == max(runs):
            return runs
        spread, discord, differ = self.spread, self.discord, self.differ
        for i, run in enumerate(runs):
            for j in range(i + 1, len(runs)):
                d = abs(run - runs[j]) * scale
                if d:
                    spread[i][j] += d * d * inflate
                    discord[i][j] += d * inflate
                    differ[i][j] += weight
        keep = math.exp(self._log)
        self.leader = elect(self.leader, [v * keep for v in score], self._pair)
        return runs

    def _pair(self, i: int, j: int) -> tuple[float, float, float]:
        """``elect``'s sums for experts ``i`` and ``j``, kept once per pair (lower index first)."""
        a, b = min(i, j), max(i, j)
        keep = math.exp(self._log)
        return self.differ[a][b] * keep, self.spread[a][b] * keep, self.discord[a][b] * keep

    def _fold(self) -> None:
        keep = math.exp(self._log)
        self.score = [v * keep for v in self.score]
        for table in (self.spread, self.discord, self.differ):
            for row in table:
                row[:] = [v * keep for v in row]
        self._log = 0.0

    def entries(self) -> int:
        return sum(s.entries() for s in self.shadows)


class FollowTheLeader:
    """``adaptive`` on a sample: its experts alone (LRU, ARC, LIRS, LFU-DA: ``experts.EXPERTS``),
    rated as its shadows rate them, and the hits of the one it follows at each request. What the
    policy loses while its tier converges to a new leader's pages is not counted."""

    __slots__ = ("election", "lru")

    def __init__(self, capacity_pages: int, scale: float, lru: LruMiniature):
        # LRU is the control's miniature (tail first, as the LRU expert), run once for both.
        self.election = _Election([cls(capacity_pages) for cls in EXPERTS if cls is not LruExpert],
                                  scale)
        self.lru = lru

    def access(self, keys: Sequence[PageKey]) -> int:
        leader = self.election.leader
        return self.election.observe(keys, self.lru.access(keys))[leader]

    def entries(self) -> int:
        return self.election.entries()


class _Size:
    """One size: the policy's model on one sample of the key space, and beside it, unless the model
    is the policy itself on the whole stream, LRU's miniature on the same sample."""

    __slots__ = ("multiplier", "pages", "rate", "threshold", "model", "control", "hits",
                 "control_hits", "lookups", "_fed", "_owes")

    def __init__(self, multiplier: float, pages: int, miniature_pages: int,
                 build: Build, exact: bool):
        self.multiplier = multiplier
        self.pages = pages
        self.rate = min(1.0, miniature_pages / pages)
        self.threshold = int(self.rate * (1 << 64))
        small = max(1, round(pages * self.rate))
        self.control = None if exact and self.rate == 1.0 else LruMiniature(small)
        self.model = build(small, self.rate, self.control)
        self._fed = isinstance(self.model, FollowTheLeader)  # it feeds the control itself
        # A sampled heat's leaves are held back for the chain's pages it did not draw.
        self._owes = isinstance(self.model, HeatMiniature) and self.model.owed is not None
        self.hits = self.control_hits = self.lookups = 0

    def access_drawn(self, keys: Sequence[PageKey], drawn: Sequence[int]) -> None:
        """A lookup's pages at positions ``drawn`` (this size's sample, in chain order)."""
        sampled = [keys[i] for i in drawn]
        if self._owes:
            ends = [*drawn[1:], len(keys)]
            self.model.owe(sampled, [end - i - 1 for i, end in zip(drawn, ends)])
        self.access(sampled)

    def access(self, keys: Sequence[PageKey]) -> None:
        self.hits += self.model.access(keys)
        control = self.control
        if control is not None:
            self.control_hits += control.last if self._fed else control.access(keys)
        self.lookups += len(keys)

    def ratio(self, lru: float) -> float:
        """The policy's hit ratio at this size, given LRU's (the stack's) over the whole stream."""
        if not self.lookups:
            return lru
        if self.control is None:
            return self.hits / self.lookups
        return min(1.0, max(0.0, lru + (self.hits - self.control_hits) / self.lookups))

    def entries(self) -> int:
        owed = self.model.owed if self._owes else None
        return (self.model.entries() + (self.control.entries() if self.control is not None else 0)
                + (len(owed) if owed is not None else 0))


def _evidence_scale(pages: int, rate: float) -> float:
    """What a hit in an expert's miniature of ``pages`` pages at sample ``rate`` counts for in the
    election. The policy's own shadows sample its tier at ``shadow.sample_rate``, ``1 / rate``
    times as much: counted that many times, the miniatures' noisier evidence (which keys the hash
    drew) changed leaders far earlier than the policy did; counted once, far later. The geometric
    mean was within 2 points of exact replays on every generated shape (docs/capacity_curves.md)."""
    return math.sqrt(sample_rate(round(pages / rate)) / rate)


# Builds a policy's model for a miniature of so many pages, sampled at a rate, beside LRU's
# miniature on the same sample (``None`` where the model is exact).
Build = Callable[[int, float, "LruMiniature | None"], _Model]


def _model(policy_name: str, config: PolicyConfig | None) -> tuple[Build, bool] | None:
    """How to build a policy's model for a miniature of so many pages at a sample rate, and whether
    it is the policy itself; ``None`` for the policies LRU's stack stands for."""
    if policy_name == "heat":
        heat = config or PolicyConfig(name=policy_name)
        return (lambda pages, rate, lru: HeatMiniature(pages, heat, sampled=rate < 1.0)), True
    if policy_name == "adaptive":
        def follow(pages: int, rate: float, lru: LruMiniature | None) -> _Model:
            assert lru is not None  # the model is not the policy: LRU's miniature is always beside it
            return FollowTheLeader(pages, _evidence_scale(pages, rate), lru)

        return follow, False
    expert = {"arc": ArcExpert, "lirs": LirsExpert, "lfuda": LfuDaExpert}.get(policy_name)
    if expert is not None:
        return (lambda pages, rate, lru: ShadowCache(expert(pages))), True
    return None


class CapacityCurve:
    """One tier's curve: the hit ratio of ``policy_name`` (run with ``config``) at
    ``capacity_pages * m`` pages for every ``m`` in ``multipliers``.

    Args:
        stack_pages: most pages the LRU stack tracks before it samples (``stack.TRACKED_PAGES``).
    """

    def __init__(self, capacity_pages: int, policy_name: str, config: PolicyConfig | None = None,
                 multipliers: Sequence[float] = MULTIPLIERS, page_bytes: int = 1,
                 stack_pages: int = TRACKED_PAGES):
        if capacity_pages < 1:
            raise ValueError(f"a capacity curve needs a tier of at least one page, not {capacity_pages}")
        self.capacity_pages = capacity_pages
        self.page_bytes = page_bytes
        self._multipliers = list(multipliers)
        self._pages = [max(1, round(capacity_pages * m)) for m in multipliers]
        model = _model(policy_name, config)
        # LRU's own curve is the head-first stack; the others' control is tail-first LRU, the
        # order in which they touch and insert chains.
        self.stack = PrefixStack(self._pages, head_first=model is None, budget=stack_pages)
        self._sizes: list[_Size] = []
        if model is not None:
            build, exact = model
            self._sizes = [_Size(m, p, MINIATURE_PAGES[policy_name], build, exact)
                           for m, p in zip(multipliers, self._pages)]
        sampled = [s.threshold for s in self._sizes if s.rate < 1.0]
        self._widest = max(sampled) if sampled else 0

    def observe(self, keys: Sequence[PageKey], hashes: Sequence[int]) -> None:
        """A lookup of a chain, in order, with each key's ``key_hash``."""
        self.stack.observe(hashes)
        if not self._sizes:
            return
        widest = self._widest
        drawn = [(i, h) for i, h in enumerate(hashes) if h < widest] if widest else []
        for size in self._sizes:
            if size.rate < 1.0:
                threshold = size.threshold
                positions = [i for i, h in drawn if h < threshold]
                if positions:
                    size.access_drawn(keys, positions)
            else:
                size.access(keys)

    def points(self) -> list[CurvePoint]:
        stack = self.stack
        looked = float(stack.lookups)
        out = []
        for i, (m, pages) in enumerate(zip(self._multipliers, self._pages)):
            hits = stack.hits[i]
            if self._sizes and looked:
                hits = self._sizes[i].ratio(hits / looked) * looked
            out.append(CurvePoint(m, pages, pages * self.page_bytes, looked, hits))
        return out

    def entries(self) -> int:
        """Keys held by the stack and the miniatures (their memory is about 100-300 bytes each)."""
        return self.stack.entries() + sum(s.entries() for s in self._sizes)


class TierCurves:
    """A capacity curve for every bounded tier of a store, started once the page size is known.

    Args:
        capacities: per tier (fastest first), its capacity in bytes, ``None`` for a tier that
            evicts on its own (its size is not ours to choose).
        policy_name: the placement policy's name (``lru``, ``heat``, ``adaptive``, or the
            simulator's ``arc``, ``lirs``, ``lfuda``; any other is modelled as ``lru``).
        config: the policy's config, which a miniature of the policy runs with (its defaults when
            ``None``).
    """

    def __init__(self, capacities: Sequence[int | None], policy_name: str,
                 config: PolicyConfig | None = None):
        self._capacities = list(capacities)
        self._policy = policy_name
        self._config = config
        self.curves: list[CapacityCurve | None] = [None] * len(capacities)
        self.page_bytes = 0
        # Seconds spent feeding the curves (where they run: their process's, or the simulator's).
        self.busy_seconds = 0.0

    def start(self, page_bytes: int) -> None:
        """Size the curves for pages of ``page_bytes`` (the first page stored); once."""
        if self.page_bytes or page_bytes <= 0:
            return
        self.page_bytes = page_bytes
        self.curves = [None if c is None else
                       CapacityCurve(max(1, c // page_bytes), self._policy, self._config,
                                     page_bytes=page_bytes)
                       for c in self._capacities]

    def on_lookup(self, keys: Sequence[PageKey]) -> None:
        if not self.page_bytes or not keys:
            return
        start = time.perf_counter()
        hashes = [key_hash(k) for k in keys]
        for curve in self.curves:
            if curve is not None:
                curve.observe(keys, hashes)
        self.busy_seconds += time.perf_counter() - start

    def points(self) -> list[list[CurvePoint]]:
        """Per tier, its curve (empty for a self-evicting tier, or before the first page)."""
        return [[] if c is None else c.points() for c in self.curves]

    def entries(self) -> int:
        return sum(c.entries() for c in self.curves if c is not None)
