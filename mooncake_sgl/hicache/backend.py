"""``MooncakeSglStorage``: SGLang's ``HiCacheStorage`` over our ``TieredStore``.

A thin, honest adapter: page hashes become ``PageKey``s in this process's namespace (one function,
the same in exists, get and set), host slot indices become ``PageView``s over the host pool, and
every failure becomes a miss. No tier logic lives here.

Why subclass ``HiCacheStorage`` and not SGLang's built-in ``MooncakeStore``: the built-in's
``__init__`` needs the real ``mooncake`` package and a master, and its keys and IO are its own; we
take over the name ``mooncake`` (see ``plugin.py``) and handle what the name switches on there.

Threading: SGLang calls from its prefetch, prefetch-IO, backup and scheduler threads at once. The
store is thread-safe; the only state here is the metrics lists (under a lock) and the pool binding,
set once at attach before IO starts.

Error boundary: every public method catches ``Exception`` and answers a miss (``False``, ``0``,
``[False] * n``, or ``None`` for one legacy page), logging at most one line per method per
``_LOG_INTERVAL_S``. A ``None`` where a list is expected would kill SGLang's storage thread.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from ..api import PageKey
from ..config import load_config
from ..keys import KeyNamespace, page_key
from ..store import TieredStore, build_store
from . import layout

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except ImportError:  # sglang <= 0.5.5
    from sglang.srt.metrics.collector import StorageMetrics  # type: ignore[no-redef]

logger = logging.getLogger(__name__)

# Arbitrary: one log line per failing method per half minute keeps a dead tier from flooding logs.
_LOG_INTERVAL_S = 30.0


class _RateLimitedLog:
    """At most one warning per operation name per interval; counts what it swallowed."""

    def __init__(self, interval_s: float = _LOG_INTERVAL_S):
        self._interval = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def report(self, op: str, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(op)
            if last is not None and now - last < self._interval:
                self._suppressed[op] = self._suppressed.get(op, 0) + 1
                return
            self._last[op] = now
            suppressed = self._suppressed.pop(op, 0)
        logger.warning("mooncake_sgl %s failed, answering a miss: %s: %s (%d similar failures since "
                       "the last report)", op, type(exc).__name__, exc, suppressed)


def _count(keys: Any) -> int:
    try:
        return len(keys)
    except Exception:
        return 0


def _boundary(miss: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn any exception of the wrapped method into ``miss(*args)`` plus a rate-limited log line."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def guarded(self: MooncakeSglStorage, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except Exception as e:
                self._errors.report(fn.__name__, e)
                return miss(*args, **kwargs)
        return guarded
    return wrap


def _all_false(keys: Any, *_: Any, **__: Any) -> list[bool]:
    return [False] * _count(keys)


def _none_each(keys: Any, *_: Any, **__: Any) -> list[None]:
    return [None] * _count(keys)


def _normalise(results: Any, n: int) -> list[bool]:
    # Exactly one bool per key whatever a tier answered.
    out = [bool(r) for r in (results or [])][:n]
    return out + [False] * (n - len(out))


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
        self._errors = _RateLimitedLog()
        self._store_config = load_config(getattr(storage_config, "extra_config", None))
        self._writer = layout.is_storage_writer(storage_config)
        self._metrics_on = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._metrics_lock = threading.Lock()
        self._prefetch_pgs: list[int] = []
        self._backup_pgs: list[int] = []
        self._prefetch_bw: list[float] = []
        self._backup_bw: list[float] = []
        self._geometry: layout.PoolGeometry | None = None
        self._ns: KeyNamespace | None = None
        self.mem_pool_host = None
        self._closed = False
        self._store: TieredStore = build_store(self._store_config, layout.rank_suffix(storage_config))
        # ``dynamic`` passes a kwargs dict where ``mooncake`` passes the pool.
        if mem_pool_host is not None and not isinstance(mem_pool_host, dict):
            try:
                self.register_mem_pool_host(mem_pool_host)
            except BaseException:
                self._store.close()  # SGLang drops a backend whose constructor failed
                raise

    # ------------------------------------------------------------------ attach

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Bind the anchor KV host pool: its geometry fixes the key namespace.

        Raises: whatever probing the pool raises; SGLang then fails the attach (an unusable pool
        must not look like an empty cache).
        """
        if mem_pool_host is self.mem_pool_host:
            return  # the factory's constructor call and the controller's both register it
        geometry = layout.pool_geometry(mem_pool_host)
        ns = layout.key_namespace(self.storage_config, geometry, self._store_config.namespace_tag)
        super().register_mem_pool_host(mem_pool_host)
        self._ns, self._geometry = ns, geometry
        buf = getattr(mem_pool_host, "kv_buffer", None)
        buffers = [buf] if isinstance(buf, torch.Tensor) else list(mem_pool_host.get_hybrid_pool_buffer())
        for t in buffers:
            self._store.register_memory(t.data_ptr(), t.numel() * t.element_size())
        logger.info("mooncake_sgl: namespace %s, %d-byte pages in %d segments, local files '%s'",
                    self._ns.describe(), geometry.page_nbytes, len(geometry.segment_sizes),
                    layout.rank_suffix(self.storage_config))

    # ------------------------------------------------------------------ keys

    def _keys(self, hashes: list[str]) -> list[PageKey]:
        if self._ns is None:
            raise RuntimeError("no host pool registered yet (register_mem_pool_host)")
        return [page_key(self._ns, h) for h in hashes]

    def _parent(self, extra_info: Any) -> PageKey | None:
        h = layout.parent_hash(extra_info)
        return page_key(self._ns, h) if h is not None and self._ns is not None else None

    def _live(self) -> None:
        if self._closed:
            raise RuntimeError("backend is closed")

    # ------------------------------------------------------------------ zero-copy path

    @_boundary(_all_false)
    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        """Read pages into the host slots ``host_indices`` (``page_size`` slots per key).

        Returns one bool per key; SGLang uses the leading run of ``True``. Destinations of
        ``False`` pages may be partly written.
        """
        self._live()
        start = time.perf_counter()
        pages = layout.page_views(self.mem_pool_host, self._geometry, host_indices, len(keys))
        ok = _normalise(self._store.get_into(self._keys(keys), pages), len(keys))
        self._record(self._prefetch_pgs, self._prefetch_bw, sum(ok), start)
        return ok

    @_boundary(_all_false)
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
        pages = layout.page_views(self.mem_pool_host, self._geometry, host_indices, len(keys))
        ok = _normalise(self._store.put_from(self._keys(keys), pages, self._parent(extra_info)), len(keys))
        self._record(self._backup_pgs, self._backup_bw, sum(ok), start)
        return ok

    # ------------------------------------------------------------------ existence

    @_boundary(lambda *a, **k: 0)
    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """Length of the leading run of ``keys`` readable in some tier (prefix semantics)."""
        self._live()
        if not keys:
            return 0
        return int(self._store.exists_prefix(self._keys(keys), self._parent(extra_info)))

    @_boundary(lambda *a, **k: False)
    def exists(self, key: str) -> bool:
        self._live()
        return bool(self._store.contains(self._keys([key]))[0])

    # ------------------------------------------------------------------ legacy copy path
    # Used by SGLang only under ``dynamic`` without ``interface_v1``. Values are flat page tensors
    # (``get_data_page(flat=True)``); ``layout.flat_page_view`` orders them like zero-copy pages, so
    # the same key holds the same bytes on both paths.

    @_boundary(lambda *a, **k: None)
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        """Read one page into ``target_location`` (a flat page; allocated when not given).

        Returns the tensor, or ``None`` on a miss.
        """
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    @_boundary(_none_each)
    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        """Per key: the filled flat page tensor, or ``None`` on a miss."""
        self._live()
        if target_locations is None:
            target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        # Filled in place, so they must already be contiguous CPU pages (flat_page_view checks).
        pages = [layout.flat_page_view(self._geometry, t) for t in target_locations]
        ok = _normalise(self._store.get_into(self._keys(keys), pages), len(keys))
        return [t if good else None for t, good in zip(target_locations, ok, strict=True)]

    @_boundary(lambda *a, **k: False)
    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        """Store one flat page tensor under ``key``."""
        return self.batch_set([key], [value])

    @_boundary(lambda *a, **k: False)
    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Store flat page tensors; ``True`` only if every page is readable afterwards."""
        self._live()
        if not self._writer:
            return True
        src = [v.detach().to("cpu").contiguous() for v in values]  # keeps the copies alive
        pages = [layout.flat_page_view(self._geometry, t) for t in src]
        return all(_normalise(self._store.put_from(self._keys(keys), pages), len(keys)))

    # ------------------------------------------------------------------ lifecycle, metrics

    @_boundary(lambda *a, **k: None)
    def clear(self) -> None:
        """Drop every page of every tier (``POST /hicache/storage-backend/clear``)."""
        self._live()
        self._store.clear()

    @_boundary(lambda *a, **k: None)
    def close(self) -> None:
        """Close the tiers; idempotent. Later calls answer misses."""
        if self._closed:
            return
        self._closed = True
        self._store.close()

    def _record(self, pgs: list[int], bws: list[float], pages: int, start: float) -> None:
        if not self._metrics_on or pages <= 0:
            return
        elapsed = max(time.perf_counter() - start, 1e-9)
        gbps = pages * self._geometry.page_nbytes / elapsed / 1e9
        with self._metrics_lock:
            pgs.append(pages)
            bws.append(gbps)

    @_boundary(lambda *a, **k: StorageMetrics())
    def get_stats(self) -> StorageMetrics:
        """Pages and GB/s per prefetch and backup call since the previous call (then reset)."""
        metrics = StorageMetrics()
        with self._metrics_lock:
            metrics.prefetch_pgs.extend(self._prefetch_pgs)
            metrics.backup_pgs.extend(self._backup_pgs)
            metrics.prefetch_bandwidth.extend(self._prefetch_bw)
            metrics.backup_bandwidth.extend(self._backup_bw)
            for lst in (self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw):
                lst.clear()
        return metrics

    def store_stats(self) -> dict[str, object]:
        """The tiered store's own counters (for ``mooncake-sgl stats`` and tests)."""
        return self._store.stats()
