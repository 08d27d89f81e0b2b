"""Torch versions of sgl_kernel's ``direct`` host<->device KV copy ops, for hosts without CUDA.

SGLang's host pools bind these ops from ``sgl_kernel.kvcacheio`` only on CUDA/ROCm/XPU; on a CPU
host the names are simply undefined and the first backup dies with a ``NameError``. The ``direct``
io backend needs exactly three of them, and they are plain index copies, so torch does them:

- ``transfer_kv_direct``: layer-first to layer-first, one tensor per layer on each side;
- ``transfer_kv_all_layer_direct_lf_pf``: every device layer into page-first host buffers
  shaped ``(pages, layers, page_size, ...)`` (the ``page_first_direct`` layout), one host buffer
  per part (K, V; or one for MLA latents and sidecar states);
- ``transfer_kv_per_layer_direct_pf_lf``: one layer back out of those host buffers.

Bytes are copied as bytes (``uint8`` views), so every KV dtype, fp8 included, moves unchanged.
Indices are token slots; ``page_size`` splits a host slot into (page, offset in page).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    # A reshape of a non-contiguous tensor is a copy: writes into it would be lost silently.
    if not t.is_contiguous():
        raise ValueError(f"KV buffer of shape {tuple(t.shape)} is not contiguous")
    return t.view(torch.uint8)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A layer-first tensor as ``(tokens, bytes per token)``."""
    return _bytes(t).view(t.shape[0], -1)


def _pages(t: torch.Tensor, page_size: int) -> torch.Tensor:
    """A page-first host buffer as ``(pages, layers, page_size, bytes per token)``."""
    return _bytes(t).view(t.shape[0], t.shape[1], page_size, -1)


def _split(indices: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = indices.to(torch.long)
    return torch.div(idx, page_size, rounding_mode="floor"), torch.remainder(idx, page_size)


def transfer_kv_direct(src_layers: Sequence[torch.Tensor], dst_layers: Sequence[torch.Tensor],
                       src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    src_idx, dst_idx = src_indices.to(torch.long), dst_indices.to(torch.long)
    for src, dst in zip(src_layers, dst_layers, strict=True):
        _rows(dst)[dst_idx.to(dst.device)] = _rows(src)[src_idx.to(src.device)].to(dst.device)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                       page_size: int) -> None:
    if not dst_ptrs or len(src_ptrs) % len(dst_ptrs):
        raise ValueError(f"{len(src_ptrs)} device layers do not split over {len(dst_ptrs)} host buffers")
    per_dst = len(src_ptrs) // len(dst_ptrs)
    src_idx = src_indices.to(torch.long)
    page, offset = _split(dst_indices, page_size)
    for j, src in enumerate(src_ptrs):
        dst = _pages(dst_ptrs[j // per_dst], page_size)
        dst[page, j % per_dst, offset] = _rows(src)[src_idx.to(src.device)].to(dst.device)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                       layer_id: int, page_size: int) -> None:
    page, offset = _split(src_indices, page_size)
    dst_idx = dst_indices.to(torch.long)
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        rows = _pages(src, page_size)[page, layer_id, offset]
        _rows(dst)[dst_idx.to(dst.device)] = rows.to(dst.device)


DIRECT_OPS = {
    "transfer_kv_direct": transfer_kv_direct,
    "transfer_kv_all_layer_direct_lf_pf": transfer_kv_all_layer_direct_lf_pf,
    "transfer_kv_per_layer_direct_pf_lf": transfer_kv_per_layer_direct_pf_lf,
}
