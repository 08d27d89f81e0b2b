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
  duration and page count, so a refusal can be read against the backups that held host slots.

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


def _timed(kind: str, original: Any) -> Any:
    @functools.wraps(original)
    def call(self: Any, keys: Any, *args: Any, **kw: Any) -> Any:
        t0 = time.time()
        out = original(self, keys, *args, **kw)
        _emit(kind, start=t0, seconds=time.time() - t0, pages=len(keys))
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
        if fullname != _CONTROLLER and fullname not in _STORAGE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            if fullname == _CONTROLLER:
                _patch_controller(module)
            else:
                _patch_storage(module, _STORAGE[fullname])

        spec.loader.exec_module = run  # type: ignore[method-assign]
        return spec


if _PATH:
    sys.meta_path.insert(0, _Finder())
