"""Placement policies (pure, event-fed; see ``api.PlacementPolicy``) and the factories that build them.

- ``lru.LruPolicy``   the baseline: per-tier recency, write-through, promote to tier 0, demote one down.
- ``heat.HeatPolicy`` decayed-frequency heat, prefix-aware eviction, adaptive probation, admission
                      filters for slower tiers, pins with TTL.
- ``adaptive.AdaptivePolicy`` the default: per tier, evicts as the best of LRU/ARC/LIRS/LFU-DA on
                      sampled shadow caches (``experts``, ``shadow``).
- ``rules``           the write-through rules (admit everywhere, promote to 0, demote one down), once.
- ``chained``         heat's and adaptive's shared base: chain links, pins, the ``on_insert`` prologue.
- ``sketch``          the bounded frequency estimators heat is built on.
- ``ledger``          a policy driven without a store, with the record of residency it reads
                      (the policy tests, the curves' miniatures).
- ``curve``, ``miniature``  capacity curves: miniatures of the policy at sizes around each tier's.

Every policy keeps ordering state only; sizes and membership are read from the record of residency
it is bound to (``api.ResidencyView``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..api import PlacementPolicy, Tier
from ..config import PolicyConfig
from .adaptive import AdaptivePolicy
from .heat import HeatPolicy
from .lru import LruPolicy


def build_policy(config: PolicyConfig, tiers: Sequence[Tier]) -> PlacementPolicy:
    """The policy ``config`` names, for ``tiers`` (fastest first), as the store uses it."""
    capacities = [None if t.capabilities.self_evicting else t.usage().capacity_bytes for t in tiers]
    return policy_for_capacities(config, capacities)


def policy_for_capacities(config: PolicyConfig, capacities: Sequence[int | None]) -> PlacementPolicy:
    """The policy ``config`` names for tiers of the given byte capacities (``None``: the tier makes
    room on its own). The trace simulator builds its policies here, so it runs the store's code."""
    if not capacities:
        raise ValueError("a policy needs at least one tier")
    if config.name == "lru":
        return LruPolicy(len(capacities))
    if config.name == "heat":
        return HeatPolicy(capacities, config)
    if config.name == "adaptive":
        return AdaptivePolicy(capacities, config)
    raise ValueError(f"unknown policy {config.name!r}; expected 'adaptive', 'heat' or 'lru'")
