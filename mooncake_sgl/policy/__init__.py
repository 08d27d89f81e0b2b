"""Placement policies (pure, event-fed; see ``api.PlacementPolicy``) and the factory the store uses."""

from __future__ import annotations

from collections.abc import Sequence

from ..api import PlacementPolicy, Tier
from ..config import PolicyConfig
from .lru import LruPolicy


def build_policy(config: PolicyConfig, tiers: Sequence[Tier]) -> PlacementPolicy:
    """The policy ``config`` names, for ``tiers`` (fastest first)."""
    if config.name == "lru":
        return LruPolicy(len(tiers))
    # Until the heat policy lands, heat falls back to the LRU baseline.
    return LruPolicy(len(tiers))
