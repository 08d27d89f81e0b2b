"""``TieredStore``: pages across tiers, fastest first, placed by a ``PlacementPolicy``.

Who owns what: each tier its bytes; ``Placement`` (``placement.py``) the residency of the managed
tiers and every call into the policy; ``moves.PlacementWork`` the placement I/O, run by the mover
(``mover.py``); this class the request paths and its counters (``Counters``, one set per source,
nested by ``stats``).

Request paths (SGLang's threads) do only their own pages' I/O:

- ``exists_prefix`` asks the tiers which of its pages they hold and buffers the lookup for the
  policy (no lock beyond the counters').
- ``get_into`` cascades: a batch is offered to tier 0, the keys it missed to tier 1, and so on. A
  page found in a slower tier is handed to the mover for promotion (dropped when the mover is
  backlogged); the mover reads it again from that tier, since the caller owns its buffer once the
  call returns.
- ``put_from`` writes tier 0 and every slower tier the policy admits; shared tiers (a pool or the
  Mooncake Store, seen by other SGLang instances) are written at the same time as the local ones,
  not after them, so another instance can read a backed-up page as early as possible. It returns
  once each ``True`` page is readable. A page no admitting tier could take goes to the first slower
  tier that takes it (admission saves writes; it must not lose pages).

Room in a managed tier is made by eviction with demotion, on the mover: after each write the mover
keeps ``moves.HEADROOM`` of each managed tier free, so a write rarely waits; when one does need room, it
asks the mover and waits (back-pressure) up to ``room_wait`` seconds, then writes what fits.
Eviction is two-phase (``Placement.prepare_evict`` → demote and remove → commit or abort): a victim
whose removal fails stays resident and evictable.

``placement="inline"`` runs the same placement work on the calling thread at once (the trace
simulator and latency baselines): the same code, in a deterministic order.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

from ..api import PageKey, PageView, PlacementPolicy, Tier, page_nbytes
from .counters import Counters
from .mover import BackgroundMover, InlineMover
from .moves import ROOM_WAIT, PlacementWork
from .placement import DRAIN_AT, Placement
from .staging import Staging

logger = logging.getLogger(__name__)

# Arbitrary: how many times a tier's put is retried after making more room, when its real
# footprint turned out larger than estimated (LMDB page overhead, fragmentation).
_MAX_ROOM_ROUNDS = 3

TIER_COUNTERS = ("hits", "misses", "bytes_read", "lookup_hits", "writes", "bytes_written",
                 "write_failures", "admission_refused", "promotions", "demotions", "demotion_failures",
                 "evictions", "eviction_aborts", "room_refused", "lost")
STORE_COUNTERS = ("lookups", "lookup_pages", "lookup_hit_pages", "promotions_dropped")


def _unique_names(tiers: Sequence[Tier]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for tier in tiers:
        n = seen.get(tier.name, 0)
        seen[tier.name] = n + 1
        out.append(tier.name if n == 0 else f"{tier.name}.{n}")
    return out


class TieredStore(PlacementWork):
    """Thread-safe page store over ``tiers`` (fastest first).

    Args:
        tiers: the tiers, fastest first; the store closes them.
        policy: decides placement; the store serialises every call into it.
        placement: ``"background"`` (placement I/O on the mover thread) or ``"inline"`` (on the
            caller, deterministic: simulator, baselines).
        clock: logical time for the policy (``time.monotonic`` by default).
        staging: buffers for pages the store moves itself (the simulator's hold no bytes).
        room_wait: seconds a write waits for the mover to make room.
    """

    def __init__(self, tiers: Sequence[Tier], policy: PlacementPolicy, *,
                 placement: Literal["background", "inline"] = "background",
                 clock: Callable[[], float] = time.monotonic, staging: Staging | None = None,
                 room_wait: float = ROOM_WAIT):
        if not tiers:
            raise ValueError("TieredStore needs at least one tier")
        if placement not in ("background", "inline"):
            raise ValueError(f"placement must be 'background' or 'inline', got {placement!r}")
        self.tiers = list(tiers)
        self.names = _unique_names(self.tiers)
        self._managed = [not t.capabilities.self_evicting for t in self.tiers]
        self._placement = Placement(policy, self._managed, clock)
        self._mover = BackgroundMover() if placement == "background" else InlineMover()
        self._staging = staging or Staging()
        self._room_wait = room_wait
        self._counters = Counters(STORE_COUNTERS)
        self._tier_counters = [Counters(TIER_COUNTERS) for _ in self.tiers]
        shared = [t for t, tier in enumerate(self.tiers) if tier.capabilities.shared]
        self._shared = frozenset(shared if placement == "background" else ())
        self._shared_writer = ThreadPoolExecutor(len(shared), "mooncake-sgl-shared-put") \
            if self._shared else None
        # Coalescing flags: at most one queued maintenance run and one headroom task per tier.
        # Plain bools: a lost race queues one extra harmless task.
        self._maintenance_queued = False
        self._headroom_queued = [False] * len(self.tiers)
        self._largest_write = [0] * len(self.tiers)
        self._closed = False
        # Metrics hook (``metrics.attach``, only under SGLang's --enable-metrics): called as
        # ``observe_latency(tier, what, seconds)`` after every tier call; ``None`` costs nothing.
        self.observe_latency: Callable[[Tier, str, float], None] | None = None
        self._seed_from_persistent_tiers()

    @property
    def policy(self) -> PlacementPolicy:
        return self._placement.policy

    # ------------------------------------------------------------------ public API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        """Per key: readable in some tier now."""
        return [t is not None for t in self._locate(keys)]

    def landed(self, keys: Sequence[PageKey]) -> list[bool]:
        """Per key: readable in some tier now, answered without a tier call where the store knows
        (a page resident in a tier the store manages); only the other keys are asked of the tiers
        that evict on their own (a pool, Mooncake Store), in one batch each. ``put_from`` already
        returns only once a page is readable; this is for a caller that wants to check later (a
        page backed up here, seen by another instance through a shared tier) without re-reading."""
        out = [any(self._placement.holds(t, k) for t, m in enumerate(self._managed) if m) for k in keys]
        pending = [i for i, known in enumerate(out) if not known]
        for t, tier in enumerate(self.tiers):
            if not pending:
                break
            if self._managed[t]:
                continue
            found = self._guarded(tier, "contains", tier.contains, [keys[i] for i in pending])
            for i, hit in zip(pending, found):
                out[i] = bool(hit)
            pending = [i for i in pending if not out[i]]
        return out

    def exists_prefix(self, keys: Sequence[PageKey], parent: PageKey | None = None) -> int:
        """Length of the leading run of ``keys`` readable in some tier. This is the access event
        the policy learns heat from (SGLang asks it once per prefetch); it is buffered, and applied
        at the next maintenance run."""
        where = self._locate(keys)
        run = next((i for i, t in enumerate(where) if t is None), len(where))
        self._counters.add(lookups=1, lookup_pages=len(keys), lookup_hit_pages=run)
        per_tier: dict[int, int] = {}
        for t in where[:run]:
            per_tier[t] = per_tier.get(t, 0) + 1  # type: ignore[index]
        for t, n in per_tier.items():
            self._tier_counters[t].add(lookup_hits=n)
        buffered = self._placement.record_lookup(keys, where, parent)
        if not self._mover.background:
            self._placement.maintain()
        elif buffered >= DRAIN_AT and not self._maintenance_queued:
            self._maintenance_queued = True
            if not self._mover.submit(self._maintain):
                self._maintenance_queued = False
        return run

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        """Copy each page into its destination from the fastest tier holding it; per key ``True``
        once its bytes are in place. Promotion of pages found in slower tiers happens later."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        done = [False] * len(keys)
        found_in: list[int] = [0] * len(keys)
        pending = list(range(len(keys)))
        for t, tier in enumerate(self.tiers):
            if not pending:
                break
            ok = self._guarded(tier, "get", tier.get_into,
                               [keys[i] for i in pending], [pages[i] for i in pending])
            missed, lost, nread = [], [], 0
            for i, hit in zip(pending, ok):
                if hit:
                    done[i] = True
                    found_in[i] = t
                    nread += page_nbytes(pages[i])
                else:
                    missed.append(i)
                    if self._managed[t] and self._placement.holds(t, keys[i]):
                        lost.append(keys[i])  # removed under us, or found corrupt by the tier
            self._tier_counters[t].add(hits=len(pending) - len(missed), misses=len(missed),
                                       bytes_read=nread)
            if lost:
                # A failed read is not proof the page left: ask the tier (a rare extra call, only
                # for pages the store believed were there).
                gone = self._gone(t, lost, False)
                self._tier_counters[t].add(lost=len(gone))
                self._placement.lost(t, gone)
            pending = missed
        slow = [i for i in range(len(keys)) if done[i] and found_in[i] > 0]
        if slow:
            sk, sf = [keys[i] for i in slow], [found_in[i] for i in slow]
            if self._mover.background:
                if not self._mover.submit(self._promote, sk, sf, None, frozenset(sk)):
                    self._counters.add(promotions_dropped=len(slow))
            else:
                self._promote(sk, sf, [pages[i] for i in slow], frozenset(keys))
        return done

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView],
                 parent: PageKey | None = None) -> list[bool]:
        """Write pages; per key ``True`` once the page is readable in at least one tier (every tier
        that acknowledged it, shared tiers included, serves it when this returns)."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        n = len(keys)
        stored = [False] * n
        if not n:
            return stored
        protected = frozenset(keys)
        admitted = self._placement.admit(keys, len(self.tiers))
        for t in range(1, len(self.tiers)):
            self._tier_counters[t].add(admission_refused=n - sum(map(bool, admitted[t])))
        shared: list[tuple[list[int], Future]] = []
        if self._shared_writer is not None:
            for t in self._shared:
                idx = [i for i in range(n) if admitted[t][i]]
                if idx:
                    fut = self._shared_writer.submit(self._write, t, [keys[i] for i in idx],
                                                     [pages[i] for i in idx], protected, parent)
                    shared.append((idx, fut))
        for t in range(len(self.tiers)):
            if t not in self._shared:
                self._write_some(t, keys, pages, [i for i in range(n) if admitted[t][i]], stored,
                                 protected, parent)
        for idx, fut in shared:
            try:
                ok = fut.result()
            except Exception:  # _write is guarded; this is the executor itself failing
                logger.exception("shared-tier write failed")
                ok = [False] * len(idx)
            for i, good in zip(idx, ok):
                stored[i] = stored[i] or good
        written = {t for t in range(len(self.tiers)) if any(admitted[t])}
        for t in range(1, len(self.tiers)):
            idx = [i for i in range(n) if not stored[i] and not admitted[t][i]]
            if idx:
                written.add(t)
                self._write_some(t, keys, pages, idx, stored, protected, parent)
        self._keep_headroom_later(written)
        return stored

    def remove(self, keys: Sequence[PageKey]) -> int:
        """Drop pages from every tier; returns how many (page, tier) copies were present."""
        removed = 0
        keys = list(keys)
        for t, tier in enumerate(self.tiers):
            got = self._guarded(tier, "remove", tier.remove, keys)
            removed += got or 0
            if self._managed[t]:
                known = [k for k in keys if self._placement.holds(t, k)]
                self._placement.lost(t, self._gone(t, known, got is not None))
        return removed

    def clear(self) -> None:
        for t, tier in enumerate(self.tiers):
            try:
                tier.clear()
                cleared = True
            except Exception as e:
                logger.warning("tier %s: clear failed: %s", tier.name, e)
                cleared = False
            if self._managed[t]:
                self._placement.lost(t, self._gone(t, list(self._placement.keys_in(t)), cleared))

    def register_memory(self, ptr: int, nbytes: int) -> None:
        for tier in self.tiers:
            self._guarded(tier, "register_memory", tier.register_memory, ptr, nbytes)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until the placement work queued so far has run (tests, benchmarks, shutdown)."""
        return self._mover.wait_idle(timeout)

    def resident_keys(self, t: int) -> set[PageKey]:
        """The pages the store knows to be in managed tier ``t`` (consistency checks)."""
        return self._placement.keys_in(t)

    def close(self) -> None:
        """Stop the mover (queued placement work is dropped), then close every tier."""
        if self._closed:
            return
        self._closed = True
        self._mover.close()
        if self._shared_writer is not None:
            self._shared_writer.shutdown(wait=True)
        for tier in self.tiers:
            try:
                tier.close()
            except Exception:
                logger.exception("closing tier %s failed", tier.name)

    def stats(self) -> dict[str, Any]:
        """Counters, one namespace per source; the shape is ``api.STATS_SHAPE``."""
        tiers: dict[str, Any] = {}
        for name, tier, counters in zip(self.names, self.tiers, self._tier_counters):
            try:
                u = tier.usage()
                usage: dict[str, Any] = {"capacity_bytes": u.capacity_bytes, "used_bytes": u.used_bytes,
                                         "holdable_bytes": u.holdable_bytes, "pages": u.pages}
            except Exception as e:  # a dead remote tier still reports its counters
                usage = {"error": str(e)}
            try:
                own = tier.stats()
            except Exception as e:
                own = {"error": str(e)}
            tiers[name] = {"usage": usage, "store": counters.snapshot(), "tier": own}
        return {"store": {**self._counters.snapshot(), **self._placement.counters.snapshot()},
                "mover": {"background": int(self._mover.background), **self._mover.counters.snapshot()},
                "policy": self._placement.policy_stats(), "tiers": tiers}

    # ------------------------------------------------------------------ writes

    def _write_some(self, t: int, keys: Sequence[PageKey], pages: Sequence[PageView], idx: list[int],
                    stored: list[bool], protected: frozenset[PageKey], parent: PageKey | None) -> None:
        if not idx:
            return
        ok = self._write(t, [keys[i] for i in idx], [pages[i] for i in idx], protected, parent)
        for i, good in zip(idx, ok):
            stored[i] = stored[i] or good

    def _write(self, t: int, keys: list[PageKey], pages: list[PageView], protected: frozenset[PageKey],
               parent: PageKey | None) -> list[bool]:
        """Write into tier ``t``, making room first where the store manages the tier."""
        tier = self.tiers[t]
        sizes = [page_nbytes(p) for p in pages]
        ok = [False] * len(keys)
        todo = list(range(len(keys)))
        counters = self._tier_counters[t]
        for _ in range(_MAX_ROOM_ROUNDS):
            roomy = True
            if self._managed[t]:
                need = sum(tier.footprint(sizes[i]) for i in todo
                           if not self._placement.holds(t, keys[i]))
                self._largest_write[t] = max(self._largest_write[t], need)
                # Short of room (a batch larger than the tier): the tier still takes what fits.
                roomy = self._ensure_room(t, need, protected)
            batch_keys, batch_pages = [keys[i] for i in todo], [pages[i] for i in todo]
            if tier.capabilities.soft_pin:
                put = functools.partial(tier.put_from, soft_pin=self._placement.pinned(batch_keys))
            else:
                put = tier.put_from
            res = self._guarded(tier, "put", put, batch_keys, batch_pages)
            held = getattr(res, "present", None) or [False] * len(todo)  # api.PutResult
            written, failed, was_held = [], [], []
            for i, good, h in zip(todo, res, held):
                (written if good else failed).append(i)
                ok[i] = bool(good)
                if good:
                    was_held.append(h)
            new = self._placement.inserted(t, [keys[i] for i in written],
                                           [tier.footprint(sizes[i]) for i in written], parent)
            new = [f and not h for f, h in zip(new, was_held)]
            # Pages the tier already held were acknowledged without being written again.
            counters.add(writes=sum(new), bytes_written=sum(sizes[i] for i, f in zip(written, new) if f))
            todo = failed
            if not todo or not self._managed[t] or not roomy:
                break
        counters.add(write_failures=len(todo))
        return ok

    # ------------------------------------------------------------------ internals

    def _guarded(self, tier: Tier, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a tier call; a failing tier yields misses, never an exception to the caller."""
        observe = self.observe_latency
        start = time.perf_counter() if observe is not None else 0.0
        try:
            return fn(*args)
        except Exception as e:
            logger.warning("tier %s: %s failed: %s", tier.name, what, e)
            if what in ("get", "put", "contains"):
                return [False] * len(args[0])
            return None
        finally:
            if observe is not None:
                observe(tier, what, time.perf_counter() - start)

    def _locate(self, keys: Sequence[PageKey]) -> list[int | None]:
        where: list[int | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        for t, tier in enumerate(self.tiers):
            if not pending:
                break
            found = self._guarded(tier, "contains", tier.contains, [keys[i] for i in pending])
            still = []
            for i, hit in zip(pending, found):
                if hit:
                    where[i] = t
                else:
                    still.append(i)
            pending = still
        return where

    def _seed_from_persistent_tiers(self) -> None:
        """Warm restart: pages a persistent tier kept are known to the policy again."""
        for t, tier in enumerate(self.tiers):
            if not (tier.capabilities.persistent and self._managed[t]):
                continue
            keys, sizes = [], []
            for key, n in tier.scan():
                keys.append(key)
                sizes.append(tier.footprint(n))
            if keys:
                self._placement.inserted(t, keys, sizes, None)
                logger.info("tier %s: %d pages found at start", tier.name, len(keys))
