"""The SSD tier's system calls for page bytes: vectored transfers, O_DIRECT writes from any memory,
and whether a range of the page file is in the page cache (``page_io`` decides when each is used).

- ``O_DIRECT`` needs each request's file offset and length, and the memory of every segment, on
  the device's logical block. Extents start on 4 KiB in the file, so the memory decides, and the
  kernel says it: a request it refuses (``EINVAL``, before it moves a byte) is written again
  through a bounce buffer of the calling thread's, with one ``memmove`` (it releases the GIL):
  CPU tensors of plain ``malloc`` memory (64 bytes past a page), a page whose size is not whole
  4 KiB blocks. Before, such pages could only be written through the page cache, whatever the
  kernel's writeback did to them. Asking the kernel costs one failed call per such request;
  checking every segment's address first cost 4-12 us a segment (24576 of them in 768 MiB of
  64 KiB pages). A bounced write's last block is padded with zeros: an extent owns its whole last
  4 KiB block. Reads are never bounced: a copy out of a bounce buffer cost as much as the page
  cache's, and cold gets into unaligned memory ran at 0.8x ``dd`` that way against 0.9-1.2x
  buffered (``bench_tiers.py --modes disk-speed --disk-speed-memory unaligned``). Nor can the
  kernel be asked: Linux 6.18 took O_DIRECT reads into memory 64 bytes past a page (writes it
  refused) at 1.6x the CPU time. So a run is read with O_DIRECT only where ``looks_aligned``.
- Reads that never wait on the device (``preadv_cached``: ``RWF_NOWAIT``): what the page cache holds
  of a range, copied on the calling thread, so a reader that must be able to give up a read of a
  disk that stalled needs no thread of its own for the pages already in memory.
- Residency: a read the page cache can serve is a memory copy, faster than the disk, so only ranges
  not wholly cached are read with ``O_DIRECT``. ``cachestat`` (Linux 6.5) says it in one call
  without touching the pages; where it is missing or a seccomp filter refuses it, ``mincore`` on a
  short-lived read-only mapping of the range says the same.

Thread context: every function may run on any thread at once; the bounce buffers are per thread.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import threading

import numpy as np

from .extents import ALIGN, aligned

BOUNCE_BYTES = 4 << 20  # one O_DIRECT write request (``page_io._CHUNK``)
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value
# cachestat's number where the kernel's shared syscall table numbers it; elsewhere only mincore.
_SYS_CACHESTAT = 451 if platform.machine() in ("x86_64", "aarch64", "arm64", "riscv64", "ppc64le",
                                               "s390x") else None
_OS_PAGE = mmap.PAGESIZE
_local = threading.local()


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def flat(seg: memoryview) -> memoryview:
    return seg.cast("B") if seg.format != "B" or seg.ndim != 1 else seg


def address(seg: memoryview) -> int:
    if not seg.nbytes:
        return 0
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(seg))  # 3x faster than numpy's
    except TypeError:  # read-only memory
        return np.frombuffer(seg, dtype=np.uint8).ctypes.data


def looks_aligned(segments: list[memoryview]) -> bool:
    """Whether O_DIRECT can fill ``segments`` as they are, judged by every length and the first
    one's address: the pages of one host pool share their alignment, and one address costs
    microseconds (a batch of small pages has tens of thousands of segments)."""
    return (bool(segments) and all(s.nbytes % ALIGN == 0 for s in segments) and
        address(segments[0]) % ALIGN == 0)


def consume(pending: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``pending`` (what one vectored call moved)."""
    while pending and n >= pending[0].nbytes:
        n -= pending.pop(0).nbytes
    if n:
        pending[0] = pending[0][n:]


def pwritev_all(fd: int, segments: list[memoryview], offset: int) -> None:
    """All of ``segments`` at ``offset``; short writes are continued. Raises ``OSError``."""
    pending = list(segments)
    while pending:
        done = os.pwritev(fd, pending[:IOV_MAX], offset)
        if done <= 0:
            raise OSError(f"pwritev wrote {done} bytes")
        offset += done
        consume(pending, done)


def preadv_all(fd: int, segments: list[memoryview], offset: int, flags: int = 0) -> int:
    """Fill ``segments`` from ``offset``; the bytes read, fewer at the end of the file (with
    ``RWF_NOWAIT`` in ``flags``: up to the first byte not in memory). Raises ``OSError``."""
    pending = list(segments)
    total = 0
    while pending:
        try:
            got = os.preadv(fd, pending[:IOV_MAX], offset, flags)
        except BlockingIOError:  # RWF_NOWAIT: the next byte is not in memory
            return total
        if got <= 0:
            return total
        offset += got
        total += got
        consume(pending, got)
    return total


def preadv_cached(fd: int, segments: list[memoryview], offset: int) -> int:
    """Fill ``segments`` from ``offset`` as far as the page cache holds the bytes now, never waiting
    on the device (``RWF_NOWAIT``: the kernel stops at the first byte it would have to read, or
    wait for, and may start reading ahead from there); the bytes read. Raises ``OSError``:
    ``EOPNOTSUPP`` where the file system (or this Python) cannot read without waiting."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        raise OSError(errno.EOPNOTSUPP, "preadv2 with RWF_NOWAIT is not available here")
    return preadv_all(fd, segments, offset, flag)


def _bounce() -> tuple[memoryview, int]:
    """This thread's bounce buffer (page-aligned anonymous memory) and its address."""
    buf = getattr(_local, "bounce", None)
    if buf is None:
        buf = _local.bounce = memoryview(mmap.mmap(-1, BOUNCE_BYTES))
    return buf, address(buf)


def write_direct(fd: int, segments: list[memoryview], offset: int) -> None:
    """``segments`` at ``offset`` (on 4 KiB) through the O_DIRECT descriptor ``fd``: as they are
    where the kernel takes them, else through this thread's bounce buffer. Raises ``OSError``
    (``EINVAL``: the device refuses even the bounce buffer's alignment)."""
    try:
        pwritev_all(fd, segments, offset)
        return
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    buf, base = _bounce()
    fill = 0
    for seg in segments:
        src, at = address(seg), 0
        while at < seg.nbytes:
            take = min(seg.nbytes - at, BOUNCE_BYTES - fill)
            ctypes.memmove(base + fill, src + at, take)
            fill, at = fill + take, at + take
            if fill == BOUNCE_BYTES:
                pwritev_all(fd, [buf], offset)
                offset, fill = offset + fill, 0
    if fill:
        end = aligned(fill)
        ctypes.memset(base + fill, 0, end - fill)
        pwritev_all(fd, [buf[:end]], offset)


def readahead_of(fd: int) -> int | None:
    """The kernel's readahead window (bytes) for the file open as ``fd``: its block device's
    ``read_ahead_kb`` (a partition's is its disk's); ``None`` where there is no block device to ask
    (btrfs, overlayfs, network file systems)."""
    dev = os.fstat(fd).st_dev
    node = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for path in (f"{node}/queue/read_ahead_kb", f"{node}/../queue/read_ahead_kb"):
        try:
            with open(path, "rb") as f:
                return int(f.read()) * 1024
        except (OSError, ValueError):
            continue
    return None


class Residency:
    """Whether ranges of one file are wholly in the page cache."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        # Until the kernel (or a seccomp filter) says it has none.
        self._cachestat = _SYS_CACHESTAT is not None

    def cached(self, offset: int, length: int) -> bool | None:
        """``None`` where neither call can say (the caller then treats the range as cached, as
        every read did before)."""
        if length <= 0:
            return True
        if self._cachestat:
            rng, out = _Range(offset, length), _Cachestat()
            if _libc.syscall(_SYS_CACHESTAT, self._fd, ctypes.byref(rng), ctypes.byref(out), 0) == 0:
                first, last = offset // _OS_PAGE, (offset + length - 1) // _OS_PAGE
                return out.nr_cache >= last - first + 1
            self._cachestat = False
        return self._mincore(offset, length)

    def _mincore(self, offset: int, length: int) -> bool | None:
        start = offset - offset % _OS_PAGE
        span = offset + length - start
        addr = _libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, self._fd, start)
        if addr in (None, _MAP_FAILED):
            return None
        try:
            vec = ctypes.create_string_buffer(-(-span // _OS_PAGE))
            if _libc.mincore(addr, span, vec) != 0:
                return None
            return all(b & 1 for b in vec.raw)
        finally:
            _libc.munmap(addr, span)
