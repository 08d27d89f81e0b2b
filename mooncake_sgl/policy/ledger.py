"""``Ledger``: a placement policy driven without a store, with the record of residency it reads.

A policy keeps ordering state only and reads sizes and membership from a record of residency
(``api.ResidencyView``); in the store that is ``store.residency.Residency``. Fed events directly (the
policy tests, a replay without tiers), a policy needs a record too: the ledger keeps one per tier
(pages and footprints), hands the policy its view, and feeds each event to the policy in the order
the store does: an arrival once the record holds the page, a departure while it still does, and
victims out of the record as soon as the policy names them (there is no eviction in flight here,
so no page is ever leaving). Holds are the caller's for one ``victims`` call: the pages it names
``protected`` (a write's own pages, in a miniature) are held while the policy chooses. Every other
attribute is the policy's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import Any

from ..api import PageKey, PlacementPolicy


class Ledger:
    """``policy`` with its own record of residency; ``unmanaged``: tiers that make room on their own,
    whose pages the store would neither record nor report (``TierCapabilities.self_evicting``)."""

    def __init__(self, policy: PlacementPolicy, unmanaged: Collection[int] = ()):
        self.policy = policy
        self._unmanaged = frozenset(unmanaged)
        self._pages: list[dict[PageKey, int]] = []
        self._views: list[Mapping[PageKey, int]] = []
        self._used: list[int] = []
        self._held: AbstractSet[PageKey] = frozenset()
        policy.bind(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    # ------------------------------------------------------------------ the view (api.ResidencyView)

    def pages(self, tier: int) -> Mapping[PageKey, int]:
        self._grow(tier)
        return self._views[tier]

    def used(self, tier: int) -> int:
        self._grow(tier)
        return self._used[tier]

    def held(self) -> AbstractSet[PageKey]:
        return self._held

    def held_bytes(self, tier: int) -> int:
        # Counted when asked: holds last one ``victims`` call here, which asks once for its tier.
        pages = self.pages(tier)
        return sum(n for k in self._held if (n := pages.get(k)) is not None) if self._held else 0

    # ------------------------------------------------------------------ events that change the record

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        if tier in self._unmanaged:
            return
        self._grow(tier)
        pages = self._pages[tier]
        fresh = {k: n for k, n in zip(keys, nbytes) if k not in pages}
        if fresh:
            pages.update(fresh)
            self._used[tier] += sum(fresh.values())
            self.policy.on_insert(list(fresh), tier, list(fresh.values()), parent)

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        self._grow(tier)
        pages = self._pages[tier]
        gone = [k for k in dict.fromkeys(keys) if k in pages]
        if gone:
            self.policy.on_remove(gone, tier)
            self._used[tier] -= sum(pages.pop(k) for k in gone)

    def victims(self, tier: int, nbytes: int, protected: AbstractSet[PageKey] = frozenset()
                ) -> list[PageKey] | None:
        """The policy's victims, ``protected`` held meanwhile (as the store holds a move's pages)."""
        self._held = protected
        try:
            chosen = self.policy.victims(tier, nbytes)
        finally:
            self._held = frozenset()
        if chosen:
            self._grow(tier)
            pages = self._pages[tier]
            self._used[tier] -= sum(pages.pop(k) for k in chosen)
        return chosen

    def on_evict_aborted(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int]) -> None:
        self._grow(tier)
        self._pages[tier].update(zip(keys, nbytes))
        self._used[tier] += sum(nbytes)
        self.policy.on_evict_aborted(keys, tier, nbytes)

    def _grow(self, tier: int) -> None:
        while len(self._pages) <= tier:
            pages: dict[PageKey, int] = {}
            self._pages.append(pages)
            self._views.append(MappingProxyType(pages))
            self._used.append(0)
