"""The page bytes of the SSD tier: one preallocated extent file, and the allocator of its extents.

The LMDB tier keeps its index (key -> offset, length, checksum) in LMDB and the page bytes here,
because measured the way a user meets the tier (pages written by one process into a fresh
directory, read by a new process after the page cache was dropped) LMDB's memory map loses to
plain file I/O at real page sizes: a value in overflow pages is faulted in 4 KiB at a time on a
cold read, and a fresh ``writemap`` page faults on every 4 KiB it writes. One ``pwritev`` from the
caller's segments and one ``preadv`` straight into the destination's segments reach the disk's
sequential speed (``scripts/bench_tiers.py --modes user-view``).

How the bytes move (writer threads, checksums alongside, O_DIRECT under dirty-memory pressure) is
``page_io``'s; this module owns where they go. Choices, each measured (writer process, page cache
dropped, reader process; 64 KiB / 1 MiB / 8 MiB pages on the development VM's virtio disk):

- Extents start on 4 KiB boundaries, so no two pages share a file-system block and a page can be
  written and read with ``O_DIRECT``. Reads of single pages were 4x slower with ``O_DIRECT`` at
  64 KiB and no faster at 8 MiB, so only a large batch's runs not in the page cache go that way,
  merged into 8 MiB requests with several in flight (``page_io``).
- Preallocation (``posix_fallocate``) ahead of the high-water mark: fresh puts 1.2-1.7x faster
  than writing into a sparse file, and a full disk shows up as a refused page at allocation instead
  of a failed write. The step doubles with the file (from ``_GROW_MIN`` up to ``_GROW_MAX``), so a
  tier that holds a few pages takes a few MiB of disk, not a quarter of a GiB.
- No readahead hints on reads: hinting every extent of a batch (``POSIX_FADV_WILLNEED``) before
  the first ``preadv`` once made cold 8 MiB reads 1.5-3x faster, but against the kernel's own
  readahead (a disk with ``read_ahead_kb`` 8192) hints per run made cold reads 2-3x slower at
  64 KiB and 1 MiB (``page_io``).
- Adjacent extents move in few calls: a batch of fresh pages is a few large ``pwritev`` (puts
  1.2-1.3x raw ``O_DIRECT`` instead of 0.5-0.9x one page per call); reads merge only up to 1 MiB
  (``page_io``).

Reuse. An extent freed by a transaction may still be read by a reader whose LMDB snapshot predates
that transaction, so the allocator hands it out again only once no reader's snapshot is older
(``oldest_reader``), LMDB's own rule for its pages. Extents are coalesced with free neighbours, so
mixed page sizes do not fragment the file for good.

Thread context: the allocator is owned by the tier's writer (under the tier's write lock).
"""

from __future__ import annotations

import bisect
import heapq
import os
from collections.abc import Iterable

ALIGN = 4096
# How far ahead of the high-water mark the file is preallocated: as much again as it holds, between
# these bounds (the upper one is a few batches of large pages).
_GROW_MIN = 4 << 20
_GROW_MAX = 256 << 20


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _latest_cover(extents: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Disjoint ``(start, end, txn)`` pieces, in order, of the union of ``(start, end, txn)``
    extents, each piece with the latest ``txn`` of the extents covering it."""
    items = sorted(extents)
    points = sorted({p for start, end, _ in items for p in (start, end)})
    out: list[tuple[int, int, int]] = []
    active: list[tuple[int, int]] = []  # (-txn, end): a max-heap of the extents covering a point
    i = 0
    for lo, hi in zip(points, points[1:]):
        while i < len(items) and items[i][0] <= lo:
            heapq.heappush(active, (-items[i][2], items[i][1]))
            i += 1
        while active and active[0][1] <= lo:
            heapq.heappop(active)
        if not active:
            continue
        txn = -active[0][0]
        if out and out[-1][1] == lo and out[-1][2] == txn:
            out[-1] = (out[-1][0], hi, txn)
        else:
            out.append((lo, hi, txn))
    return out


class ExtentAllocator:
    """Free space of ``[0, capacity)`` in 4 KiB-aligned extents.

    State: the high-water mark (everything above is free and never used), and free extents below
    it, each with the id of the transaction that freed it. Built from the extents the index holds
    (``rebuild``) at open and whenever another process wrote to the same environment.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity - capacity % ALIGN
        self.hwm = 0
        self.used = 0
        # Free extents below the high-water mark, by start: (length, freeing transaction id).
        self._free: dict[int, tuple[int, int]] = {}
        self._starts: list[int] = []  # sorted keys of _free, for neighbour lookups
        # The same extents by length, for an exact or best fit without scanning them all.
        self._by_size: dict[int, dict[int, None]] = {}
        self._sizes: list[int] = []  # sorted keys of _by_size
        self._settled: tuple[int | None] | None = None  # the readers ``_settle`` last ran for

    def rebuild(self, extents: Iterable[tuple[int, int]], freed: Iterable[tuple[int, int, int]] = (),
                freed_by: int = 0) -> None:
        """Free space is the complement of ``(offset, length)`` extents in use. Where one of the
        ``freed`` ``(offset, length, txn)`` extents covers it, it is reusable once no reader is
        older than ``txn`` (the latest such), elsewhere once none is older than ``freed_by`` (0:
        no reader can still see it). Space above both the extents in use and the freed ones is
        bump space, except that with ``freed_by`` the high-water mark does not drop (space below
        it may have held pages a reader still sees).

        Extents may lie past the capacity (another process with a larger one shares the file, or
        the capacity was lowered): they count as used, and the space past the capacity is never
        handed out."""
        spans = sorted((off, aligned(n)) for off, n in extents)
        old_hwm = self.hwm
        self._free, self._starts, self._by_size, self._sizes = {}, [], {}, []
        self._settled = None
        self.hwm = self.used = 0
        gaps: list[tuple[int, int]] = []
        for off, n in spans:
            if off > self.hwm:
                gaps.append((self.hwm, off))
            self.hwm = max(self.hwm, off + n)
            self.used += n
        marks = _latest_cover((off, off + aligned(n), t) for off, n, t in freed if t > freed_by)
        top = max(marks[-1][1] if marks else 0, old_hwm if freed_by else 0)
        if top > self.hwm:
            gaps.append((self.hwm, top))
            self.hwm = top
        j = 0
        for start, end in gaps:
            while j < len(marks) and marks[j][1] <= start:
                j += 1
            at, k = start, j
            while at < end:
                if k < len(marks) and marks[k][0] <= at:  # inside a freed extent
                    stop, txn = min(end, marks[k][1]), marks[k][2]
                    if marks[k][1] <= end:
                        k += 1
                else:
                    stop, txn = min(end, marks[k][0]) if k < len(marks) else end, freed_by
                self._put_within(at, stop - at, txn)
                at = stop

    def allocate(self, nbytes: int, oldest_reader: int | None) -> int | None:
        """Offset of a new extent for ``nbytes``, or ``None`` if the capacity has no room for it.

        ``oldest_reader``: the oldest snapshot (transaction id) any reader holds, ``None`` if no
        reader is active; an extent freed by transaction ``t`` is reusable once ``t <= oldest``.
        Smallest fit first (an exact fit is the common case: a deployment has one page size).
        """
        need = aligned(nbytes)
        for length in self._sizes[bisect.bisect_left(self._sizes, need):]:
            for start in self._by_size[length]:
                if ((oldest_reader is None or self._free[start][1] <= oldest_reader) and
                        start + need <= self.capacity):
                    freed_by = self._pop(start)[1]
                    if length > need:
                        self._put(start + need, length - need, freed_by)
                    self.used += need
                    return start
        if self._settle(oldest_reader):  # coalesced free space may fit it now
            return self.allocate(nbytes, oldest_reader)
        if self.hwm + need > self.capacity:
            return None
        off = self.hwm
        self.hwm += need
        self.used += need
        return off

    def release(self, offset: int, nbytes: int) -> None:
        """Undo an allocation that no committed record ever named (its page was refused or its
        write failed). Space taken from the top goes back to the top: left as a free extent there,
        past the end of a file that could not grow, it would be the best fit for the next page of
        that size every time, and every such page would be refused while freed space sat unused."""
        length = aligned(nbytes)
        if offset + length == self.hwm:
            self.hwm = offset
            self.used -= length
        else:
            self.free(offset, nbytes, 0)

    def free(self, offset: int, nbytes: int, txn: int) -> None:
        """Return an extent freed by transaction ``txn`` (0: no reader can ever have seen it)."""
        length = aligned(nbytes)
        self.used -= length
        # Merged only with neighbours freed by the same transaction: merged with an older one, it
        # would keep that one from reuse as long as it waits itself, and space freed a little at
        # a time next to a large free extent kept all of it waiting for good (``_settle``
        # coalesces extents once no reader can see them).
        i = bisect.bisect_left(self._starts, offset)
        if i > 0:
            prev = self._starts[i - 1]
            plen, pby = self._free[prev]
            if prev + plen == offset and pby == txn:
                self._pop(prev)
                offset, length = prev, plen + length
        nxt = self._free.get(offset + length)
        if nxt is not None and nxt[1] == txn:
            self._pop(offset + length)
            length += nxt[0]
        # Even at the top of the file it stays a free extent, not bump space: a reader may still
        # see it until transaction ``txn`` is older than every reader.
        self._put_within(offset, length, txn)
        self._settled = None

    def _settle(self, oldest_reader: int | None) -> bool:
        """Mark the free extents no reader can see any more as such (transaction 0) and coalesce
        neighbours among them; whether anything changed. Run when an allocation found no fit, at
        most once per state of the free extents and readers."""
        if self._settled == (oldest_reader,) or not self._free:
            return False
        self._settled = (oldest_reader,)
        merged: list[list[int]] = []
        changed = False
        for start in self._starts:
            length, txn = self._free[start]
            if txn and (oldest_reader is None or txn <= oldest_reader):
                txn, changed = 0, True
            if merged and txn == 0 and merged[-1][2] == 0 and merged[-1][0] + merged[-1][1] == start:
                merged[-1][1] += length
                changed = True
            else:
                merged.append([start, length, txn])
        if changed:
            self._free, self._starts, self._by_size, self._sizes = {}, [], {}, []
            for start, length, txn in merged:
                self._put(start, length, txn)
        return changed

    def free_extents(self) -> int:
        return len(self._free)

    def _put_within(self, start: int, length: int, txn: int) -> None:
        """A free extent, cut at the capacity (nothing past it is handed out)."""
        length = min(length, self.capacity - start)
        if length > 0:
            self._put(start, length, txn)

    def _put(self, start: int, length: int, txn: int) -> None:
        self._free[start] = (length, txn)
        bisect.insort(self._starts, start)
        bucket = self._by_size.get(length)
        if bucket is None:
            bucket = self._by_size[length] = {}
            bisect.insort(self._sizes, length)
        bucket[start] = None  # a dict keeps insertion order: oldest frees are reused first

    def _pop(self, start: int) -> tuple[int, int]:
        del self._starts[bisect.bisect_left(self._starts, start)]
        length, txn = self._free.pop(start)
        bucket = self._by_size[length]
        del bucket[start]
        if not bucket:
            del self._by_size[length]
            del self._sizes[bisect.bisect_left(self._sizes, length)]
        return length, txn


def allocate_ahead(fd: int, start: int, end: int, limit: int) -> int | None:
    """Give file ``fd`` disk from ``start`` (what it has so far) to at least ``end``: ahead by as
    much again as it has (``_GROW_MIN`` to ``_GROW_MAX``, never past ``limit``), or exactly to
    ``end`` where the step does not fit. Returns the new end, ``None`` if not even ``end`` fits."""
    step = min(_GROW_MAX, max(_GROW_MIN, start))
    for stop in (min(max(end, start + step), max(limit, end)), end):
        try:
            os.posix_fallocate(fd, start, stop - start)
        except OSError:
            continue
        return stop
    return None


class ExtentFile:
    """``pages.bin``: page bytes at offsets the index names. ``OSError``s propagate; the tier turns
    them into per-key misses or refusals."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._allocated = os.fstat(self._fd).st_size

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def allocated(self) -> int:
        """Bytes of the file with disk allocated (pages fit there without the file system)."""
        return self._allocated

    def reserve(self, end: int, limit: int) -> bool:
        """Preallocate the file up to at least ``end`` (ahead by a step, never past ``limit``).
        ``False`` if the file system has no room."""
        if end <= self._allocated:
            return True
        got = allocate_ahead(self._fd, self._allocated, end, limit)
        if got is None:
            return False
        self._allocated = got
        return True

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
