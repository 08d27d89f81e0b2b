"""How SGLang's host KV pool and storage config map onto our pages and key namespaces.

- ``PoolGeometry``: the facts about a registered host pool that IO needs (page size, segments per
  page, bytes per page, how a legacy flat page orders its segments).
- ``page_views``: host slot indices → one ``PageView`` per page, through the pool's own
  ``get_page_buffer_meta`` (zero copy: the views alias the pool's memory).
- ``flat_page_view``: a flat page tensor (SGLang's legacy copy path) → a ``PageView`` whose
  concatenation is byte-identical to the zero-copy page, so both paths share keys and bytes.
- ``key_namespace`` / ``rank_suffix``: a ``HiCacheStorageConfig`` plus the pool → the key namespace
  and the per-process name of local files.
- ``head_split`` / ``head_group_views``: SGLang's split heads, each page as one object per head group
  of the lcm grid (``keys.KeyNamespace.head_groups`` names them).

SGLang's storage config arrives as ``sglang_config.StorageRank`` and each host pool as
``sglang_pool.HostPool``, both read once at attach.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from ..api import PageView
from ..buffers import pages_from_pointers, view_at
from ..config import HbmTierConfig, HostTierConfig, StoreConfig
from ..errors import ConfigError
from ..keys import KeyNamespace
from .sglang_config import StorageRank
from .sglang_pool import HostPool


@dataclass(frozen=True)
class PoolGeometry:
    page_size: int  # tokens per page, as host indices count them
    layout: str
    dtype: str
    segment_sizes: tuple[int, ...]  # bytes of each zero-copy segment of one page, in order
    # Legacy flat pages (``get_data_page(flat=True)``) may order the same segments differently:
    # ``flat_order[j]`` is the position in the flat page of zero-copy segment ``j``.
    flat_order: tuple[int, ...]

    @property
    def page_nbytes(self) -> int:
        return sum(self.segment_sizes)


def pool_geometry(pool: HostPool) -> PoolGeometry:
    """Probe one page of ``pool`` (pointer arithmetic only; no memory is touched)."""
    if pool.logical:
        # Indices only: no segments, and a dtype of none, so the namespace names no bytes.
        return PoolGeometry(page_size=pool.page_size, layout=pool.layout, dtype="none",
                            segment_sizes=(), flat_order=())
    _, sizes = pool.page_buffer_meta(torch.arange(pool.page_size, dtype=torch.int64))
    sizes = tuple(int(s) for s in sizes)
    order = tuple(range(len(sizes)))
    # MHA ``layer_first`` gives zero-copy segments K0 V0 K1 V1 ..., while its flat page is the
    # slice kv_buffer[:, :, page] = K0 K1 ... V0 V1 ...; every other layout (and MLA, which has one
    # segment per layer) already agrees. Subclasses with more segments (scales) keep theirs.
    layer_num = pool.layer_num
    if pool.kind == "mha" and pool.layout == "layer_first" and len(sizes) == 2 * layer_num:
        order = tuple((j % 2) * layer_num + j // 2 for j in range(len(sizes)))
    return PoolGeometry(page_size=pool.page_size, layout=pool.layout, dtype=pool.dtype,
                        segment_sizes=sizes, flat_order=order)


def check_host_indices(pool: HostPool, host_indices: Any, page_size: int) -> None:
    """Refuse indices that would address memory outside the pool.

    SGLang's ``get_page_buffer_meta`` is pointer arithmetic without bounds, so an index of 1e9 or
    -1 turns into a copy from or to an arbitrary address (a segfault in memmove at best). Every
    page a call names must lie wholly inside the pool.

    Raises:
        ValueError: not an integer tensor, a count that is not whole pages, or an index out of range.
    """
    if not isinstance(host_indices, torch.Tensor) or host_indices.dtype in (
            torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64):
        # Whatever the caller passed, a tensor or not: its dtype, if any, only goes into the message.
        raise ValueError(f"host_indices must be an integer tensor, got {type(host_indices).__name__}"
                         f" {getattr(host_indices, 'dtype', '')}")
    n = host_indices.numel()
    if n % page_size:
        raise ValueError(f"{n} host indices are not whole pages of {page_size} slots")
    if not n:
        return
    limit = pool.slots
    flat = host_indices.reshape(-1)
    lowest, highest = int(flat.min()), int(flat.max())
    last_start = int(flat[::page_size].max())
    if lowest < 0 or highest >= limit or last_start + page_size > limit:
        raise ValueError(f"host indices out of range: [{lowest}, {highest}] with pages of {page_size} "
                         f"slots, but the {pool.class_name} holds {limit} slots")


def page_views(pool: HostPool, geometry: PoolGeometry, host_indices: torch.Tensor, npages: int
               ) -> list[PageView]:
    """Views of the ``npages`` host pages starting at ``host_indices[i * page_size]``.

    Raises:
        ValueError: ``host_indices`` does not hold exactly ``npages`` pages (SGLang #27033), or
            names slots outside the pool.
    """
    check_host_indices(pool, host_indices, geometry.page_size)
    if len(host_indices) != npages * geometry.page_size:
        raise ValueError(f"{len(host_indices)} host indices for {npages} pages of "
                         f"{geometry.page_size} tokens")
    ptrs, sizes = pool.page_buffer_meta(host_indices)
    return pages_from_pointers([int(p) for p in ptrs], [int(s) for s in sizes], npages)


def sized_for_pages(config: StoreConfig, page_nbytes: int) -> StoreConfig:
    """``config`` with ``slot_size: auto`` of slot tiers fixed to one KV page.

    ``auto`` means "the page size"; taking it from whatever is written first would let a hybrid
    model's sidecar (SGLang backs those up before the KV pages) set the slot, and every KV page
    after it would then be too large for the tier.
    """
    if page_nbytes <= 0:
        return config
    tiers = [msgspec.structs.replace(t, slot_size=page_nbytes)
             if isinstance(t, (HostTierConfig, HbmTierConfig)) and t.slot_size == "auto" else t
             for t in config.tiers]
    return msgspec.structs.replace(config, tiers=type(config.tiers)(tiers))


def flat_page_view(geometry: PoolGeometry, flat: torch.Tensor) -> PageView:
    """Segments of a contiguous CPU flat page, in zero-copy order.

    The views alias ``flat``; the caller keeps the tensor alive while they are used.

    Raises:
        ValueError: the tensor is not a contiguous CPU tensor of exactly one page.
    """
    nbytes = flat.numel() * flat.element_size()
    if flat.device.type != "cpu" or not flat.is_contiguous() or nbytes != geometry.page_nbytes:
        raise ValueError(f"flat page must be a contiguous CPU tensor of {geometry.page_nbytes} bytes, "
                         f"got {nbytes} bytes on {flat.device} (contiguous={flat.is_contiguous()})")
    base = flat.data_ptr()
    # Offsets of the segments as they sit in the flat page.
    flat_sizes = [0] * len(geometry.segment_sizes)
    for j, pos in enumerate(geometry.flat_order):
        flat_sizes[pos] = geometry.segment_sizes[j]
    offsets = [sum(flat_sizes[:pos]) for pos in range(len(flat_sizes))]
    return [view_at(base + offsets[pos], geometry.segment_sizes[j])
            for j, pos in enumerate(geometry.flat_order)]


def _cp_coordinates(cfg: StorageRank) -> tuple[int, int]:
    # Attention CP (NSA) and decode CP (DCP, MLA only) each shard a page's bytes; fold both into
    # one coordinate so either one changing changes the namespace.
    dcp_size = max(1, cfg.dcp_size)
    cp_size = max(1, cfg.attn_cp_size)
    return cfg.attn_cp_rank * dcp_size + cfg.dcp_rank, cp_size * dcp_size


def is_rank_replicated(cfg: StorageRank) -> bool:
    """MLA (and other replicated) KV: every TP rank holds the same page bytes."""
    return cfg.is_mla_model


def head_split(cfg: StorageRank, pool: HostPool) -> int:
    """Head groups per page this rank stores apart: ``tp_lcm_size // tp_size`` where SGLang set
    ``should_split_heads`` (an MHA pool in the ``page_head`` layout with ``tp_lcm_size > tp_size``),
    else 1.

    Raises:
        ConfigError: ``tp_lcm_size`` above ``tp_size`` on a pool that is not ``page_head``
            (SGLang then leaves ``should_split_heads`` off: pages would be stored whole, shared
            with no other TP size, while the operator asked for sharing).
        ValueError: a ``tp_lcm_size`` that is not a multiple of ``tp_size``, or a pool whose heads
            do not divide into the groups (a model with fewer KV heads than ``tp_lcm_size``: SGLang
            replicates those heads, so no lcm-grid rank owns a distinct share of them).
    """
    tp_size = max(1, cfg.tp_size)
    lcm = cfg.tp_lcm_size
    if lcm > tp_size and not is_rank_replicated(cfg) and pool.layout != "page_head":
        raise ConfigError(f"tp_lcm_size {lcm} splits pages by head, which only the page_head host "
                          f"layout can, but the host pool has layout {pool.layout!r}; start SGLang "
                          "with --hicache-mem-layout page_head, or drop tp_lcm_size",
                          key="tp_lcm_size", source="--hicache-storage-backend-extra-config")
    if not cfg.should_split_heads:
        return 1
    if lcm <= tp_size or lcm % tp_size:
        raise ValueError(f"split heads: tp_lcm_size {lcm} must be a multiple of tp_size {tp_size} "
                         "and larger than it")
    split = lcm // tp_size
    heads = pool.head_num  # 0 for a pool without heads: no split fits it
    if not heads or heads % split:
        raise ValueError(f"split heads: this rank's {heads} KV heads do not divide into tp_lcm_size "
                         f"{lcm} / tp_size {tp_size} = {split} groups; choose a tp_lcm_size that "
                         "divides the model's KV head count times tp_size")
    return split


def head_group_views(page: PageView, split: int) -> list[PageView]:
    """A ``page_head`` page cut into its ``split`` head groups, each a view of its share of every
    segment (K heads g, V heads g), aliasing the page.

    In ``page_head`` a page's K (and V) block is ``(heads, page_size, layers, head_dim)``, heads
    outermost, so head group ``g`` is the ``g``-th equal share of each block: the bytes SGLang's
    ``get_split_heads_page_buffer_meta`` points at, and the whole page of lcm-grid rank ``g`` on a
    server of TP size ``tp_lcm_size``.

    Raises:
        ValueError: a segment that does not divide into ``split`` equal shares.
    """
    if split == 1:
        return [page]
    for seg in page:
        if seg.nbytes % split:
            raise ValueError(f"a {seg.nbytes}-byte segment does not divide into {split} head groups")
    return [[seg[g * (seg.nbytes // split):(g + 1) * (seg.nbytes // split)] for seg in page]
            for g in range(split)]


def key_namespace(cfg: StorageRank, geometry: PoolGeometry, tag: str = "", weights: str = "") -> KeyNamespace:
    """The namespace every key of this process lives in (model and its checkpoint fingerprint
    ``weights``, dtype, layout, page, ranks, tag).

    The DP rank is left out on purpose: attention-TP rank r holds the same heads in every DP group,
    so DP groups share pages through shared tiers.
    """
    cp_rank, cp_size = _cp_coordinates(cfg)
    return KeyNamespace(
        model=cfg.model_name,
        dtype=geometry.dtype,
        layout=geometry.layout,
        page_size=geometry.page_size,
        tp_rank=cfg.tp_rank,
        tp_size=cfg.tp_size,
        pp_rank=cfg.pp_rank,
        pp_size=max(1, cfg.pp_size),
        cp_rank=cp_rank,
        cp_size=cp_size,
        rank_replicated=is_rank_replicated(cfg),
        tag=tag,
        weights=weights,
    )


def rank_suffix(cfg: StorageRank) -> str:
    """Directory name of this process's local files (e.g. its LMDB environment).

    MHA: one per TP/PP/CP/DP rank, so every writer owns its file and its capacity accounting.
    MLA: the TP ranks of one DP group share the storage writer's file (LMDB allows one writer
    process and many readers), because only the writer stores pages and every rank reads them.
    """
    cp_rank, cp_size = _cp_coordinates(cfg)
    shared = _tp_ranks_share_local_files(cfg)
    parts = [] if shared else [f"tp{cfg.tp_rank}"]
    parts.append(f"pp{cfg.pp_rank}")
    if cp_size > 1:
        parts.append(f"cp{cp_rank}")
    if cfg.dp_rank:
        parts.append(f"dp{cfg.dp_rank}")
    if shared:
        parts.insert(0, "mla")
    return "_".join(parts)


def reports_local_usage(cfg: StorageRank) -> bool:
    """Whether this rank reports the usage of its local files (``rank_suffix``'s directory), so that
    a sum over ranks counts each byte once: where TP ranks share the directory, TP rank 0 does."""
    return not _tp_ranks_share_local_files(cfg) or cfg.tp_rank == 0


def _tp_ranks_share_local_files(cfg: StorageRank) -> bool:
    # The one statement of which ranks share a directory (``rank_suffix``, ``reports_local_usage``).
    return is_rank_replicated(cfg)


def parent_hash(extra_info: Any) -> str | None:
    """The page hash just before a call's first key, when SGLang passes prefix keys."""
    # SGLang passes a ``HiCacheStorageExtraInfo`` or None; the getattr keeps a caller's other
    # object from turning every call into a miss at the boundary.
    prefix: Sequence[str] | None = getattr(extra_info, "prefix_keys", None) if extra_info else None
    return prefix[-1] if prefix else None
