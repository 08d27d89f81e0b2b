"""``ChainedPolicy``: what the heat and adaptive policies share.

Both rank the pages of every bounded tier in their own way and keep, beside that ordering, only what
prefix awareness and pins need: per tier, each page's resident children (``TierState.kids``: a
parent is no victim before its children), chain links (``chains.ChainLinks``) and pins
(``pins.Pins``). Which tier holds a page, and its size, are read from the record
(``api.ResidencyView``). Here: the one ``on_insert`` prologue (the page size learnt from the first
write, nothing kept for a self-evicting tier, chains taken tail first), the bookkeeping of links
when a page arrives in or leaves a tier, and the bytes a tier could free.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..api import PageKey, PlacementPolicy, PolicyReport
from ..config import PinConfig
from .chains import ChainLinks
from .pins import Pins


@dataclass(frozen=True)
class ChainedReport(PolicyReport):
    """The counts ``ChainedPolicy`` keeps for the heat and adaptive policies, nested in their reports."""

    tracked_pages: int  # ranked in at least one tier
    pinned_pages: int


class TierState:
    """A policy's ordering state for one tier, as far as ``ChainedPolicy`` reads it."""

    __slots__ = ("capacity", "kids", "evictions")

    def __init__(self, capacity: int | None):
        self.capacity = capacity  # None: the tier makes room on its own, nothing is ranked there
        self.kids: dict[PageKey, int] = {}  # resident children in this tier, by parent
        self.evictions = 0


class ChainedPolicy(PlacementPolicy, ABC):
    """A policy over ``tiers`` (fastest first) with chain links and pins, reading residency from
    the record it is bound to."""

    def __init__(self, tiers: Sequence[TierState], pins: Sequence[PinConfig], links: ChainLinks):
        if not tiers:
            raise ValueError(f"{type(self).__name__} needs at least one tier")
        self._tiers = list(tiers)
        self._bounded = [t for t, s in enumerate(tiers) if s.capacity is not None]
        self._page_bytes = 0  # learnt from the first insert; sizes what is kept in pages
        self._tracked = 0  # pages ranked in at least one tier
        self._links = links
        self._pins = Pins(pins)
        self._now = 0.0

    # ------------------------------------------------------------------ hooks

    @abstractmethod
    def _sized(self) -> None:
        """The page size (``_page_bytes``) is known now: size what is kept in pages."""

    @abstractmethod
    def _place(self, state: TierState, tier: int, key: PageKey, nbytes: int) -> None:
        """``key`` arrived in bounded ``tier``: rank it."""

    def _advance(self, now: float) -> None:
        """Logical time moved forward to ``now`` (before pins expire)."""

    # ------------------------------------------------------------------ events

    def tick(self, now: float) -> None:
        if now <= self._now:
            return
        self._now = now
        self._advance(now)
        self._pins.tick(now)

    def is_pinned(self, key: PageKey) -> bool:
        return self._pins.is_pinned(key)

    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        if not keys:
            return
        if not self._page_bytes:
            self._page_bytes = max(1, max(nbytes))
            self._sized()
        state = self._tiers[tier]
        if state.capacity is None:
            # A self-evicting tier drops pages without telling anyone: tracking them would grow
            # without bound, and no victims are ever asked of it.
            return
        links = self._links
        for key, n in zip(reversed(keys), reversed(nbytes)):  # tail first: tails leave first
            self._place(state, tier, key, n)
            if not self._elsewhere(key, tier):
                links.adopt(key)
                self._tracked += 1
            p = links.parent_of(key)
            if p is not None:
                state.kids[p] = state.kids.get(p, 0) + 1

    def _chained_report(self) -> ChainedReport:
        """What every chained policy's report holds (its own ``stats()`` places it)."""
        return ChainedReport(self._tracked, len(self._pins))

    # ------------------------------------------------------------------ shared internals

    def _elsewhere(self, key: PageKey, tier: int) -> bool:
        """Is ``key`` ranked in a bounded tier other than ``tier``."""
        view = self.residency
        for t in self._bounded:
            if t != tier and key in view.pages(t):
                return True
        return False

    def _depart(self, state: TierState, tier: int, key: PageKey) -> None:
        """``key`` leaves ``tier`` (removed or chosen as a victim): its parent loses a child there,
        and a page ranked nowhere else loses its link and pin."""
        self._links.leave_tier(key, state.kids)
        if not self._elsewhere(key, tier):
            self._links.drop(key)
            self._pins.forget(key)
            self._tracked -= 1

    def _learn_links(self, keys: Sequence[PageKey], parent: PageKey | None) -> None:
        view = self.residency
        self._links.link_children(keys, parent, [view.pages(t) for t in self._bounded],
                                  [self._tiers[t].kids for t in self._bounded])

    def _evictable(self, tier: int) -> int:
        """Bytes of the tier that are neither held nor pinned (O(pinned): the record keeps the held
        bytes current)."""
        view = self.residency
        sizes: Mapping[PageKey, int] = view.pages(tier)
        held = view.held()
        pinned = 0
        for key in self._pins.keys():
            n = sizes.get(key)
            if n is not None and key not in held and self.is_pinned(key):
                pinned += n
        return view.used(tier) - view.held_bytes(tier) - pinned
