"""``Residency``: the one record of which managed tier holds which page, and the only caller of the
policy.

Facts and their owners:

- a tier owns its bytes and its own index of them (what ``contains`` answers);
- ``Residency`` owns, per managed tier (one that does not evict on its own), the pages the store
  put there and their footprints, which of them are *leaving* (an eviction under way), and per page
  a hold count: a page held by a write, a demotion or a promotion in flight is never a victim. The
  policy reads this record through a read-only view (``api.ResidencyView``, bound once): per tier,
  the pages not leaving and their footprints, and the held pages with their bytes per tier (kept
  current as each hold begins and ends, so choosing victims never walks the holds). It keeps
  ordering state only, no map beside the record, and hears of a change when it is committed here:
  of an arrival once the record holds the page, of a departure while it still does, so every page
  it ranks has its size here;
- the policy owns its decisions (which victims, which tier) and the ordering they need.

Moves out of a tier are two-phase, as the tiers' own writes are:

1. ``plan_room``: the policy names victims and forgets them (``PlacementPolicy.victims``) and
   names each one's demotion target; here they stay resident but leaving (out of the policy's
   view), so nothing else removes them while their bytes are being copied down or removed. The
   same call answers the rest of what a write asks before it writes (which of its pages the tier
   holds already, which are pinned), so a write takes the lock once to plan;
2. the store copies (demotes) and removes them through the tier;
3. ``commit_evict`` forgets the victims whose removal succeeded; ``abort_evict`` gives the rest
   back to the policy (``PlacementPolicy.on_evict_aborted``), so a tier whose ``remove`` failed
   still has evictable pages once it works again.

Lookups are recorded, not applied: ``record_lookup`` appends to a bounded, lossy buffer without
taking the lock (Caffeine's read buffer), and ``maintain`` drains it into the policy in one step
under the lock. A full buffer drops the oldest lookups (a lost recency signal costs a little
precision; a blocked reader costs latency). Decisions that depend on heat (``admit``,
``promotion_targets``, ``plan_room`` when it evicts) drain first, so they see every lookup that was
not dropped.

Every change to the record, and every lookup handed to the policy, is also an event
(``api.StoreEvent``) for the store's observers (``observers.EventHub``): queued under the lock, in
commit order, and delivered once the lock is released.

All methods are thread-safe; none does I/O. The lock is never held while a tier is called or an
observer runs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass

from ..api import (
    ExpertStanding,
    PageKey,
    PagesLookedUp,
    PagesRead,
    PagesRemoved,
    PagesStored,
    PlacementPolicy,
    PolicyReport,
    RemovalCause,
    StoreObserver,
)
from ..policy.promotion_reach import PromotionReach
from ..tally import Tally
from .observers import EventHub
from .stats import ResidencyStats

# Arbitrary: lookups buffered between maintenance runs. SGLang looks up once per prefetch, so this
# is far more than arrive between two writes; it only bounds memory when writes stop.
LOOKUP_BUFFER = 4096
# Buffered lookups that make the store ask the mover for a maintenance run (coalesced). Arbitrary.
DRAIN_AT = LOOKUP_BUFFER // 4


@dataclass(frozen=True, slots=True)
class Victim:
    """A page chosen to leave a managed tier, *leaving* until its eviction commits or aborts."""

    key: PageKey
    footprint: int
    target: int | None  # the tier the policy demotes it to; None, or one not slower: dropped


@dataclass(frozen=True, slots=True)
class RoomPlan:
    """What ``Residency.plan_room`` decided for a write into one tier, in one step under its lock."""

    need: int  # bytes of the batch's pages the record lacks there (held ones need no room)
    short: bool  # the tier cannot take them (and the reserve) without evicting, or cannot say
    # Chosen when the tier is short and said what it can take; each must end in ``commit_evict`` or
    # ``abort_evict``. Empty there: the policy could not free enough without a held page.
    victims: tuple[Victim, ...]
    pins: tuple[bool, ...] | None  # per key: pinned now; None when not asked


class _Ranked(Mapping[PageKey, int]):
    """One managed tier's pages that are not leaving, and their footprints: what its policy ranks.
    A live window on ``Residency``'s own maps, read under its lock (policies are called there)."""

    __slots__ = ("_resident", "_leaving")

    def __init__(self, resident: dict[PageKey, int], leaving: set[PageKey]):
        self._resident = resident
        self._leaving = leaving

    def __getitem__(self, key: PageKey) -> int:
        if key in self._leaving:
            raise KeyError(key)
        return self._resident[key]

    def get(self, key: PageKey, default: int | None = None) -> int | None:
        n = self._resident.get(key)
        return default if n is None or key in self._leaving else n

    def __contains__(self, key: object) -> bool:
        return key in self._resident and key not in self._leaving

    def __iter__(self) -> Iterator[PageKey]:
        leaving = self._leaving
        return (k for k in self._resident if k not in leaving)

    def __len__(self) -> int:
        return len(self._resident) - len(self._leaving)


class _View:
    """The ``api.ResidencyView`` a policy is bound to: reads of the record, nothing that writes it."""

    __slots__ = ("_ranked", "_used", "_held", "_held_bytes")

    def __init__(self, ranked: list[_Ranked], used: list[int], holds: dict[PageKey, int],
                 held_bytes: list[int]):
        self._ranked = ranked
        # The three below are ``Residency``'s own, which keeps them current.
        self._used = used
        self._held = holds.keys()
        self._held_bytes = held_bytes

    def pages(self, tier: int) -> Mapping[PageKey, int]:
        return self._ranked[tier]

    def used(self, tier: int) -> int:
        return self._used[tier]

    def held(self) -> AbstractSet[PageKey]:
        return self._held

    def held_bytes(self, tier: int) -> int:
        return self._held_bytes[tier]


class Residency:
    """Residency of the managed tiers and the policy behind it (see the module docstring).

    Args:
        policy: the placement policy; only ever called here, under ``_lock``, and bound to a
            read-only view of this record.
        managed: per tier, whether the store tracks its pages (not self-evicting).
        clock: logical time for ``policy.tick`` (monotonic seconds by default; the simulator's
            trace time).
        reach_bytes: tier 0's capacity, where a promotion into it must also be within reach
            (``mooncake_sgl.policy.promotion_reach``); ``None``: the policy's target stands.
    """

    def __init__(self, policy: PlacementPolicy, managed: Sequence[bool], clock: Callable[[], float],
                 reach_bytes: int | None = None):
        self.policy = policy
        self.events = EventHub()
        self.managed = list(managed)
        self._clock = clock
        self._lock = threading.Lock()
        self._resident: list[dict[PageKey, int]] = [{} for _ in managed]
        self._leaving: list[set[PageKey]] = [set() for _ in managed]
        self._used = [0] * len(self.managed)  # per tier, footprints of the pages not leaving
        self._holds: dict[PageKey, int] = {}
        # Per tier, footprints of the pages both ranked there (resident, not leaving) and held:
        # changed where a hold begins or ends and where a held page arrives, leaves or comes back.
        self._held_bytes = [0] * len(self.managed)
        self._lookups: deque[tuple[float, Sequence[PageKey], list[int | None], PageKey | None]] = (
            deque(maxlen=LOOKUP_BUFFER))
        self.counters = Tally(ResidencyStats)
        self._reach = PromotionReach(reach_bytes) if reach_bytes and self.managed[0] else None
        policy.bind(_View([_Ranked(r, g) for r, g in zip(self._resident, self._leaving)], self._used,
                          self._holds, self._held_bytes))

    def observe(self, observer: StoreObserver, with_current: bool) -> None:
        """Send ``observer`` every event from now on; with ``with_current``, first the pages each
        managed tier holds now, as ``PagesStored``."""
        with self._lock:
            first = [PagesStored(t, tuple(held), tuple(held.values()))
                     for t, held in enumerate(self._resident) if held] if with_current else []
            self.events.add(observer, first)
        self.events.deliver()

    # ------------------------------------------------------------------ lookups

    def record_lookup(self, keys: Sequence[PageKey], where: list[int | None],
                      parent: PageKey | None) -> int:
        """Buffer a lookup for the next ``maintain``; returns how many are buffered now."""
        buf = self._lookups
        dropped = len(buf) == LOOKUP_BUFFER
        buf.append((self._clock(), keys, where, parent))  # deque.append is atomic
        self.counters.add(lookups_recorded=1, lookups_dropped=int(dropped))
        return len(buf)

    def maintain(self) -> None:
        """Feed every buffered lookup to the policy, in arrival order."""
        with self._lock:
            self._drain()
        self.events.deliver()

    def _drain(self) -> None:
        buf, policy = self._lookups, self.policy
        if not buf:
            return
        while buf:
            try:
                now, keys, where, parent = buf.popleft()
            except IndexError:
                break
            policy.tick(now)
            policy.on_lookup(keys, where, parent)
            if self._reach is not None:
                self._reach.used([k for k, w in zip(keys, where) if w == 0])
            self.events.post(PagesLookedUp(keys))
        self.counters.add(maintenance_runs=1)

    def read(self, event: PagesRead) -> None:
        """Tell the observers what a tier's read took (nothing is recorded: no lock is needed for
        the policy, only for the order of the events)."""
        if not self.events.observed:
            return
        with self._lock:
            self.events.post(event)
        self.events.deliver()

    # ------------------------------------------------------------------ holds

    @contextmanager
    def held(self, keys: Sequence[PageKey]) -> Iterator[None]:
        """While the block runs, none of ``keys`` is a victim in any tier (a write, demotion or
        promotion of them is in flight). Holds nest and count: a page two writers hold stays held
        until both are done."""
        holds = self._holds
        with self._lock:
            first = []
            for k in keys:
                n = holds.get(k, 0)
                holds[k] = n + 1
                if not n:
                    first.append(k)
            self._count_held(first, 1)
        try:
            yield
        finally:
            with self._lock:
                last = []
                for k in keys:
                    n = holds[k] - 1
                    if n:
                        holds[k] = n
                    else:
                        del holds[k]
                        last.append(k)
                self._count_held(last, -1)

    def _count_held(self, keys: list[PageKey], sign: int) -> None:
        """``keys`` became held (``sign`` 1) or free (-1): their footprints in every tier that ranks
        them move in or out of that tier's held bytes."""
        if not keys:
            return
        for t, (resident, leaving) in enumerate(zip(self._resident, self._leaving)):
            if resident:
                self._held_bytes[t] += sign * sum(
                    n for k in keys if (n := resident.get(k)) is not None and k not in leaving)

    # ------------------------------------------------------------------ residency

    def holds(self, t: int, key: PageKey) -> bool:
        """Does the store know ``key`` to be in managed tier ``t``."""
        return key in self._resident[t]

    def keys_in(self, t: int) -> set[PageKey]:
        """A snapshot of tier ``t``'s resident pages (consistency checks, ``clear``)."""
        with self._lock:
            return set(self._resident[t])

    def inserted(self, t: int, keys: Sequence[PageKey], footprints: Sequence[int],
                 parent: PageKey | None) -> list[bool]:
        """Pages became readable in tier ``t``; the new ones are recorded and told to the policy.
        Returns, per key, whether it is new there (always ``True`` for an unmanaged tier, whose
        contents the store does not know)."""
        if not self.managed[t]:
            return [True] * len(keys)
        if not keys:
            return []
        with self._lock:
            resident = self._resident[t]
            new = [k not in resident for k in keys]
            fresh = {k: n for k, n, f in zip(keys, footprints, new) if f}  # each told once
            if fresh:
                resident.update(fresh)
                self._used[t] += sum(fresh.values())
                if self._holds:
                    self._held_bytes[t] += sum(n for k, n in fresh.items() if k in self._holds)
                self.policy.on_insert(list(fresh), t, list(fresh.values()), parent)
                if t == 0 and self._reach is not None:
                    self._reach.arrived(list(fresh), list(fresh.values()))
                self.events.post(PagesStored(t, tuple(fresh), tuple(fresh.values())))
        self.events.deliver()
        return new

    def lost(self, t: int, keys: Sequence[PageKey], cause: RemovalCause = RemovalCause.LOST) -> None:
        """Pages left tier ``t`` outside an eviction (removed, found corrupt, dropped by the tier,
        cleared). Pages being evicted are left to their eviction's commit or abort."""
        if not self.managed[t] or not keys:
            return
        with self._lock:
            resident, leaving = self._resident[t], self._leaving[t]
            gone = [k for k in dict.fromkeys(keys) if k in resident and k not in leaving]
            if gone:
                self.policy.on_remove(gone, t)  # first: it reads their sizes here
                if self._holds:
                    self._held_bytes[t] -= sum(resident[k] for k in gone if k in self._holds)
                self._used[t] -= sum(resident.pop(k) for k in gone)
                self.events.post(PagesRemoved(t, tuple(gone), cause))
        self.events.deliver()

    # ------------------------------------------------------------------ two-phase eviction

    def plan_room(self, t: int, free: int, keys: Sequence[PageKey] = (), footprints: Sequence[int] = (),
                  reserve: Callable[[int], int] | None = None, pins: bool = False) -> RoomPlan:
        """Room in tier ``t`` for the batch ``keys`` (each page's ``footprints`` there), decided in
        one step under the lock (see ``RoomPlan``). ``free``: the bytes the tier says it can take
        now (negative: it cannot say, and nothing is evicted). ``reserve(need)``: bytes to keep
        free beyond the batch's ``need`` (the mover's headroom, which grows with the largest
        batch); not asked for a batch the tier holds whole, asked alone when there is no batch. It
        runs under the lock: arithmetic only, no tier call. ``pins``: also say which of ``keys``
        are pinned now.

        Raises: ``RuntimeError`` when the policy names a page its view of ``t`` lacks (no victim is
        marked leaving then). The policies of this package cannot: they take victims' sizes from
        the view and skip what it lacks. A policy from elsewhere is checked here. Whatever else
        the policy raises once victims are marked leaving gives them back first: the caller never
        sees them, so it could not end their eviction.
        """
        policy = self.policy
        need, short = 0, False
        chosen: list[PageKey] = []
        try:
            with self._lock:
                resident = self._resident[t]
                if self.managed[t]:
                    need = sum(n for k, n in zip(keys, footprints) if k not in resident)
                    total = need + reserve(need) if reserve is not None and (need > 0 or not keys) else need
                    short = free < total and total > 0
                    if short and free >= 0:
                        chosen = self._mark_leaving(t, total - free)
                try:
                    # Asked once the policy has let the victims go, as it decides them for pages
                    # leaving the tier.
                    targets = [policy.demotion_target(k, t) for k in chosen]
                    pinned = tuple(policy.is_pinned(k) for k in keys) if pins else None
                except BaseException:
                    self._give_back(t, chosen, [resident[k] for k in chosen])
                    raise
                victims = tuple(Victim(k, resident[k], target) for k, target in zip(chosen, targets))
        finally:
            self.events.deliver()
        self.counters.add(evictions_prepared=len(victims))
        return RoomPlan(need, short, victims, pinned)

    def _mark_leaving(self, t: int, nbytes: int) -> list[PageKey]:
        """The policy's victims freeing ``nbytes`` of tier ``t``, marked leaving (none: it cannot)."""
        self._drain()
        chosen = self.policy.victims(t, nbytes)
        if not chosen:
            return []
        resident, leaving, holds = self._resident[t], self._leaving[t], self._holds
        unknown = [k for k in chosen if k not in resident or k in leaving or k in holds]
        if unknown:
            raise RuntimeError(f"{type(self.policy).__name__} named {len(unknown)} victim(s) of "
                               f"tier {t} that are not resident there, already leaving, or held")
        leaving.update(chosen)
        self._used[t] -= sum(resident[k] for k in set(chosen))
        return chosen

    def commit_evict(self, t: int, keys: Sequence[PageKey]) -> None:
        """The victims ``keys`` are gone from tier ``t``: forget them (the policy already has)."""
        if not keys:
            return
        with self._lock:
            resident, leaving = self._resident[t], self._leaving[t]
            gone = [k for k in keys if k in leaving]
            for k in gone:
                leaving.discard(k)
                del resident[k]
            if gone:
                self.events.post(PagesRemoved(t, tuple(gone), RemovalCause.EVICTED))
        self.events.deliver()
        self.counters.add(evictions_committed=len(keys))

    def abort_evict(self, t: int, victims: Sequence[Victim]) -> None:
        """The victims are still in tier ``t`` (their removal failed): the policy gets them back."""
        if not victims:
            return
        with self._lock:
            self._give_back(t, [v.key for v in victims], [v.footprint for v in victims])
        self.counters.add(evictions_aborted=len(victims))

    def _give_back(self, t: int, keys: Sequence[PageKey], footprints: Sequence[int]) -> None:
        if not keys:
            return
        resident, leaving, holds = self._resident[t], self._leaving[t], self._holds
        for k in keys:
            if k in leaving:
                leaving.discard(k)
                self._used[t] += resident[k]
                if k in holds:  # held while it was leaving (a write of it began meanwhile)
                    self._held_bytes[t] += resident[k]
        self.policy.on_evict_aborted(keys, t, footprints)

    # ------------------------------------------------------------------ decisions

    def admit(self, keys: Sequence[PageKey], ntiers: int) -> list[list[bool]]:
        """Per tier, per key: write it there now (tier 0 always takes every page)."""
        with self._lock:
            self._drain()
            admitted = [[True] * len(keys) if t == 0 else self.policy.admit(keys, t) for t in range(ntiers)]
        self.events.deliver()
        return admitted

    def promotion_targets(self, keys: Sequence[PageKey], found: Sequence[int]) -> list[int | None]:
        """Where each page a read found (in tier ``found[i]``) is copied up to: the policy's
        target, into tier 0 only if the page is within reach there (a pinned page always is)."""
        with self._lock:
            self._drain()
            policy, reach = self.policy, self._reach
            targets = [policy.promotion_target(k, t) for k, t in zip(keys, found)]
            if reach is not None:
                beyond = 0
                for i, (k, target) in enumerate(zip(keys, targets)):
                    if target != 0:
                        reach.used((k,))
                    elif not reach.judge(k) and not policy.is_pinned(k):
                        targets[i] = None
                        beyond += 1
                self.counters.add(promotions_beyond_reach=beyond)
        self.events.deliver()
        return targets

    def policy_stats(self) -> tuple[PolicyReport, list[ExpertStanding]]:
        """The policy's own counters and its experts' standings, read together."""
        with self._lock:
            return self.policy.stats(), self.policy.standings()
