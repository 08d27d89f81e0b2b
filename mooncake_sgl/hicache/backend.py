"""``MooncakeSglStorage``: SGLang's ``HiCacheStorage`` over our ``TieredStore``.

A thin, honest adapter: page hashes become ``PageKey``s in this process's namespace, host slots (or
the legacy path's flat pages) become ``PageView``s, and every page of every API moves through one
path, ``page_objects.move_pages``. No tier logic lives here.

Why subclass ``HiCacheStorage`` and not SGLang's built-in ``MooncakeStore``: the built-in's
``__init__`` needs the real ``mooncake`` package and a master, and its keys and IO are its own; we
take over the name ``mooncake`` (see ``plugin.py``) and handle what the name switches on there.

Hybrid models (the v2 API): every sidecar pool is stored as objects in the same tiers, keyed in a
namespace derived from the KV one; ``sidecars.py`` holds the rules (replication across TP ranks,
restorable prefixes) and the consistency rule between KV and sidecars.

Threading: SGLang calls from its prefetch, prefetch-IO, backup and scheduler threads at once. The
store is thread-safe; the state here is the pool binding, set at attach before IO starts, and the
sidecar pool objects, built once per pool under ``_pools_lock``. Each host pool is read once, when it
is registered, into a ``sglang_pool.HostPool``; nothing below the attach touches SGLang's pool.

Error boundary: a tier's failure is already a miss inside the store (``store.tier_calls``); what
the store itself raises becomes a miss of the method's own shape at ``boundary``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolTransfer,
    PoolTransferResult,
    disabled_l3_layout,
)

from ..api import PageKey, PageView, TierKind
from ..builtin_config import wait_for_store_server
from ..config_sources import resolve_config
from ..failure_log import FailureLog
from ..keys import KV_POOL, KeyNamespace
from ..metrics.attach import StoreWatch, observe_store
from ..policy.curve_feed import CurveFeed
from ..policy.load_gate import RECHECK_READS, LoadGate
from ..store import TieredStore, build_store
from . import (
    fingerprint,
    l3_layout,
    layout,
    namespace_board,
    page_objects,
    prefill_clock,
    router_events,
    sidecars,
    staging_room,
    touch_points,
    weight_updates,
)
from .boundary import (
    WeightsChanging,
    all_false,
    boundary,
    each_pool_false,
    no_restorable_prefix,
    none_each,
)
from .call_metrics import CallMetrics, StorageMetrics
from .page_hash import load_page_hash
from .sglang_config import StorageRank
from .sglang_pool import HostPool

logger = logging.getLogger(__name__)
# Tiers whose reads can turn slow from one call to the next (a disk other processes use, a link to
# a pool): the load gate reads a hit there one page first and judges the rest with that read.
VOLATILE_KINDS = frozenset({TierKind.SSD, TierKind.REMOTE})
# Tiers whose reads cannot turn slow (memory in this process): a hit there is read in one call
# however long since the tier was last read. Judged again from its first page after a quiet spell,
# a 63-page hit in host DRAM took 6-9 ms in a live CPU server against 2-3 ms in one call.
STEADY_KINDS = frozenset({TierKind.HBM, TierKind.HOST})
# How long ``close`` lets queued placement work run: a detach should not lose the demotions already
# queued to a persistent tier; bounded so a stuck tier cannot hang SGLang's detach.
DETACH_DRAIN_S = 5.0


class MooncakeSglStorage(HiCacheStorage):
    """HiCache L3 storage over the tiers of ``--hicache-storage-backend-extra-config``.

    Constructed by SGLang's factory as ``(storage_config, mem_pool_host)`` under the name
    ``mooncake``, or as ``(storage_config, {})`` under ``dynamic`` (then extra-config needs
    ``"interface_v1": 1`` for the zero-copy path); the host pool always arrives through
    ``register_mem_pool_host`` too.

    Raises (constructor only): ``ConfigError`` for a bad extra-config, ``TierError`` for a tier that
    cannot start. Both fail the attach loudly, which is what a misconfiguration deserves.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, mem_pool_host: Any = None):
        self.storage_config = storage_config
        self._rank = StorageRank.read(storage_config)
        self._errors = FailureLog(logger)
        resolved = resolve_config(self._rank.extra_config, storage_config)
        logger.info("mooncake_sgl: %s", resolved.describe())
        if resolved.check_server_url:  # SGLang's built-in check_server: wait for a store server
            wait_for_store_server(resolved.check_server_url)
        self._store_config = resolved.config
        self._writer = self._rank.is_storage_writer
        self._metrics_on = self._rank.enable_storage_metrics
        self._calls = CallMetrics(self._metrics_on)
        self._geometry: layout.PoolGeometry | None = None
        self._ns: KeyNamespace | None = None
        self._kv: page_objects.PoolObjects | None = None
        self._pools_lock = threading.Lock()
        self._host_pools: dict[str, HostPool] = {}  # sidecar host pools by PoolName value
        self._sidecars: dict[str, page_objects.PoolObjects] = {}
        self.mem_pool_host = None
        self._closed = False
        self._session_ids_seen = False
        self._weights = fingerprint.checkpoint_fingerprint(self._rank.model_name)
        # Weight updates at run time (``weight_updates``): the last checkpoint fingerprinted and
        # where it came from, the identity of weights loaded but not yet keyed (SGLang's caches
        # may still hold the old ones' KV), and whether calls answer misses meanwhile.
        self._checkpoint = self._weights
        self._source = fingerprint.model_source(self._rank.model_name)
        self._next_weights: fingerprint.Fingerprint | None = None
        self._weights_changing = False
        weight_updates.follow(self)
        try:
            took = load_page_hash()
        except RuntimeError as e:  # SGLang meets it again at its first hash, and reports it there
            logger.warning("mooncake_sgl: %s", e)
        else:
            if took > 1.0:
                logger.info("mooncake_sgl: SGLang's page-hash extension built or loaded in %.1f s", took)
        # Built once the KV pool is known: host slots are sized to its page (see ``layout``).
        self._store: TieredStore | None = None
        self._watch: StoreWatch | None = None  # our /metrics series and the counter file
        self._board: namespace_board.BoardCheck | None = None  # built with the store
        self._curves: CurveFeed | None = None  # the store's capacity curves, where asked for
        self._announcer: router_events.Announcer | None = None  # ``router_events: local``
        self._gate: LoadGate | None = None  # ``load_gate``: hits worth loading, built with the store
        # ``dynamic`` passes a kwargs dict where ``mooncake`` passes the pool.
        if mem_pool_host is not None and not isinstance(mem_pool_host, dict):
            try:
                self.register_mem_pool_host(mem_pool_host)
            except BaseException:
                if self._store is not None:
                    self._store.close()  # SGLang drops a backend whose constructor failed
                raise

    # ------------------------------------------------------------------ attach

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Bind the anchor KV host pool: its geometry fixes the key namespace.

        Raises: ``ConfigError`` for a pool lacking a field its SGLang class declares, or whatever
        probing its page raises; SGLang then fails the attach (an unusable pool must not look like
        an empty cache).
        """
        if mem_pool_host is self.mem_pool_host:
            return  # the factory's constructor call and the controller's both register it
        pool = HostPool.read(mem_pool_host)
        ns, geometry, kv = self._kv_binding(pool)
        if self._store is None:
            self._store = build_store(layout.sized_for_pages(self._store_config, kv.object_nbytes),
                                      layout.rank_suffix(self._rank))
            if self._store_config.policy.capacity_curves:
                self._curves = CurveFeed(self._store.tiers, self._store.names, self._store.policy, "process")
                self._store.observe(self._curves)
            if self._store_config.router_events == "local":
                self._announcer = router_events.Announcer(
                    t for t, tier in enumerate(self._store.tiers) if not tier.capabilities.shared)
            self._board = namespace_board.BoardCheck(self._store.tiers)
            gate = self._store_config.load_gate
            if gate.enabled:
                self._gate = LoadGate(self._store.names, gate.margin, prefill_clock.reading,
                                      volatile=[t.kind in VOLATILE_KINDS for t in self._store.tiers],
                                      steady=[t.kind in STEADY_KINDS for t in self._store.tiers])
                self._store.observe(self._gate)
        super().register_mem_pool_host(mem_pool_host)
        with self._pools_lock:
            self._ns, self._geometry, self._kv = ns, geometry, kv
            self._sidecars.clear()  # derived from the KV namespace: rebuilt on next use
        self._register_buffers(pool)
        if self._watch is None:
            self._watch = observe_store(self._store, self.storage_config, self._metrics_on,
                                        layout.reports_local_usage(self._rank))
        logger.info("mooncake_sgl: namespace %s, %d-byte pages in %d segments, local files '%s'; "
                    "model fingerprint %s", self._ns.describe(), geometry.page_nbytes,
                    len(geometry.segment_sizes), layout.rank_suffix(self._rank),
                    self._weights.summary)
        if kv.head_groups:
            logger.info("mooncake_sgl: split heads: each page stored as %d head groups of %d bytes, "
                        "under lcm-grid ranks %s of %d", len(kv.head_groups), kv.object_nbytes,
                        ",".join(str(g.tp_rank) for g in kv.head_groups), kv.head_groups[0].tp_size)
        self._post_namespace()
        staging_room.check(pool.host_tokens, pool.device_tokens, namespace_board.sglang_role(),
                           self._rank.extra_config)

    def _kv_binding(self, pool: HostPool
                    ) -> tuple[KeyNamespace, layout.PoolGeometry, page_objects.PoolObjects]:
        """The KV namespace, pool geometry and page objects of ``pool`` under the weights this
        backend keys by now."""
        geometry = layout.pool_geometry(pool)
        ns = layout.key_namespace(self._rank, geometry, self._store_config.namespace_tag,
                                  self._weights.digest)
        # DeepSeek V4's anchor only hands out indices; its sidecars carry the bytes (and heads).
        split = 1 if pool.logical else layout.head_split(self._rank, pool)
        return ns, geometry, page_objects.kv_objects(pool, geometry, ns, split)

    # ------------------------------------------------------------------ weight updates
    # Called by ``weight_updates``' hooks on SGLang's scheduler thread; see that module for why.

    def weights_changing(self) -> None:
        """A weight update starts: from now on every call is a miss (writes are refused). Weights
        loaded by an earlier update and not yet keyed are superseded: a flush within this update
        must not key by them."""
        self._weights_changing = True
        self._next_weights = None

    def weights_changed(self, update: weight_updates.WeightUpdate) -> None:
        """A weight update ended: key by the new weights once SGLang's caches hold none of the old."""
        weights = weight_updates.next_weights(update, self._checkpoint, self._source)
        loaded = weight_updates.source_after(update, self._source)
        if loaded is not None:
            self._source, self._checkpoint = loaded, weights
        self._next_weights = weights
        logger.info("mooncake_sgl: weights updated (update_weights_from_%s, %s): model fingerprint %s; "
                    "%s", update.kind, "succeeded" if update.succeeded else "failed", weights.summary,
                    "keyed at once (SGLang flushed its caches)" if update.flushed else
                    "storage answers misses until the next successful /flush_cache")
        if update.flushed:
            self.cache_flushed()

    def cache_flushed(self) -> None:
        """SGLang's caches were flushed: weights loaded since the last key change take effect."""
        if self._next_weights is None:
            return
        with self._pools_lock:
            self._weights, self._next_weights = self._next_weights, None
            if self._kv is not None:
                self._ns, self._geometry, self._kv = self._kv_binding(self._kv.pool)
            self._sidecars.clear()  # derived from the KV namespace: rebuilt on next use
            self._weights_changing = False
        if self._ns is not None:
            logger.info("mooncake_sgl: namespace now %s", self._ns.describe())
            self._post_namespace()

    def _post_namespace(self) -> None:
        """This instance's namespace on the shared tiers' board (``namespace_board``), and to the
        router announcer: the pages it announces are this namespace's."""
        if self._announcer is not None and self._kv is not None and self._store is not None:
            # A hybrid model's KV page is no hit without its sidecars: nothing of it is announced.
            kv = () if self._host_pools else (self._kv.head_groups or (self._ns,))
            self._announcer.set_namespaces(ns.digest for ns in kv)
            if not self._announcer.observing:
                # Pages an SSD tier kept from an earlier run are this worker's too. Pages of a
                # later namespace that a tier already holds (a weight update back to weights seen
                # before) are not announced: the record is not read again.
                self._announcer.observing = True
                self._store.observe(self._announcer, with_current=True)
        if self._board is None or self._ns is None or self._kv is None:
            return
        record = namespace_board.record_for(self._ns, max(1, len(self._kv.head_groups)),
                                            namespace_board.sglang_role())
        self._board.post(record)
        if self._watch is not None and self._watch.exporter is not None:
            self._watch.exporter.namespace(namespace_board.info_fields(record, self._store_config.tiers))

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Bind a hybrid model's host pool (every ``HostPoolGroup`` entry, KV included).

        The KV entry is the anchor ``register_mem_pool_host`` already bound; a sidecar pool is read
        now, its objects derived on first use (or at ``on_host_pools_registered``), so pools
        registered later (dynamic sidecars) work the same way.

        Raises: ``ConfigError`` for a pool lacking a field its SGLang class declares.
        """
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = sidecars.pool_name(host_pool_name)
        if name == KV_POOL:
            return
        pool = HostPool.read(host_pool)
        with self._pools_lock:
            self._host_pools[name] = pool
            self._sidecars.pop(name, None)

    def on_host_pools_registered(self) -> None:
        """Derive every sidecar pool's objects now, so a pool we cannot store fails the attach
        loudly instead of missing quietly on every request."""
        for name in list(self._host_pools):
            objects = self._objects(name)
            logger.info("mooncake_sgl: pool %s: %d-byte pages as %d part(s), %s", name,
                        objects.geometry.page_nbytes, objects.parts,
                        "shared by TP ranks" if objects.namespace.rank_replicated else "per TP rank")

    def _register_buffers(self, pool: HostPool) -> None:
        for t in pool.buffers:
            self._store.register_memory(t.data_ptr(), t.numel() * t.element_size())

    def _objects(self, name: Any) -> page_objects.PoolObjects:
        """The stored-object view of a registered pool.

        Raises: ``RuntimeError`` before the KV pool is registered, ``KeyError`` naming an
        unregistered pool.
        """
        key = sidecars.pool_name(name)
        with self._pools_lock:
            if self._kv is None:
                raise RuntimeError("no host pool registered yet (register_mem_pool_host)")
            if key == KV_POOL:
                return self._kv
            objects = self._sidecars.get(key)
            if objects is not None:
                return objects
            if key not in self._host_pools:
                raise KeyError(f"pool {key!r} was never registered (register_mem_host_pool_v2); "
                               f"registered: {sorted(self._host_pools)}")
            objects = sidecars.sidecar_objects(self._rank, self._kv, key, self._host_pools[key])
            self._register_buffers(objects.pool)
            self._sidecars[key] = objects
            return objects

    # ------------------------------------------------------------------ keys
    # A KV page is one object, or one per head group (split heads): ``PoolObjects`` keys and views.

    def _kv_objects(self) -> page_objects.PoolObjects:
        if self._kv is None:
            raise RuntimeError("no host pool registered yet (register_mem_pool_host)")
        return self._kv

    def _parent(self, extra_info: Any) -> PageKey | None:
        return page_objects.part_key(self._kv_objects(), layout.parent_hash(extra_info))

    def _live(self) -> None:
        if self._closed:
            raise RuntimeError("backend is closed")
        if self._weights_changing:
            raise WeightsChanging
        if self._store is None:
            raise RuntimeError("no host pool registered yet (register_mem_pool_host)")
        if self._board is not None:
            self._board.in_use()

    # ------------------------------------------------------------------ zero-copy path

    @boundary(all_false)
    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        """Read pages into the host slots ``host_indices`` (``page_size`` slots per key).

        Returns one bool per key; SGLang uses the leading run of ``True``. Destinations of
        ``False`` pages may be partly written.
        """
        self._live()
        start = time.perf_counter()
        kv: page_objects.PoolObjects = self._kv_objects()
        pages = kv.pages(host_indices, len(keys))
        where = self._rejudged(kv, keys)
        done = self._first_read(kv, where, len(keys))
        # No page in a tier that may have turned slow: nothing to bound.
        limit = self._give_up_after(kv, where) if done < len(keys) else None
        # Bounded, only the page in the tier that may have turned slow; otherwise one call for all.
        split = done - 1 if limit is not None else 0
        ok = page_objects.move_pages(self._store, kv, keys[:split], pages[:split], None, write=False)
        given_up = False
        reads: list[tuple[int, float]] = []  # bytes and wall seconds of each read judged by
        if all(ok):
            read, given_up = self._read_within(kv, where, split, done, keys, pages, limit, reads)
            ok += read
        while done < len(keys) and all(ok):
            # Judged again after each read, in doubling steps until the reads so far are evidence
            # enough to judge the disk by (a throttle's or a cache's burst makes one page look fast,
            # the host's scheduling one read slow).
            left = len(keys) - done
            worth, bounded = self._still_worth(kv, where[done * kv.parts:], left, reads)
            doubling = worth >= left and bounded
            step = min(left, done, self._bounded_step(kv, where, done, limit) or left) if doubling else worth
            # A doubling step is bounded as the first read is; the rest, once judged worth it, is not.
            read, given_up = self._read_within(kv, where, done, done + step, keys, pages,
                                               limit if doubling else None, reads)
            ok += read
            done += step
            if step < left and step == worth:
                given_up = True  # the rest is given up
                break
        ok += [False] * (len(keys) - len(ok))
        if given_up and not self._gate_keeps_partial(kv, ok):
            ok = [False] * len(keys)
        self._calls.record("prefetch", 0 if kv.logical else sum(ok), self._geometry.page_nbytes, start)
        return ok

    def _rejudged(self, kv: page_objects.PoolObjects, keys: list[str]) -> list[int]:
        """The tier of each object of the leading run of ``keys`` found now, where the load gate may
        judge the hit again as it is read (``LoadGate.rereads``); empty otherwise (read it whole)."""
        if self._gate is None or kv.logical or not self._gate.rereads():
            return []
        where = self._store.where(kv.keys(keys))
        run = next((i for i, t in enumerate(where) if t is None), len(where))
        return where[:run]  # type: ignore[return-value]

    def _first_read(self, kv: page_objects.PoolObjects, where: list[int], npages: int) -> int:
        """Pages to read before the gate judges the rest again: through the first page in a tier
        whose reads can turn slow (a disk, a link) or not read lately, so such a tier turned slow
        costs that page, not the hit; all of them otherwise."""
        if not where:
            return npages
        assert self._gate is not None
        objects = self._gate.first_read(where)
        return npages if objects >= len(where) else -(-objects // kv.parts)

    def _bounded_step(self, kv: page_objects.PoolObjects, where: list[int], done: int,
                      limit: float | None) -> int | None:
        """The most pages a bounded step from page ``done`` on may read: what its tier is expected
        to read well within ``limit`` (``LoadGate.step_objects``), at least one; ``None`` (no
        limit) where the step is not bounded, the page is in no tier, or the tier was not read yet."""
        at = done * kv.parts
        if limit is None or at >= len(where):
            return None
        assert self._gate is not None
        objects = self._gate.step_objects(where[at], kv.object_nbytes, limit)
        return None if objects is None else max(1, objects // kv.parts)

    def _give_up_after(self, kv: page_objects.PoolObjects, where: list[int]) -> float | None:
        """How long a read of a hit the gate judges again (``where``) may wait in a tier that may
        have turned slow before the rest of the hit is given up; ``None``: no bound."""
        if not where:
            return None
        assert self._gate is not None and self._geometry is not None
        return self._gate.give_up_after(len(where), self._geometry.page_size / kv.parts)

    def _read_within(self, kv: page_objects.PoolObjects, where: list[int], lo: int, hi: int,
                     keys: list[str], pages: list[PageView], limit: float | None,
                     reads: list[tuple[int, float]]) -> tuple[list[bool], bool]:
        """Pages ``lo:hi`` of the hit read, and whether they were given up: read within ``limit``
        seconds, or none of them (a tier that stalled: the rest of the hit counted as given up).
        The read's bytes and wall seconds are added to ``reads``."""
        assert self._geometry is not None
        start = time.perf_counter()
        if limit is None:
            ok = page_objects.move_pages(self._store, kv, keys[lo:hi], pages[lo:hi], None, write=False)
            reads.append(((hi - lo) * self._geometry.page_nbytes, time.perf_counter() - start))
            return ok, False
        ok = page_objects.read_within(self._store, kv, keys[lo:hi], pages[lo:hi], limit)
        reads.append(((hi - lo) * self._geometry.page_nbytes, time.perf_counter() - start))
        if ok is None:
            assert self._gate is not None
            self._gate.gave_up(where[lo * kv.parts:])
            return [False] * (hi - lo), True
        return ok, False

    def _gate_keeps_partial(self, kv: page_objects.PoolObjects, ok: list[bool]) -> bool:
        """Whether the leading pages read of a hit whose rest was given up are reported loaded
        (``LoadGate.keeps_partial``); the rest of ``ok`` is already ``False``."""
        assert self._gate is not None
        read = next((i for i, hit in enumerate(ok) if not hit), len(ok))
        return self._gate.keeps_partial(read * kv.parts, len(ok) * kv.parts)

    def _still_worth(self, kv: page_objects.PoolObjects, where: list[int], npages: int,
                     reads: list[tuple[int, float]]) -> tuple[int, bool]:
        """Of the ``npages`` left of a hit being read (their objects' tiers ``where``; ``reads``: the
        bytes and wall seconds of each read so far), how many to go on reading, and whether in
        bounded steps: the gate's judgement with that evidence (pages found in no tier are read,
        and miss, as before)."""
        assert self._gate is not None and self._geometry is not None
        rest = self._gate.admit_rest(where, kv.object_nbytes, self._geometry.page_size / kv.parts, reads)
        return (npages if rest.objects >= len(where) else rest.objects // kv.parts), rest.bounded

    @boundary(all_false)
    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        """Store the pages in host slots ``host_indices``; ``True`` once readable (or already there).

        An MLA rank that is not the storage writer stores nothing and answers ``True``: the writer
        stores the identical page and every rank reads it.
        """
        self._live()
        if not self._writer:
            return [True] * len(keys)
        start = time.perf_counter()
        kv: page_objects.PoolObjects = self._kv_objects()
        ok = page_objects.move_pages(self._store, kv, keys, kv.pages(host_indices, len(keys)),
                                     layout.parent_hash(extra_info), write=True)
        self._calls.record("backup", 0 if kv.logical else sum(ok), self._geometry.page_nbytes, start)
        return ok

    # ------------------------------------------------------------------ existence

    @boundary(lambda *a, **k: 0)
    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """Length of the leading run of ``keys`` readable in some tier (prefix semantics)."""
        self._live()
        if not keys:
            return 0
        kv: page_objects.PoolObjects = self._kv_objects()
        objects = kv.keys(keys)
        return self._worth_loading(kv, objects, self._store.locate_prefix(objects, self._parent(extra_info)))

    def _worth_loading(self, kv: page_objects.PoolObjects, objects: list[PageKey], where: list[int]) -> int:
        """Pages of a hit (``objects``, the leading ones in tiers ``where``) worth loading: the load
        gate's answer, all of them without one. Tiers it wants measured get a probe read."""
        n = len(where)
        if self._gate is None or kv.logical or self._geometry is None:
            return n // kv.parts
        admission = self._gate.admit(where, kv.object_nbytes, self._geometry.page_size / kv.parts)

        def in_tier(t: int, most: int | None) -> list[PageKey]:
            return [k for k, w in zip(objects, where) if w == t][:most]

        for t, most in zip(admission.probe, admission.probe_objects):
            self._store.probe_reads(t, in_tier(t, most), kv.object_nbytes)
        for t in admission.recheck:
            self._store.probe_reads(t, in_tier(t, RECHECK_READS), kv.object_nbytes, one_call_each=True)
        return admission.objects // kv.parts

    @boundary(lambda *a, **k: False)
    def exists(self, key: str) -> bool:
        self._live()
        found = self._store.contains(self._kv_objects().keys([key]))
        return bool(found) and all(found)

    # ------------------------------------------------------------------ hybrid pools (v2)

    @boundary(no_restorable_prefix)
    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info: Any = None) -> PoolTransferResult:
        """Which prefixes of ``keys`` can be restored with every pool they need.

        ``kv_hit_pages`` is the longest restorable prefix, ``restorable_prefix_pages`` all of them
        (trailing-pages pools leave holes; SGLang intersects the sets across ranks), and
        ``extra_pool_hit_pages`` each pool's own boundary. The lookup is also the access event the
        policy learns heat from, for the KV pages and the sidecar objects it would load.
        """
        self._live()
        if not keys:
            return PoolTransferResult(0, {}, [])
        kv = self._objects(KV_POOL)
        prior = layout.parent_hash(extra_info)
        objects = kv.keys(keys)
        kv_pages = len(keys) if kv.logical else self._worth_loading(
            kv, objects, self._store.locate_prefix(objects, page_objects.part_key(kv, prior)))
        looked_up = [(self._objects(t.name), t) for t in pool_transfers or ()] if kv_pages else []
        evidence = [sidecars.evidence(self._store, objects, t, keys, kv_pages, prior)
                    for objects, t in looked_up]
        result = sidecars.resolve(kv_pages, evidence)
        sidecars.heat_trailing(self._store, looked_up, evidence, keys, result.kv_hit_pages)
        return result

    @boundary(each_pool_false)
    def batch_get_v2(self, transfers: list[PoolTransfer], extra_info: Any = None
                     ) -> dict[Any, list[bool]]:
        """Read each transfer's pages into its pool's host slots; per pool, one bool per page."""
        self._live()
        return {t.name: self._pool_io(t, extra_info, write=False) for t in transfers}

    @boundary(each_pool_false)
    def batch_set_v2(self, transfers: list[PoolTransfer], extra_info: Any = None
                     ) -> dict[Any, list[bool]]:
        """Store each transfer's pages from its pool's host slots; ``True`` once readable."""
        self._live()
        if not self._session_ids_seen:
            self._session_ids_seen = sidecars.refuse_session_id(extra_info)
        return {t.name: self._pool_io(t, extra_info, write=True) for t in transfers}

    def _pool_io(self, transfer: PoolTransfer, extra_info: Any, write: bool) -> list[bool]:
        # One pool's failure is that pool's miss; the other pools of the call still move.
        hashes = list(transfer.keys or ())
        if not hashes:
            return []
        try:
            objects = self._objects(transfer.name)
            return page_objects.move_pages(self._store, objects, hashes,
                                           objects.pages(transfer.host_indices, len(hashes)),
                                           layout.parent_hash(extra_info), write)
        except Exception as e:
            self._errors.report(f"batch_{'set' if write else 'get'}_v2[{transfer.name}]", e)
            return [False] * len(hashes)

    # ------------------------------------------------------------------ legacy copy path
    # Used by SGLang only under ``dynamic`` without ``interface_v1``. Values are flat page tensors
    # (``get_data_page(flat=True)``); ``layout.flat_page_view`` orders them like zero-copy pages, so
    # the same key holds the same bytes on both paths.

    @boundary(lambda *a, **k: None)
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        """Read one page into ``target_location`` (a flat page; allocated when not given).

        Returns the tensor, or ``None`` on a miss.
        """
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    @boundary(none_each)
    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        """Per key: the filled flat page tensor, or ``None`` on a miss."""
        self._live()
        if target_locations is None:
            target_locations = [self._kv_objects().pool.dummy_flat_page() for _ in keys]
        # Filled in place, so they must already be contiguous CPU pages (flat_page_view checks).
        pages = [layout.flat_page_view(self._geometry, t) for t in target_locations]
        ok = page_objects.move_pages(self._store, self._kv_objects(), keys, pages, None, write=False)
        return [t if good else None for t, good in zip(target_locations, ok, strict=True)]

    @boundary(lambda *a, **k: False)
    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        """Store one flat page tensor under ``key``."""
        return self.batch_set([key], [value])

    @boundary(lambda *a, **k: False)
    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Store flat page tensors; ``True`` only if every page is readable afterwards."""
        self._live()
        if not self._writer:
            return True
        src = [v.detach().to("cpu").contiguous() for v in values]  # keeps the copies alive
        pages = [layout.flat_page_view(self._geometry, t) for t in src]
        return all(page_objects.move_pages(self._store, self._kv_objects(), keys, pages, None, write=True))

    # ------------------------------------------------------------------ lifecycle, metrics

    @boundary(lambda *a, **k: None)
    def clear(self) -> None:
        """Drop every page of every tier (``POST /hicache/storage-backend/clear``)."""
        self._live()
        self._store.clear()

    @boundary(lambda *a, **k: None)
    def close(self) -> None:
        """Let the queued placement work run (up to ``DETACH_DRAIN_S``), then close the tiers;
        idempotent. Later calls answer misses."""
        if self._closed:
            return
        self._closed = True
        if self._store is not None:
            self._store.drain(DETACH_DRAIN_S)  # before the final counters, so they count it
        if self._watch is not None:
            self._watch.close()  # final counters while the tiers are still open
        if self._store is not None:
            self._store.close()
        if self._curves is not None:
            self._curves.close()

    def describe_l3_object_layout(self, *, sidecar_pool_specs: Any = (),
                                  swa_trailing_pages: int | None = None,
                                  page_size: int | None = None) -> dict[str, Any]:
        """Our answer to ``GET /get_hicache_l3_cache_layout`` (``l3_layout``: always disabled, with
        what our keys are instead). Never raises: the scheduler calls it while starting up."""
        try:
            if self._closed:
                return disabled_l3_layout("the mooncake_sgl backend is closed", backend="mooncake",
                                          page_size=page_size)
            if self._ns is None or self._geometry is None or self._store is None:
                return disabled_l3_layout("no host pool registered yet (register_mem_pool_host)",
                                          backend="mooncake", page_size=page_size)
            return l3_layout.describe(self._ns, self._geometry, self._store, self._store_config.tiers,
                                      list(self._host_pools), page_size, self._store_config.router_events)
        except Exception as e:
            return disabled_l3_layout(f"mooncake_sgl could not describe its layout: "
                                      f"{type(e).__name__}: {e}", backend="mooncake", page_size=page_size)

    @boundary(lambda *a, **k: StorageMetrics())
    def get_stats(self) -> StorageMetrics:
        """Pages and GB/s per prefetch and backup call since the previous call (then reset)."""
        return self._calls.drain()


touch_points.apply(touch_points.POINTS, touch_points.Phase.BACKEND)
