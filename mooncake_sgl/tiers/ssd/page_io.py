"""The SSD tier's page data path: bytes to and from ``pages.bin`` with their checksums, overlapped.

Where a put's time went (``scripts/bench_tiers.py --modes put-profile``: a fresh process, a fresh
directory, 8 MiB pages): the copy into the page cache 76%, the xxh3 checksum 23% (it runs while
the caller waits, one page after the other), the index transaction and extent allocation about 1%.
At 64 KiB the copy was 51%, the checksum 21% and the index 23%. So the two costs that matter are
done at once here rather than one after the other:

- *Writes*: each run of adjacent extents goes to a small pool of writer threads in chunks
  (``os.pwritev`` releases the GIL), while the calling thread computes the checksums of the batch
  (``xxhash``'s one-shot digest keeps the GIL, so it is the one job left on the caller; measured:
  two threads hashing ran no faster than one). The caller gets the digests and the per-page
  outcome only once every chunk of the page has been written, so the tier still commits a record
  only for bytes already in the file.
- *Buffered while the page cache takes the batch faster than the disk would, O_DIRECT once it does
  not* (``LmdbTierConfig.direct_io: auto``; the choice is ``write_route``'s). A buffered
  write the kernel does not throttle is a memory copy: faster than the disk, and the pages stay in
  the cache for reads. A throttled one runs at the kernel's writeback speed, which on the
  development VM was 0.45 GB/s while O_DIRECT wrote the same bytes at 0.6-1.9 GB/s (and it makes
  every other writer on the machine wait too). There, O_DIRECT moves the bytes from the caller's
  memory to the disk at the disk's speed, with no copy and no dirty pages. O_DIRECT needs the
  segments on 4 KiB in memory and in length (the extent is in the file); other pages, and file
  systems without it (tmpfs), take the buffered path.
- *Reads*: the runs of a batch are shared by the calling thread and the pool's threads, each
  reading a run straight into the destination's segments and hashing it at once, a piece at a time
  while the piece is still in that core's cache (``xxhash``'s streaming update releases the GIL
  above 64 KiB, so two cores hash at once). Each reader takes a contiguous stretch of the batch,
  in file order, through a descriptor of its own: the kernel keeps readahead state per open file,
  so each reader is one sequential stream it can follow. Readers that took turns run by run on
  one descriptor looked random to it (measured cold, 8 MiB pages, 10 interleaved rounds in fresh
  reader processes: median 1.34 GB/s against 1.07 for turns on one descriptor, faster in 8 of the
  10 rounds; 1 MiB pages, 8 rounds: 1.93 against 1.32). A reader done with its stretch takes the
  last runs of another's, so a helper that has not started is never waited for.
  Reads are plain blocking ``preadv`` calls, with no
  readahead hints: the kernel's own readahead serves the readers' sequential runs. Measured cold
  in a fresh reader process (page cache dropped, interleaved A/B, 2-vCPU VM whose disk has
  ``read_ahead_kb`` 8192): hinting each run with ``POSIX_FADV_WILLNEED`` a 32 MiB window ahead
  read 0.3-0.6x as fast as no hints at 64 KiB and 1 MiB pages and 0.5-0.9x at 8 MiB (a hint is a
  request the size of one run, issued by the reader before its read; the kernel's readahead
  issues its full window at once). Every page is still checked against its record before it
  counts as a hit.

O_DIRECT and the page cache stay coherent: the kernel writes back and drops any cached page of a
range before it writes that range directly, and our extents never share a 4 KiB block, so a
buffered reader never sees stale bytes of a rewritten extent (and were the kernel to fail that
invalidation, the stale bytes would fail their checksum: a miss, never wrong KV).

Thread context: one ``PageIO`` per tier, shared by its reader threads and its writer; the pool's
threads only move bytes (no locks of the tier, no LMDB). The tier calls ``close`` once no operation
is in flight; it joins the pool.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import xxhash

from ...api import PageKey, PageView, page_nbytes
from ...failure_log import FailureLog
from .extents import ALIGN, aligned
from .records import checksum
from .write_route import PROBE_BYTES, WriteRoute

logger = logging.getLogger(__name__)

# Bytes per O_DIRECT request: several in flight keep the device queue busy while the caller hashes
# (arbitrary; as the raw O_DIRECT baseline of ``bench_tiers.py``). Buffered writes to one file are
# serialised by its inode lock, so they go in large requests, one after the other.
_DIRECT_CHUNK = 4 << 20
_BUFFERED_CHUNK = 64 << 20
# Reads: runs of at most 1 MiB (``extents``: measured best for buffered cold reads). A larger
# page is read and hashed in pieces, each hashed while it is still in the reading core's cache.
_READ_RUN = 1 << 20
_PIECE = 512 << 10
# Threads moving bytes: O_DIRECT requests in flight at once, and reads of a batch (arbitrary).
_IO_THREADS = 4
# Batches of reads at least this large are read by the calling thread and the pool's together,
# with one helper per further core: a helper beyond the cores only adds its wake-up (measured on
# the loaded 2-vCPU VM: each submit cost the caller about 0.3 ms, a tenth of a 8 MiB warm batch).
# Smaller batches are read by the caller alone: there a helper descheduled mid-run (load ~27 on 2
# vCPUs) made the caller wait for it, 3 ms batches taking 10-70 ms.
_GANG_MIN_BYTES = 32 << 20
_GANG_HELPERS = max(1, min(_IO_THREADS, (os.cpu_count() or 2) - 1))
# Batches smaller than this move on the calling thread, checksums after the bytes: waking a thread
# cost more than the overlap gave (measured on the loaded 2-vCPU VM, buffered, best of 15: 128
# pages of 64 KiB, 8 MiB, 34 ms through the pool vs 2.6 ms inline; 128 MiB of 1 MiB pages 179 ms
# vs 254 ms).
_POOL_MIN_BYTES = 32 << 20
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
_PAD = memoryview(bytearray(ALIGN))


def _flat(seg: memoryview) -> memoryview:
    return seg.cast("B") if seg.format != "B" or seg.ndim != 1 else seg


def _address(seg: memoryview) -> int:
    return np.frombuffer(seg, dtype=np.uint8).ctypes.data if seg.nbytes else 0


def direct_ok(page: PageView) -> bool:
    """Whether O_DIRECT can write this page from where it is: every segment starts and ends on a
    4 KiB boundary of memory (an extent always starts on one in the file)."""
    return all(s.nbytes % ALIGN == 0 and _address(s) % ALIGN == 0 for s in page)


def _pwritev_all(fd: int, segments: list[memoryview], offset: int) -> None:
    """All of ``segments`` at ``offset``; short writes are continued. Raises ``OSError``."""
    pending = list(segments)
    while pending:
        batch = pending[:_IOV_MAX]
        done = os.pwritev(fd, batch, offset)
        if done <= 0:
            raise OSError(f"pwritev wrote {done} bytes")
        offset += done
        _consume(pending, done)


def _consume(pending: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``pending`` (what one vectored call moved)."""
    while pending and n >= pending[0].nbytes:
        n -= pending.pop(0).nbytes
    if n:
        pending[0] = pending[0][n:]


def _pwritev_direct(direct_fd: int, fd: int, segments: list[memoryview], offset: int) -> None:
    """With O_DIRECT; through the page cache where the device refuses the request's alignment
    (``EINVAL``: a logical block larger than 4 KiB)."""
    try:
        _pwritev_all(direct_fd, segments, offset)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        _pwritev_all(fd, segments, offset)


def _preadv_all(fd: int, segments: list[memoryview], offset: int) -> int:
    """Fill ``segments`` from ``offset``; the bytes read, fewer at the end of the file. Raises
    ``OSError``."""
    pending = list(segments)
    total = 0
    while pending:
        batch = pending[:_IOV_MAX]
        got = os.preadv(fd, batch, offset)
        if got <= 0:
            return total
        offset += got
        total += got
        _consume(pending, got)
    return total


def _run_now(fn, *args) -> Future:
    """``fn(*args)`` on this thread, as a finished future (batches too small for the pool)."""
    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except OSError as e:
        done.set_exception(e)
    return done


def _chunks(segments: list[memoryview], offset: int, limit: int) -> list[tuple[int, list[memoryview]]]:
    """``segments`` at ``offset`` cut into requests of at most ``limit`` bytes (segments are split
    at 4 KiB multiples, so each request stays aligned for O_DIRECT)."""
    if sum(seg.nbytes for seg in segments) <= limit:  # the common case: no cutting
        return [(offset, segments)]
    out: list[tuple[int, list[memoryview]]] = []
    cur: list[memoryview] = []
    start, size = offset, 0
    for seg in segments:
        while seg.nbytes:
            take = min(seg.nbytes, limit - size)
            cur.append(seg[:take])
            seg = seg[take:]
            size += take
            if size >= limit:
                out.append((start, cur))
                start, cur, size = start + size, [], 0
    if cur:
        out.append((start, cur))
    return out


class _Stretches:
    """Which task each of a gang's readers takes next: worker ``w`` owns the ``w``-th contiguous
    stretch of ``0..ntasks-1`` and takes it front to back; once it is done, it takes the last task
    of the stretch with the most left (the owner keeps its sequential front)."""

    def __init__(self, ntasks: int, workers: int) -> None:
        bounds = [ntasks * w // workers for w in range(workers + 1)]
        self._left = [[bounds[w], bounds[w + 1]] for w in range(workers)]
        self._lock = threading.Lock()

    def next(self, worker: int) -> int | None:
        with self._lock:
            own = self._left[worker]
            if own[0] < own[1]:
                own[0] += 1
                return own[0] - 1
            other = max(self._left, key=lambda span: span[1] - span[0])
            if other[0] >= other[1]:
                return None
            other[1] -= 1
            return other[1]


class _ReadDescriptors:
    """Read-only descriptors of the file, one per reader at a time, opened as needed and kept: the
    kernel's readahead state belongs to an open file, and readers at different offsets sharing one
    thrash it. Where no descriptor can be opened (out of descriptors), the shared one serves."""

    def __init__(self, path: str, shared_fd: int) -> None:
        self._path = path
        self._shared = shared_fd
        self._free: list[int] = []
        self._opened: list[int] = []
        self._lock = threading.Lock()

    @contextmanager
    def one(self) -> Iterator[int]:
        with self._lock:
            fd = self._free.pop() if self._free else -1
        if fd < 0:
            try:
                fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                yield self._shared
                return
            with self._lock:
                self._opened.append(fd)
        try:
            yield fd
        finally:
            with self._lock:
                self._free.append(fd)

    def close(self) -> None:
        with self._lock:
            for fd in self._opened:
                os.close(fd)
            self._opened.clear()
            self._free.clear()


class PageIO:
    """Writes and reads of page bytes at extents of one file, with their checksums."""

    def __init__(self, path: str, buffered_fd: int, mode: str) -> None:
        """``mode``: ``"auto"``, ``"direct"`` or ``"buffered"`` (``LmdbTierConfig.direct_io``)."""
        self._fd = buffered_fd
        self._direct_fd = -1
        self._mode = mode
        # Pages written with O_DIRECT (``stats``: ``direct_pages``). Written by the one writer at a
        # time (the tier's write lock), read by anyone.
        self.direct_pages = 0
        self.disk_errors = 0  # reads and writes of page bytes that failed (``stats``: disk_errors)
        self._errors_lock = threading.Lock()
        self._failures = FailureLog(logger)
        self._path = path
        if mode != "buffered":
            try:
                self._direct_fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | getattr(os, "O_DIRECT", 0))
            except OSError:  # tmpfs and some others refuse O_DIRECT: the buffered path serves
                self._direct_fd = -1
        self._route = WriteRoute() if mode == "auto" and self.direct else None
        self._readers = _ReadDescriptors(path, buffered_fd)
        self._pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="mooncake-sgl-ssd-io")

    @property
    def direct(self) -> bool:
        return self._direct_fd >= 0

    @property
    def throttled(self) -> int:
        """Times a buffered batch was found throttled by the kernel (``direct_io: auto``)."""
        return self._route.throttled if self._route is not None else 0

    def write(self, keys: Sequence[PageKey], items: Sequence[tuple[int, PageView]]
              ) -> tuple[list[bool], list[int]]:
        """Write each ``(offset, page)`` and checksum it under its key; per item, whether its bytes
        are in the file, and its digest. Returns once every write has ended (written or failed)."""
        n = len(items)
        jobs: list[tuple[list[int], bool, list[Future]]] = []
        total = sum(page_nbytes(p) for _, p in items)
        buffered = self._route is not None and self._route.buffered(total)
        # A probe of the disk's rate: its first bytes O_DIRECT, timed to when they are written.
        probe = PROBE_BYTES if self._route is not None and self._route.probing and total > PROBE_BYTES else 0
        probed: list[float] = []
        started = time.perf_counter()
        submit = self._pool.submit if total >= _POOL_MIN_BYTES else _run_now
        for run, direct in self._runs(items, buffered, probe):
            segs = self._iovecs(items, run)
            if direct:
                futures = [submit(_pwritev_direct, self._direct_fd, self._fd, c, off)
                           for off, c in _chunks(segs, items[run[0]][0], _DIRECT_CHUNK)]
                if probe:  # when the probe's bytes were written, not when the batch was
                    for f in futures:
                        f.add_done_callback(lambda _: probed.append(time.perf_counter()))
            else:
                futures = [submit(_pwritev_all, self._fd, c, off)
                           for off, c in _chunks(segs, items[run[0]][0], _BUFFERED_CHUNK)]
            jobs.append((run, direct, futures))
        # Hashing here, while the pool writes (if it does): the digests are ready when the bytes are.
        digests = [checksum(keys[j], items[j][1]) for j in range(n)]
        done = [False] * n
        for run, direct, futures in jobs:
            ok = True
            for f in futures:
                failed = f.exception()
                if failed is not None:
                    self._disk_failed("write", failed)
                ok = failed is None and ok
            for j in run:
                done[j] = ok
            if direct and ok:
                self.direct_pages += len(run)
        ways = {direct for _, direct, _ in jobs}
        direct_bytes = sum(page_nbytes(items[j][1]) for run, direct, _ in jobs if direct for j in run)
        if self._route is not None and all(done):
            if probe and direct_bytes:  # the probe's rate alone: the rest overlapped it
                self._route.wrote(False, direct_bytes, max(probed) - started)
            elif len(ways) == 1:  # one way only: its rate
                self._route.wrote(not ways.pop(), total, time.perf_counter() - started)
        return done, digests

    def read(self, keys: Sequence[PageKey], items: Sequence[tuple[int, PageView, int]]) -> list[bool]:
        """Fill each ``(offset, page, digest)`` from the file; per item ``True`` only if all its
        bytes were read and they match ``digest``.

        Each run of adjacent extents is read and then hashed by the same thread, a piece at a
        time, while the piece is still in that core's cache; runs go to the calling thread and the
        pool's threads alike (``_gang``), each reading its own stretch in file order through its
        own descriptor. No readahead hints: the kernel's readahead serves the runs (module
        docstring: hints made cold reads slower)."""
        n = len(items)
        sizes = [page_nbytes(p) for _, p, _ in items]
        runs: list[tuple[int, int, list[int]]] = []  # (start, end, items), by offset
        for j in sorted(range(n), key=lambda j: items[j][0]):
            offset = items[j][0]
            if runs and offset == runs[-1][1] and runs[-1][1] - runs[-1][0] < _READ_RUN:
                runs[-1][2].append(j)
                runs[-1] = (runs[-1][0], offset + aligned(sizes[j]), runs[-1][2])
            else:
                runs.append((offset, offset + aligned(sizes[j]), [j]))
        done = [False] * n

        def one(r: int, fd: int) -> None:
            start, _, run = runs[r]
            if len(run) == 1 and sizes[run[0]] > _PIECE:
                j = run[0]
                done[j] = self._read_piecewise(fd, keys[j], items[j], sizes[j])
                return
            segs: list[memoryview] = []
            for j in run:
                segs.extend(_flat(seg) for seg in items[j][1])
                gap = -sizes[j] % ALIGN
                if gap and j != run[-1]:
                    segs.append(_PAD[:gap])  # the rest of its 4 KiB block, before the next extent
            got = self._fill(fd, segs, start)
            for j in run:
                offset, page, digest = items[j]
                done[j] = offset + sizes[j] <= start + got and checksum(keys[j], page) == digest

        if sum(sizes) >= _GANG_MIN_BYTES and len(runs) > 1:
            self._gang(len(runs), one)
        else:
            with self._readers.one() as fd:
                for r in range(len(runs)):
                    one(r, fd)
        return done

    def _read_piecewise(self, fd: int, key: PageKey, item: tuple[int, PageView, int], nbytes: int
                        ) -> bool:
        """One large page, read and hashed ``_PIECE`` bytes at a time (each piece is hashed while
        it is still in this core's cache; the streaming digest equals the one-shot one)."""
        offset, page, digest = item
        h = xxhash.xxh3_64(seed=xxhash.xxh3_64_intdigest(key))
        pos = offset
        for seg in page:
            flat = _flat(seg)
            for at in range(0, flat.nbytes, _PIECE):
                piece = flat[at:at + _PIECE]
                if self._fill(fd, [piece], pos) < piece.nbytes:
                    return False
                h.update(piece)  # releases the GIL above 64 KiB: other runs hash meanwhile
                pos += piece.nbytes
        return pos - offset == nbytes and h.intdigest() == digest

    def _fill(self, fd: int, segs: list[memoryview], offset: int) -> int:
        """Read ``segs`` from ``offset``; the bytes read (fewer at the end of the file, 0 on an
        error: the pages are misses)."""
        try:
            return _preadv_all(fd, segs, offset)
        except OSError as e:
            self._disk_failed("read", e)
            return 0

    def _disk_failed(self, op: str, e: BaseException) -> None:
        """A read or write of page bytes failed (a failing disk, a file system gone read-only):
        counted, and logged at most once per interval with the count held back."""
        with self._errors_lock:
            self.disk_errors += 1
        code = getattr(e, "errno", None)
        self._failures.report(f"SSD tier {op}", OSError(code, f"{op} of page bytes in {self._path} "
                                                             f"failed: {getattr(e, 'strerror', e)}"))

    def _gang(self, ntasks: int, fn: Callable[[int, int], None]) -> None:
        """``fn(task, fd)`` for tasks ``0..ntasks-1`` on the calling thread and up to
        ``_GANG_HELPERS`` pool threads, each through its own descriptor and its own stretch of the
        tasks (``_Stretches``). The caller works too, so a batch never waits for a thread to wake
        (on a loaded machine a wake-up took longer than a small batch's read), and helpers that
        had not started when the caller ran out of tasks are cancelled, not awaited."""
        workers = min(_GANG_HELPERS, ntasks - 1) + 1
        stretches = _Stretches(ntasks, workers)

        def loop(worker: int) -> None:
            with self._readers.one() as fd:
                for task in iter(lambda: stretches.next(worker), None):
                    fn(task, fd)

        helpers = [self._pool.submit(loop, w) for w in range(1, workers)]
        loop(0)
        for f in helpers:
            if not f.cancel():
                f.result()

    def _runs(self, items: Sequence[tuple[int, PageView]], buffered: bool, probe: int = 0
              ) -> list[tuple[list[int], bool]]:
        """Runs of adjacent extents, each written all with O_DIRECT or all not; with ``probe``,
        O_DIRECT only until that many bytes have gone that way (in file order)."""
        if buffered or not self.direct:
            return [(run, False) for run in _runs_of(items, 1 << 62)]
        out: list[tuple[list[int], bool]] = []
        left = probe or 1 << 62
        for run in _runs_of(items, 1 << 62):
            start = len(out)
            for j in run:  # within a run every extent follows the one before it
                d = left > 0 and direct_ok(items[j][1])
                if d:
                    left -= page_nbytes(items[j][1])
                if len(out) > start and out[-1][1] == d:
                    out[-1][0].append(j)
                else:
                    out.append(([j], d))
        return out

    @staticmethod
    def _iovecs(items: Sequence[tuple[int, PageView]], run: list[int]) -> list[memoryview]:
        return _iovecs_of(items, run)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._readers.close()
        if self._direct_fd >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1


def _runs_of(items: Sequence[tuple[int, PageView]], limit: int) -> list[list[int]]:
    """Indices of ``items`` grouped into runs of extents that follow each other in the file, a run
    growing while it is shorter than ``limit`` bytes."""
    runs: list[list[int]] = []
    end = -1
    for j in sorted(range(len(items)), key=lambda j: items[j][0]):
        offset, page = items[j]
        if runs and offset == end and end - items[runs[-1][0]][0] < limit:
            runs[-1].append(j)
        else:
            runs.append([j])
        end = offset + aligned(page_nbytes(page))
    return runs


def _iovecs_of(items: Sequence[tuple[int, PageView]], run: list[int]) -> list[memoryview]:
    out: list[memoryview] = []
    for n, j in enumerate(run):
        page = items[j][1]
        out.extend(_flat(s) for s in page)
        gap = aligned(page_nbytes(page)) - page_nbytes(page)
        if gap and n + 1 < len(run):
            out.append(_PAD[:gap])
    return out
