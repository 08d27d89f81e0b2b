"""The tiered page store: ``TieredStore`` and ``build_store``.

- ``core``       ``TieredStore``: request paths (lookup, cascade read, write with admission) and stats.
- ``placement``  ``Placement``: the one owner of residency, the lookup buffer, every policy call,
                 two-phase eviction (prepare → commit/abort).
- ``moves``      the placement I/O: two-phase eviction with demotion, promotion, headroom.
- ``mover``      where placement I/O runs: a bounded background thread, or inline.
- ``staging``    reusable buffers for pages the store moves between tiers itself.
- ``counters``   thread-safe counters, one set per source.
"""

from __future__ import annotations

from ..api import Tier
from ..config import StoreConfig
from .core import TieredStore

__all__ = ["TieredStore", "build_store"]


def build_store(config: StoreConfig, rank_suffix: str = "") -> TieredStore:
    """The store a config describes. ``rank_suffix`` keeps per-rank local files apart."""
    from ..policy import build_policy
    from ..tiers import build_tier

    tiers: list[Tier] = []
    try:
        for tier_config in config.tiers:
            tiers.append(build_tier(tier_config, rank_suffix=rank_suffix))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return TieredStore(tiers, build_policy(config.policy, tiers))
