"""Hybrid-model host pools built with real sglang 0.5.23 classes on CPU, the transfers SGLang's
cache controller builds for them, a ``HybridCacheController`` whose storage-thread methods run
without its threads, and SGLang's own Mooncake Store backend on a real ``mooncake_master``.

Setups (``SETUPS``):
- ``mha+mamba``: ``MHATokenToKVPoolHost`` + ``MambaPoolHost`` (one state per node end, trailing 1).
- ``mla+dsa``:   ``MLATokenToKVPoolHost`` + ``DSAIndexerPoolHost`` from a CPU ``DSATokenToKVPool``
                 (KV-derived: the indexer reuses the KV host indices; all pages).
- ``mha+swa``:   ``MHATokenToKVPoolHost`` + a second MHA host pool for the sliding-window layers
                 (trailing window of ``SWA_WINDOW`` pages).
"""

from __future__ import annotations

import ctypes
import random
import threading
from dataclasses import dataclass, field
from queue import Queue
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (
    HybridCacheController,
    PrefetchOperation,
    StorageOperation,
)
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
from sglang.srt.mem_cache.pool_host import HostPoolGroup, PoolEntry
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_hash_str

from mooncake_sgl.buffers import view_at

from . import pools

SETUPS = ("mha+mamba", "mla+dsa", "mha+swa")
SWA_WINDOW = 2  # pages the sliding-window pool keeps at a node end
DSA_PAGE = 64  # DSATokenToKVPool requires 64-token pages
MAMBA_SLOTS = 16


@dataclass
class Hybrid:
    """One hybrid setup: the KV anchor, one sidecar pool, and how SGLang moves the sidecar."""

    name: str
    kv: Any
    side_name: PoolName
    side: Any
    page: int
    is_mla: bool
    group: HostPoolGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = HostPoolGroup([
            PoolEntry(name=PoolName.KV, host_pool=self.kv, device_pool=None, layer_mapper=lambda i: i,
                      is_primary_index_anchor=True),
            PoolEntry(name=self.side_name, host_pool=self.side, device_pool=None,
                      layer_mapper=lambda i: i)])

    @property
    def kv_derived(self) -> bool:
        return self.side_name == PoolName.INDEXER

    def tokens(self, npages: int, seed: int) -> list[int]:
        rnd = random.Random(seed)
        return [rnd.randrange(150_000) for _ in range(npages * self.page)]

    def hashes(self, tokens: list[int], prior: str | None = None) -> list[str]:
        return list(get_hash_str(tokens, prior, self.page))

    def side_slots(self, npages: int) -> int:
        """Host slots of the sidecar one node end needs (Mamba: one state slot)."""
        return 1 if self.side_name == PoolName.MAMBA else npages * self.page

    def backup_transfer(self, node_hashes: list[str]) -> tuple[PoolTransfer, torch.Tensor | None]:
        """The sidecar transfer a node's backup carries (``CacheTransferPhase.BACKUP_STORAGE``),
        and the sidecar host slots it reads (``None`` when it reuses the KV slots)."""
        if self.kv_derived:
            return PoolTransfer(name=self.side_name, indices_from_pool=PoolName.KV), None
        window = 1 if self.side_name == PoolName.MAMBA else SWA_WINDOW
        idx = self.side.alloc(self.side_slots(window))
        return PoolTransfer(name=self.side_name, host_indices=idx, keys=node_hashes[-window:],
                            hit_policy=PoolHitPolicy.TRAILING_PAGES), idx

    def query_transfer(self) -> PoolTransfer:
        """The sidecar transfer a prefetch query carries (``CacheTransferPhase.PREFETCH``)."""
        if self.kv_derived:
            return PoolTransfer(name=self.side_name, indices_from_pool=PoolName.KV)
        window = 1 if self.side_name == PoolName.MAMBA else SWA_WINDOW
        return PoolTransfer(name=self.side_name, keys=["__placeholder__"] * window,
                            hit_policy=PoolHitPolicy.TRAILING_PAGES)


def build(name: str) -> Hybrid:
    """A fresh setup (new host memory each call, so two backends never share destinations)."""
    with host_memory_budget_scope(1 << 30):
        if name == "mha+mamba":
            # 6.5 KiB of state per slot: more than one 4 KiB KV page, so it is stored in parts.
            temporal = torch.zeros(3, MAMBA_SLOTS, 2, 16, 16, dtype=torch.float32)
            conv = (torch.zeros(3, MAMBA_SLOTS, 3, 16, dtype=torch.bfloat16),
                    torch.zeros(3, MAMBA_SLOTS, 3, 8, dtype=torch.bfloat16))
            mamba = MambaPoolHost(MambaStateBufferInfo(temporal=temporal, conv=conv), 2.0, 0,
                                  device_capacity=MAMBA_SLOTS, pin_memory=False, layout="page_first")
            return Hybrid(name, pools.build_pool("mha", "page_first"), PoolName.MAMBA, mamba,
                          pools.PAGE, False)
        if name == "mla+dsa":
            device = DSATokenToKVPool(
                size=16 * DSA_PAGE, page_size=DSA_PAGE, kv_lora_rank=pools.KV_LORA_RANK,
                dtype=pools.DTYPE, qk_rope_head_dim=pools.ROPE_DIM, layer_num=2, device="cpu",
                index_head_dim=128, enable_memory_saver=False,
                kv_cache_dim=pools.KV_LORA_RANK + pools.ROPE_DIM, index_buf_size=16 * DSA_PAGE)
            kv = MLATokenToKVPoolHost(device.get_device_pool_infos()[0].buffer_info, 2.0, 0, DSA_PAGE,
                                      "page_first", pin_memory=False, device="cpu",
                                      device_capacity_tokens=16 * DSA_PAGE, start_layer=0, end_layer=2,
                                      target_layer_num=2)
            indexer = DSAIndexerPoolHost(decl=make_dsa_indexer_pool_decl(device), anchor_host=kv,
                                         pin_memory=False)
            return Hybrid(name, kv, PoolName.INDEXER, indexer, DSA_PAGE, True)
        if name == "mha+swa":
            return Hybrid(name, pools.build_pool("mha", "page_first"), PoolName.SWA,
                          pools.build_pool("mha", "page_first"), pools.PAGE, False)
    raise ValueError(f"unknown hybrid setup {name!r}; known: {SETUPS}")


def storage_config(setup: Hybrid, extra: dict[str, Any], model: str = pools.MODEL) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=setup.is_mla, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config=extra)


def attach(backend: Any, setup: Hybrid) -> Any:
    """What ``HybridCacheController.attach_storage_backend`` does after creating the backend."""
    backend.register_mem_pool_host(setup.kv)
    for entry in setup.group.entries:
        backend.register_mem_host_pool_v2(entry.host_pool, entry.name)
    backend.on_host_pools_registered()
    return backend


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


def _segments(pool: Any, idx: torch.Tensor) -> list[tuple[int, int]]:
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    return list(zip((int(p) for p in ptrs), (int(n) for n in sizes), strict=True))


def read(pool: Any, idx: torch.Tensor) -> bytes:
    """Every byte the pool's pages at ``idx`` hold, segments in the pool's own order."""
    return b"".join(ctypes.string_at(p, n) for p, n in _segments(pool, idx))


def fill(pool: Any, idx: torch.Tensor, seed: int) -> None:
    """Seeded random bytes into every segment of the pool's pages at ``idx``."""
    rng = np.random.default_rng(seed)
    for p, n in _segments(pool, idx):
        np.frombuffer(view_at(p, n), dtype=np.uint8)[:] = rng.integers(0, 256, n, dtype=np.uint8)
