"""``TieredStore``: pages across tiers, fastest first, placed by a ``PlacementPolicy``.

This class is the request paths and nothing else; each concern it uses is an object of its own,
called in one direction (see the package docstring for the tree):

- ``TierCalls`` every call into a tier, where a tier's failure becomes a miss;
- ``Residency`` the one record of which managed tier holds which page, and the policy behind it;
- ``Placer`` a write into one tier with room made first (two-phase eviction with demotion);
- ``Promoter`` pages found in slower tiers copied up;
- the mover (``BackgroundMover``, or ``InlineMover``) where placement work runs.

Request paths (SGLang's threads) do only their own pages' I/O:

- ``exists_prefix`` asks the tiers which of its pages they hold and buffers the lookup for the
  policy (no lock beyond the counters').
- ``get_into`` cascades: a batch is offered to tier 0, the keys it missed to tier 1, and so on. A
  page found in a slower tier is handed to the mover for promotion (dropped when the mover is
  backlogged).
- ``get_into_within`` is ``get_into`` with a deadline: what a disk's page cache holds is read on the
  calling thread (it cannot stall), the rest on one of two reader threads into staging memory,
  copied out only if the caller still waits (the load gate's bound on a tier that may have stalled).
- ``put_from`` writes tier 0 and every slower tier the policy admits; shared tiers (a pool or the
  Mooncake Store, seen by other SGLang instances) are written at the same time as the local ones,
  not after them, so another instance can read a backed-up page as early as possible. It returns
  once each ``True`` page is readable. A page no admitting tier could take goes to the first slower
  tier that takes it (admission saves writes; it must not lose pages).

``mover="inline"`` runs the same placement work on the calling thread at once (the trace simulator
and latency baselines): the same code, in a deterministic order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal

from ..api import (
    PageKey,
    PagesRead,
    PageView,
    PlacementPolicy,
    RemovalCause,
    StoreObserver,
    Tier,
    TierReport,
    TierReportError,
    page_nbytes,
)
from ..buffers import scatter
from ..tally import Tally
from .inline_mover import InlineMover
from .mover import BackgroundMover, Mover
from .placer import ROOM_WAIT, Placer
from .promoter import Promoter
from .residency import DRAIN_AT, Residency
from .staging import Staging
from .stats import (
    ExpertReport,
    LookupStats,
    MoverReport,
    StoreReport,
    StoreTierReport,
    TierExpertsReport,
    TierReadStats,
    UsageError,
    UsageReport,
)
from .tier_calls import TierCalls

logger = logging.getLogger(__name__)

MOVERS = ("background", "inline")


# Most bytes one probe read takes (``probe_reads``): enough for a per-call cost and a rate.
PROBE_BYTES = 4 << 20


class TieredStore:
    """Thread-safe page store over ``tiers`` (fastest first).

    Args:
        tiers: the tiers, fastest first; the store closes them.
        policy: decides placement; the store serialises every call into it.
        mover: ``"background"`` (placement I/O on the mover thread) or ``"inline"`` (on the caller,
            deterministic: simulator, baselines).
        clock: logical time for the policy (``time.monotonic`` by default).
        staging: buffers for pages the store moves itself (the simulator's hold no bytes).
        room_wait: seconds a write waits for the mover to make room.

    What the store's record commits, and the lookups its policy learns from, go to the observers
    added with ``observe`` (``api.StoreObserver``).
    """

    def __init__(self, tiers: Sequence[Tier], policy: PlacementPolicy, *,
                 mover: Literal["background", "inline"] = "background",
                 clock: Callable[[], float] = time.monotonic, staging: Staging | None = None,
                 room_wait: float = ROOM_WAIT):
        if not tiers:
            raise ValueError("TieredStore needs at least one tier")
        if mover not in MOVERS:
            raise ValueError(f"mover must be 'background' or 'inline', got {mover!r}")
        self._calls = calls = TierCalls(tiers)
        self.tiers = calls.tiers
        self.names = calls.names
        self._cached_reads = any(t.capabilities.cached_reads for t in self.tiers)
        usage0 = calls.call(0, "usage", self.tiers[0].usage) if len(tiers) > 1 else None
        self._residency = Residency(policy, calls.managed, clock,
                                    usage0.capacity_bytes if usage0 is not None else None)
        self._mover: Mover = BackgroundMover() if mover == "background" else InlineMover()
        staging = self._staging = staging or Staging()
        self._placer = Placer(calls, self._residency, self._mover, staging, room_wait)
        self._promoter = Promoter(calls, self._residency, self._placer, self._mover, staging)
        self._counters = Tally(LookupStats)
        # Per tier, what the request paths count; the placer and the promoter count their own moves.
        self._read_counters = [Tally(TierReadStats) for _ in self.tiers]
        shared = [t for t, tier in enumerate(self.tiers) if tier.capabilities.shared]
        self._shared = frozenset(shared if mover == "background" else ())
        self._shared_writer = (ThreadPoolExecutor(len(shared), "mooncake-sgl-shared-put")
            if self._shared else None)
        # Coalescing flag: at most one queued maintenance run. A plain bool: a lost race queues one
        # extra harmless run.
        self._maintenance_queued = False
        self._closed = False
        self._prober: ThreadPoolExecutor | None = None  # ``probe_reads``, started at the first
        self._probing: set[int] = set()  # tiers with a probe read queued or running
        self._probing_lock = threading.Lock()
        self._bounded: ThreadPoolExecutor | None = None  # ``get_into_within``, started at the first
        self._bounded_lock = threading.Lock()
        self._seed_from_persistent_tiers()

    @property
    def policy(self) -> PlacementPolicy:
        return self._residency.policy

    @property
    def latency_hook(self) -> Callable[[Tier, str, float], None] | None:
        """The hook ``time_tier_calls`` set, or ``None``."""
        return self._calls.observe_latency

    def time_tier_calls(self, hook: Callable[[Tier, str, float], None] | None) -> None:
        """Metrics hook (``metrics.attach``): called as ``(tier, what, seconds)`` after every tier
        call; ``None`` costs nothing."""
        self._calls.observe_latency = hook

    def observe(self, observer: StoreObserver, *, with_current: bool = False) -> None:
        """Send ``observer`` every event from now on (``api.StoreObserver``); with ``with_current``,
        first every page the managed tiers hold now (pages a persistent tier kept from an earlier
        run among them) as ``PagesStored``. One that also has ``section`` and ``stats()``
        (``api.ReportingObserver``) adds ``stats()[section]``."""
        self._residency.observe(observer, with_current)

    def maintain(self) -> None:
        """Apply the buffered lookups to the policy (and tell the observers) now, rather than at the
        next write or maintenance run."""
        self._residency.maintain()

    # ------------------------------------------------------------------ public API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        """Per key: readable in some tier now."""
        return [t is not None for t in self._calls.locate(keys)]

    def where(self, keys: Sequence[PageKey]) -> list[int | None]:
        """Per key, the fastest tier holding it now (``None``: no tier); no access event, unlike
        ``locate_prefix``: for a reader planning how to read what a lookup already found."""
        return self._calls.locate(keys)

    def exists_prefix(self, keys: Sequence[PageKey], parent: PageKey | None = None) -> int:
        """Length of the leading run of ``keys`` readable in some tier. This is the access event
        the policy learns heat from (SGLang asks it once per prefetch); it is buffered, and applied
        at the next maintenance run."""
        return len(self.locate_prefix(keys, parent))

    def locate_prefix(self, keys: Sequence[PageKey], parent: PageKey | None = None) -> list[int]:
        """The tier each page of the leading run of ``keys`` readable in some tier is in now (its
        fastest); the same access event as ``exists_prefix``."""
        where = self._calls.locate(keys)
        run = next((i for i, t in enumerate(where) if t is None), len(where))
        self._counters.add(lookups=1, lookup_pages=len(keys), lookup_hit_pages=run)
        per_tier: dict[int, int] = {}
        for t in where[:run]:
            per_tier[t] = per_tier.get(t, 0) + 1  # type: ignore[index]
        for t, n in per_tier.items():
            self._read_counters[t].add(lookup_hits=n)
        buffered = self._residency.record_lookup(keys, where, parent)
        if not self._mover.background:
            self._residency.maintain()
        elif buffered >= DRAIN_AT and not self._maintenance_queued:
            self._maintenance_queued = True
            if not self._mover.submit(self._maintain):
                self._maintenance_queued = False
        return where[:run]  # type: ignore[return-value]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        """Copy each page into its destination from the fastest tier holding it; per key ``True``
        once its bytes are in place. Promotion of pages found in slower tiers happens later."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        return self._read(keys, pages, cached=False)

    def _read(self, keys: Sequence[PageKey], pages: Sequence[PageView], cached: bool) -> list[bool]:
        """``get_into``'s cascade; with ``cached``, only of what tiers with ``cached_reads`` hold in
        memory now (``Tier.get_into_cached``), where a page not read is no miss."""
        calls, residency = self._calls, self._residency
        done = [False] * len(keys)
        found_in: list[int] = [0] * len(keys)
        pending = list(range(len(keys)))
        for t, tier in enumerate(self.tiers):
            if not pending:
                break
            if cached and not tier.capabilities.cached_reads:
                continue
            start = time.perf_counter()
            what, read = ("get_cached", tier.get_into_cached) if cached else ("get", tier.get_into)
            ok = calls.call(t, what, read, [keys[i] for i in pending], [pages[i] for i in pending])
            took = time.perf_counter() - start
            missed, lost, nread = [], [], 0
            for i, hit in zip(pending, ok):
                if hit:
                    done[i] = True
                    found_in[i] = t
                    nread += page_nbytes(pages[i])
                else:
                    missed.append(i)
                    if not cached and calls.managed[t] and residency.holds(t, keys[i]):
                        lost.append(keys[i])  # removed under us, or found corrupt by the tier
            hits = len(pending) - len(missed)
            if not cached or hits:
                self._read_counters[t].add(hits=hits, misses=0 if cached else len(missed),
                                           bytes_read=nread)
                asked = hits if cached else len(pending)
                residency.read(PagesRead(t, asked, hits, nread, took))
            if lost:
                # A failed read is not proof the page left: ask the tier (a rare extra call, only
                # for pages the store believed were there).
                gone = calls.gone(t, lost, False)
                self._read_counters[t].add(lost=len(gone))
                residency.lost(t, gone)
            pending = missed
        slow = [i for i in range(len(keys)) if done[i] and found_in[i] > 0]
        if slow:
            sk, sf = [keys[i] for i in slow], [found_in[i] for i in slow]
            sizes = [page_nbytes(pages[i]) for i in slow]
            if self._mover.background:
                if not self._mover.submit(self._promoter.promote, sk, sf, None, sk, sizes):
                    self._counters.add(promotions_dropped=len(slow))
            else:
                self._promoter.promote(sk, sf, [pages[i] for i in slow], list(keys), sizes)
        return done

    def get_into_within(self, keys: Sequence[PageKey], pages: Sequence[PageView],
                        seconds: float) -> list[bool] | None:
        """``get_into``, given up after ``seconds``: ``None`` then. For a reader that would rather
        compute the pages than wait longer for a tier that may have stalled: the destinations are
        never written after it has given up. What the tiers hold in memory (a disk's page cache)
        is read first on this thread (it cannot stall); the rest on one of two reader threads into
        staging memory, copied out only if the caller still waits (the read goes on there and ends
        there; its ``PagesRead`` still tells what it took)."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        start = time.perf_counter()
        done = self._read(keys, pages, cached=True) if self._cached_reads else [False] * len(keys)
        rest = [i for i, hit in enumerate(done) if not hit]
        if not rest:
            return done
        with self._bounded_lock:
            if self._closed:
                return None
            if self._bounded is None:  # two: a read stuck in one tier leaves a worker for the next
                self._bounded = ThreadPoolExecutor(2, "mooncake-sgl-bounded-read")
            read = _BoundedRead()
            future = self._bounded.submit(self._read_staged, [keys[i] for i in rest],
                                          [pages[i] for i in rest], read)
        try:
            future.result(max(0.0, seconds - (time.perf_counter() - start)))
        except TimeoutError:
            pass
        with read.lock:
            read.given_up = read.ok is None
            if read.ok is None:
                return None
            for i, hit in zip(rest, read.ok):
                done[i] = bool(hit)
            return done

    def _read_staged(self, keys: Sequence[PageKey], pages: Sequence[PageView], read: _BoundedRead) -> None:
        staged = self._staging.pages("bounded-read", [page_nbytes(p) for p in pages])
        ok = self.get_into(keys, staged)
        with read.lock:  # the reader waits here while the pages are copied out, then sees them
            if read.given_up:
                return
            for src, dst, hit in zip(staged, pages, ok):
                if hit:
                    scatter(src[0], dst)
            read.ok = ok

    def probe_reads(self, t: int, keys: Sequence[PageKey], nbytes: int, one_call_each: bool = False) -> None:
        """Time a read of ``keys`` (up to ``PROBE_BYTES`` of them) from tier ``t`` into scratch
        memory, on the mover's thread: its ``PagesRead`` tells the observers what the tier's reads
        cost now (the load gate, when no request has read the tier lately). Nothing else changes:
        no heat, no promotion. ``nbytes``: the size the caller stored each page at, the size read
        where the tier cannot tell a page's (the pool: its protocol names no sizes); where it can,
        a page it does not hold is not read. ``one_call_each``: a read call (and a ``PagesRead``)
        per key, one after the other, instead of one for all."""
        if not keys or self._closed:
            return
        if not self._mover.background:
            self._probe_read(t, list(keys), nbytes, one_call_each)
            return
        with self._probing_lock:
            if t in self._probing:
                return
            if self._prober is None:  # its own thread: a slow tier's probe never delays placement
                self._prober = ThreadPoolExecutor(1, "mooncake-sgl-probe")
            self._probing.add(t)
            self._prober.submit(self._probe_read, t, list(keys), nbytes, one_call_each)

    def _probe_read(self, t: int, keys: list[PageKey], nbytes: int, one_call_each: bool) -> None:
        try:
            for call in ([[k] for k in keys] if one_call_each else [keys]):
                if self._closed:
                    return
                self._time_read(t, call, nbytes)
        finally:
            with self._probing_lock:
                self._probing.discard(t)

    def _time_read(self, t: int, keys: list[PageKey], nbytes: int) -> None:
        sizes = self._calls.sizes(t, keys)
        if not any(sizes):  # a tier that names no size (or holds none of them: each read misses)
            sizes = [nbytes] * len(keys)
        picked, total = [], 0
        for key, n in zip(keys, sizes):
            if n and (not picked or total + n <= PROBE_BYTES):
                picked.append((key, n))
                total += n
        if not picked:
            return
        scratch = [[memoryview(bytearray(n))] for _, n in picked]
        start = time.perf_counter()
        ok = self._calls.call(t, "get", self.tiers[t].get_into, [k for k, _ in picked], scratch)
        took = time.perf_counter() - start
        nread = sum(n for (_, n), hit in zip(picked, ok) if hit)
        self._residency.read(PagesRead(t, len(picked), sum(map(bool, ok)), nread, took, probe=True))

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView],
                 parent: PageKey | None = None) -> list[bool]:
        """Write pages; per key ``True`` once the page is readable in at least one tier (every tier
        that acknowledged it, shared tiers included, serves it when this returns)."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        if not keys:
            return []
        with self._residency.held(keys):
            return self._put_held(keys, pages, parent)

    def _put_held(self, keys: Sequence[PageKey], pages: Sequence[PageView],
                  parent: PageKey | None) -> list[bool]:
        n = len(keys)
        stored = [False] * n
        ntiers = len(self.tiers)
        admitted = self._residency.admit(keys, ntiers)
        for t in range(1, ntiers):
            self._read_counters[t].add(admission_refused=n - sum(map(bool, admitted[t])))
        shared: list[tuple[list[int], Future]] = []
        if self._shared_writer is not None:
            for t in self._shared:
                idx = [i for i in range(n) if admitted[t][i]]
                if idx:
                    fut = self._shared_writer.submit(self._placer.write, t, [keys[i] for i in idx],
                                                     [pages[i] for i in idx], parent)
                    shared.append((idx, fut))
        for t in range(ntiers):
            if t not in self._shared:
                self._write_some(t, keys, pages, [i for i in range(n) if admitted[t][i]], stored, parent)
        for idx, fut in shared:
            try:
                ok = fut.result()
            except Exception:  # the placer's tier calls are guarded; this is the executor failing
                logger.exception("shared-tier write failed")
                ok = [False] * len(idx)
            for i, good in zip(idx, ok):
                stored[i] = stored[i] or good
        written = {t for t in range(ntiers) if any(admitted[t])}
        for t in range(1, ntiers):
            idx = [i for i in range(n) if not stored[i] and not admitted[t][i]]
            if idx:
                written.add(t)
                self._write_some(t, keys, pages, idx, stored, parent)
        self._placer.keep_headroom_later(written)
        return stored

    def remove(self, keys: Sequence[PageKey]) -> int:
        """Drop pages from every tier; returns how many (page, tier) copies were present."""
        calls, residency = self._calls, self._residency
        removed = 0
        keys = list(keys)
        for t in range(len(self.tiers)):
            got = calls.remove(t, keys)
            removed += got or 0
            if calls.managed[t]:
                known = [k for k in keys if residency.holds(t, k)]
                residency.lost(t, calls.gone(t, known, got is not None))
        return removed

    def clear(self) -> None:
        calls, residency = self._calls, self._residency
        for t, tier in enumerate(self.tiers):
            cleared = calls.call(t, "clear", lambda tier=tier: tier.clear() or True) is not None
            if calls.managed[t]:
                residency.lost(t, calls.gone(t, list(residency.keys_in(t)), cleared), RemovalCause.CLEARED)

    def register_memory(self, ptr: int, nbytes: int) -> None:
        for t, tier in enumerate(self.tiers):
            self._calls.call(t, "register_memory", tier.register_memory, ptr, nbytes)

    def drain(self, timeout: float = 30.0) -> bool:
        """Let the placement work and probe reads queued so far run (a detach keeps the demotions
        it queued into a persistent tier); ``False`` on timeout."""
        start = time.monotonic()
        if self._prober is not None:
            try:  # one worker: a task queued now runs after every probe queued before it
                self._prober.submit(lambda: None).result(timeout)
            except (TimeoutError, RuntimeError):  # RuntimeError: shut down, nothing left to run
                return False
        return self._mover.drain(max(0.0, timeout - (time.monotonic() - start)))

    def close(self) -> None:
        """Stop the mover, then close every tier. Placement work still queued (demotions included)
        is dropped: ``drain`` first to keep it."""
        if self._closed:
            return
        self._closed = True
        if self._prober is not None:
            self._prober.shutdown(wait=True)
        with self._bounded_lock:  # no bounded read starts once the store is closed
            bounded, self._bounded = self._bounded, None
        if bounded is not None:
            bounded.shutdown(wait=True)  # a read given up still runs in a tier: let it end first
        dropped = self._mover.close()
        if dropped:
            logger.info("mooncake_sgl: store closed with %d placement tasks still queued; dropped "
                        "(demotions among them never reach their tier)", dropped)
        if self._shared_writer is not None:
            self._shared_writer.shutdown(wait=True)
        self._calls.close()

    def stats(self) -> StoreReport:
        """Counters, one field per source (``as_dict()``: the nesting of ``api.STATS_SHAPE``)."""
        tiers: dict[str, StoreTierReport] = {}
        for t, (name, tier) in enumerate(zip(self.names, self.tiers)):
            usage: UsageReport | UsageError
            try:
                usage = UsageReport.of(tier.usage())
            except Exception as e:  # a dead remote tier still reports its counters
                usage = UsageError(str(e))
            own: TierReport
            try:
                own = tier.stats()
            except Exception as e:
                own = TierReportError(str(e))
            tiers[name] = StoreTierReport(usage, self._read_counters[t].snapshot(),
                                          self._placer.counters[t].snapshot(),
                                          self._promoter.counters[t].snapshot(), own)
        policy, standings = self._residency.policy_stats()
        switches: dict[str, int] = {}
        experts: dict[str, dict[str, ExpertReport]] = {}
        for s in standings:
            switches.setdefault(self.names[s.tier], s.leader_switches)
            experts.setdefault(self.names[s.tier], {})[s.expert] = ExpertReport(int(s.leading),
                                                                                s.shadow_hit_ratio)
        return StoreReport(self._counters.snapshot(), self._residency.counters.snapshot(),
                           MoverReport(self._mover.background, self._mover.counters.snapshot()),
                           policy, {n: TierExpertsReport(switches[n], e) for n, e in experts.items()},
                           tiers, {o.section: o.stats() for o in self._residency.events.reporting})

    # ------------------------------------------------------------------ internals

    def _write_some(self, t: int, keys: Sequence[PageKey], pages: Sequence[PageView], idx: list[int],
                    stored: list[bool], parent: PageKey | None) -> None:
        if not idx:
            return
        ok = self._placer.write(t, [keys[i] for i in idx], [pages[i] for i in idx], parent)
        for i, good in zip(idx, ok):
            stored[i] = stored[i] or good

    def _maintain(self) -> None:
        self._maintenance_queued = False
        self._residency.maintain()

    def _seed_from_persistent_tiers(self) -> None:
        """Warm restart: pages a persistent tier kept are known to the policy again."""
        for t, tier in enumerate(self.tiers):
            if not (tier.capabilities.persistent and self._calls.managed[t]):
                continue
            keys, sizes = [], []
            for key, n in tier.scan():
                keys.append(key)
                sizes.append(tier.footprint(n))
            if keys:
                self._residency.inserted(t, keys, sizes, None)
                logger.info("tier %s: %d pages found at start", tier.name, len(keys))


class _BoundedRead:
    """One ``get_into_within``: the pages read (``ok``, set once they are in their destinations), or
    ``given_up`` by the reader first; whichever comes first under ``lock`` wins."""

    __slots__ = ("lock", "ok", "given_up")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: list[bool] | None = None
        self.given_up = False
