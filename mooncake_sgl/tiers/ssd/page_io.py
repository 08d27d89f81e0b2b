"""The SSD tier's page data path: bytes to and from ``pages.bin`` with their checksums, overlapped.

What a fresh tier met with one large batch spent its time on (``scripts/bench_tiers.py --modes
disk-speed,put-profile,get-profile``: 96 pages of 8 MiB, one ``put_from`` in a new directory and
one cold ``get_into`` in a new process, against ``dd`` with ``oflag``/``iflag=direct`` on the same
disk, 2-vCPU VM at load 2.6-3): the put waited on its writer threads, which copied the whole batch
into the page cache (a memory copy that a busy CPU slows to the disk's speed or below, and that the
kernel must still write back: put + sync 0.63x ``dd``), while the caller hashed (57% of the put's
time on that CPU); a cold get waited on buffered reads of 512 KiB pieces by two readers, whose
pace the device's readahead window decided (with the kernel's usual 128 KiB: 0.77x ``dd``).
Hence:

- *Writes go the faster way, measured* (``write_route``, ``direct_io: auto``). A batch large enough
  for the pool is cut into 4 MiB requests and driven by one pool thread: first ``PROBE_BYTES`` each
  way the route has no recent rate for (a fresh tier: both, O_DIRECT first), then the rest the way
  the route picks. O_DIRECT requests go four at a time from the caller's memory straight to the
  disk (no copy, no dirty pages, the CPU only waits); buffered ones one after the other (buffered
  writes to one file are serialised by its inode lock). The two ways never run side by side: on
  one file they contend for that lock, and on a 300 MB/s disk (``bench_tiers.py --modes
  throttled``) the page cache's writer then waited on the disk's requests and the put fell from
  1.12 to 0.39 GB/s. Smaller batches go one way on the calling thread. Pages that ``O_DIRECT``
  cannot take as they are go through a bounce buffer (``direct``).
- *Checksums* are computed by the calling thread while the pool writes, with ``xxhash``'s
  streaming update, which releases the GIL (``records.checksum``): the one-shot digest kept it for
  a whole 8 MiB segment, and a writer whose request had ended could not take its next one. Then
  the tier names the pages in its transaction (``write``'s ``then``) while the last requests are
  still in flight. The caller gets the per-page outcome only once every request covering the page
  has been written, so the tier still commits a record only for bytes already in the file.
- *Cold reads with O_DIRECT where the kernel reads ahead little.* A batch large enough for the
  pool is cut into runs of adjacent extents of up to 8 MiB; a run not wholly in the page cache
  (``direct``: ``cachestat``/``mincore``) into memory O_DIRECT can fill is read with one O_DIRECT
  request straight into the destination's segments, the caller and seven pool threads taking the
  runs in file order, and hashed by the thread that read it: requests in flight whatever the
  device's ``read_ahead_kb``, and no copy out of the page cache (half the CPU time). A buffered
  reader's pace is its readahead window's: with the kernel's usual 128 KiB, one batch of 96 pages
  of 8 MiB read cold at 0.77x ``dd`` buffered and 1.15x with O_DIRECT, 768 pages of 1 MiB at 0.68x
  and 1.04x (``bench_tiers.py --modes disk-speed --disk-speed-loop-readahead 128``, medians of 3
  rounds at load 6-12; the issue's machine: 0.46x).
  Where the window is at least a request (the development VM's disk: 8192 KiB), the kernel's
  asynchronous readahead keeps as much in flight and the two ways ran alike (0.9-1.2x ``dd``
  either way, interleaved), so cold reads stay buffered there and leave the pages cached. Runs in
  the page cache, into other memory, and ``direct_io: buffered`` are read buffered.
- *Buffered reads* (warm runs, small batches): runs of up to 1 MiB, each reader a contiguous
  stretch of the batch in file order through a descriptor of its own, a large page read and hashed
  a piece at a time while it is still in that core's cache (measured cold, 8 MiB pages, 10 rounds
  in fresh reader processes: median 1.34 GB/s against 1.07 for readers taking turns on one
  descriptor, whose readahead then saw random reads). No readahead hints: hinting each run with
  ``POSIX_FADV_WILLNEED`` read 0.3-0.9x as fast as the kernel's own readahead (``read_ahead_kb``
  8192). A reader done with its stretch takes the last runs of another's, so a helper that has not
  started is never waited for. Every page is checked against its record before it counts as a hit.

O_DIRECT and the page cache stay coherent: the kernel writes back and drops any cached page of a
range before it writes that range directly, and writes back dirty pages before it reads a range
directly; our extents never share a 4 KiB block, so a buffered reader never sees stale bytes of a
rewritten extent (and were the kernel to fail that invalidation, the stale bytes would fail their
checksum: a miss, never wrong KV).

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
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

from ...api import PageKey, PageView, page_nbytes
from ...failure_log import FailureLog
from . import direct
from .extents import ALIGN, aligned
from .readers import InOrder, ReadDescriptors, Stretches
from .records import checksum
from .write_route import PROBE_BYTES, WriteRoute

logger = logging.getLogger(__name__)

# Bytes per write request, either way: several O_DIRECT ones in flight keep the device queue busy.
_CHUNK = direct.BOUNCE_BYTES
# O_DIRECT write requests in flight (pool threads, besides the one driving a large batch).
_DIRECT_LANE = 4
# O_DIRECT read requests in flight (the caller and pool threads). A reader issues its next request
# only once it has been scheduled to hash the last one, so on a busy CPU more of them keep the disk
# busy: cold gets of 96 pages of 8 MiB on the 2-vCPU VM at load 4-5, 6 interleaved rounds, ran
# at a median 1.12x ``dd`` with 8 readers against 0.95x with 5 (the lowest round 1.00x against 0.48x).
_DIRECT_READERS = 8
_IO_THREADS = max(_DIRECT_LANE + 1, _DIRECT_READERS - 1)
# Cold reads: runs of adjacent extents of up to this much, one O_DIRECT request each (``dd``'s
# 8 MiB blocks reach the disk's sequential speed).
_DIRECT_READ = 8 << 20
# Buffered reads: runs of at most 1 MiB (``extents``: measured best for buffered cold reads). A
# larger page is read and hashed in pieces, each hashed while it is still in the reading core's
# cache.
_READ_RUN = 1 << 20
_PIECE = 512 << 10
# Batches of reads at least this large are read by the calling thread and the pool's together:
# buffered runs with one helper per further core (a helper beyond the cores only adds its wake-up:
# measured on the loaded 2-vCPU VM, each submit cost the caller about 0.3 ms), O_DIRECT ones with
# ``_DIRECT_READERS - 1`` helpers (they wait on the disk, not a core). Smaller batches are read by
# the caller alone: there a helper descheduled mid-run (load ~27 on 2 vCPUs) made the caller wait
# for it, 3 ms batches taking 10-70 ms.
_GANG_MIN_BYTES = 32 << 20
_GANG_HELPERS = max(1, min(_DIRECT_LANE, (os.cpu_count() or 2) - 1))
# Batches smaller than this move on the calling thread, one way, checksums after the bytes: waking a
# thread cost more than the overlap gave (measured on the loaded 2-vCPU VM, buffered, best of 15:
# 128 pages of 64 KiB, 8 MiB, 34 ms through the pool vs 2.6 ms inline; 128 MiB of 1 MiB pages
# 179 ms vs 254 ms).
_POOL_MIN_BYTES = 32 << 20
_PAD = memoryview(bytearray(ALIGN))


class _Requests:
    """One write batch cut into requests in file order, and per request which way it went
    (``None``: it failed) and the errors met."""

    def __init__(self, requests: list[tuple[int, list[memoryview]]]) -> None:
        self.requests = requests
        self.how: list[bool | None] = [None] * len(requests)  # True: O_DIRECT
        self.errors: list[OSError] = []
        self._lock = threading.Lock()

    def upto(self, first: int, nbytes: int) -> int:
        """The request after those from ``first`` that add up to ``nbytes``."""
        k, got = first, 0
        while k < len(self.requests) and got < nbytes:
            got += sum(s.nbytes for s in self.requests[k][1])
            k += 1
        return k

    def write(self, first: int, stop: int, write: Callable[[list[memoryview], int], bool],
              pool: ThreadPoolExecutor | None, threads: int) -> int:
        """Requests ``first..stop-1`` through ``write`` (which returns whether it went O_DIRECT),
        on ``threads`` of ``pool`` (in flight at once) or this thread; the bytes written."""
        left = deque(range(first, stop))
        done = [0]

        def loop() -> None:
            while True:
                with self._lock:
                    if not left:
                        return
                    k = left.popleft()
                offset, segs = self.requests[k]
                try:
                    went = write(segs, offset) if segs else False
                except OSError as e:
                    with self._lock:
                        self.errors.append(e)
                    continue
                with self._lock:
                    self.how[k] = went
                    done[0] += sum(s.nbytes for s in segs)

        if pool is None:
            loop()
        else:
            for f in [pool.submit(loop) for _ in range(min(threads, stop - first))]:
                f.result()
        return done[0]

    def outcome(self, items: Sequence[tuple[int, PageView]], sizes: Sequence[int]
                ) -> tuple[list[bool], int]:
        """Per item, whether every request covering its extent was written; and how many items
        went wholly O_DIRECT. Requests are in file order, and neither they nor extents overlap."""
        starts = np.array([off for off, _ in self.requests], dtype=np.int64)
        ends = starts + np.array([sum(s.nbytes for s in segs) for _, segs in self.requests], dtype=np.int64)
        first = np.array([off for off, _ in items], dtype=np.int64)
        last = first + np.array([max(1, aligned(n)) for n in sizes], dtype=np.int64)
        lo = np.searchsorted(ends, first, side="right")  # the first request ending past the start
        hi = np.searchsorted(starts, last, side="left")  # the first one starting at or past the end
        failed = np.concatenate(([0], np.cumsum([how is None for how in self.how])))
        buffered = np.concatenate(([0], np.cumsum([how is not True for how in self.how])))
        done = failed[hi] == failed[lo]
        direct_items = done & (hi > lo) & (buffered[hi] == buffered[lo])
        return done.tolist(), int(direct_items.sum())


class PageIO:
    """Writes and reads of page bytes at extents of one file, with their checksums."""

    def __init__(self, path: str, buffered_fd: int, mode: str) -> None:
        """``mode``: ``"auto"``, ``"direct"`` or ``"buffered"`` (``LmdbTierConfig.direct_io``)."""
        self._fd = buffered_fd
        self._direct_fd = -1
        self._mode = mode
        # Pages written wholly with O_DIRECT (``stats``: ``direct_pages``). Written by the one writer
        # at a time (the tier's write lock), read by anyone.
        self.direct_pages = 0
        self.disk_errors = 0  # reads and writes of page bytes that failed (``stats``: disk_errors)
        self._errors_lock = threading.Lock()
        self._failures = FailureLog(logger)
        self._path = path
        if mode != "buffered":
            try:
                self._direct_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_DIRECT", 0))
            except OSError:  # tmpfs and some others refuse O_DIRECT: the buffered path serves
                self._direct_fd = -1
        self._resident = direct.Residency(buffered_fd)
        self._nowait = True  # until the file system says it cannot read without waiting (``read_cached``)
        # Where the kernel's own readahead window is as large as an O_DIRECT read request, its
        # asynchronous readahead keeps as much in flight for a buffered reader: cold reads stay
        # buffered there (and leave the pages cached). Read once: a change needs a reopen.
        ahead = direct.readahead_of(buffered_fd)
        self._cold_direct = self.direct and (ahead is None or ahead < _DIRECT_READ)
        self._route = WriteRoute() if mode == "auto" and self.direct else None
        self._readers = ReadDescriptors(path, buffered_fd)
        self._pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="mooncake-sgl-ssd-io")

    @property
    def direct(self) -> bool:
        return self._direct_fd >= 0

    @property
    def throttled(self) -> int:
        """Times a buffered batch was found throttled by the kernel (``direct_io: auto``)."""
        return self._route.throttled if self._route is not None else 0

    # ------------------------------------------------------------------------------ writes

    def write(self, keys: Sequence[PageKey], items: Sequence[tuple[int, PageView]],
              then: Callable[[list[int]], None] | None = None) -> tuple[list[bool], list[int]]:
        """Write each ``(offset, page)`` and checksum it under its key; per item, whether its bytes
        are in the file, and its digest. ``then(digests)`` runs on this thread as soon as the digests
        are known, while the pool may still be writing (the tier names the pages in its transaction
        meanwhile). Returns, or raises what ``then`` raised, once every write has ended."""
        sizes = [page_nbytes(p) for _, p in items]
        total = sum(sizes)
        runs = [run for _, _, run in _merged(items, sizes, 1 << 62)]
        reqs = _Requests([req for run in runs for req in _chunks(_iovecs_of(items, sizes, run),
                                                                  items[run[0]][0], _CHUNK)])
        if total >= _POOL_MIN_BYTES:
            # One pool thread drives the batch (its O_DIRECT requests on the others) while this one
            # hashes: the digests are ready when the bytes are.
            driver = self._pool.submit(self._write_pooled, reqs, total)
        else:
            self._write_inline(reqs, total)
            driver = None
        try:
            digests = [checksum(keys[j], items[j][1]) for j in range(len(items))]
            if then is not None:
                then(digests)
        finally:  # no extent may be given back while a write into it is in flight
            if driver is not None:
                driver.result()
            for e in reqs.errors:
                self._disk_failed("write", e)
        done, direct_items = reqs.outcome(items, sizes)
        self.direct_pages += direct_items
        return done, digests

    def _write_inline(self, reqs: _Requests, total: int) -> None:
        """A small batch, one way, on this thread."""
        buffered = not self.direct or (self._route is not None and self._route.buffered(total))
        started = time.perf_counter()
        reqs.write(0, len(reqs.requests), self._write_buffered if buffered else self._write_direct,
                   None, 0)
        if self._route is not None and not reqs.errors:
            self._route.wrote(buffered, total, time.perf_counter() - started)

    def _write_pooled(self, reqs: _Requests, total: int) -> None:
        """A large batch: first ``PROBE_BYTES`` each way the route has no recent rate for, then the
        rest the way it picks with those rates; O_DIRECT requests ``_DIRECT_LANE`` at a time,
        buffered ones one after the other (buffered writes to one file are serialised by its inode
        lock). Runs on a pool thread, under the tier's write lock."""
        if not self.direct:
            reqs.write(0, len(reqs.requests), self._write_buffered, None, 0)
            return
        if self._route is None:
            reqs.write(0, len(reqs.requests), self._write_direct, self._pool, _DIRECT_LANE)
            return
        at, left = 0, total
        for buffered in self._route.probes(total):
            stop = reqs.upto(at, PROBE_BYTES)
            if stop >= len(reqs.requests):
                break  # the batch is no longer than its probes: it goes the way ``buffered`` says
            left -= self._timed(reqs, at, stop, buffered)
            at = stop
        self._timed(reqs, at, len(reqs.requests), self._route.buffered(left))

    def _timed(self, reqs: _Requests, first: int, stop: int, buffered: bool) -> int:
        """Requests ``first..stop-1`` one way, their rate reported to the route; the bytes."""
        started = time.perf_counter()
        if buffered:
            nbytes = reqs.write(first, stop, self._write_buffered, None, 0)
        else:
            nbytes = reqs.write(first, stop, self._write_direct, self._pool, _DIRECT_LANE)
        if self._route is not None and not reqs.errors:
            self._route.wrote(buffered, nbytes, time.perf_counter() - started)
        return nbytes

    def _write_buffered(self, segs: list[memoryview], offset: int) -> bool:
        direct.pwritev_all(self._fd, segs, offset)
        return False

    def _write_direct(self, segs: list[memoryview], offset: int) -> bool:
        """With O_DIRECT; through the page cache where the device refuses the request's alignment
        (``EINVAL``: a logical block larger than 4 KiB)."""
        try:
            direct.write_direct(self._direct_fd, segs, offset)
            return True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
        return self._write_buffered(segs, offset)

    # ------------------------------------------------------------------------------- reads

    def read(self, keys: Sequence[PageKey], items: Sequence[tuple[int, PageView, int]]) -> list[bool]:
        """Fill each ``(offset, page, digest)`` from the file; per item ``True`` only if all its
        bytes were read and they match ``digest``.

        Each run of adjacent extents is read and then hashed by the same thread; runs go to the
        calling thread and the pool's threads alike (``_gang``). A large batch's runs not wholly in
        the page cache are read with O_DIRECT."""
        n = len(items)
        sizes = [page_nbytes(p) for _, p, _ in items]
        cold = self._cold_direct and sum(sizes) >= _GANG_MIN_BYTES
        runs: list[tuple[int, list[int], bool]] = []  # (start, items, with O_DIRECT), by offset
        for start, end, run in _merged(items, sizes, _DIRECT_READ if cold else _READ_RUN):
            if (cold and self._resident.cached(start, end - start) is False and
                    direct.looks_aligned([seg for j in run for seg in items[j][1]])):
                runs.append((start, run, True))
            elif cold:  # in the page cache, or memory O_DIRECT cannot fill: buffered runs
                runs.extend((s, r, False) for s, _, r in _merged([items[j] for j in run],
                                                                 [sizes[j] for j in run], _READ_RUN,
                                                                 run))
            else:
                runs.append((start, run, False))
        done = [False] * n

        def one(r: int, fd: int) -> None:
            start, run, through_direct = runs[r]
            if len(run) == 1 and sizes[run[0]] > (_DIRECT_READ if through_direct else _PIECE):
                j = run[0]
                done[j] = self._read_piecewise(fd, keys[j], items[j], sizes[j], through_direct)
                return
            got = self._fill(fd, _iovecs_of(items, sizes, run), start, through_direct)
            for j in run:
                offset, page, digest = items[j]
                done[j] = offset + sizes[j] <= start + got and checksum(keys[j], page) == digest

        if sum(sizes) >= _GANG_MIN_BYTES and len(runs) > 1:
            self._gang(len(runs), one, any(d for _, _, d in runs))
        else:
            with self._readers.one() as fd:
                for r in range(len(runs)):
                    one(r, fd)
        return done

    def read_cached(self, keys: Sequence[PageKey], items: Sequence[tuple[int, PageView, int]]
                    ) -> list[bool | None]:
        """``read`` of what the page cache holds now, on this thread, never waiting on the disk: per
        item ``True`` (read, matches ``digest``), ``False`` (read whole, not the bytes its checksum
        names) or ``None`` (not wholly in memory now: nothing is known of it, and its destination
        may be partly written)."""
        out: list[bool | None] = [None] * len(items)
        if not self._nowait:
            return out
        sizes = [page_nbytes(p) for _, p, _ in items]
        # The readers' descriptors: a read that meets the kernel's readahead mark starts the next
        # window on the stream the earlier reads of the hit opened.
        with self._readers.one() as fd:
            for start, _, run in _merged(items, sizes, _READ_RUN):
                try:
                    got = direct.preadv_cached(fd, _iovecs_of(items, sizes, run), start)
                except OSError as e:
                    if e.errno == errno.EOPNOTSUPP:  # the file system cannot: reads wait, as before
                        self._nowait = False
                        return out
                    continue  # a failing disk: the read that waits meets it, and counts it
                for j in run:
                    offset, page, digest = items[j]
                    if offset + sizes[j] <= start + got:
                        out[j] = checksum(keys[j], page) == digest
        return out

    def _read_piecewise(self, fd: int, key: PageKey, item: tuple[int, PageView, int], nbytes: int,
                        through_direct: bool) -> bool:
        """One large page, read and hashed a piece at a time (buffered: each piece hashed while it
        is still in this core's cache; O_DIRECT: one request per piece). The streaming digest
        equals the one-shot one."""
        offset, page, digest = item
        h = xxhash.xxh3_64(seed=xxhash.xxh3_64_intdigest(key))
        segs = [direct.flat(seg) for seg in page]
        for at, piece in _chunks(segs, offset, _DIRECT_READ if through_direct else _PIECE):
            want = sum(p.nbytes for p in piece)
            if self._fill(fd, piece, at, through_direct) < want:
                return False
            for p in piece:
                h.update(p)  # releases the GIL above 64 KiB: other runs hash meanwhile
        return h.intdigest() == digest

    def _fill(self, fd: int, segs: list[memoryview], offset: int, through_direct: bool) -> int:
        """Read ``segs`` from ``offset``; the bytes read (fewer at the end of the file, 0 on an
        error: the pages are misses)."""
        try:
            if through_direct:
                try:
                    return direct.preadv_all(self._direct_fd, segs, offset)
                except OSError as e:
                    if e.errno != errno.EINVAL:  # not memory O_DIRECT can fill: read it buffered
                        raise
            return direct.preadv_all(fd, segs, offset)
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

    def _gang(self, ntasks: int, fn: Callable[[int, int], None], cold: bool) -> None:
        """``fn(task, fd)`` for tasks ``0..ntasks-1`` on the calling thread and pool threads, each
        through its own descriptor: for buffered reads one helper per further core, each reader
        with its own stretch of the tasks (``readers.Stretches``); with ``cold`` (some go O_DIRECT)
        ``_DIRECT_READERS - 1`` helpers taking the tasks in file order (``readers.InOrder``). The caller works
        too, so a batch never waits for a thread to wake (on a loaded machine a wake-up took longer
        than a small batch's read), and helpers that had not started when the caller ran out of
        tasks are cancelled, not awaited."""
        workers = min(_DIRECT_READERS - 1 if cold else _GANG_HELPERS, ntasks - 1) + 1
        stretches = InOrder(ntasks) if cold else Stretches(ntasks, workers)

        def loop(worker: int) -> None:
            with self._readers.one() as fd:
                for task in iter(lambda: stretches.next(worker), None):
                    fn(task, fd)

        futures = [self._pool.submit(loop, w) for w in range(1, workers)]
        loop(0)
        for f in futures:
            if not f.cancel():
                f.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._readers.close()
        if self._direct_fd >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1


def _merged(items: Sequence[tuple], sizes: Sequence[int], limit: int, names: Sequence[int] | None = None
            ) -> list[tuple[int, int, list[int]]]:
    """``(start, end, item indices)`` of the runs of extents that follow each other in the file, in
    file order, a run growing while it is shorter than ``limit`` bytes; indices into ``names``
    where given."""
    runs: list[tuple[int, int, list[int]]] = []
    for j in sorted(range(len(items)), key=lambda j: items[j][0]):
        offset, name = items[j][0], j if names is None else names[j]
        if runs and offset == runs[-1][1] and runs[-1][1] - runs[-1][0] < limit:
            runs[-1][2].append(name)
            runs[-1] = (runs[-1][0], offset + aligned(sizes[j]), runs[-1][2])
        else:
            runs.append((offset, offset + aligned(sizes[j]), [name]))
    return runs


def _chunks(segments: list[memoryview], offset: int, limit: int) -> list[tuple[int, list[memoryview]]]:
    """``segments`` at ``offset`` cut into requests of at most ``limit`` bytes (segments are split
    at 4 KiB multiples, so each request stays aligned for O_DIRECT)."""
    if sum(seg.nbytes for seg in segments) <= limit:  # the common case: no cutting
        return [(offset, segments)]
    out: list[tuple[int, list[memoryview]]] = []
    cur: list[memoryview] = []
    start, size = offset, 0
    for seg in segments:
        if size + seg.nbytes < limit:  # most segments of small pages: no slicing
            cur.append(seg)
            size += seg.nbytes
            continue
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


def _iovecs_of(items: Sequence[tuple], sizes: Sequence[int], run: list[int]) -> list[memoryview]:
    """The segments of the pages ``run`` (``items[j][1]``), adjacent in the file, as one vectored
    request: each extent's last 4 KiB block padded into scratch before the next extent."""
    out: list[memoryview] = []
    for n, j in enumerate(run):
        out.extend(direct.flat(s) for s in items[j][1])
        gap = -sizes[j] % ALIGN
        if gap and n + 1 < len(run):
            out.append(_PAD[:gap])
    return out
