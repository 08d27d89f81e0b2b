"""TieredStore: pages across tiers, fastest first, placed by a ``PlacementPolicy``.

Who owns what:
- the store owns ``_resident[t]``, the index of pages (key -> footprint) in every tier it manages
  (not self-evicting); it feeds the policy and sizes evictions from it;
- each tier owns its bytes and its own thread safety;
- the policy owns every placement decision and is only called under ``_lock``.

Reads cascade: a batch is offered to tier 0, the keys it missed to tier 1, and so on. A page evicted
between a lookup and a read is then simply found in a slower tier (or is a miss). A page found in a
slower tier is promoted into the faster tier the policy names, from the bytes just read into the
caller's buffer, before the call returns (the caller owns that buffer afterwards).

Writes go to tier 0 and to every slower tier the policy admits. Room is made first: the policy names
victims, each victim is demoted (copied to the tier the policy names, if not already there) and then
removed. A put is acknowledged (``True``) only once the page is readable in at least one tier.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence

from .api import PageKey, PageView, PlacementPolicy, Tier, page_nbytes
from .config import StoreConfig

logger = logging.getLogger(__name__)

# Arbitrary: how many times a tier's put is retried after making more room, when its real
# footprint turned out larger than estimated (LMDB page overhead, fragmentation).
_MAX_ROOM_ROUNDS = 3


class TierCounters:
    __slots__ = ("hits", "bytes_read", "writes", "bytes_written", "write_failures", "promotions",
                 "demotions", "evictions", "lost")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class TieredStore:
    """Thread-safe page store over ``tiers`` (fastest first)."""

    def __init__(self, tiers: Sequence[Tier], policy: PlacementPolicy):
        if not tiers:
            raise ValueError("TieredStore needs at least one tier")
        self.tiers = list(tiers)
        self.policy = policy
        self._lock = threading.RLock()
        self._managed = [not t.capabilities.self_evicting for t in self.tiers]
        self._resident: list[dict[PageKey, int]] = [{} for _ in self.tiers]
        self.counters = [TierCounters() for _ in self.tiers]
        self.lookups = 0
        self.lookup_hits = 0
        self._closed = False
        self._seed_from_persistent_tiers()

    # ------------------------------------------------------------------ public API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        return [t is not None for t in self._locate(keys)]

    def exists_prefix(self, keys: Sequence[PageKey], parent: PageKey | None = None) -> int:
        """Length of the leading run of ``keys`` readable in some tier. This is the access event
        the policy learns heat from (SGLang asks it once per prefetch)."""
        where = self._locate(keys)
        run = next((i for i, t in enumerate(where) if t is None), len(where))
        with self._lock:
            self.policy.tick(time.monotonic())
            self.policy.on_lookup(keys, where, parent)
            self.lookups += len(keys)
            self.lookup_hits += run
        return run

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        """Copy each page into its destination from the fastest tier holding it."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        done = [False] * len(keys)
        found_in: list[int | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        for t, tier in enumerate(self.tiers):
            if not pending:
                break
            ok = self._guarded(tier, "get", tier.get_into,
                               [keys[i] for i in pending], [pages[i] for i in pending])
            missed = []
            lost = []
            nread = 0
            for i, hit in zip(pending, ok):
                if hit:
                    done[i] = True
                    found_in[i] = t
                    nread += page_nbytes(pages[i])
                else:
                    missed.append(i)
                    if keys[i] in self._resident[t]:
                        lost.append(keys[i])  # removed under us, or found corrupt by the tier
            self._count(t, hits=len(pending) - len(missed), bytes_read=nread)
            if lost:
                self._forget(t, lost)
            pending = missed
        self._promote(keys, pages, found_in)
        return done

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView],
                 parent: PageKey | None = None) -> list[bool]:
        """Write pages; ``True`` once a page is readable in at least one tier."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        stored = [False] * len(keys)
        protected = frozenset(keys)
        with self._lock:
            admitted_by_tier = [self.policy.admit(keys, t) if t else [True] * len(keys)
                                for t in range(len(self.tiers))]
        for t in range(len(self.tiers)):
            idx = [i for i in range(len(keys)) if admitted_by_tier[t][i]]
            self._write_into(t, keys, pages, idx, stored, protected, parent)
        # Admission is an optimisation, losing a page is not: a page no admitting tier could take
        # (a batch larger than DRAM, say) goes to the first slower tier that takes it.
        for t in range(1, len(self.tiers)):
            idx = [i for i in range(len(keys)) if not stored[i] and not admitted_by_tier[t][i]]
            self._write_into(t, keys, pages, idx, stored, protected, parent)
        return stored

    def _write_into(self, t: int, keys: Sequence[PageKey], pages: Sequence[PageView], idx: list[int],
                    stored: list[bool], protected: frozenset[PageKey], parent: PageKey | None) -> None:
        if not idx:
            return
        ok = self._write(t, [keys[i] for i in idx], [pages[i] for i in idx], protected, parent)
        for i, good in zip(idx, ok):
            stored[i] = stored[i] or good

    def remove(self, keys: Sequence[PageKey]) -> int:
        removed = 0
        for t, tier in enumerate(self.tiers):
            removed += self._guarded(tier, "remove", tier.remove, list(keys)) or 0
            self._forget(t, [k for k in keys if k in self._resident[t]])
        return removed

    def clear(self) -> None:
        for t, tier in enumerate(self.tiers):
            self._guarded(tier, "clear", tier.clear)
            self._forget(t, list(self._resident[t]))

    def register_memory(self, ptr: int, nbytes: int) -> None:
        for tier in self.tiers:
            self._guarded(tier, "register_memory", tier.register_memory, ptr, nbytes)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for tier in self.tiers:
            try:
                tier.close()
            except Exception:
                logger.exception("closing tier %s failed", tier.name)

    def stats(self) -> dict[str, object]:
        tiers = {}
        for t, tier in enumerate(self.tiers):
            try:
                usage = tier.usage()
                use = {"capacity_bytes": usage.capacity_bytes, "used_bytes": usage.used_bytes,
                       "pages": usage.pages}
            except Exception as e:  # a dead remote tier still reports its counters
                use = {"error": str(e)}
            tiers[tier.name] = {**use, **self.counters[t].as_dict(), **tier.stats()}
        with self._lock:
            policy = self.policy.stats()
        return {"lookups": self.lookups, "lookup_hits": self.lookup_hits, "tiers": tiers,
                "policy": policy}

    # ------------------------------------------------------------------ internals

    def _guarded(self, tier: Tier, what: str, fn, *args):
        """Run a tier call; a failing tier yields misses, never an exception to the caller."""
        try:
            return fn(*args)
        except Exception as e:
            logger.warning("tier %s: %s failed: %s", tier.name, what, e)
            if what in ("get", "put", "contains"):
                return [False] * len(args[0])
            return None

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

    def _write(self, t: int, keys: list[PageKey], pages: list[PageView], protected: frozenset[PageKey],
               parent: PageKey | None) -> list[bool]:
        tier = self.tiers[t]
        sizes = [page_nbytes(p) for p in pages]
        ok = [False] * len(keys)
        todo = list(range(len(keys)))
        for _ in range(_MAX_ROOM_ROUNDS):
            roomy = True
            if self._managed[t]:
                need = sum(tier.footprint(sizes[i]) for i in todo if keys[i] not in self._resident[t])
                # Short of room (a batch larger than the tier): the tier still takes what fits.
                roomy = self._make_room(t, need, protected)
            batch_keys, batch_pages = [keys[i] for i in todo], [pages[i] for i in todo]
            if tier.capabilities.soft_pin:
                with self._lock:
                    pins = [self.policy.is_pinned(k) for k in batch_keys]
                res = self._guarded(tier, "put", functools.partial(tier.put_from, soft_pin=pins),
                                    batch_keys, batch_pages)
            else:
                res = self._guarded(tier, "put", tier.put_from, batch_keys, batch_pages)
            written, failed = [], []
            for i, good in zip(todo, res):
                (written if good else failed).append(i)
                ok[i] = good
            self._count(t, writes=len(written), bytes_written=sum(sizes[i] for i in written))
            if written:
                with self._lock:
                    fresh = [i for i in written if keys[i] not in self._resident[t]]
                    charged = [tier.footprint(sizes[i]) for i in fresh]
                    for i, n in zip(fresh, charged):
                        self._resident[t][keys[i]] = n
                    self.policy.on_insert([keys[i] for i in fresh], t, charged, parent)
            todo = failed
            if not todo or not self._managed[t] or not roomy:
                break
        self._count(t, write_failures=len(todo))
        return ok

    def _make_room(self, t: int, need: int, protected: frozenset[PageKey]) -> bool:
        """Evict (with demotion) until ``need`` bytes are free in tier ``t``."""
        if need <= 0:
            return True
        tier = self.tiers[t]
        try:
            free = tier.usage().free_bytes
        except Exception as e:
            logger.warning("tier %s: usage failed: %s", tier.name, e)
            return False
        if free >= need:
            return True
        with self._lock:
            victims = self.policy.victims(t, need - free, protected)
        if not victims:
            return False
        self._demote(t, victims, protected)
        self._guarded(tier, "remove", tier.remove, victims)
        self._forget(t, victims)
        self._count(t, evictions=len(victims))
        return True

    def _demote(self, t: int, victims: list[PageKey], protected: frozenset[PageKey]) -> None:
        with self._lock:
            targets = {v: self.policy.demotion_target(v, t) for v in victims}
        by_target: dict[int, list[PageKey]] = {}
        for v, target in targets.items():
            if target is not None and target > t:
                by_target.setdefault(target, []).append(v)
        for target, keys in by_target.items():
            have = self._guarded(self.tiers[target], "contains", self.tiers[target].contains, keys)
            move = [k for k, h in zip(keys, have) if not h]
            if not move:
                continue
            staged: list[PageView] = []
            moved: list[PageKey] = []
            for k in move:
                n = self._resident[t].get(k)
                size = self.tiers[t].page_size_of(k) or n
                if not size:
                    continue
                buf = memoryview(bytearray(size))
                if self._guarded(self.tiers[t], "get", self.tiers[t].get_into, [k], [[buf]])[0]:
                    staged.append([buf])
                    moved.append(k)
            if moved:
                ok = self._write(target, moved, staged, protected | frozenset(moved), None)
                self._count(target, demotions=sum(ok))

    def _promote(self, keys: Sequence[PageKey], pages: Sequence[PageView], found_in: list[int | None]
                 ) -> None:
        with self._lock:
            plan = [(i, self.policy.promotion_target(keys[i], t)) for i, t in enumerate(found_in)
                    if t]
        by_target: dict[int, list[int]] = {}
        for i, target in plan:
            if target is not None and target < found_in[i]:
                by_target.setdefault(target, []).append(i)
        for target, idx in by_target.items():
            ok = self._write(target, [keys[i] for i in idx], [pages[i] for i in idx],
                             frozenset(keys), None)
            self._count(target, promotions=sum(ok))

    def _count(self, t: int, **deltas: int) -> None:
        # SGLang's storage threads call in concurrently: counters change under the lock.
        with self._lock:
            c = self.counters[t]
            for name, d in deltas.items():
                setattr(c, name, getattr(c, name) + d)

    def _forget(self, t: int, keys: list[PageKey]) -> None:
        if not keys:
            return
        with self._lock:
            gone = [k for k in keys if self._resident[t].pop(k, None) is not None]
            if gone:
                self.policy.on_remove(gone, t)

    def _seed_from_persistent_tiers(self) -> None:
        """Warm restart: pages a persistent tier kept are known to the policy again."""
        for t, tier in enumerate(self.tiers):
            if not (tier.capabilities.persistent and self._managed[t]):
                continue
            keys, sizes = [], []
            for key, n in tier.scan():
                keys.append(key)
                sizes.append(tier.footprint(n))
                self._resident[t][key] = sizes[-1]
            if keys:
                self.policy.on_insert(keys, t, sizes, None)
                logger.info("tier %s: %d pages found at start", tier.name, len(keys))


def build_store(config: StoreConfig, rank_suffix: str = "") -> TieredStore:
    """The store a config describes. ``rank_suffix`` keeps per-rank local files apart."""
    from .policy import build_policy
    from .tiers import build_tier

    tiers: list[Tier] = []
    try:
        for tier_config in config.tiers:
            tiers.append(build_tier(tier_config, rank_suffix=rank_suffix))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return TieredStore(tiers, build_policy(config.policy, tiers))
