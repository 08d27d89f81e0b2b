"""The write-through rules, written once for every policy and the simulator's references: every
write is admitted to every tier, a page found below tier 0 is promoted to it, and a victim moves one
tier down (the store skips the copy when the page is already there). ``WriteThrough`` is those rules
as a policy's decisions; a policy that gates them (``heat``: by heat) calls ``promotion_tier`` and
``demotion_tier`` for where a page goes once it is warm enough.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence

from ..api import PageKey, PlacementPolicy


def promotion_tier(found_tier: int) -> int | None:
    """Where a page found in ``found_tier`` is promoted to: tier 0, unless it is there already."""
    return 0 if found_tier > 0 else None


def demotion_tier(from_tier: int, ntiers: int) -> int | None:
    """Where a victim of ``from_tier`` moves to: the tier below, unless it is the last tier."""
    return from_tier + 1 if from_tier + 1 < ntiers else None


class WriteThrough(PlacementPolicy, ABC):
    """A policy over ``ntiers`` tiers whose admission, promotion and demotion are the write-through
    rules; it decides only which pages are victims."""

    def __init__(self, ntiers: int):
        if ntiers < 1:
            raise ValueError(f"{type(self).__name__} needs at least one tier")
        self.ntiers = ntiers

    def admit(self, keys: Sequence[PageKey], tier: int) -> list[bool]:
        return [True] * len(keys)

    def promotion_target(self, key: PageKey, found_tier: int) -> int | None:
        return promotion_tier(found_tier)

    def demotion_target(self, key: PageKey, from_tier: int) -> int | None:
        return demotion_tier(from_tier, self.ntiers)
