"""Views over raw host memory, and the two copies every tier makes (in and out of a page).

SGLang hands pages as (pointer, size) lists from ``mem_pool_host.get_page_buffer_meta``; a page may
be several segments (K and V, or one per layer). Lifetime: a view is valid only while the host pool
that owns the memory is alive; never keep one past the call that received it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from .api import PageView


def view_at(ptr: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` at address ``ptr`` (no copy)."""
    return memoryview((ctypes.c_ubyte * nbytes).from_address(ptr)).cast("B")


def pages_from_pointers(ptrs: Sequence[int], sizes: Sequence[int], npages: int) -> list[PageView]:
    """Group a flat (pointer, size) list into ``npages`` pages of equal segment count."""
    if npages <= 0 or len(ptrs) != len(sizes) or len(ptrs) % npages:
        raise ValueError(f"{len(ptrs)} segments cannot be split into {npages} pages")
    per = len(ptrs) // npages
    return [[view_at(p, s) for p, s in zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per])]
            for i in range(npages)]


def gather(page: PageView, dst: memoryview) -> None:
    """Copy a page's segments back to back into ``dst`` (which must be exactly its size)."""
    off = 0
    for seg in page:
        n = seg.nbytes
        # numpy copies large buffers with the GIL released; memoryview slice assignment does not.
        np.copyto(np.frombuffer(dst[off:off + n], dtype=np.uint8), np.frombuffer(seg, dtype=np.uint8))
        off += n


def scatter(src: memoryview, page: PageView) -> None:
    """Copy ``src`` (the page's bytes back to back) out into the page's segments."""
    off = 0
    for seg in page:
        n = seg.nbytes
        np.copyto(np.frombuffer(seg, dtype=np.uint8), np.frombuffer(src[off:off + n], dtype=np.uint8))
        off += n
