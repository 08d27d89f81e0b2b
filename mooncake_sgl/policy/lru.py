"""LRU placement: the baseline policy.

Per tier, an ordered map from key to size in recency order. Every page written is admitted to every
tier (write-through), a page found in a slower tier is promoted to tier 0, and a victim of a tier is
demoted to the next tier below it (the store skips the copy when the page is already there).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from ..api import PageKey, PlacementPolicy


class LruPolicy(PlacementPolicy):
    name = "lru"

    def __init__(self, ntiers: int):
        if ntiers < 1:
            raise ValueError("LruPolicy needs at least one tier")
        self._ntiers = ntiers
        self._tiers: list[OrderedDict[PageKey, int]] = [OrderedDict() for _ in range(ntiers)]

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        for key, tier in zip(keys, tiers):
            if tier is None:
                break  # SGLang uses a prefix only up to its first miss
            for t in self._tiers:
                if key in t:
                    t.move_to_end(key)

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        resident = self._tiers[tier]
        for key, n in zip(keys, nbytes):
            resident[key] = n
            resident.move_to_end(key)

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        resident = self._tiers[tier]
        for key in keys:
            resident.pop(key, None)

    def residents(self, tier: int) -> set[PageKey]:
        return set(self._tiers[tier])

    def admit(self, keys: Sequence[PageKey], tier: int) -> list[bool]:
        return [True] * len(keys)

    def victims(self, tier: int, nbytes: int, protected: AbstractSet[PageKey] = frozenset()
                ) -> list[PageKey] | None:
        chosen: list[PageKey] = []
        freed = 0
        for key, n in self._tiers[tier].items():
            if freed >= nbytes:
                break
            if key in protected:
                continue
            chosen.append(key)
            freed += n
        if freed < nbytes:
            return None
        self.on_remove(chosen, tier)  # a victim is forgotten at once, as by every policy
        return chosen

    def promotion_target(self, key: PageKey, found_tier: int) -> int | None:
        return 0 if found_tier > 0 else None

    def demotion_target(self, key: PageKey, from_tier: int) -> int | None:
        return from_tier + 1 if from_tier + 1 < self._ntiers else None

    def stats(self) -> dict[str, float]:
        return {f"tier{i}_pages": float(len(t)) for i, t in enumerate(self._tiers)}
