"""LRU placement: the baseline policy.

Per tier, the resident pages in recency order (sizes are the record's, ``api.ResidencyView``), and
the write-through rules (``rules.WriteThrough``): every page written is admitted to every tier, a
page found in a slower tier is promoted to tier 0, and a victim of a tier is demoted to the next
tier below it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ..api import PageKey, PolicyReport
from .rules import WriteThrough


@dataclass(frozen=True)
class LruTierReport:
    pages: int


@dataclass(frozen=True)
class LruReport(PolicyReport):
    tiers: tuple[LruTierReport, ...]  # fastest first: ``tier{i}_pages``


class LruPolicy(WriteThrough):
    name = "lru"

    def __init__(self, ntiers: int):
        super().__init__(ntiers)
        self._order: list[OrderedDict[PageKey, None]] = [OrderedDict() for _ in range(ntiers)]

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        for key, tier in zip(keys, tiers):
            if tier is None:
                break  # SGLang uses a prefix only up to its first miss
            for order in self._order:
                if key in order:
                    order.move_to_end(key)

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        order = self._order[tier]
        for key in keys:
            order[key] = None

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        order = self._order[tier]
        for key in keys:
            order.pop(key, None)

    def victims(self, tier: int, nbytes: int) -> list[PageKey] | None:
        view = self.residency
        if view.used(tier) - view.held_bytes(tier) < nbytes:
            return None  # known without walking the order past every held page
        sizes, held = view.pages(tier), view.held()
        chosen: list[PageKey] = []
        freed = 0
        for key in self._order[tier]:
            if freed >= nbytes:
                break
            n = sizes.get(key)
            if n is None or key in held:  # only the record's pages can be victims
                continue
            chosen.append(key)
            freed += n
        if freed < nbytes:
            return None
        self.on_remove(chosen, tier)  # a victim is forgotten at once, as by every policy
        return chosen

    def stats(self) -> LruReport:
        return LruReport(tuple(LruTierReport(len(self.residency.pages(i))) for i in range(self.ntiers)))
