"""Torch versions of sgl_kernel's ``direct`` host<->device KV copy ops, for hosts without CUDA.

SGLang's host pools bind these ops from ``sgl_kernel.kvcacheio`` only on CUDA/ROCm/XPU; on a CPU
host the names are simply undefined and the first backup dies with a ``NameError``. The ``direct``
io backend needs exactly three of them, and they are plain index copies, so torch does them:

- ``transfer_kv_direct``: layer-first to layer-first, one tensor per layer on each side;
- ``transfer_kv_all_layer_direct_lf_pf``: every device layer into page-first host buffers
  shaped ``(pages, layers, page_size, ...)`` (the ``page_first_direct`` layout), one host buffer
  per part (K, V; or one for MLA latents and sidecar states);
- ``transfer_kv_per_layer_direct_pf_lf``: one layer back out of those host buffers.

Bytes are copied as bytes, so every KV dtype, fp8 included, moves unchanged. Indices are token
slots; ``page_size`` splits a host slot into (page, offset in page).

Speed: these run in the scheduler's thread, between forward passes, for every token a request
loads back (12,288 tokens of a 4-layer model: 96 MiB). Indexing a ``uint8`` view copies byte by
byte (0.1 GB/s here, about a second for that load). When both sides name whole aligned pages, which
is what HiCache moves (its host and device allocators hand out pages), one row per page is copied
(``index_select``/``index_copy_`` over page-sized rows, at memory speed); otherwise token rows are
copied in the widest integer type that divides them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _bytes(t: torch.Tensor) -> torch.Tensor:
    # A reshape of a non-contiguous tensor is a copy: writes into it would be lost silently.
    if not t.is_contiguous():
        raise ValueError(f"KV buffer of shape {tuple(t.shape)} is not contiguous")
    return t.view(torch.uint8)


def _word(nbytes: int) -> torch.dtype:
    """The widest integer type whose size divides ``nbytes``: fewer, larger elements to index."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        if nbytes % dtype.itemsize == 0:
            return dtype
    return torch.uint8


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A layer-first tensor as ``(tokens, words per token)``."""
    row = _bytes(t).view(t.shape[0], -1)
    return row.view(_word(row.shape[1]))


def _page_rows(t: torch.Tensor, page_size: int) -> torch.Tensor:
    """A layer-first tensor as ``(whole pages, words per page)``; a trailing partial page is left out."""
    row = _bytes(t).view(t.shape[0], -1)
    pages = row[: t.shape[0] // page_size * page_size].view(-1, page_size * row.shape[1])
    return pages.view(_word(pages.shape[1]))


def _pages(t: torch.Tensor, page_size: int) -> torch.Tensor:
    """A page-first host buffer as ``(pages, layers, page_size, words per token)``."""
    token = _bytes(t).view(t.shape[0], t.shape[1], page_size, -1)
    return token.view(_word(token.shape[3]))


def _host_pages(t: torch.Tensor) -> torch.Tensor:
    """A page-first host buffer as ``(pages, layers, words per page of one layer)``."""
    page = _bytes(t).view(t.shape[0], t.shape[1], -1)
    return page.view(_word(page.shape[2]))


def _same_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    # Word views of rows of different sizes could still line up (one int64 vs one int32): refuse.
    if src.dtype != dst.dtype or src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"rows of {src.shape[1:].numel() * src.element_size()} bytes cannot be copied "
                         f"into rows of {dst.shape[1:].numel() * dst.element_size()} bytes")


def _copy(dst: torch.Tensor, dst_idx: torch.Tensor, src: torch.Tensor, src_idx: torch.Tensor) -> None:
    """``dst[dst_idx] = src[src_idx]`` along dim 0 of two word views of equal rows."""
    _same_rows(dst, src)
    dst.index_copy_(0, dst_idx.to(dst.device), src.index_select(0, src_idx.to(src.device)).to(dst.device))


def _split(indices: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = indices.to(torch.long)
    return torch.div(idx, page_size, rounding_mode="floor"), torch.remainder(idx, page_size)


def _whole_pages(indices: torch.Tensor, page_size: int) -> torch.Tensor | None:
    """The page numbers if ``indices`` are whole pages in order (page ``p`` = slots ``p*size ..
    p*size + size-1``), else ``None``."""
    idx = indices.to(torch.long)
    if page_size <= 1 or idx.numel() == 0 or idx.numel() % page_size:
        return None
    slots = idx.view(-1, page_size)
    first = slots[:, :1]
    if bool((first % page_size).any()) or not bool((slots - first == torch.arange(page_size)).all()):
        return None
    return first.squeeze(1) // page_size


def transfer_kv_direct(src_layers: Sequence[torch.Tensor], dst_layers: Sequence[torch.Tensor],
                       src_indices: torch.Tensor, dst_indices: torch.Tensor, page_size: int) -> None:
    src_pages, dst_pages = _whole_pages(src_indices, page_size), _whole_pages(dst_indices, page_size)
    src_idx, dst_idx = src_indices.to(torch.long), dst_indices.to(torch.long)
    for src, dst in zip(src_layers, dst_layers, strict=True):
        if src_pages is not None and dst_pages is not None:
            _copy(_page_rows(dst, page_size), dst_pages, _page_rows(src, page_size), src_pages)
        else:
            _copy(_rows(dst), dst_idx, _rows(src), src_idx)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                       page_size: int) -> None:
    if not dst_ptrs or len(src_ptrs) % len(dst_ptrs):
        raise ValueError(f"{len(src_ptrs)} device layers do not split over {len(dst_ptrs)} host buffers")
    per_dst = len(src_ptrs) // len(dst_ptrs)
    src_pages, dst_pages = _whole_pages(src_indices, page_size), _whole_pages(dst_indices, page_size)
    src_idx = src_indices.to(torch.long)
    page, offset = _split(dst_indices, page_size)
    for j, src in enumerate(src_ptrs):
        host = dst_ptrs[j // per_dst]
        if src_pages is not None and dst_pages is not None:
            _copy(_host_pages(host).select(1, j % per_dst), dst_pages, _page_rows(src, page_size), src_pages)
        else:
            rows, tokens = _rows(src), _pages(host, page_size)
            _same_rows(tokens[:, 0, 0], rows)
            tokens[page, j % per_dst, offset] = rows[src_idx.to(src.device)].to(host.device)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs: Sequence[torch.Tensor], dst_ptrs: Sequence[torch.Tensor],
                                       src_indices: torch.Tensor, dst_indices: torch.Tensor,
                                       layer_id: int, page_size: int) -> None:
    src_pages, dst_pages = _whole_pages(src_indices, page_size), _whole_pages(dst_indices, page_size)
    page, offset = _split(src_indices, page_size)
    dst_idx = dst_indices.to(torch.long)
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        if src_pages is not None and dst_pages is not None:
            _copy(_page_rows(dst, page_size), dst_pages, _host_pages(src).select(1, layer_id), src_pages)
        else:
            rows, tokens = _rows(dst), _pages(src, page_size)[page, layer_id, offset]
            _same_rows(rows, tokens)
            rows.index_copy_(0, dst_idx.to(dst.device), tokens.to(dst.device))


DIRECT_OPS = {
    "transfer_kv_direct": transfer_kv_direct,
    "transfer_kv_all_layer_direct_lf_pf": transfer_kv_all_layer_direct_lf_pf,
    "transfer_kv_per_layer_direct_pf_lf": transfer_kv_per_layer_direct_pf_lf,
}
