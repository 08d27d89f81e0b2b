"""SGLang's own controller code and SGLang's own Mooncake Store backend around the hybrid setups of
``devtools.testing.hybrid_pools``: a ``HybridCacheController`` whose storage-thread methods
(backup, hit query, prefetch transfer) run without its threads, and the built-in ``MooncakeStore``
attached like ours on a real ``mooncake_master``."""

from __future__ import annotations

import threading
from queue import Queue
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolTransfer
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (
    HybridCacheController,
    PrefetchOperation,
    StorageOperation,
)

from devtools.testing.hybrid_pools import SETUPS, Hybrid, Shape, build, fill, read

from . import pools

__all__ = ["SETUPS", "Hybrid", "Shape", "attach", "backup", "build", "builtin_backend", "controller", "fill",
           "prefetch", "query", "read", "storage_config"]


def storage_config(setup: Hybrid, extra: dict[str, Any], model: str = pools.MODEL) -> HiCacheStorageConfig:
    return setup.storage_config(extra, model)


def attach(backend: Any, setup: Hybrid) -> Any:
    return setup.attach(backend)


def builtin_backend(setup: Hybrid, master: Any) -> Any:
    """SGLang's own ``MooncakeStore`` over the master, attached like ours."""
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    extra = {"master_server_address": master.rpc_address, "metadata_server": "P2PHANDSHAKE",
             "protocol": "tcp", "local_hostname": "127.0.0.1", "global_segment_size": 64 << 20,
             "device_name": ""}
    return attach(MooncakeStore(storage_config(setup, extra), setup.kv), setup)


def controller(setup: Hybrid, backend: Any) -> HybridCacheController:
    """A ``HybridCacheController`` carrying just the state its storage-thread methods read."""
    ctl = object.__new__(HybridCacheController)
    ctl.storage_backend = backend
    ctl.storage_backend_type = "mooncake"
    ctl.mem_pool_host = setup.group
    ctl.storage_host_pool = setup.kv
    ctl.page_size = setup.page
    ctl.storage_config = backend.storage_config  # backup_skip: not is_storage_writer
    ctl.prefetch_sync_queue = Queue()
    ctl.host_mem_release_queue = Queue()
    ctl.extra_host_mem_release_queues = {}
    ctl.page_set_func = ctl._page_set_zero_copy
    ctl.page_get_func = ctl._page_get_zero_copy
    return ctl


def backup(ctl: HybridCacheController, setup: Hybrid, tokens: list[int], kv_idx: torch.Tensor,
           transfer: PoolTransfer, prior: str | None = None, prefix_keys: list[str] | None = None
           ) -> StorageOperation:
    """Back one node up (``transfer``: its sidecar) through the controller's backup-thread code."""
    hashes = setup.hashes(tokens, prior)
    op = StorageOperation(kv_idx, tokens, hash_value=hashes, prefix_keys=prefix_keys,
                          pool_transfers=[transfer])
    HybridCacheController._page_backup(ctl, op)
    return op


def query(ctl: HybridCacheController, setup: Hybrid, tokens: list[int]) -> PrefetchOperation:
    """The prefetch thread's hit query (``_storage_hit_query``) for ``tokens``."""
    op = PrefetchOperation(SimpleNamespace(rid=f"req-{threading.get_ident()}"), tokens,
                           pool_transfers=[setup.query_transfer()])
    op.hash_value, op.storage_hit_count = HybridCacheController._storage_hit_query(ctl, op)
    return op


def prefetch(ctl: HybridCacheController, setup: Hybrid, op: PrefetchOperation
             ) -> tuple[int, dict[str, int], torch.Tensor, torch.Tensor | None]:
    """Allocate host slots for the hit as the scheduler does, then run the prefetch-IO thread's
    transfer. Returns (KV pages loaded, sidecar pool hits, KV slots, sidecar slots)."""
    npages = len(op.hash_value)
    op.host_indices = setup.kv.alloc(npages * setup.page)
    side_idx = None
    for transfer in op.pool_transfers:
        if transfer.indices_from_pool is None:
            window = len(transfer.keys)
            side_idx = setup.side.alloc(setup.side_slots(window))
            transfer.host_indices = side_idx
    HybridCacheController._page_transfer_with_stable_layout(ctl, op)
    acks = []
    while not ctl.prefetch_sync_queue.empty():
        acks.append(ctl.prefetch_sync_queue.get())
    kv_tokens = max((a.completed_tokens for a in acks if a.completed_tokens), default=0)
    pool_hits = next((a.pool_hits for a in reversed(acks) if getattr(a, "pool_hits", None)), {})
    return kv_tokens // setup.page, pool_hits, op.host_indices, side_idx

