"""``Placer``: writes pages into one tier, making room there first by two-phase eviction with
demotion, and keeps a headroom free in each managed tier.

One object owns the whole of "put these pages into tier t": one call plans the write
(``Residency.plan_room``: which pages ``t`` holds already, the victims the policy names and the tier
it demotes each to, the pins), room is made in ``t`` by evicting those victims, each first copied
into its demotion tier, and a copy into a slower tier is a write of this same object into that
tier. So demotion cascades downward (tier indices only grow, so it ends at the slowest tier) inside
this one class, which calls only the objects below it: ``TierCalls`` (the tiers), ``Residency`` (the
record and the policy), the mover (where a copy runs) and ``Staging`` (its buffers).

Where it runs: on the mover in the product, on the caller with ``mover="inline"``. A request thread
only chooses victims and removes those that need no copy; copying a victim down is another page's
I/O and waits for the mover (back-pressure, up to ``room_wait``; victims the mover has not started
on by then go back to the policy). After each write the mover keeps ``HEADROOM`` of each managed
tier free, so a write rarely waits.

Pages being written, demoted or promoted are held on the record (``Residency.held``), so room made
for them never evicts them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..api import PageKey, PageView, page_nbytes
from ..tally import Tally
from .mover import Mover
from .residency import Residency, RoomPlan, Victim
from .staging import Staging
from .stats import TierPlacementStats
from .tier_calls import TierCalls

# Arbitrary: share of each managed tier the mover keeps free after writes (at least two of the
# largest batches written there so far, at most a quarter of the tier), so writes rarely wait for
# eviction.
HEADROOM = 0.05
# Arbitrary: how long a write waits for the mover to make room before it writes what fits.
ROOM_WAIT = 5.0
# Arbitrary: how many times a tier's put is retried after making more room, when its real
# footprint turned out larger than estimated (LMDB page overhead, fragmentation).
MAX_ROOM_ROUNDS = 3


class Placer:
    """Writes into a tier with room made first (see the module docstring).

    Args:
        calls: the tiers.
        residency: the record of managed tiers and the policy.
        mover: where copies run (``BackgroundMover``), or the caller (``InlineMover``).
        staging: buffers for the victims it copies down.
        room_wait: seconds a request thread waits for the mover to make room.
    """

    def __init__(self, calls: TierCalls, residency: Residency, mover: Mover,
                 staging: Staging, room_wait: float = ROOM_WAIT) -> None:
        self._calls = calls
        self._residency = residency
        self._mover = mover
        self._staging = staging
        self._room_wait = room_wait
        n = len(calls)
        self.counters = [Tally(TierPlacementStats) for _ in range(n)]
        # Coalescing flags: at most one queued headroom task per tier. Plain bools: a lost race
        # queues one extra harmless task.
        self._headroom_queued = [False] * n
        self._largest_write = [0] * n

    # ------------------------------------------------------------------ writes

    def write(self, t: int, keys: list[PageKey], pages: list[PageView], parent: PageKey | None
              ) -> list[bool]:
        """Write into tier ``t``, making room first where the store manages the tier; per key
        ``True`` once the page is readable there."""
        calls, residency = self._calls, self._residency
        tier = calls.tiers[t]
        managed = calls.managed[t]
        soft_pin = tier.capabilities.soft_pin
        sizes = [page_nbytes(p) for p in pages]
        ok = [False] * len(keys)
        todo = list(range(len(keys)))
        counters = self.counters[t]
        for _ in range(MAX_ROOM_ROUNDS):
            batch_keys = [keys[i] for i in todo]
            roomy, pins = True, None
            if managed:
                # Short of room (a batch larger than the tier): the tier still takes what fits.
                roomy, pins = self._ensure_room(t, batch_keys, [tier.footprint(sizes[i]) for i in todo],
                                                soft_pin)
            elif soft_pin:  # working out the pins takes the policy's lock: only where they act
                pins = residency.plan_room(t, -1, batch_keys, pins=True).pins
            res = calls.put(t, batch_keys, [pages[i] for i in todo], pins)
            written, failed, was_held = [], [], []
            for i, good, h in zip(todo, res.ok, res.present):
                (written if good else failed).append(i)
                ok[i] = bool(good)
                if good:
                    was_held.append(h)
            new = residency.inserted(t, [keys[i] for i in written],
                                     [tier.footprint(sizes[i]) for i in written], parent)
            new = [f and not h for f, h in zip(new, was_held)]
            # Pages the tier already held were acknowledged without being written again.
            counters.add(writes=sum(new), bytes_written=sum(sizes[i] for i, f in zip(written, new) if f))
            todo = failed
            if not todo or not managed or not roomy:
                break
        counters.add(write_failures=len(todo))
        return ok

    # ------------------------------------------------------------------ room

    def _ensure_room(self, t: int, keys: list[PageKey], footprints: list[int], pins: bool
                     ) -> tuple[bool, tuple[bool, ...] | None]:
        """Make room in managed tier ``t`` for a batch: (whether it fits, its pins when asked)."""
        mover = self._mover
        on_mover = not mover.background or mover.on_mover_thread()
        # The mover's own writes (promotions, demotions) keep the headroom free, so they do not
        # take the room SGLang's next backup is about to need.
        reserve = self._reserve(t) if mover.background and on_mover else None
        free = self._calls.free(t)
        plan = self._residency.plan_room(t, free, keys, footprints, reserve, pins)
        self._largest_write[t] = max(self._largest_write[t], plan.need)
        # A request thread that outran the mover only chooses victims and removes those that need
        # no copy (a slower tier already holds them, or they are dropped); copying victims down is
        # another page's I/O, left to the mover.
        return self._make_room(t, plan, free, copy_here=on_mover), plan.pins

    def _make_room(self, t: int, plan: RoomPlan, free: int, copy_here: bool = True) -> bool:
        if not plan.short:
            return True
        if free < 0:
            return False
        if not plan.victims:
            self.counters[t].add(room_refused=1)
            return False
        return self._end_eviction(t, plan.victims, copy_here)

    def _end_eviction(self, t: int, victims: tuple[Victim, ...], copy_here: bool) -> bool:
        """Demote and remove planned victims, here or on the mover. Whatever happens on the way (a
        raise, a closed mover, a task cancelled or still queued when the wait ends), every victim
        ends committed or aborted: a victim left leaving would stay out of the policy's view for
        good, its bytes still in the tier."""
        # Who ends the eviction: the task, if it starts, or else this caller. One claim, so a task
        # that starts after the caller gave up finds the victims already given back.
        claim = threading.Lock()

        def evict() -> bool:
            return claim.acquire(blocking=False) and self._evict(t, victims)

        try:
            if copy_here or not self._needs_copy(t, victims):
                return evict()
            return self._mover.call(evict, default=False, timeout=self._room_wait)
        finally:
            if claim.acquire(blocking=False):
                self._residency.abort_evict(t, victims)
                self.counters[t].add(eviction_aborts=len(victims))

    def _needs_copy(self, t: int, victims: Sequence[Victim]) -> bool:
        """Would evicting ``victims`` copy any of them down (a reachable target tier not known to
        hold it). A target known to be cut off takes no copy: the victim is dropped at once, not
        after the mover, who may be stuck in a call to that very tier (a dead master's RPC
        timeout, ~4 s), gets round to it."""
        tiers, managed, residency = self._calls.tiers, self._calls.managed, self._residency
        return any(v.target is not None and v.target > t and tiers[v.target].reachable()
                   and not (managed[v.target] and residency.holds(v.target, v.key)) for v in victims)

    def _evict(self, t: int, victims: Sequence[Victim]) -> bool:
        """Demote and remove planned victims, then commit the removed and abort the rest, whatever
        raises on the way (tier calls cannot, the store's own code might)."""
        gone: list[PageKey] = []
        kept: Sequence[Victim] = victims
        try:
            self._demote(t, victims)
            gone, kept = self._remove_victims(t, victims)
        finally:
            try:
                self._residency.commit_evict(t, gone)
            finally:
                self._residency.abort_evict(t, kept)
        self.counters[t].add(evictions=len(gone), eviction_aborts=len(kept))
        return bool(gone)

    def _remove_victims(self, t: int, victims: Sequence[Victim]) -> tuple[list[PageKey], list[Victim]]:
        """(removed keys, victims still in the tier)."""
        keys = [v.key for v in victims]
        if self._calls.remove(t, keys) is not None:
            return keys, []
        gone = set(self._calls.gone(t, keys, False))
        return [k for k in keys if k in gone], [v for v in victims if v.key not in gone]

    def _demote(self, t: int, victims: Sequence[Victim]) -> None:
        calls = self._calls
        footprints = {v.key: v.footprint for v in victims}
        by_target: dict[int, list[PageKey]] = {}
        for v in victims:
            if v.target is not None and v.target > t:
                by_target.setdefault(v.target, []).append(v.key)
        for target in [x for x in by_target if not calls.tiers[x].reachable()]:
            # Cut off: a copy would only fail (after reading the victims for nothing).
            self.counters[t].add(demotion_failures=len(by_target.pop(target)))
        source = calls.tiers[t]
        for target, group in by_target.items():
            have = calls.contains(target, group)
            move = [k for k, h in zip(group, have) if not h]
            sizes = [n or footprints[k] for k, n in zip(move, calls.sizes(t, move))]
            for batch in self._staging.batches(sizes):
                bk = [move[i] for i in batch]
                staged = self._staging.pages(("demote", t), [sizes[i] for i in batch])
                got = calls.call(t, "get", source.get_into, bk, staged)
                self._mover.yield_now()
                moved = [k for k, g in zip(bk, got) if g]
                pages = [p for p, g in zip(staged, got) if g]
                ok: Sequence[bool] = []
                if moved:
                    with self._residency.held(moved):
                        ok = self.write(target, moved, pages, None)
                self.counters[target].add(demotions=sum(ok))
                self.counters[t].add(demotion_failures=len(bk) - sum(ok))

    # ------------------------------------------------------------------ headroom

    def keep_headroom_later(self, tiers: set[int]) -> None:
        """After a write into ``tiers``: ask the mover to bring each managed one back to its
        headroom (coalesced: one queued task per tier)."""
        if not self._mover.background:
            return
        for t in tiers:
            if (self._calls.managed[t] and not self._headroom_queued[t]
                    and self._calls.free(t) < self._reserve(t)(0)):
                self._headroom_queued[t] = True
                if not self._mover.submit(self._keep_headroom, t, urgent=True):
                    self._headroom_queued[t] = False

    def _reserve(self, t: int) -> Callable[[int], int]:
        """Tier ``t``'s headroom with a batch of ``need`` bytes about to be written: the batch
        counts towards the largest one. Arithmetic only, so the plan can ask it under its lock,
        once it knows the batch's need."""
        try:
            # Of what the tier can hold now: against a budget a full disk cannot reach, keeping a
            # share of the budget free would evict the whole tier.
            cap = self._calls.tiers[t].usage().holdable_bytes
        except Exception:
            return lambda need: 0
        least = max(int(cap * HEADROOM), 2 * self._largest_write[t])
        return lambda need: min(cap // 4, max(least, 2 * need))

    def _keep_headroom(self, t: int) -> None:
        self._headroom_queued[t] = False
        free = self._calls.free(t)
        self._make_room(t, self._residency.plan_room(t, free, reserve=self._reserve(t)), free)
