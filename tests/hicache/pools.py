"""Real sglang 0.5.23 host KV pools on CPU, their page bytes, and sglang page hashes.

Shared by the in-process tests (through conftest) and the restart test's worker processes.
Pools are tiny (4 layers, 16-token pages, 4 KiB per page) so a test moves bytes in milliseconds.
"""

from __future__ import annotations

import ctypes
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo, MLABufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_hash_str

from mooncake_sgl.buffers import view_at

LAYERS, HEADS, HEAD_DIM, PAGE, DEVICE_TOKENS = 4, 2, 8, 16, 1024
KV_LORA_RANK, ROPE_DIM = 24, 8
DTYPE = torch.bfloat16
LAYOUTS = ("page_first", "page_first_direct", "layer_first")
KINDS = ("mha", "mla")
MODEL = "toy-org/toy-model"


def build_pool(kind: str, layout: str, allocator_type: str = "default", pin_memory: bool = False,
               heads: int = HEADS, ratio: float = 2.0) -> Any:
    """A real ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` over CPU memory (MHA: ``heads``
    KV heads on this rank; ``ratio``: host tokens per device token, SGLang's ``--hicache-ratio``)."""
    cpu = torch.device("cpu")
    if kind == "mha":
        k = tuple(torch.zeros(DEVICE_TOKENS, heads, HEAD_DIM, dtype=DTYPE) for _ in range(LAYERS))
        v = tuple(torch.zeros(DEVICE_TOKENS, heads, HEAD_DIM, dtype=DTYPE) for _ in range(LAYERS))
        bufs = KVBuffers(k=k, v=v, k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
                         v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
                         layout=KVBufferLayout.NHD)
        info = MHABufferInfo(buffers=bufs, page_size=PAGE, head_num=heads, head_dim=HEAD_DIM,
                             v_head_dim=HEAD_DIM, dtype=DTYPE, device=cpu)
        with host_memory_budget_scope(1 << 30):
            return MHATokenToKVPoolHost(info, ratio, 0, PAGE, layout, pin_memory=pin_memory, device="cpu",
                                        allocator_type=allocator_type, device_capacity_tokens=DEVICE_TOKENS,
                                        start_layer=0, end_layer=LAYERS)
    if kind == "mla":
        dim = KV_LORA_RANK + ROPE_DIM
        rows = tuple(torch.zeros(DEVICE_TOKENS, 1, dim, dtype=DTYPE) for _ in range(LAYERS))
        ptrs = torch.tensor([t.data_ptr() for t in rows], dtype=torch.uint64)
        info = MLABufferInfo(buffers=rows, data_ptrs=ptrs,
                             layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS, page_size=PAGE,
                             kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=ROPE_DIM, kv_cache_dim=dim,
                             dtype=DTYPE, device=cpu)
        with host_memory_budget_scope(1 << 30):
            return MLATokenToKVPoolHost(info, ratio, 0, PAGE, layout, pin_memory=False, device="cpu",
                                        allocator_type=allocator_type, device_capacity_tokens=DEVICE_TOKENS,
                                        start_layer=0, end_layer=LAYERS, target_layer_num=LAYERS)
    raise ValueError(f"unknown pool kind {kind!r}")


def _segments(pool: Any, indices: torch.Tensor, npages: int) -> list[list[tuple[int, int]]]:
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    per = len(ptrs) // npages
    return [list(zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per], strict=True))
            for i in range(npages)]


def page_bytes(pool: Any, indices: torch.Tensor) -> list[bytes]:
    """The bytes of each page at ``indices`` (segments concatenated, as the store keeps them)."""
    npages = len(indices) // PAGE
    return [b"".join(ctypes.string_at(p, n) for p, n in page) for page in _segments(pool, indices, npages)]


def fill_random(pool: Any, indices: torch.Tensor, seed: int) -> None:
    """Overwrite every byte of the pages at ``indices`` with seeded random bytes."""
    rng = np.random.default_rng(seed)
    for page in _segments(pool, indices, len(indices) // PAGE):
        for p, n in page:
            np.frombuffer(view_at(p, n), dtype=np.uint8)[:] = rng.integers(0, 256, n, dtype=np.uint8)


def zero_pages(pool: Any, indices: torch.Tensor) -> None:
    for page in _segments(pool, indices, len(indices) // PAGE):
        for p, n in page:
            np.frombuffer(view_at(p, n), dtype=np.uint8)[:] = 0


def page_hashes(npages: int, seed: int, prior: str | None = None) -> list[str]:
    """SGLang's own page-hash chain (``get_hash_str``) over seeded random token ids."""
    rnd = random.Random(seed)
    tokens = [rnd.randrange(0, 150_000) for _ in range(npages * PAGE)]
    hashes = get_hash_str(tokens, prior, PAGE)
    return list(hashes) if isinstance(hashes, list) else [hashes]


def extra_config(root: Path) -> dict[str, Any]:
    """A small host tier (16 pages of 4 KiB) in front of LMDB under ``root``. The LRU policy writes
    through, so every acknowledged page is also on disk whatever its heat: these tests check the
    adapter and must not depend on how the heat policy is tuned."""
    tiers = [{"kind": "host", "capacity": "64KiB", "pin_memory": False},
             {"kind": "lmdb", "path": str(root / "lmdb"), "capacity": "64MiB"}]
    return {"tiers": tiers, "policy": {"name": "lru"}}


def storage_config(kind: str, layout: str, root: Path, *, tp_rank: int = 0, tp_size: int = 1,
                   pp_rank: int = 0, pp_size: int = 1, model: str | None = MODEL, metrics: bool = False,
                   extra: dict[str, Any] | None = None) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=kind == "mla", enable_storage_metrics=metrics,
        is_page_first_layout=layout == "page_first", model_name=model,
        extra_config=extra if extra is not None else extra_config(root))
