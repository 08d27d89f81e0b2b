"""Replays requests through the real ``TieredStore`` over zero-byte tiers (``size_tier.SizeTier``) and
reports what the store did, from the store's own counters.

Per request (a prompt's chain of pages, arriving at ``t``), the calls SGLang makes:

1. ``exists_prefix(keys)``: the leading run of pages found is the prefix hit;
2. ``get_into`` of that run (pages found in a slower tier may be promoted);
3. ``put_from`` of the pages after the run, with ``parent`` = the last hit page.

The store runs with ``mover="inline"`` (placement work on the calling thread, so a replay is
deterministic) and with the trace's time as its clock. Nothing is re-implemented here: admission,
eviction, demotion and promotion are the store's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..api import PageKey, PlacementPolicy, PolicyReport
from ..policy.curve_feed import CurveFeed
from ..store import TieredStore
from .size_tier import SizeStaging, SizeTier, sized_page
from .trace import Request


@dataclass
class TierStats:
    capacity_bytes: int
    hit_pages: int = 0
    bytes_written: int = 0  # every page written into this tier (new pages, promotions, demotions)
    bytes_promoted: int = 0  # written here as promotions from a slower tier
    bytes_demoted: int = 0  # written here as demotions from a faster tier
    evictions: int = 0
    refused_writes: int = 0  # pages the tier had no room for


@dataclass
class SimResult:
    policy: str
    requests: int = 0
    lookup_pages: int = 0
    hit_pages: int = 0
    tiers: list[TierStats] = field(default_factory=list)
    policy_stats: PolicyReport = field(default_factory=PolicyReport)

    @property
    def hit_ratio(self) -> float:
        return self.hit_pages / self.lookup_pages if self.lookup_pages else 0.0

    def tier_hit_ratio(self, t: int) -> float:
        return self.tiers[t].hit_pages / self.lookup_pages if self.lookup_pages else 0.0

    def as_dict(self) -> dict:
        return {"policy": self.policy, "requests": self.requests, "lookup_pages": self.lookup_pages,
                "hit_pages": self.hit_pages, "hit_ratio": self.hit_ratio,
                "tiers": [dict(vars(t), hit_ratio=self.tier_hit_ratio(i)) for i, t in enumerate(self.tiers)],
                "policy_stats": self.policy_stats.as_dict()}


class Simulator:
    """Tiers of ``capacities`` bytes (fastest first) holding pages of ``page_bytes`` each, run by a
    ``TieredStore`` with ``policy`` (and its capacity curves, with ``curves``: in this thread, so a
    replay is deterministic)."""

    def __init__(self, policy: PlacementPolicy, capacities: Sequence[int], page_bytes: int, name: str = "",
                 curves: bool = False):
        if not capacities:
            raise ValueError("the simulator needs at least one tier")
        if page_bytes <= 0:
            raise ValueError(f"page_bytes must be positive, got {page_bytes}")
        self.policy = policy
        self.page = page_bytes
        self.caps = list(capacities)
        self.name = name or type(policy).__name__
        self._now = 0.0
        self._page = sized_page(page_bytes)
        self.store = TieredStore([SizeTier(f"t{i}", c) for i, c in enumerate(self.caps)], policy,
                                 mover="inline", clock=self._clock, staging=SizeStaging())
        self.curves = CurveFeed(self.store.tiers, self.store.names, policy, "inline") if curves else None
        if self.curves is not None:
            self.store.observe(self.curves)

    def _clock(self) -> float:
        return self._now

    def run(self, requests: Iterable[Request], progress: Callable[[int], None] | None = None) -> SimResult:
        for req in requests:
            self.request(req.keys, req.t)
            if progress is not None:
                progress(1)
        return self.result

    def request(self, keys: Sequence[PageKey], t: float) -> int:
        """One request's lookup, read of its prefix hit and write-back; returns the hit length."""
        self._now = t
        store, page = self.store, self._page
        run = store.exists_prefix(keys)
        if run:
            store.get_into(keys[:run], [page] * run)
        if run < len(keys):
            store.put_from(keys[run:], [page] * (len(keys) - run), keys[run - 1] if run else None)
        return run

    @property
    def result(self) -> SimResult:
        """What the store did so far, from its counters."""
        stats = self.store.stats()
        top = stats.lookups
        tiers = []
        for cap, name in zip(self.caps, self.store.names):
            t = stats.tiers[name]
            placed = t.placement
            tiers.append(TierStats(cap, hit_pages=t.reads.lookup_hits, bytes_written=placed.bytes_written,
                                   bytes_promoted=t.promotion.promotions * self.page,
                                   bytes_demoted=placed.demotions * self.page, evictions=placed.evictions,
                                   refused_writes=placed.write_failures))
        return SimResult(self.name, requests=top.lookups, lookup_pages=top.lookup_pages,
                         hit_pages=top.lookup_hit_pages, tiers=tiers, policy_stats=stats.policy)
