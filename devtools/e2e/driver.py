"""The CPU end-to-end run: SGLang's real ``HiCacheController`` drives our backend on a long-context
workload; this module plays the part of the radix cache (the scheduler side), which needs CUDA.

Why not the real ``UnifiedRadixCache`` (sglang 0.5.23), as tried on this CPU-only machine: with
``ServerArgs(device="cpu", enable_hierarchical_cache=True, hicache_storage_backend="mooncake")``
published, ``UnifiedRadixCache(CacheInitParams(...))`` builds, but ``init_hicache`` fails: the
hybrid pool assembler (``hybrid_pool_assembler.py``, host pool construction) builds the host pool
without a ``pin_memory`` argument, so the default ``pin_memory=True`` calls ``cudaHostRegister``
through ``torch.cuda.cudart()`` → "Found no NVIDIA driver" (getting that far also needs ``openai``,
``sniffio`` and ``partial-json-parser``, which the lean install lacks). Past that, load-back to the device and
the scheduler loop need CUDA streams and kernels too. The controller itself runs unmodified.

Per request, in the order ``UnifiedRadixCache`` does it with the device cache flushed:

1. match the prompt's pages against the host (L2) pool: an LRU of SGLang page hashes → host slots;
2. for the rest, ``controller.prefetch`` → the controller's prefetch thread hashes the tokens
   (``get_storage_hash_str``) and calls our ``batch_exists`` in chunks of 128; if the hit is at
   least ``prefetch_threshold`` tokens, host slots are allocated (evicting L2 pages as
   ``evict_host`` does) and handed back through ``prefetch_buffer``; the controller's IO thread
   calls our ``batch_get_v1`` in batches of 128 and acks through its sync thread;
3. the pages still missing are "prefilled": written into fresh host slots (deterministic bytes
   per page hash) and backed up with ``controller.write_storage`` → our ``batch_set_v1``.

Loaded pages are checked byte for byte against the pattern their hash implies. The report gives,
per request and round, where each token came from and the load time against the time to recompute
the same tokens at ``prefill_tokens_per_s``; per tier of our store, pages and bytes moved.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import torch

from devtools.testing.backend_record import store_stats

from .rig import Rig, build_rig
from .workload import KvShape, PagePattern, Request, WorkloadSpec, make_requests

# Llama-3-8B prefill on one H100 (bf16, long prompts, FlashAttention): roughly 10k-20k tokens/s
# depending on context length; the middle of that range is the stated default.
DEFAULT_PREFILL_TOKENS_PER_S = 15_000.0
_QUEUE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class E2EConfig:
    shape: KvShape = field(default_factory=KvShape)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    host_pool_pages: int = 136  # SGLang's host (L2) pool; must hold the largest request
    host_tier: str = "256MiB"  # our DRAM tier; "" leaves it out
    lmdb_capacity: str = "8GiB"
    lmdb_sync: bool = False
    work_dir: str = ""  # LMDB lives here; default: a fresh temporary directory
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    prefetch_threshold: int = 256
    policy: str = "adaptive"  # our store's placement policy: adaptive (the product default), heat or lru

    def extra_config(self, work_dir: Path) -> dict[str, Any]:
        """What ``--hicache-storage-backend-extra-config`` would hold for this run."""
        tiers: list[dict[str, Any]] = []
        if self.host_tier:
            tiers.append({"kind": "host", "capacity": self.host_tier, "pin_memory": False})
        tiers.append({"kind": "lmdb", "path": str(work_dir / "lmdb"), "capacity": self.lmdb_capacity,
                      "sync": self.lmdb_sync})
        return {"tiers": tiers, "policy": {"name": self.policy}}


class HostLru:
    """The host (L2) pool's page index as the radix cache would keep it: hash → first host slot,
    least recently used first. Eviction frees slots through the controller (``evict_host``)."""

    def __init__(self, rig: Rig):
        self._rig = rig
        self._pages: OrderedDict[str, int] = OrderedDict()
        self.evicted = 0

    def match(self, hashes: list[str]) -> int:
        run = 0
        for h in hashes:
            if h not in self._pages:
                break
            self._pages.move_to_end(h)
            run += 1
        return run

    def insert(self, hashes: list[str], host_indices: torch.Tensor) -> None:
        ps = self._rig.shape.page_size
        for i, h in enumerate(hashes):
            self._pages[h] = int(host_indices[i * ps])
            self._pages.move_to_end(h)

    def alloc(self, npages: int, protected: set[str]) -> torch.Tensor:
        """Host slots for ``npages`` pages, evicting unprotected LRU pages as needed."""
        pool, ps = self._rig.host_pool, self._rig.shape.page_size
        need = npages * ps
        while pool.available_size() < need:
            victim = next((h for h in self._pages if h not in protected), None)
            if victim is None:
                raise RuntimeError(f"host pool of {self._rig.host_capacity_pages} pages cannot hold "
                                   f"a {npages}-page request; raise host_pool_pages")
            first = self._pages.pop(victim)
            self._rig.controller.evict_host(torch.arange(first, first + ps, dtype=torch.int64))
            self.evicted += 1
        idx = pool.alloc(need)
        if idx is None:
            raise RuntimeError(f"host pool refused {need} slots with {pool.available_size()} free")
        return idx


def _wait(queue: Queue, what: str) -> Any:
    try:
        return queue.get(timeout=_QUEUE_TIMEOUT_S)
    except Empty:
        raise RuntimeError(f"SGLang's controller produced no {what} within {_QUEUE_TIMEOUT_S:.0f}s; "
                           "see the log for a storage-thread exception") from None


class _Runner:
    def __init__(self, config: E2EConfig, rig: Rig):
        self.cfg = config
        self.rig = rig
        self.cc = rig.controller
        self.ps = config.shape.page_size
        self.lru = HostLru(rig)
        self.pattern = PagePattern(config.shape)
        self.verify_failures = 0
        self.backup_failures = 0

    def _hashes(self, tokens: list[int]) -> list[str]:
        from sglang.srt.mem_cache.utils import get_hash_str

        n = len(tokens) // self.ps * self.ps
        return get_hash_str(tokens[:n], None, self.ps) if n else []

    def _prefetch(self, req: Request, hashes: list[str], host_hit: int, protected: set[str]
                  ) -> tuple[int, float, float]:
        """Storage pages loaded, query seconds, total load seconds (0 when nothing is fetched)."""
        ps = self.ps
        rest = req.tokens[host_hit * ps:len(hashes) * ps]
        if len(rest) < self.cc.prefetch_threshold:
            return 0, 0.0, 0.0
        start = time.perf_counter()
        op = self.cc.prefetch(req.rid, rest, hashes[host_hit - 1] if host_hit else None, None)
        answered = _wait(self.cc.prefetch_hit_queue, "storage hit query")
        if answered is not op:
            raise RuntimeError("controller answered a hit query for another request")
        query_s = time.perf_counter() - start
        hit_tokens = op.storage_hit_count
        if hit_tokens < self.cc.prefetch_threshold:
            return 0, query_s, 0.0  # the radix cache revokes hits below the threshold
        npages = hit_tokens // ps
        op.host_indices = self.lru.alloc(npages, protected)
        self.cc.prefetch_buffer.put(op)
        while True:
            ack = _wait(self.cc.ack_prefetch_queue, "prefetch ack")
            if ack.operation is not op:
                raise RuntimeError("controller acked another request's prefetch")
            if ack.completed_tokens is not None:
                op.completed_tokens = ack.completed_tokens
            if ack.completed_req:
                break
        load_s = time.perf_counter() - start
        loaded = op.completed_tokens // ps
        got = hashes[host_hit:host_hit + loaded]
        for i, h in enumerate(got):
            k, v = self.rig.page_regions(int(op.host_indices[i * ps]))
            if not self.pattern.matches(k, v, h):
                self.verify_failures += 1
        self.lru.insert(got, op.host_indices)
        if loaded < npages:
            self.cc.evict_host(op.host_indices[loaded * ps:])
        protected.update(got)
        return loaded, query_s, load_s

    def _prefill_and_backup(self, req: Request, hashes: list[str], first: int, protected: set[str]
                            ) -> float:
        ps, n = self.ps, len(hashes) - first
        if n <= 0:
            return 0.0
        idx = self.lru.alloc(n, protected)
        todo = hashes[first:]
        for i, h in enumerate(todo):
            self.pattern.fill(*self.rig.page_regions(int(idx[i * ps])), h)
        self.lru.insert(todo, idx)
        protected.update(todo)
        start = time.perf_counter()
        self.cc.write_storage(idx, req.tokens[first * ps:len(hashes) * ps], hash_value=todo)
        op = _wait(self.cc.ack_backup_queue, "backup ack")
        if op.completed_tokens != n * ps:
            self.backup_failures += n - op.completed_tokens // ps
        return time.perf_counter() - start

    def serve(self, req: Request) -> dict[str, Any]:
        hashes = self._hashes(req.tokens)
        host_hit = self.lru.match(hashes)
        protected = set(hashes[:host_hit])
        loaded, query_s, load_s = self._prefetch(req, hashes, host_hit, protected)
        backup_s = self._prefill_and_backup(req, hashes, host_hit + loaded, protected)
        ps = self.ps
        storage_tokens = loaded * ps
        return {
            "rid": req.rid, "round": req.question, "doc": req.doc, "prompt_tokens": len(req.tokens),
            "host_tokens": host_hit * ps, "storage_tokens": storage_tokens,
            "computed_tokens": len(req.tokens) - (host_hit + loaded) * ps,
            "query_s": query_s, "load_s": load_s, "backup_s": backup_s,
            "recompute_s": storage_tokens / self.cfg.prefill_tokens_per_s,
        }


def _memory() -> dict[str, float]:
    """Peak RSS, and the current split: anonymous and shared memory (the pools; SGLang maps its host
    pool MAP_SHARED) vs file-backed (LMDB's map: page cache the kernel can drop)."""
    out = {"peak_rss_bytes": float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                out[name.lower() + "_bytes"] = float(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, dict[str, int]]:
    keys = ("hits", "bytes_read", "writes", "bytes_written", "promotions", "demotions", "evictions")
    out = {}
    for name, stats in after["tiers"].items():
        now, prev = stats["store"], before["tiers"].get(name, {}).get("store", {})
        out[name] = {k: int(now.get(k, 0)) - int(prev.get(k, 0)) for k in keys}
        out[name]["pages_now"] = int(stats["usage"].get("pages", 0))
    return out


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    loads = [r["load_s"] for r in rows if r["storage_tokens"]]
    storage = sum(r["storage_tokens"] for r in rows)
    load_total = sum(loads)
    recompute = sum(r["recompute_s"] for r in rows)
    return {
        "requests": len(rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "host_tokens": sum(r["host_tokens"] for r in rows),
        "storage_tokens": storage,
        "computed_tokens": sum(r["computed_tokens"] for r in rows),
        "requests_with_storage_hits": len(loads),
        "load_s_mean": statistics.fmean(loads) if loads else 0.0,
        "load_s_p50": _pct(loads, 0.5),
        "load_s_p99": _pct(loads, 0.99),
        "load_s_total": load_total,
        "recompute_s_total": recompute,
        "load_vs_recompute": (load_total / recompute) if recompute else None,
        "load_tokens_per_s": (storage / load_total) if load_total else None,
        "backup_s_total": sum(r["backup_s"] for r in rows),
    }


def run_e2e(config: E2EConfig, on_request: Callable[[dict[str, Any]], None] | None = None
            ) -> dict[str, Any]:
    """Run the workload; returns the JSON-able report (see ``report.format_report``)."""
    requests = make_requests(config.workload, config.shape.page_size)
    largest = max(len(r.tokens) for r in requests) // config.shape.page_size
    if config.host_pool_pages < largest:
        raise ValueError(f"host_pool_pages={config.host_pool_pages} is smaller than the largest "
                         f"request ({largest} pages); SGLang's host pool always holds one request")
    with tempfile.TemporaryDirectory(prefix="mooncake-sgl-e2e-", dir=config.work_dir or None) as tmp:
        started = time.perf_counter()
        rig = build_rig(config.shape, config.host_pool_pages, config.extra_config(Path(tmp)),
                        prefetch_threshold=config.prefetch_threshold)
        try:
            runner = _Runner(config, rig)
            before = store_stats(rig.backend)
            rows = []
            for req in requests:
                rows.append(runner.serve(req))
                if on_request is not None:
                    on_request(rows[-1])
            after = store_stats(rig.backend)
            metrics = rig.backend.get_stats()
            memory = _memory()
        finally:
            rig.close()
        wall = time.perf_counter() - started
    rounds = sorted({r["round"] for r in rows})
    shape = config.shape
    return {
        "config": {**asdict(config), "shape": {**asdict(shape), "dtype": str(shape.dtype)},
                   "page_bytes": shape.page_bytes, "store_extra_config": config.extra_config(Path("<tmp>"))},
        "sglang": {"backend_class": rig.backend_class, "controller": type(rig.controller).__name__,
                   "host_pool": type(rig.host_pool).__name__, "host_pool_pages": rig.host_capacity_pages,
                   "page_io": "batch_get_v1/batch_set_v1 (zero copy)",
                   "prefetch_pages": sum(metrics.prefetch_pgs), "backup_pages": sum(metrics.backup_pgs)},
        "tiers": _delta(after, before),
        "host_pool_evictions": runner.lru.evicted,
        "verify_failures": runner.verify_failures,
        "backup_failures": runner.backup_failures,
        "rounds": [{"round": q, **_summarise([r for r in rows if r["round"] == q])} for q in rounds],
        "totals": _summarise(rows),
        "requests": rows,
        "memory": memory,
        "wall_s": wall,
    }
