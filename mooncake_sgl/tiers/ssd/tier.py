"""``LmdbTier``: the SSD tier's ``Tier`` API over its index (``index``), page file (``extents``)
and page I/O (``page_io``). The package docstring (``tiers/ssd/__init__.py``) gives the design.

What lives here: reads in one read transaction (its snapshot keeps the extents it reads from being
reused), write batches in one write transaction, deletions, corrupt pages dropped, the counters
and the one boundary where LMDB and I/O errors become ``TierError``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import lmdb

from ...api import (
    PageKey,
    PageView,
    PutResult,
    Tier,
    TierCapabilities,
    TierKind,
    TierReport,
    TierUsage,
    page_nbytes,
)
from ...config import LmdbTierConfig, default_cache_dir
from ...errors import TierClosed, TierError, TierFull
from ...tally import Tally
from .extents import ExtentAllocator, ExtentFile, aligned
from .index import INDEX_SLACK, LmdbIndex
from .page_io import PageIO
from .probe import open_failed, refuse_unwritable
from .records import IndexFull, oldest_reader, pack_record, parse_record

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class SsdTierStats:
    """The SSD tier's own counts (``stats()``, beside its gauges): pages unless named bytes."""

    get_hits: int = 0
    get_misses: int = 0
    get_size_mismatch: int = 0  # asked at another size than stored: a miss
    corrupt_pages: int = 0  # failed their checksum or could not be read: dropped
    put_pages: int = 0
    put_existing: int = 0  # already there at the same size: acknowledged, not rewritten
    put_replaced: int = 0  # there at another size: replaced
    put_full: int = 0  # refused for want of room
    put_bad_key: int = 0  # empty or longer than LMDB's key limit
    bytes_read: int = 0
    bytes_written: int = 0
    removed: int = 0
    write_txns: int = 0
    map_full_retries: int = 0  # write batches shortened because the index map filled
    io_errors: int = 0  # pages whose bytes could not be written
    dead_readers: int = 0  # reader slots freed of processes that died reading
    foreign_writes: int = 0  # write transactions that found another process's commits first
    dropped_at_open: int = 0  # records whose bytes were gone or named twice at open
    disk_full: int = 0  # write transactions refused because the file system had no room


@dataclass(frozen=True)
class SsdTierReport(TierReport):
    """The SSD tier's ``stats()``: its counts and its gauges now."""

    counts: SsdTierStats
    free_extents: int  # free runs of the extent file (fragmentation)
    direct_pages: int  # pages written with O_DIRECT
    buffered_throttled: int  # buffered batches found throttled by the kernel (``direct_io: auto``)
    disk_errors: int  # reads and writes of page bytes that failed
    write_busy_s: float  # seconds the write lock was held for puts and removals
    index_locked_bytes: int  # bytes of the LMDB index locked in memory

    def corrupt_pages(self) -> int:
        return self.counts.corrupt_pages

    def write_busy_seconds(self) -> float:
        return self.write_busy_s


# Keys per read transaction while scanning: short transactions let writers reuse freed space.
_SCAN_CHUNK = 4096  # arbitrary


def default_lmdb_path() -> str:
    return str(default_cache_dir() / "lmdb")


class LmdbTier(Tier):
    """Persistent, checksummed pages: an LMDB index over a preallocated extent file."""

    name = "lmdb"
    kind = TierKind.SSD
    capabilities = TierCapabilities(persistent=True, local_files=True, cached_reads=True)

    def __init__(self, config: LmdbTierConfig) -> None:
        self._config = config
        self.path = config.path or default_lmdb_path()
        self._capacity = int(config.capacity)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise open_failed(self.path, e) from None
        refuse_unwritable(self.path)
        self._alloc = ExtentAllocator(self._capacity)
        self._counters = Tally(SsdTierStats)
        pages_path = os.path.join(self.path, "pages.bin")
        self._index = LmdbIndex(self.path, config, self._alloc, pages_path, self._counters.add)
        try:
            self._file = ExtentFile(pages_path)
        except OSError as e:
            self._index.close()
            raise open_failed(self.path, e) from None
        self._io = PageIO(self._file.path, self._file.fd, config.direct_io)
        self._write_lock = threading.Lock()
        self._state = threading.Condition()
        self._active = 0
        self._closed = False
        # Seconds the write lock was held (puts, removals): its rate near 1 means the tier's writer
        # is never idle, so pages are offered faster than it stores them (``stats``: write_busy_s).
        self._write_busy_s = 0.0
        try:
            self._index.sweep_and_rebuild()
        except BaseException:
            self._index.close()
            self._io.close()
            self._file.close()
            raise

    # --------------------------------------------------------------------------- plumbing

    @contextmanager
    def _lmdb_errors(self, what: str) -> Iterator[None]:
        """Every use of the environment runs in here: the one place LMDB and I/O exceptions become
        tier errors, and a count of operations in flight that ``close`` waits for."""
        with self._state:
            if self._closed:
                raise TierClosed(f"lmdb tier at {self.path} is closed")
            self._active += 1
        try:
            self._index.resident.guard()  # a failing disk under the index: an error here, not SIGBUS there
            yield
        except (lmdb.Error, OSError) as e:
            raise TierError(f"lmdb tier at {self.path}: {what} failed: {e}. If the files are "
                            "damaged, delete the directory; its pages will be recomputed.") from e
        finally:
            with self._state:
                self._active -= 1
                if not self._active:
                    self._state.notify_all()

    @contextmanager
    def _writer(self) -> Iterator[None]:
        """The write lock, its busy time counted."""
        with self._write_lock:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self._write_busy_s += time.perf_counter() - t0

    def _read(self) -> lmdb.Transaction:
        """A read transaction on the pages tree (buffers: values are views into the map)."""
        return self._index.env.begin(db=self._index.pages, buffers=True)

    def _key_ok(self, key: PageKey) -> bool:
        """LMDB refuses empty keys and keys over its limit (511 bytes by default) with an error."""
        return 0 < len(key) <= self._index.max_key

    # ------------------------------------------------------------------------------ Tier API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        with self._lmdb_errors("contains"), self._read() as txn:
            # Existence only: checksums are verified when the bytes are actually read.
            return [self._key_ok(k) and txn.get(k) is not None for k in keys]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        return self._get(keys, pages, self._io.read, "get")

    def get_into_cached(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        return self._get(keys, pages, self._io.read_cached, "get_cached")

    def _get(self, keys: Sequence[PageKey], pages: Sequence[PageView],
             read: Callable[[list[PageKey], list[tuple[int, PageView, int]]], Sequence[bool | None]],
             what: str) -> list[bool]:
        """``get_into`` through ``read`` (``PageIO.read`` or ``read_cached``), whose ``None`` is a
        page not read now: not a miss, nor corrupt (``get_into_cached``; misses and size mismatches
        are then left for the read that follows to count)."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        counted = what == "get"
        results = [False] * len(keys)
        corrupt: list[tuple[PageKey, bytes]] = []
        misses = mismatched = hits = nread = 0
        # The whole read runs inside the read transaction: its snapshot keeps the extents it
        # reads from being reused by a writer until it ends.
        with self._lmdb_errors(what), self._read() as txn:
            plan = []
            for i, (key, page) in enumerate(zip(keys, pages)):
                value = txn.get(key) if self._key_ok(key) else None
                if value is None:
                    misses += 1
                    continue
                rec = parse_record(value)
                if rec is None:
                    corrupt.append((key, bytes(value)))
                elif rec[1] != page_nbytes(page):
                    mismatched += 1
                else:
                    plan.append((i, key, rec, bytes(value)))
            whole = read([key for _, key, _, _ in plan],
                         [(rec[0], pages[i], rec[2]) for i, _, rec, _ in plan])
            for (i, key, (_, length, _), value), ok in zip(plan, whole):
                if ok is None:
                    continue
                if not ok:  # short, unreadable or not the bytes its checksum names
                    corrupt.append((key, value))
                    continue
                results[i] = True
                hits += 1
                nread += length
        if not counted:
            misses = mismatched = 0
        self._counters.add(get_hits=hits, get_misses=misses + len(corrupt), get_size_mismatch=mismatched,
                           bytes_read=nread)
        if corrupt:
            self._drop_corrupt(corrupt)
        return results

    def _drop_corrupt(self, found: list[tuple[PageKey, bytes]]) -> None:
        """Delete pages that failed their check, unless another writer replaced them since."""
        def body(txn: lmdb.Transaction) -> list[tuple[int, int] | None]:
            gone: list[tuple[int, int] | None] = []
            for key, record in found:
                if txn.get(key) == record:
                    txn.delete(key)
                    rec = parse_record(record)
                    gone.append(rec[:2] if rec is not None else None)
            return gone

        try:
            self._counters.add(corrupt_pages=self._deleting_txn("removing corrupt pages", len(found), body))
        except TierFull as e:  # they stay misses: every read of them fails the same check
            logger.warning("%s", e)

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *,
                 soft_pin: Sequence[bool] | None = None) -> PutResult:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        results = [False] * len(keys)
        todo = []
        for i, key in enumerate(keys):
            if not self._key_ok(key):
                self._counters.add(put_bad_key=1)
            else:
                todo.append(i)
        with self._writer(), self._lmdb_errors("put"):
            # Retry with a shorter prefix of the batch while the index map is full: the pages
            # before the one that did not fit are committed, the rest are False.
            limit = len(todo)
            if limit and not self._index.room(limit):
                self._counters.add(disk_full=1)
                limit = 0  # every page refused; the index is untouched
            while limit:
                done = self._write_txn(keys, pages, todo[:limit])
                if isinstance(done, int):
                    self._counters.add(map_full_retries=1)
                    self._index.env.reader_check()
                    limit = done if done < limit else limit // 2
                    continue
                written, existing, replaced = done
                for i in written + existing:
                    results[i] = True
                self._counters.add(put_pages=len(written), put_existing=len(existing),
                            put_replaced=replaced, write_txns=1,
                            bytes_written=sum(page_nbytes(pages[i]) for i in written))
                break
        self._counters.add(put_full=len(todo) - sum(results[i] for i in todo))
        # Pages already here are not reported present: the store goes by its own record of this tier.
        return PutResult.written(results)

    def _write_txn(self, keys: Sequence[PageKey], pages: Sequence[PageView], todo: list[int]
                   ) -> tuple[list[int], list[int], int] | int:
        """Write ``todo`` in one transaction: ``(written, already present, replaced)`` once
        committed (pages without room are in neither list), or the item at which the index map
        filled (``len(todo)``: at commit) after an abort."""
        written: list[int] = []
        existing: list[int] = []
        allocated: list[tuple[int, int]] = []
        replaced: list[tuple[int, int]] = []
        txn, tid = self._index.begin_write()
        try:
            oldest = oldest_reader(self._index.env) if self._alloc.free_extents() else None
            # Allocate every page first, so pages in fresh extents go to disk in one pwritev.
            # Each planned page: its position in ``todo``, index, offset, size, and the record it
            # replaces (parsed, and its bytes to put back should the write fail).
            planned: list[tuple[int, int, int, int, tuple[int, int, int] | None, bytes | None]] = []
            seen: set[PageKey] = set()
            checked = False
            for pos, i in enumerate(todo):
                nbytes = page_nbytes(pages[i])
                old = txn.get(keys[i])
                old_rec = parse_record(old) if old is not None else None
                if old_rec is not None and old_rec[1] == nbytes:
                    existing.append(i)
                    continue
                if keys[i] in seen:
                    continue  # the same key twice in one batch: the first one is written
                offset = self._alloc.allocate(nbytes, oldest)
                if offset is None and not checked and self._alloc.free_extents():
                    checked = True  # the space may be pinned only by a reader that died
                    oldest = self._index.clear_dead_readers()
                    offset = self._alloc.allocate(nbytes, oldest)
                if offset is None:
                    continue
                if not self._file.reserve(offset + aligned(nbytes), self._alloc.capacity):
                    self._alloc.release(offset, nbytes)  # the file system is full
                    continue
                seen.add(keys[i])
                allocated.append((offset, nbytes))
                planned.append((pos, i, offset, nbytes, old_rec, None if old is None else bytes(old)))

            def name(digests: list[int]) -> None:
                # Runs while the page bytes are still being written: nothing commits before the
                # write returns, and a page whose bytes failed is taken out again below.
                for (pos, i, offset, nbytes, _, _), digest in zip(planned, digests):
                    try:
                        txn.put(keys[i], pack_record(offset, nbytes, digest))
                    except lmdb.MapFullError:
                        raise IndexFull(pos) from None

            stored, _ = self._io.write([keys[i] for _, i, _, _, _, _ in planned],
                                       [(offset, pages[i]) for _, i, offset, _, _, _ in planned], name)
            for (pos, i, _, _, old_rec, old), ok in zip(planned, stored):
                if ok:
                    if old_rec is not None:
                        replaced.append(old_rec[:2])
                    written.append(i)
                    continue
                self._counters.add(io_errors=1)
                try:  # the key names what it named before, or nothing
                    if old is None:
                        txn.delete(keys[i])
                    else:
                        txn.put(keys[i], old)
                except lmdb.MapFullError:
                    raise IndexFull(pos) from None
            if written and self._config.sync:
                self._file.sync()  # the bytes are on disk before the index names them
            try:
                self._index.log_frees(txn, tid, replaced)
                txn.commit()
            except lmdb.MapFullError:
                raise IndexFull(len(todo)) from None
        except IndexFull as full:
            txn.abort()
            for off, n in reversed(allocated):
                self._alloc.release(off, n)  # never named by a committed record
            return full.at
        except BaseException:
            txn.abort()
            for off, n in reversed(allocated):
                self._alloc.release(off, n)
            raise
        self._index.committed(tid, bool(written))
        for (_, _, off, nbytes, _, _), ok in reversed(list(zip(planned, stored))):
            if not ok:  # allocated, but its write failed: nothing names it
                self._alloc.release(off, nbytes)
        for off, n in replaced:
            self._alloc.free(off, n, tid)
        return written, existing, len(replaced)

    def _deleting_txn(self, what: str, records: int,
                      body: Callable[[lmdb.Transaction], list[tuple[int, int] | None]]) -> int:
        """Run ``body`` (deletes up to ``records`` records, returns their extents) in one write
        transaction; the extents are free once it commits. Returns how many records went.

        Raises:
            TierFull: the index map has no page left even for a deletion, or the file system has
                no disk for the index pages the deletion writes.
        """
        with self._writer(), self._lmdb_errors(what):
            if not self._index.room(records, deleting=True):
                self._counters.add(disk_full=1)
                raise TierFull(f"lmdb tier at {self.path}: {what} needs disk for the index and the "
                               "file system is full", hint="free some space on that disk")
            for attempt in range(2):
                txn, tid = self._index.begin_write()
                try:
                    gone = body(txn)
                    self._index.log_frees(txn, tid, [e for e in gone if e is not None])
                    if gone:
                        txn.commit()
                    else:
                        txn.abort()  # nothing changed (a drop of an empty tree would commit)
                    break
                except lmdb.MapFullError:
                    txn.abort()
                    if attempt == 0 and self._index.env.reader_check():
                        continue
                    raise TierFull(f"lmdb tier at {self.path}: {what} needs free index pages and "
                                   "the index map is full", hint="a long-running reader may pin "
                                   "freed pages; raise the capacity of the lmdb tier") from None
                except BaseException:
                    txn.abort()
                    raise
            self._index.committed(tid, bool(gone))
            for extent in gone:
                if extent is not None:  # None: a record that was not ours named no extent
                    self._alloc.free(extent[0], extent[1], tid)
        return len(gone)

    def remove(self, keys: Sequence[PageKey]) -> int:
        def body(txn: lmdb.Transaction) -> list[tuple[int, int] | None]:
            gone: list[tuple[int, int] | None] = []
            for key in keys:
                value = txn.pop(key) if self._key_ok(key) else None
                if value is not None:
                    rec = parse_record(value)
                    gone.append(rec[:2] if rec is not None else None)
            return gone

        removed = self._deleting_txn("remove", len(keys), body)
        self._counters.add(removed=removed)
        return removed

    def usage(self) -> TierUsage:
        with self._lmdb_errors("usage"), self._index.env.begin(db=self._index.pages) as txn:
            pages = txn.stat(self._index.pages)["entries"]
        # The budget, not the file: the file is preallocated ahead of use. Room: when other data
        # fills the disk, the store must evict here to write, or every write would be refused and
        # the tier would keep its oldest pages for good.
        return TierUsage(capacity_bytes=self._capacity, used_bytes=self._alloc.used, pages=pages,
                         room_bytes=self._room())

    def _room(self) -> int | None:
        """Page bytes that still fit: the file's allocated space not in use, plus what the file
        system has left beyond the index's slack; ``None`` if the file system cannot say."""
        try:
            fs = os.statvfs(self.path)
        except OSError:
            return None
        disk = fs.f_bavail * fs.f_frsize - 2 * INDEX_SLACK
        return max(0, self._file.allocated - self._alloc.used) + max(0, disk)

    def footprint(self, nbytes: int) -> int:
        return aligned(nbytes)

    def page_size_of(self, key: PageKey) -> int | None:
        if not self._key_ok(key):
            return None
        with self._lmdb_errors("page_size_of"), self._read() as txn:
            value = txn.get(key)
            rec = parse_record(value) if value is not None else None
            return None if rec is None else rec[1]

    def scan(self) -> Iterator[tuple[PageKey, int]]:
        """Every stored page, in key order, read in short transactions (no page bytes touched)."""
        last: bytes | None = None
        while True:
            chunk: list[tuple[PageKey, int]] = []
            with self._lmdb_errors("scan"), self._read() as txn:
                cur = txn.cursor()
                more = cur.set_range(last) if last is not None else cur.first()
                if more and last is not None and bytes(cur.key()) == last:
                    more = cur.next()
                while more and len(chunk) < _SCAN_CHUNK:
                    rec = parse_record(cur.value())
                    if rec is not None:
                        chunk.append((bytes(cur.key()), rec[1]))
                    last = bytes(cur.key())
                    more = cur.next()
            yield from chunk
            if not more:
                return

    def stats(self) -> SsdTierReport:
        return SsdTierReport(self._counters.snapshot(), self._alloc.free_extents(), self._io.direct_pages,
                             self._io.throttled, self._io.disk_errors, self._write_busy_s,
                             self._index.resident.locked_bytes)

    def clear(self) -> None:
        def body(txn: lmdb.Transaction) -> list[tuple[int, int] | None]:
            gone = [r[:2] if r is not None else None
                    for r in map(parse_record, (v for _, v in txn.cursor()))]
            txn.drop(self._index.pages, delete=False)
            return gone

        self._deleting_txn("clear", 0, body)  # a drop frees pages; the freelist is counted

    def close(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._state.wait_for(lambda: self._active == 0)
        self._index.close()
        self._io.close()
        self._file.close()
