"""Hybrid-model host pools built with real sglang 0.5.23 classes on CPU, and the sidecar transfers
SGLang's cache controller builds for them. Tests and ``scripts/bench_v2.py`` drive backends with
these; nothing on a serving path imports this module.

Setups (``SETUPS``):
- ``mha+mamba``: ``MHATokenToKVPoolHost`` + ``MambaPoolHost`` (one state per node end, trailing 1);
- ``mla+dsa``:   ``MLATokenToKVPoolHost`` + ``DSAIndexerPoolHost`` from a CPU ``DSATokenToKVPool``
                 (KV-derived: the indexer reuses the KV host indices; all pages);
- ``mha+swa``:   ``MHATokenToKVPoolHost`` + a second MHA host pool for the sliding-window layers
                 (trailing window of ``Shape.swa_window`` pages);
- ``mha+draft``: ``MHATokenToKVPoolHost`` + the speculative draft model's MHA host pool (KV-derived:
                 same host indices; all pages);
- ``dsv4``:      DeepSeek V4's shape: a ``LogicalHostPool`` KV anchor (indices only, no bytes) + a
                 ``DeepSeekV4PagedHostPool`` compressed pool (``deepseek_v4_c4``, KV-derived, all
                 pages) that carries every byte.

Construction notes (sglang 0.5.23 on CPU): ``pin_memory=False`` everywhere (pinning needs CUDA);
``DSATokenToKVPool`` needs ``index_buf_size`` (its default reads a DCP width a CPU process never
publishes), 64-token pages and ``index_head_dim=128``; ``DSAIndexerHostPoolBuilder.build`` takes no
``pin_memory``, so ``DSAIndexerPoolHost`` is constructed directly.
"""

from __future__ import annotations

import ctypes
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.device_pool_info import (
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolHitPolicy, PoolName, PoolTransfer
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
from sglang.srt.mem_cache.memory_pool_host import DeepSeekV4PagedHostPool, LogicalHostPool
from sglang.srt.mem_cache.pool_host import HostPoolGroup, PoolEntry
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_hash_str

from mooncake_sgl.buffers import view_at

SETUPS = ("mha+mamba", "mla+dsa", "mha+swa", "mha+draft", "dsv4")
DSA_PAGE = 64  # DSATokenToKVPool requires 64-token pages
DSA_INDEX_HEAD_DIM = 128  # ... and this index head dim


@dataclass(frozen=True)
class Shape:
    """Sizes of the pools; the defaults are tiny (tests move bytes in milliseconds)."""

    page: int = 16  # tokens per page (DSA always uses 64)
    pages: int = 64  # device pages; host pools hold twice that
    layers: int = 4
    heads: int = 2
    head_dim: int = 8
    swa_layers: int = 4
    swa_window: int = 2  # pages the sliding-window pool keeps at a node end
    mla_dim: int = 32  # kv_lora_rank + rope dim
    mamba_layers: int = 3
    mamba_heads: int = 2
    mamba_state: int = 16  # temporal state is heads x state x state float32
    dtype: torch.dtype = torch.bfloat16
    layout: str = "page_first"  # host layout of every pool: page_first or page_first_direct


@dataclass
class Hybrid:
    """One hybrid setup: the KV anchor, one sidecar pool, and how SGLang moves the sidecar."""

    name: str
    kv: Any
    side_name: PoolName
    side: Any
    page: int
    is_mla: bool
    window: int  # sidecar pages one node end carries (all-pages pools: every page)
    group: HostPoolGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = HostPoolGroup([
            PoolEntry(name=PoolName.KV, host_pool=self.kv, device_pool=None, layer_mapper=lambda i: i,
                      is_primary_index_anchor=True),
            PoolEntry(name=self.side_name, host_pool=self.side, device_pool=None,
                      layer_mapper=lambda i: i)])

    @property
    def kv_derived(self) -> bool:
        """The sidecar reuses the KV host indices (DSA indexer, draft KV, V4 compressed KV)."""
        return self.side_name in (PoolName.INDEXER, PoolName.DRAFT, PoolName.DEEPSEEK_V4_C4)

    def tokens(self, npages: int, seed: int) -> list[int]:
        rnd = random.Random(seed)
        return [rnd.randrange(150_000) for _ in range(npages * self.page)]

    def hashes(self, tokens: list[int], prior: str | None = None) -> list[str]:
        """SGLang's own page-hash chain (``get_hash_str``)."""
        return list(get_hash_str(tokens, prior, self.page))

    def side_slots(self, npages: int) -> int:
        """Host slots of the sidecar that ``npages`` of its pages take (Mamba: one per state)."""
        return npages * int(self.side.page_size)

    def backup_transfer(self, node_hashes: list[str]) -> tuple[PoolTransfer, torch.Tensor | None]:
        """The sidecar transfer a node's backup carries (``CacheTransferPhase.BACKUP_STORAGE``),
        and the sidecar host slots it reads (``None`` when it reuses the KV slots)."""
        if self.kv_derived:
            return PoolTransfer(name=self.side_name, indices_from_pool=PoolName.KV), None
        idx = self.side.alloc(self.side_slots(self.window))
        return PoolTransfer(name=self.side_name, host_indices=idx, keys=node_hashes[-self.window:],
                            hit_policy=PoolHitPolicy.TRAILING_PAGES), idx

    def query_transfer(self) -> PoolTransfer:
        """The sidecar transfer a prefetch query carries (``CacheTransferPhase.PREFETCH``)."""
        if self.kv_derived:
            return PoolTransfer(name=self.side_name, indices_from_pool=PoolName.KV)
        return PoolTransfer(name=self.side_name, keys=["__placeholder__"] * self.window,
                            hit_policy=PoolHitPolicy.TRAILING_PAGES)

    def storage_config(self, extra: dict[str, Any], model: str = "toy-org/toy-model",
                       **fields: Any) -> HiCacheStorageConfig:
        cfg = HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=self.is_mla, enable_storage_metrics=False,
            is_page_first_layout=self.kv.layout == "page_first",
            model_name=model, extra_config=extra)
        for name, value in fields.items():
            setattr(cfg, name, value)
        return cfg

    def attach(self, backend: Any) -> Any:
        """What ``HybridCacheController.attach_storage_backend`` does after creating the backend."""
        backend.register_mem_pool_host(self.kv)
        for entry in self.group.entries:
            backend.register_mem_host_pool_v2(entry.host_pool, entry.name)
        backend.on_host_pools_registered()
        return backend


def mha_pool(shape: Shape, layers: int) -> MHATokenToKVPoolHost:
    """A real MHA host pool over CPU memory (``page_first``)."""
    tokens = shape.pages * shape.page
    k = tuple(torch.zeros(tokens, shape.heads, shape.head_dim, dtype=shape.dtype) for _ in range(layers))
    v = tuple(torch.zeros(tokens, shape.heads, shape.head_dim, dtype=shape.dtype) for _ in range(layers))
    bufs = KVBuffers(k=k, v=v, k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
                     v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
                     layout=KVBufferLayout.NHD)
    info = MHABufferInfo(buffers=bufs, page_size=shape.page, head_num=shape.heads, head_dim=shape.head_dim,
                         v_head_dim=shape.head_dim, dtype=shape.dtype, device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, shape.page, shape.layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=layers)


def build(name: str, shape: Shape = Shape()) -> Hybrid:
    """A fresh setup: new host memory on each call, so two backends never share destinations.

    Raises: ``ValueError`` naming the known setups for an unknown ``name``.
    """
    if name not in SETUPS:
        raise ValueError(f"unknown hybrid setup {name!r}; known: {', '.join(SETUPS)}")
    with host_memory_budget_scope(1 << 40):
        if name == "mha+mamba":
            slots = shape.pages
            temporal = torch.zeros(shape.mamba_layers, slots, shape.mamba_heads, shape.mamba_state,
                                   shape.mamba_state, dtype=torch.float32)
            conv = (torch.zeros(shape.mamba_layers, slots, 3, 2 * shape.mamba_state, dtype=shape.dtype),
                    torch.zeros(shape.mamba_layers, slots, 3, shape.mamba_state, dtype=shape.dtype))
            mamba = MambaPoolHost(MambaStateBufferInfo(temporal=temporal, conv=conv), 2.0, 0,
                                  device_capacity=slots, pin_memory=False, layout=shape.layout)
            return Hybrid(name, mha_pool(shape, shape.layers), PoolName.MAMBA, mamba, shape.page,
                          False, window=1)
        if name == "mha+swa":
            return Hybrid(name, mha_pool(shape, shape.layers), PoolName.SWA,
                          mha_pool(shape, shape.swa_layers), shape.page, False, window=shape.swa_window)
        if name == "mha+draft":  # a one-layer draft model (EAGLE-style) over the target's indices
            return Hybrid(name, mha_pool(shape, shape.layers), PoolName.DRAFT, mha_pool(shape, 1),
                          shape.page, False, window=0)
        if name == "dsv4":
            host_pages = 2 * shape.pages + 1
            anchor = LogicalHostPool(size=(host_pages - 1) * shape.page, page_size=shape.page,
                                     layout=shape.layout)
            item = shape.mla_dim * shape.page * 2  # one page row per layer (arbitrary width)
            rows = [torch.zeros(shape.pages, item, dtype=torch.uint8) for _ in range(shape.layers)]
            c4 = DeepSeekV4PagedHostPool(str(PoolName.DEEPSEEK_V4_C4), rows, item, host_pages, shape.page,
                                         layout=shape.layout, pin_memory=False)
            return Hybrid(name, anchor, PoolName.DEEPSEEK_V4_C4, c4, shape.page, True, window=0)
        tokens = shape.pages * DSA_PAGE
        rope = 8
        device = DSATokenToKVPool(
            size=tokens, page_size=DSA_PAGE, kv_lora_rank=shape.mla_dim - rope, dtype=shape.dtype,
            qk_rope_head_dim=rope, layer_num=shape.layers, device="cpu",
            index_head_dim=DSA_INDEX_HEAD_DIM, enable_memory_saver=False, kv_cache_dim=shape.mla_dim,
            index_buf_size=tokens)
        kv = MLATokenToKVPoolHost(device.get_device_pool_infos()[0].buffer_info, 2.0, 0, DSA_PAGE,
                                  shape.layout, pin_memory=False, device="cpu", device_capacity_tokens=tokens,
                                  start_layer=0, end_layer=shape.layers, target_layer_num=shape.layers)
        indexer = DSAIndexerPoolHost(decl=make_dsa_indexer_pool_decl(device), anchor_host=kv,
                                     pin_memory=False)
        return Hybrid(name, kv, PoolName.INDEXER, indexer, DSA_PAGE, True, window=0)


def _segments(pool: Any, idx: torch.Tensor) -> list[tuple[int, int]]:
    meta = pool.get_page_buffer_meta(idx)
    if meta is None:  # a logical pool: indices only, no bytes
        return []
    ptrs, sizes = meta
    return list(zip((int(p) for p in ptrs), (int(n) for n in sizes), strict=True))


def page_nbytes(pool: Any) -> int:
    """Bytes of one page of ``pool`` (all its segments)."""
    return sum(n for _, n in _segments(pool, torch.arange(int(pool.page_size), dtype=torch.int64)))


def read(pool: Any, idx: torch.Tensor) -> bytes:
    """Every byte the pool's pages at ``idx`` hold, segments in the pool's own order."""
    return b"".join(ctypes.string_at(p, n) for p, n in _segments(pool, idx))


def fill(pool: Any, idx: torch.Tensor, seed: int) -> None:
    """Seeded random bytes into every segment of the pool's pages at ``idx``."""
    rng = np.random.default_rng(seed)
    for p, n in _segments(pool, idx):
        np.frombuffer(view_at(p, n), dtype=np.uint8)[:] = rng.integers(0, 256, n, dtype=np.uint8)
