"""Capacity curves, online: the prefix hit ratio each tier would have had at sizes around its own.

An operator sizing a tier asks what twice (or half) the capacity would have served. The policy's
shadows (``shadow``) already answer "which expert" from miniature caches; the same construction
over several sizes answers "how big": for each multiple ``m`` of a tier's capacity ``C`` in
``MULTIPLIERS``, a miniature of the policy runs on the pages whose key hash falls in a fraction
``R_m`` of the hash space, at ``R_m * m * C`` pages (SHARDS, fixed-size variant, and its "miniature
simulation": Waldspurger et al., USENIX ATC 2017). ``R_m`` is chosen so each miniature holds at most
``SHADOW_PAGES`` pages, which bounds memory and the work per looked-up page (at most one sampled
page per miniature) whatever the tier's size; a miniature of a small tier is the tier itself
(``R_m`` = 1, exact).

What each size reports: the sampled pages looked up and the sampled prefix hits (a sampled page
hits when it and every sampled page before it in the request are resident, as SGLang counts the
leading run), scaled by ``1 / R_m`` to the whole stream.

Which miniature stands for which policy:

- ``lru`` (and the simulator's ``arc``, ``lirs``, ``lfuda``): its eviction expert alone
  (``shadow.ShadowCache``); the expert is the policy. Given several experts, a size reports the
  best one's hits.
- ``heat`` and ``adaptive``: no single expert is their order (heat's probation, ghosts and sketch;
  adaptive's switches between experts, which the best expert alone does not pay for), so the
  miniature is the policy itself on a ``policy.ledger.Ledger``, fed the lookups and write-backs the
  store would give it (``miniature.PolicyMiniature``). What the policy sizes by its capacity (heat's
  sketch, ghosts and reuse watch; adaptive's experts, shadows and decay window) scales with ``R_m``
  as the stream does. It runs with the policy's own config and without a clock (the store hands
  over lookups, not time). Exact at ``R_m`` = 1; within 1.7 points of an
  exact replay where measured; it costs about the policy's own work once per size.

docs/capacity_curves.md has the accuracy and cost measured (``scripts/bench_capacity_curves.py``).

Tiers are modelled as one cache each, fed every lookup: in a write-through store a slower tier holds
what the faster ones evicted, so "found in this tier or a faster one" behaves as one cache of this
tier's size. Counts are cumulative (Prometheus counters; a window is a ``rate()`` away).

Thread context: in a server, in a process of their own (``curve_process``: this module's work is
too much for the serving process); in the simulator, fed under the residency lock
(``store.residency``), like the policy, so a replay is deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..api import PageKey, PlacementPolicy
from ..config import PolicyConfig
from .adaptive import AdaptivePolicy
from .experts import EXPERTS, ArcExpert, Expert, LfuDaExpert, LirsExpert, LruExpert
from .heat import HeatPolicy
from .miniature import PolicyMiniature
from .shadow import ShadowCache, key_hash

# Sizes reported, as multiples of the tier's capacity: three halvings and three doublings.
MULTIPLIERS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
# Most pages one miniature holds. SHARDS' fixed-size variant reports miss ratio curves within a
# point at a few thousand sampled pages; here 2,048 missed a generated RAG trace's 8x point by 11
# points (long shared documents: few sampled chains) and 4,096 by 1 (docs/capacity_curves.md).
# Memory is bounded at about 7 sizes x experts x this many entries per tier.
SHADOW_PAGES = 4096


# Builds a policy for one tier of so many one-byte pages (a miniature's ``PolicyMiniature``).
PolicyFactory = Callable[[int], PlacementPolicy]


def curve_experts(policy_name: str) -> tuple[type[Expert], ...]:
    """The eviction experts whose miniatures stand for ``policy_name`` (see the module docstring);
    none for a policy modelled by a miniature of itself (``curve_policy``)."""
    if curve_policy(policy_name) is not None:
        return ()
    return {"adaptive": tuple(EXPERTS), "arc": (ArcExpert,), "lirs": (LirsExpert,),
            "lfuda": (LfuDaExpert,)}.get(policy_name, (LruExpert,))


def curve_policy(policy_name: str, config: PolicyConfig | None = None) -> PolicyFactory | None:
    """How to build the miniature of a policy that no single eviction expert is (``heat``,
    ``adaptive``), with ``config`` (its defaults when ``None``); ``None`` for the policies an expert
    models."""
    cls = {"heat": HeatPolicy, "adaptive": AdaptivePolicy}.get(policy_name)
    if cls is None:
        return None
    config = config or PolicyConfig(name=policy_name)
    return lambda pages: cls([pages], config)


def head_first(policy_name: str) -> bool:
    """Whether ``policy_name`` touches a chain's pages head first (``LruPolicy``: the tail ends most
    recent, so a small tier loses heads first); the others go tail first."""
    return policy_name == "lru"


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


class _Miniature(Protocol):
    """What a size reads of its miniatures (``shadow.ShadowCache``, ``miniature.PolicyMiniature``)."""

    hits: int

    def access(self, keys: Sequence[PageKey]) -> int: ...

    def entries(self) -> int: ...


class _Size:
    """The miniatures of one size, on one sample of the key space: one per expert, or the policy's."""

    __slots__ = ("multiplier", "pages", "threshold", "rate", "shadows", "lookups")

    def __init__(self, multiplier: float, pages: int, experts: Sequence[type[Expert]], head_first: bool,
                 policy: PolicyFactory | None):
        self.multiplier = multiplier
        self.pages = pages
        self.rate = min(1.0, SHADOW_PAGES / pages)
        self.threshold = int(self.rate * (1 << 64))
        shadow_pages = max(1, round(pages * self.rate))
        self.shadows: list[_Miniature] = [ShadowCache(cls(shadow_pages), head_first=head_first)
                                          for cls in experts]
        if policy is not None:
            self.shadows.append(PolicyMiniature(policy(shadow_pages), shadow_pages))
        self.lookups = 0


class CapacityCurve:
    """One tier's curve: miniatures of ``capacity_pages * m`` pages for every ``m`` in
    ``multipliers``, of the experts ``experts`` (touching chains ``head_first`` or tail first) and
    of the policy ``policy`` builds, if any."""

    def __init__(self, capacity_pages: int, experts: Sequence[type[Expert]],
                 multipliers: Sequence[float] = MULTIPLIERS, page_bytes: int = 1,
                 head_first: bool = False, policy: PolicyFactory | None = None):
        if capacity_pages < 1:
            raise ValueError(f"a capacity curve needs a tier of at least one page, not {capacity_pages}")
        if not experts and policy is None:
            raise ValueError("a capacity curve needs experts or a policy to model")
        self.capacity_pages = capacity_pages
        self.page_bytes = page_bytes
        self._sizes = [_Size(m, max(1, round(capacity_pages * m)), experts, head_first, policy)
                       for m in multipliers]

    def observe(self, keys: Sequence[PageKey], hashes: Sequence[int]) -> None:
        """A lookup of a chain, in order, with each key's ``key_hash``."""
        for size in self._sizes:
            threshold = size.threshold
            sampled = [k for k, h in zip(keys, hashes) if h < threshold]
            if not sampled:
                continue
            size.lookups += len(sampled)
            for shadow in size.shadows:
                shadow.access(sampled)

    def points(self) -> list[CurvePoint]:
        return [CurvePoint(s.multiplier, s.pages, s.pages * self.page_bytes, s.lookups / s.rate,
                           max(sh.hits for sh in s.shadows) / s.rate) for s in self._sizes]

    def entries(self) -> int:
        """Keys held by the miniatures (their memory is about 100-300 bytes each)."""
        return sum(sh.entries() for s in self._sizes for sh in s.shadows)


class TierCurves:
    """A capacity curve for every bounded tier of a store, started once the page size is known.

    Args:
        capacities: per tier (fastest first), its capacity in bytes, ``None`` for a tier that
            evicts on its own (its size is not ours to choose).
        policy_name: the placement policy's name (``curve_experts``, ``curve_policy``).
        config: the policy's config, which a miniature of the policy runs with (its defaults when
            ``None``).
    """

    def __init__(self, capacities: Sequence[int | None], policy_name: str,
                 config: PolicyConfig | None = None):
        self._capacities = list(capacities)
        self._experts = curve_experts(policy_name)
        self._policy = curve_policy(policy_name, config)
        self._head_first = head_first(policy_name)
        self.curves: list[CapacityCurve | None] = [None] * len(capacities)
        self.page_bytes = 0
        # CPU time fed to the miniatures, so an operator sees what the curves cost (a scheduler's
        # time under the GIL: they run where the policy is fed).
        self.busy_seconds = 0.0

    def start(self, page_bytes: int) -> None:
        """Size the miniatures for pages of ``page_bytes`` (the first page stored); once."""
        if self.page_bytes or page_bytes <= 0:
            return
        self.page_bytes = page_bytes
        self.curves = [None if c is None else
                       CapacityCurve(max(1, c // page_bytes), self._experts, page_bytes=page_bytes,
                                     head_first=self._head_first, policy=self._policy)
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
