"""The pool's DRAM segment, and the same-host shared-memory path into it.

The server creates one segment per tenant with ``memfd_create`` (anonymous: a killed server leaves
nothing in /dev/shm) and pre-faults it with ``MAP_POPULATE``, so neither puts nor benchmarks pay
the first-touch page fault (about 11 µs per 4 KiB page on our VMs). A same-host client receives
its tenant's memfd (never another's) over the Unix control socket (SCM_RIGHTS: that the descriptor
arrives at all proves both ends share a kernel), maps it, and moves each page with one numpy copy
(GIL released). The control messages carry only offsets; see ``protocol`` for RESERVE/COMMIT and
LEASE/RELEASE.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..api import PageView

_MADV_POPULATE_WRITE = 23  # Linux >= 5.14; not yet named by the mmap module


def _map(fd: int, size: int, populate: bool) -> mmap.mmap:
    flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
    mm = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    if populate:
        # MAP_POPULATE read-faults a shared mapping; the first write to each page would still
        # fault to make it writable. POPULATE_WRITE settles that up front.
        try:
            mm.madvise(_MADV_POPULATE_WRITE)
        except OSError:
            pass
    return mm


class Segment:
    """The server's segment: one memfd of ``size`` bytes mapped read-write, pre-faulted."""

    def __init__(self, size: int, *, name: str = "mooncake-sgl-pool", populate: bool = True):
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._mm = _map(self.fd, size, populate)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self._mm)
        # Base address, for registering the segment with an RDMA device (the array is dropped at
        # once so it holds no export that would block unmapping).
        self.address = int(np.frombuffer(self._mm, dtype=np.uint8).ctypes.data)

    def close(self) -> None:
        if self.fd < 0:
            return
        try:
            self.view.release()
            self._mm.close()
        except (BufferError, ValueError):
            # A view handed to a socket call is still alive somewhere; the mapping goes with the
            # process instead.
            pass
        os.close(self.fd)
        self.fd = -1


class SharedMapping:
    """A client's mapping of a pool segment received as a descriptor; copies pages in and out.

    The client pre-faults its page tables for segments up to ``POPULATE_LIMIT`` (connect then
    costs a fraction of a second per GiB); past that, the first copy into each 4 KiB page pays a
    minor fault instead, and the page tables grow only as the pool is used.

    There is no ``close``: the mapping goes when the last reference does, because a copy may still
    be running in another thread when its client drops the connection.
    """

    POPULATE_LIMIT = 16 << 30

    def __init__(self, fd: int, size: int):
        self.size = size
        self._mm = _map(fd, size, size <= self.POPULATE_LIMIT)
        self._arr = np.frombuffer(self._mm, dtype=np.uint8)

    def write_page(self, offset: int, page: PageView) -> None:
        """Copy a page's segments back to back into the segment at ``offset``."""
        arr = self._arr
        for seg in page:
            n = seg.nbytes
            np.copyto(arr[offset:offset + n], np.frombuffer(seg, dtype=np.uint8))
            offset += n

    def read_page(self, offset: int, page: PageView) -> None:
        """Copy the bytes at ``offset`` out into a page's segments."""
        arr = self._arr
        for seg in page:
            n = seg.nbytes
            np.copyto(np.frombuffer(seg, dtype=np.uint8), arr[offset:offset + n])
            offset += n
