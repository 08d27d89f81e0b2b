"""What we use of an SGLang host memory pool, read once when the pool is registered.

sglang 0.5.23's host pools differ by class, and the class says which fields a pool has: an MHA pool
(``MHATokenToKVPoolHost`` and its subclasses, ``pool_host/mha.py``) has KV heads, an MLA pool
(``MLATokenToKVPoolHost``, ``pool_host/mla.py``) one latent row per layer, DeepSeek V4's KV anchor
(``LogicalHostPool``, ``memory_pool_host.py``) hands out indices and holds no bytes, and the sidecar
pools (Mamba state, DSA indexer, DeepSeek V4's compressed pools, ...) are ``HostKVCache``s with
what every one of those has. So a pool is told apart by ``isinstance`` on SGLang's classes, and
each field its class declares is read with plain attribute access: a field a later SGLang renames
or drops is a ``ConfigError`` at attach naming it, never a silent default (``getattr(pool,
"head_num", 0)`` would have refused split heads with "0 KV heads", and ``hasattr(pool,
"v_buffer")`` took an MLA pool with split K/V buffers for a head-sharded one). Everything in
``hicache/`` below the attach takes this record, not SGLang's object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..errors import ConfigError

PoolKind = Literal["mha", "mla", "logical", "other"]

# SGLang's page arithmetic: host slot indices -> (pointer, size) of every segment of their pages.
PageBufferMeta = Callable[[torch.Tensor], tuple[Sequence[int], Sequence[int]]]


@dataclass(frozen=True)
class HostPool:
    """One SGLang host pool as this backend uses it."""

    kind: PoolKind  # by SGLang's class: "other" is any other ``HostKVCache`` (the sidecars)
    class_name: str  # SGLang's class, for messages
    page_size: int  # tokens per key as host indices count them (decode CP: the widened page)
    slots: int  # host indices name slots [0, slots) (decode CP: logical slots)
    layout: str
    dtype: str
    layer_num: int  # MHA and MLA; 0 for the other classes, which do not all declare it
    head_num: int  # MHA: this rank's KV heads; 0 for the classes without heads
    host_tokens: int  # tokens the pool holds
    device_tokens: int  # MHA and MLA: tokens of the device pool it mirrors; 0 elsewhere
    buffers: tuple[torch.Tensor, ...]  # host memory the tiers may register; none when logical
    page_buffer_meta: PageBufferMeta
    dummy_flat_page: Callable[[], torch.Tensor]  # a flat page tensor (the legacy copy path)

    @property
    def logical(self) -> bool:
        """Indices only, no buffer (DeepSeek V4's KV anchor): its sidecars carry the bytes."""
        return self.kind == "logical"

    @classmethod
    def read(cls, pool: Any) -> HostPool:
        """The record of SGLang's host pool ``pool``.

        Raises:
            ConfigError: ``pool`` is no host pool class of sglang 0.5.23, or lacks a field its
                class declares there.
        """
        # Imported here, not with the backend: SGLang's factory loads the backend where these
        # modules' kernels may not import (another platform selected), and by the time a pool
        # exists SGLang's cache controller has imported them itself.
        from sglang.srt.mem_cache.memory_pool_host import LogicalHostPool
        from sglang.srt.mem_cache.pool_host import HostKVCache
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        try:
            if isinstance(pool, LogicalHostPool):
                return cls(kind="logical", class_name=type(pool).__name__, page_size=int(pool.page_size),
                           slots=int(pool.logical_size), layout=str(pool.layout),
                           dtype=_dtype_name(pool.dtype), layer_num=0, head_num=0,
                           host_tokens=int(pool.size), device_tokens=0, buffers=(),
                           page_buffer_meta=pool.get_page_buffer_meta,
                           dummy_flat_page=pool.get_dummy_flat_data_page)
            if not isinstance(pool, HostKVCache):
                raise ConfigError(f"SGLang's host pool is a {type(pool).__name__}, no host pool "
                                  "class of sglang 0.5.23 (a HostKVCache or LogicalHostPool)")
            mha = isinstance(pool, MHATokenToKVPoolHost)
            mla = isinstance(pool, MLATokenToKVPoolHost)
            return cls(kind="mha" if mha else "mla" if mla else "other", class_name=type(pool).__name__,
                       page_size=int(pool.logical_page_size), slots=int(pool.logical_size),
                       layout=str(pool.layout), dtype=_dtype_name(pool.dtype),
                       layer_num=int(pool.layer_num) if mha or mla else 0,
                       head_num=int(pool.head_num) if mha else 0, host_tokens=int(pool.size),
                       device_tokens=int(pool.device_capacity_tokens) if mha or mla else 0,
                       buffers=_buffers(pool, mha or mla), page_buffer_meta=pool.get_page_buffer_meta,
                       dummy_flat_page=pool.get_dummy_flat_data_page)
        except AttributeError as e:
            raise ConfigError(f"SGLang's host pool ({type(pool).__name__}) has no field {e.name!r}: "
                              "this backend reads the fields sglang 0.5.23 declares on that class",
                              key=e.name, source=type(pool).__name__) from None


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _buffers(pool: Any, kv_pool: bool) -> tuple[torch.Tensor, ...]:
    # An MHA or MLA pool keeps its K and V in one tensor, registered whole; one that keeps them
    # apart (an asymmetric MHA pool's tuple) lists them, as every sidecar class does.
    if kv_pool and isinstance(pool.kv_buffer, torch.Tensor):
        return (pool.kv_buffer,)
    return tuple(pool.get_hybrid_pool_buffer())
