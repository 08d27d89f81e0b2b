"""The pool's DRAM segment, and the same-host shared-memory path into it.

The server creates the segment with ``memfd_create`` (anonymous: a killed server leaves nothing in
/dev/shm) and pre-faults it with ``MAP_POPULATE``, so neither puts nor benchmarks pay the first-touch
page fault (about 11 µs per 4 KiB page on our VMs). A same-host client receives the memfd over the
Unix control socket (SCM_RIGHTS: that the descriptor arrives at all proves both ends share a
kernel), maps it, and moves each page with one numpy copy (GIL released). The control messages
carry only offsets; see ``protocol`` for RESERVE/COMMIT and LEASE/RELEASE.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence

import numpy as np

from ..api import PageView


def _map(fd: int, size: int, populate: bool) -> mmap.mmap:
    flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


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

    ``populate`` pre-faults the client's page tables too; without it the first copy into each
    4 KiB page pays a minor fault.
    """

    def __init__(self, fd: int, size: int, *, populate: bool = True):
        self.size = size
        self._mm = _map(fd, size, populate)
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

    def write_pages(self, offsets: Sequence[int], pages: Sequence[PageView]) -> None:
        for off, page in zip(offsets, pages):
            self.write_page(off, page)

    def close(self) -> None:
        self._arr = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass
