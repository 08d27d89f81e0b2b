"""Replays requests through a ``PlacementPolicy`` exactly as ``TieredStore`` drives it, with byte-sized
tiers that hold no bytes, and counts what the store would have done.

Per request (a prompt's chain of pages, arriving at ``t``):

1. lookup: ``tick(t)``, find the fastest tier holding each page, ``on_lookup``; the leading run of
   found pages is the prefix hit, credited to the tier each page was found in;
2. read: pages of that run found below tier 0 are offered for promotion (``promotion_target``) and
   written into the target tier;
3. write-back: the pages after the run are written with ``parent`` = the last hit page: to tier 0,
   and to each slower tier that ``admit`` accepts; a page no tier took (a batch larger than
   tier 0) then goes to the first slower tier with room, admitted or not.

A write first makes room: ``victims`` for the missing bytes, each victim demoted where
``demotion_target`` says (unless already there), then removed (``on_remove``). A tier that cannot
make room takes what fits, as the store's tiers do. This mirrors ``store.TieredStore`` (``_write``,
``_make_room``, ``_demote``, ``_promote``); keep the two in step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..api import PageKey, PlacementPolicy
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
    policy_stats: dict[str, float] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        return self.hit_pages / self.lookup_pages if self.lookup_pages else 0.0

    def tier_hit_ratio(self, t: int) -> float:
        return self.tiers[t].hit_pages / self.lookup_pages if self.lookup_pages else 0.0

    def as_dict(self) -> dict:
        return {"policy": self.policy, "requests": self.requests, "lookup_pages": self.lookup_pages,
                "hit_pages": self.hit_pages, "hit_ratio": self.hit_ratio,
                "tiers": [dict(vars(t), hit_ratio=self.tier_hit_ratio(i)) for i, t in enumerate(self.tiers)],
                "policy_stats": self.policy_stats}


class Simulator:
    """Tiers of ``capacities`` bytes (fastest first) holding pages of ``page_bytes`` each."""

    def __init__(self, policy: PlacementPolicy, capacities: Sequence[int], page_bytes: int, name: str = ""):
        if not capacities:
            raise ValueError("the simulator needs at least one tier")
        if page_bytes <= 0:
            raise ValueError(f"page_bytes must be positive, got {page_bytes}")
        self.policy = policy
        self.page = page_bytes
        self.resident: list[set[PageKey]] = [set() for _ in capacities]
        self.caps = list(capacities)
        self.result = SimResult(name or type(policy).__name__, tiers=[TierStats(c) for c in capacities])

    def run(self, requests: Iterable[Request], progress: Callable[[int], None] | None = None) -> SimResult:
        for req in requests:
            self.request(req.keys, req.t)
            if progress is not None:
                progress(1)
        self.result.policy_stats = self.policy.stats()
        return self.result

    def request(self, keys: Sequence[PageKey], t: float) -> int:
        policy, res = self.policy, self.result
        where = self._locate(keys)
        run = next((i for i, w in enumerate(where) if w is None), len(where))
        policy.tick(t)
        policy.on_lookup(keys, where, None)
        res.requests += 1
        res.lookup_pages += len(keys)
        res.hit_pages += run
        for w in where[:run]:
            res.tiers[w].hit_pages += 1
        # Read path: SGLang reads only the prefix hit; slow-tier pages may be promoted.
        promote: dict[int, list[PageKey]] = {}
        for key, w in zip(keys[:run], where[:run]):
            if w:
                target = policy.promotion_target(key, w)
                if target is not None and target < w:
                    promote.setdefault(target, []).append(key)
        protected = frozenset(keys[:run])  # the store protects the pages of the read batch
        for target, ks in promote.items():
            res.tiers[target].bytes_promoted += self.page * self._write(target, ks, protected, None)
        # Write-back of the pages computed by this request.
        if run < len(keys):
            todo = keys[run:]
            parent = keys[run - 1] if run else None
            put_protected = frozenset(todo)
            admitted = [[True] * len(todo)] + [policy.admit(todo, t) for t in range(1, len(self.caps))]
            stored: set[PageKey] = set()
            for tier in range(len(self.caps)):
                ks = [k for k, ok in zip(todo, admitted[tier]) if ok]
                if ks:
                    self._write(tier, ks, put_protected, parent)
                    stored.update(k for k in ks if k in self.resident[tier])
            # As the store does: a page no admitting tier took goes to the first slower tier
            # that takes it (admission saves writes, it must not lose pages).
            for tier in range(1, len(self.caps)):
                ks = [k for k, ok in zip(todo, admitted[tier]) if not ok and k not in stored]
                if ks:
                    self._write(tier, ks, put_protected, parent)
                    stored.update(k for k in ks if k in self.resident[tier])
        return run

    def _locate(self, keys: Sequence[PageKey]) -> list[int | None]:
        out: list[int | None] = []
        for k in keys:
            for t, res in enumerate(self.resident):
                if k in res:
                    out.append(t)
                    break
            else:
                out.append(None)
        return out

    def _write(self, t: int, keys: Sequence[PageKey], protected: frozenset[PageKey],
               parent: PageKey | None) -> int:
        """Write ``keys`` into tier ``t`` (making room first); returns pages newly written."""
        resident = self.resident[t]
        fresh = [k for k in keys if k not in resident]
        if not fresh:
            return 0
        need = len(fresh) * self.page
        free = self.caps[t] - len(resident) * self.page
        if free < need:
            self._make_room(t, need - free, protected)
            free = self.caps[t] - len(resident) * self.page
        fits = max(0, min(len(fresh), free // self.page))
        stats = self.result.tiers[t]
        stats.refused_writes += len(fresh) - fits
        # The store writes a batch in order; what does not fit is the batch's tail.
        written = fresh[:fits]
        if written:
            resident.update(written)
            stats.bytes_written += self.page * len(written)
            self.policy.on_insert(written, t, [self.page] * len(written), parent)
        return len(written)

    def _make_room(self, t: int, need: int, protected: frozenset[PageKey]) -> None:
        victims = self.policy.victims(t, need, protected)
        if not victims:
            return
        down: dict[int, list[PageKey]] = {}
        for v in victims:
            target = self.policy.demotion_target(v, t)
            if target is not None and target > t:
                down.setdefault(target, []).append(v)
        for target, ks in down.items():
            move = [k for k in ks if k not in self.resident[target]]
            if move:
                n = self._write(target, move, protected | frozenset(move), None)
                self.result.tiers[target].bytes_demoted += self.page * n
        self.resident[t].difference_update(victims)
        self.result.tiers[t].evictions += len(victims)
        self.policy.on_remove(victims, t)
