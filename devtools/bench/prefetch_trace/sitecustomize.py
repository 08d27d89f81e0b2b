"""Diagnostic, not product: a timeline of SGLang's storage-hit allocations in a live server.

Put this folder first on a server's ``PYTHONPATH`` and set ``MOONCAKE_SGL_PREFETCH_TRACE=FILE``
(``scripts/bench_prefetch.py --trace DIR`` does both for the variants it names); every process of
that server then appends JSON lines to ``FILE.<pid>``:

- ``alloc``: each ``allocate_storage_hit`` (the step where SGLang stages a storage hit in its host
  pool): the hit, the host pool's size and free tokens before, the tokens ``evict_host`` freed, the
  free tokens after, what was allocated (0: refused, ``host_capacity``), the device pool's used
  tokens (their host copies are pinned under ``write_through`` while they stay on the device), the
  backups queued or running and the prefetches in flight;
- ``set`` / ``get`` / ``exists``: each call into the storage backend (ours or any other), with its
  duration and page count (and, ours, the recompute rate its load gate judged by), so a refusal
  can be read against the backups that held host slots;
- ours: ``where`` (locating a hit), ``bounded`` (each bounded read of the load gate, as its asker
  waited for it) and ``staged`` (the same read on the store's reader thread);
- the scheduler's side of a storage hit: ``prefetch`` (``prefetch_from_storage`` asked for a
  request), ``transfer`` (the controller's read of it ended: the pages it got), ``progress``
  (``check_prefetch_progress`` first answered not done, then done) and ``batch`` (each batch run:
  its requests, mode and duration), so the time between the backend's answer and the request's
  first token can be placed.

Nothing here changes what SGLang does: each wrapper calls the original and returns its result.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time
from typing import Any

_PATH = os.environ.get("MOONCAKE_SGL_PREFETCH_TRACE", "")
_CONTROLLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller"
_BASE_CONTROLLER = "sglang.srt.managers.cache_controller"
_RADIX = "sglang.srt.mem_cache.unified_radix_cache"
_SCHEDULER = "sglang.srt.managers.scheduler"
_STORAGE = {"mooncake_sgl.hicache.backend": "MooncakeSglStorage",
            "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store": "MooncakeStore"}
_lock = threading.Lock()


def _emit(kind: str, **fields: Any) -> None:
    line = json.dumps({"t": time.time(), "kind": kind, **fields}) + "\n"
    with _lock, open(f"{_PATH}.{os.getpid()}", "a") as f:
        f.write(line)


def _size(fn: Any) -> int:
    try:
        return int(fn())
    except Exception:
        return -1


def _patch_controller(module: Any) -> None:
    cls = module.HybridCacheController
    original = cls.allocate_storage_hit

    @functools.wraps(original)
    def allocate_storage_hit(self: Any, operation: Any, hit_tokens: int, **kw: Any) -> Any:
        host = self.mem_pool_host
        evicted = []
        evict = kw.get("evict_host")
        if evict is not None:
            def counted(n: int, evict: Any = evict) -> Any:
                before = _size(host.available_size)
                out = evict(n)
                evicted.append(_size(host.available_size) - before)
                return out
            kw["evict_host"] = counted
        cache = getattr(evict, "__self__", None)
        device = getattr(cache, "token_to_kv_pool_allocator", None)
        free0 = _size(host.available_size)
        indices, alloc_len = original(self, operation, hit_tokens, **kw)
        queue = getattr(self, "backup_queue", None)
        _emit("alloc", rid=str(getattr(operation, "request_id", "")), hit=hit_tokens,
              host_size=int(getattr(host, "size", -1)), host_free_before=free0,
              evicted=sum(evicted), host_free_after=_size(host.available_size),
              allocated=0 if indices is None else alloc_len, min_tokens=kw.get("min_tokens"),
              device_used=(int(device.size) - _size(device.available_size)) if device is not None else -1,
              backups_queued=queue.qsize() if queue is not None else -1,
              prefetching=len(getattr(cache, "ongoing_prefetch", ()) or ()))
        return indices, alloc_len

    cls.allocate_storage_hit = allocate_storage_hit


def _patch_transfer(module: Any) -> None:
    cls = module.HiCacheController
    original = cls._page_transfer

    @functools.wraps(original)
    def _page_transfer(self: Any, operation: Any) -> Any:
        t0 = time.time()
        out = original(self, operation)
        _emit("transfer", rid=str(getattr(operation, "request_id", "")), start=t0,
              seconds=time.time() - t0, pages=out)
        return out

    cls._page_transfer = _page_transfer


def _patch_radix(module: Any) -> None:
    cls = module.UnifiedRadixCache
    prefetch, progress = cls.prefetch_from_storage, cls.check_prefetch_progress
    waiting: set[str] = set()

    @functools.wraps(prefetch)
    def prefetch_from_storage(self: Any, request: Any, *args: Any, **kw: Any) -> Any:
        _emit("prefetch", rid=str(getattr(request, "rid", "")))
        return prefetch(self, request, *args, **kw)

    @functools.wraps(progress)
    def check_prefetch_progress(self: Any, request: Any) -> Any:
        done = progress(self, request)
        rid = str(getattr(request, "rid", ""))
        if not done and rid not in waiting:
            waiting.add(rid)
            _emit("progress", rid=rid, done=False)
        elif done:
            waiting.discard(rid)
            _emit("progress", rid=rid, done=True)
        return done

    cls.prefetch_from_storage = prefetch_from_storage
    cls.check_prefetch_progress = check_prefetch_progress


def _patch_scheduler(module: Any) -> None:
    cls = module.Scheduler
    original = cls.run_batch

    @functools.wraps(original)
    def run_batch(self: Any, batch: Any, *args: Any, **kw: Any) -> Any:
        t0 = time.time()
        out = original(self, batch, *args, **kw)
        _emit("batch", start=t0, seconds=time.time() - t0, mode=str(getattr(batch, "forward_mode", "")),
              rids=[str(r.rid) for r in getattr(batch, "reqs", ())])
        return out

    cls.run_batch = run_batch


def _patch_store(module: Any) -> None:
    """Our store's bounded reads (the load gate's steps): each as its asker saw it (``bounded``)
    and as its reader thread read it (``staged``), so waiting on threads can be told from
    reading; and locating a hit (``where``)."""
    cls = module.TieredStore
    within, staged, where = cls.get_into_within, cls._read_staged, cls.where

    @functools.wraps(within)
    def get_into_within(self: Any, keys: Any, *args: Any, **kw: Any) -> Any:
        t0 = time.time()
        out = within(self, keys, *args, **kw)
        _emit("bounded", start=t0, seconds=time.time() - t0, pages=len(keys), ok=out is not None)
        return out

    @functools.wraps(staged)
    def read_staged(self: Any, keys: Any, *args: Any, **kw: Any) -> Any:
        t0 = time.time()
        out = staged(self, keys, *args, **kw)
        _emit("staged", start=t0, seconds=time.time() - t0, pages=len(keys))
        return out

    @functools.wraps(where)
    def located(self: Any, keys: Any) -> Any:
        t0 = time.time()
        out = where(self, keys)
        _emit("where", start=t0, seconds=time.time() - t0, pages=len(keys))
        return out

    cls.get_into_within, cls._read_staged, cls.where = get_into_within, read_staged, located


_PATCHES = {_CONTROLLER: _patch_controller, _BASE_CONTROLLER: _patch_transfer, _RADIX: _patch_radix,
            _SCHEDULER: _patch_scheduler, "mooncake_sgl.store.tiered_store": _patch_store}


def _timed(kind: str, original: Any) -> Any:
    @functools.wraps(original)
    def call(self: Any, keys: Any, *args: Any, **kw: Any) -> Any:
        t0 = time.time()
        out = original(self, keys, *args, **kw)
        gate = getattr(self, "_gate", None)  # ours: the recompute rate its judgement used
        rate = {} if gate is None else {"gate_s_per_token": gate.stats().prefill_seconds_per_token}
        _emit(kind, start=t0, seconds=time.time() - t0, pages=len(keys), **rate)
        return out
    return call


def _patch_storage(module: Any, name: str) -> None:
    cls = getattr(module, name)
    for method, kind in (("batch_set_v1", "set"), ("batch_get_v1", "get"), ("batch_exists", "exists")):
        if method in cls.__dict__:
            setattr(cls, method, _timed(kind, cls.__dict__[method]))


class _Finder(importlib.abc.MetaPathFinder):
    """Patches each traced module right after it is first executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _PATCHES and fullname not in _STORAGE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            if fullname in _PATCHES:
                _PATCHES[fullname](module)
            else:
                _patch_storage(module, _STORAGE[fullname])

        spec.loader.exec_module = run  # type: ignore[method-assign]
        return spec


if _PATH:
    sys.meta_path.insert(0, _Finder())
