"""``Promoter``: copies pages a read found in a slower tier into the faster tier the policy names.

A read (``TieredStore.get_into``) hands the pages it found below tier 0 here. Inline, their bytes
are still in the caller's buffers and are written up at once; on the mover, the caller owns its
buffers once its call returned, so the pages are read again from the tier they were found in, into
staging buffers. The write up is ``Placer.write`` (room made first, with demotion). The pages are
held on the record while they move, so the room made for them never evicts them.
"""

from __future__ import annotations

from ..api import PageKey, PageView
from ..tally import Tally
from .mover import Mover
from .placer import Placer
from .residency import Residency
from .staging import Staging
from .stats import TierPromotionStats
from .tier_calls import TierCalls


class Promoter:
    """Promotion of pages found in slower tiers (see the module docstring).

    ``counters[t]["promotions"]`` counts the pages promoted into tier ``t``.
    """

    def __init__(self, calls: TierCalls, residency: Residency, placer: Placer,
                 mover: Mover, staging: Staging) -> None:
        self._calls = calls
        self._residency = residency
        self._placer = placer
        self._mover = mover
        self._staging = staging
        self.counters = [Tally(TierPromotionStats) for _ in range(len(calls))]

    def promote(self, keys: list[PageKey], found: list[int], pages: list[PageView] | None,
                hold: list[PageKey], nbytes: list[int]) -> None:
        """Copy ``keys`` (found in tiers ``found``, read at ``nbytes`` each) up where the policy
        says. ``pages`` holds their bytes already (inline); ``None`` means read them again from
        where they were found, at the size they were read at: a tier reads a page only into a
        destination of its stored size (the tier conformance suite holds every tier to it), so no
        tier is asked (the pool could not say; Mooncake Store asks its master once per page).
        ``hold`` are the pages no eviction may take meanwhile (the promoted ones, or the caller's
        whole read)."""
        with self._residency.held(hold):
            by_target: dict[int, list[int]] = {}
            for i, target in enumerate(self._residency.promotion_targets(keys, found)):
                if target is not None and target < found[i]:
                    by_target.setdefault(target, []).append(i)
            for target, idx in by_target.items():
                if pages is not None:
                    self._write_up(target, [keys[i] for i in idx], [pages[i] for i in idx])
                    continue
                by_source: dict[int, list[int]] = {}
                for i in idx:
                    by_source.setdefault(found[i], []).append(i)
                for source, sidx in by_source.items():
                    self._reread_and_write_up(source, target, [keys[i] for i in sidx],
                                              [nbytes[i] for i in sidx])

    def _reread_and_write_up(self, source: int, target: int, keys: list[PageKey], nbytes: list[int]) -> None:
        tier = self._calls.tiers[source]
        for batch in self._staging.batches(nbytes):
            bk = [keys[j] for j in batch]
            staged = self._staging.pages(("promote", source), [nbytes[j] for j in batch])
            got = self._calls.call(source, "get", tier.get_into, bk, staged)
            self._mover.yield_now()
            self._write_up(target, [k for k, g in zip(bk, got) if g],
                           [p for p, g in zip(staged, got) if g])

    def _write_up(self, target: int, keys: list[PageKey], pages: list[PageView]) -> None:
        if keys:
            ok = self._placer.write(target, keys, pages, None)
            self._mover.yield_now()
            self.counters[target].add(promotions=sum(ok))
