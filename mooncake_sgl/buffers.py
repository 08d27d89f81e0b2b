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


def copy_batch(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """``dst[:] = src`` for each ``(dst, src)`` pair of 1-D ``uint8`` arrays, in as few numpy copies
    as the addresses allow.

    Each numpy copy releases the GIL and must take it back; a thread waiting for the GIL behind one
    that runs Python waits up to the interpreter's switch interval (5 ms) for it. SGLang's scheduler
    loops in Python while a request waits for its prefetch, so a 12k-token prefetch (384 segments of
    256 KiB) copied one segment per call spent ~2 s waiting for 0.1 s of copying (48 MB/s). A run of
    consecutive pairs whose destinations and sources each advance by one constant stride (pages in
    consecutive host-pool pages and consecutive slots: what SGLang and our slot stacks hand out)
    is copied as one strided 2-D copy instead, when the two strided views' extents are apart.
    Destinations must not overlap.

    Why the extents: numpy checks a 2-D copy for overlap by the views' bounds only, and copies
    through a temporary when they meet; it checks that copy the same way. Two rows of sources far
    apart (a page in a heap buffer, the next in a large mapping) give a view whose bounds span the
    heap, so every temporary fell inside them: numpy recursed until the stack overflowed, killing
    the process with SIGSEGV (a promotion in a test did, once every few suite runs).
    """
    i = 0
    while i < len(pairs):
        dst, src = pairs[i]
        n = dst.nbytes
        if src.nbytes != n:
            raise ValueError(f"cannot copy {src.nbytes} bytes into {n}")
        d0, s0 = _address(dst), _address(src)
        j = i + 1
        if j < len(pairs) and pairs[j][0].nbytes == n and pairs[j][1].nbytes == n:
            d_step, s_step = _address(pairs[j][0]) - d0, _address(pairs[j][1]) - s0
            # Rows of a strided view must not overlap (a stride under ``n`` would alias them).
            if d_step >= n and s_step >= n:
                while (j < len(pairs) and pairs[j][0].nbytes == n and pairs[j][1].nbytes == n
                       and _address(pairs[j][0]) == d0 + (j - i) * d_step
                       and _address(pairs[j][1]) == s0 + (j - i) * s_step):
                    j += 1
                rows = j - i  # at least 2: pair i + 1 set the strides
                d_end, s_end = d0 + (rows - 1) * d_step + n, s0 + (rows - 1) * s_step + n
                if d_end <= s0 or s_end <= d0:
                    np.copyto(np.lib.stride_tricks.as_strided(dst, (rows, n), (d_step, 1)),
                              np.lib.stride_tricks.as_strided(src, (rows, n), (s_step, 1),
                                                              writeable=False))
                else:  # one 1-D copy each: numpy checks those for overlap only if strides are negative
                    for d, s in pairs[i:j]:
                        np.copyto(d, s)
                i = j
                continue
        np.copyto(dst, src)
        i += 1


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]
