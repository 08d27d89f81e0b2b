"""The placement I/O of ``TieredStore``: making room (two-phase eviction with demotion), promotion
and headroom. A mixin, so the request paths (``core.py``) and the moves read as two files; the state
is the store's, declared below.

Where it runs: on the mover (``mover.py``) in the product, on the caller with ``placement="inline"``.
A request thread only chooses victims and removes those that need no copy; copying a victim down is
another page's I/O and waits for the mover (back-pressure, up to ``room_wait``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..api import PageKey, PageView, Tier
from .counters import Counters
from .mover import BackgroundMover, InlineMover
from .placement import Placement
from .staging import Staging

logger = logging.getLogger(__name__)

# Arbitrary: share of each managed tier the mover keeps free after writes (at least two of the
# largest batches written there so far, at most a quarter of the tier), so writes rarely wait for
# eviction.
HEADROOM = 0.05
# Arbitrary: how long a write waits for the mover to make room before it writes what fits.
ROOM_WAIT = 5.0


class PlacementWork:
    """Eviction, demotion, promotion and headroom over the store's tiers."""

    tiers: list[Tier]
    _managed: list[bool]
    _placement: Placement
    _mover: BackgroundMover | InlineMover
    _staging: Staging
    _room_wait: float
    _tier_counters: list[Counters]
    _headroom_queued: list[bool]
    _largest_write: list[int]
    _maintenance_queued: bool
    _guarded: Callable[..., Any]
    _write: Callable[..., list[bool]]

    def _yield_gil(self) -> None:
        """On the mover: let a request thread waiting for the GIL have it now, between the steps of
        a move, rather than after the interpreter's switch interval (5 ms), the wait a busy mover
        adds to SGLang's calls. Inline (the simulator) there is no one to yield to, and a yield on
        a loaded machine costs milliseconds."""
        if self._mover.background:
            time.sleep(0)

    def _ensure_room(self, t: int, need: int, protected: frozenset[PageKey]) -> bool:
        if need <= 0:
            return True
        if not self._mover.background:
            return self._free(t) >= need or self._make_room(t, need, protected)
        if self._mover.on_mover_thread():
            # The mover's own writes (promotions, demotions) keep the headroom free, so they do
            # not take the room SGLang's next backup is about to need.
            need += self._headroom(t)
            return self._free(t) >= need or self._make_room(t, need, protected)
        # A request thread that outran the mover: choosing victims is bookkeeping, and removing
        # victims that a slower tier already holds (or that are dropped) is part of this write;
        # only copying victims down is another page's I/O, left to the mover.
        free = self._free(t)
        if free >= need:
            return True
        if free < 0:
            return False
        victims = self._placement.prepare_evict(t, need - free, protected)
        if not victims:
            self._tier_counters[t].add(room_refused=1)
            return False
        if self._needs_copy(t, victims):
            return self._mover.call(self._evict, t, victims, protected, default=False,
                                    timeout=self._room_wait)
        return self._evict(t, victims, protected)

    def _needs_copy(self, t: int, victims: list[tuple[PageKey, int]]) -> bool:
        """Would evicting ``victims`` copy any of them down (a reachable target tier not known to
        hold it). A target known to be cut off takes no copy: the victim is dropped at once, not
        after the mover, who may be stuck in a call to that very tier (a dead master's RPC
        timeout, ~4 s), gets round to it."""
        keys = [k for k, _ in victims]
        for k, target in zip(keys, self._placement.demotion_targets(t, keys)):
            if target is not None and target > t and self.tiers[target].reachable() and not (
                    self._managed[target] and self._placement.holds(target, k)):
                return True
        return False

    def _free(self, t: int) -> int:
        tier = self.tiers[t]
        try:
            return tier.usage().free_bytes
        except Exception as e:
            logger.warning("tier %s: usage failed: %s", tier.name, e)
            return -1

    def _make_room(self, t: int, need: int, protected: frozenset[PageKey]) -> bool:
        """Evict (with demotion) until ``need`` bytes are free in tier ``t``; ``False`` when nothing
        could be freed."""
        free = self._free(t)
        if free < 0:
            return False
        if free >= need:
            return True
        victims = self._placement.prepare_evict(t, need - free, protected)
        if not victims:
            self._tier_counters[t].add(room_refused=1)
            return False
        return self._evict(t, victims, protected)

    def _evict(self, t: int, victims: list[tuple[PageKey, int]], protected: frozenset[PageKey]) -> bool:
        """Demote and remove prepared victims, then commit the removed and abort the rest."""
        self._demote(t, victims, protected)
        gone, kept = self._remove_victims(t, victims)
        self._placement.commit_evict(t, gone)
        self._placement.abort_evict(t, kept)
        self._tier_counters[t].add(evictions=len(gone), eviction_aborts=len(kept))
        return bool(gone)

    def _remove_victims(self, t: int, victims: list[tuple[PageKey, int]]
                        ) -> tuple[list[PageKey], list[tuple[PageKey, int]]]:
        """(removed keys, victims still in the tier)."""
        keys = [k for k, _ in victims]
        tier = self.tiers[t]
        if self._guarded(tier, "remove", tier.remove, keys) is not None:
            return keys, []
        gone = set(self._gone(t, keys, False))
        return [k for k in keys if k in gone], [v for v in victims if v[0] not in gone]

    def _gone(self, t: int, keys: list[PageKey], removed: bool) -> list[PageKey]:
        """Which ``keys`` are no longer in tier ``t``: all of them after a removal that worked;
        after one that failed, those the tier says it lacks (none if it cannot say)."""
        if removed or not keys:
            return keys
        tier = self.tiers[t]
        try:
            still = tier.contains(keys)
        except Exception as e:
            logger.warning("tier %s: contains after a failed remove failed: %s", tier.name, e)
            return []
        return [k for k, s in zip(keys, still) if not s]

    def _demote(self, t: int, victims: list[tuple[PageKey, int]], protected: frozenset[PageKey]) -> None:
        keys = [k for k, _ in victims]
        footprints = dict(victims)
        by_target: dict[int, list[PageKey]] = {}
        for k, target in zip(keys, self._placement.demotion_targets(t, keys)):
            if target is not None and target > t:
                by_target.setdefault(target, []).append(k)
        for target in [x for x in by_target if not self.tiers[x].reachable()]:
            # Cut off: a copy would only fail (after reading the victims for nothing).
            self._tier_counters[t].add(demotion_failures=len(by_target.pop(target)))
        source = self.tiers[t]
        for target, group in by_target.items():
            have = self._guarded(self.tiers[target], "contains", self.tiers[target].contains, group)
            move = [k for k, h in zip(group, have) if not h]
            sizes = [source.page_size_of(k) or footprints[k] for k in move]
            for batch in self._staging.batches(sizes):
                bk = [move[i] for i in batch]
                staged = self._staging.pages(("demote", t), [sizes[i] for i in batch])
                got = self._guarded(source, "get", source.get_into, bk, staged)
                self._yield_gil()
                moved = [k for k, g in zip(bk, got) if g]
                pages = [p for p, g in zip(staged, got) if g]
                ok = self._write(target, moved, pages, protected | frozenset(moved), None) if moved else []
                self._tier_counters[target].add(demotions=sum(ok))
                self._tier_counters[t].add(demotion_failures=len(bk) - sum(ok))

    def _promote(self, keys: list[PageKey], found: list[int], pages: list[PageView] | None,
                 protected: frozenset[PageKey]) -> None:
        """Copy pages found in slower tiers into the tier the policy names. ``pages`` holds their
        bytes already (inline); ``None`` means read them again from where they were found."""
        by_target: dict[int, list[int]] = {}
        for i, target in enumerate(self._placement.promotion_targets(keys, found)):
            if target is not None and target < found[i]:
                by_target.setdefault(target, []).append(i)
        for target, idx in by_target.items():
            if pages is not None:
                self._promote_into(target, [keys[i] for i in idx], [pages[i] for i in idx], protected)
                continue
            by_source: dict[int, list[int]] = {}
            for i in idx:
                by_source.setdefault(found[i], []).append(i)
            for source, sidx in by_source.items():
                self._reread_and_promote(source, target, [keys[i] for i in sidx], protected)

    def _reread_and_promote(self, source: int, target: int, keys: list[PageKey],
                            protected: frozenset[PageKey]) -> None:
        tier = self.tiers[source]
        sizes = [tier.page_size_of(k) or 0 for k in keys]
        present = [i for i, n in enumerate(sizes) if n]
        for batch in self._staging.batches([sizes[i] for i in present]):
            bk = [keys[present[j]] for j in batch]
            staged = self._staging.pages(("promote", source), [sizes[present[j]] for j in batch])
            got = self._guarded(tier, "get", tier.get_into, bk, staged)
            self._yield_gil()
            self._promote_into(target, [k for k, g in zip(bk, got) if g],
                               [p for p, g in zip(staged, got) if g], protected)

    def _promote_into(self, target: int, keys: list[PageKey], pages: list[PageView],
                      protected: frozenset[PageKey]) -> None:
        if keys:
            ok = self._write(target, keys, pages, protected, None)
            self._yield_gil()
            self._tier_counters[target].add(promotions=sum(ok))

    def _maintain(self) -> None:
        self._maintenance_queued = False
        self._placement.maintain()

    def _keep_headroom_later(self, tiers: set[int]) -> None:
        if not self._mover.background:
            return
        for t in tiers:
            if self._managed[t] and not self._headroom_queued[t] and self._free(t) < self._headroom(t):
                self._headroom_queued[t] = True
                if not self._mover.submit(self._keep_headroom, t, urgent=True):
                    self._headroom_queued[t] = False

    def _headroom(self, t: int) -> int:
        try:
            # Of what the tier can hold now: against a budget a full disk cannot reach, keeping a
            # share of the budget free would evict the whole tier.
            cap = self.tiers[t].usage().holdable_bytes
        except Exception:
            return 0
        return min(cap // 4, max(int(cap * HEADROOM), 2 * self._largest_write[t]))

    def _keep_headroom(self, t: int) -> None:
        self._headroom_queued[t] = False
        self._make_room(t, self._headroom(t), frozenset())
