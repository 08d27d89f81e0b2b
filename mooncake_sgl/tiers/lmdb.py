"""The SSD tier: checksummed KV pages on local disk that survive crashes and restarts.

Design. One directory per rank holding an LMDB environment, the *index* (``data.mdb``,
``lock.mdb``), and an extent file with the page bytes (``pages.bin``, see ``ssd_extents``). The
index maps ``PageKey -> record`` (offset, length, checksum; 32 bytes, see ``ssd_records``).

Why each choice:

- *Disk speed.* Page bytes never pass through LMDB's memory map: a put writes the caller's
  segments into preallocated extents from writer threads while it checksums them, through the page
  cache while the kernel takes them freely and with ``O_DIRECT`` once it would throttle; a get
  reads into the destination's segments and hashes each piece as it lands, leaving readahead
  to the kernel (``ssd_io``).
  Measured the way a user meets the tier (writer process, page cache dropped, new reader
  process), values kept in LMDB read 1.4-2.3x slower and were written 2-7x slower at 64 KiB and
  8 MiB than this; ``scripts/bench_tiers.py --modes user-view`` compares it with SGLang's
  ``HiCacheFile`` and the disk's ``O_DIRECT`` limit; ``ssd_extents`` says what each option gave.
- *Warm restart.* The index is LMDB's B-tree: whatever a committed transaction wrote is found by a
  new process (``scan`` yields it for the store to seed its policy). A page's bytes are written
  before the transaction naming them commits (and ``fdatasync``-ed first with ``sync``), so a
  process killed mid-batch leaves only unnamed bytes in free extents; the allocator is rebuilt
  from the index at open, so they are simply free again.
- *Damage never kills the opener.* A truncated or damaged ``data.mdb`` makes LMDB abort or die of
  SIGBUS, so a child process walks the index first (``lmdb_probe``); a damaged environment is
  moved aside (its page file deleted, only the newest few kept: ``lmdb_aside``) and the tier
  starts empty. Records naming bytes past the end of ``pages.bin`` are
  dropped at open; a short read later is a miss.
- *A failing disk never kills the reader.* LMDB reads its index through a map, where a page the
  kernel must read back from a disk that answers with an I/O error is SIGBUS. The maps are kept
  read in and locked in memory, each growth read in by a call that returns the error instead
  (``lmdb_resident``); a failing disk is then misses, one log line, and reads again once it does.
- *Integrity.* The checksum is verified on every read, over the bytes as they landed in the
  destination; a mismatch is a miss, counted, and the page is deleted, so corrupt KV is never
  handed to the model (Mooncake #2236, SGLang #27504 show what silently wrong KV does).
- *Batched writes.* One write transaction per ``put_from`` batch: one commit (one fsync of each
  file with ``sync``) for up to 128 pages.
- *Capacity* is a budget on the extent file: page bytes rounded up to 4 KiB. A page that does not
  fit is a per-key ``False``, which the store answers by evicting. Freed extents are reused once
  no reader can still see the page they held (LMDB's own rule, applied to our extents).
- *A full disk refuses, never crashes.* Page bytes: the extent file grows only by
  ``posix_fallocate``, so a page that finds no disk is a ``False``, and its space goes back to the
  top rather than becoming a free extent past the end of the file. Index: LMDB grows ``data.mdb``
  by writing into it, which on a full file system is SIGBUS through the map or ENOSPC at commit,
  so its disk is allocated ahead of every write transaction (``_index_room``); removals then still
  commit, and the space they free takes new pages. ``usage().room_bytes`` says what the disk still
  holds, so the store evicts here to keep writing rather than every write being refused while the
  oldest pages stay (``tests/adversarial/test_lmdb_full_disk.py``).
- *True means readable.* A key already present at the same size is ``True`` without a rewrite (the
  first value is kept); at a different size the page is replaced, so a read at the size just
  acknowledged hits.

Thread context: reads run in parallel (LMDB readers never block; ``preadv`` takes no lock); writes
take one in-process lock so a write transaction stays on one thread, and LMDB's own lock serialises
writers across processes.

Several processes on one directory (the TP ranks of an MLA model by design, two servers on one
host, a restart overlapping the old process's exit; ``tests/adversarial/test_ssd_shared_dir_stress.py``
kills them at random):

- LMDB tells live processes from dead ones, and the first opener from later ones, by POSIX locks
  on ``lock.mdb``, which closing *any* descriptor of it drops: ours stays open as long as the
  environment (py-lmdb refuses a second environment on a directory the process has open).
- Extents are allocated only inside a write transaction (one process at a time). A process whose
  expected transaction id is not the one it got rebuilds its allocator from the index first; at
  open the sweep and the rebuild read one write transaction, so no commit falls in between.
- Which extents each commit freed is kept in the index (a free log, pruned once no reader is
  older), so a rebuilt allocator reuses old free space at once and waits only for what readers
  of any process may still see.
- Reader slots of processes that died reading are freed when an allocation finds no reusable
  space, and every ``_READER_CHECK_S``.
- Records past this process's capacity are another process's (or a lowered capacity's) pages:
  kept and counted as used, never allocated over.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import lmdb

from ..api import PageKey, PageView, Tier, TierCapabilities, TierKind, TierUsage, page_nbytes
from ..config import LmdbTierConfig, default_cache_dir
from ..errors import TierClosed, TierError, TierFull
from .lmdb_aside import set_aside
from .lmdb_probe import damage_of, open_failed, refuse_unwritable
from .lmdb_resident import ResidentIndex
from .ssd_extents import ExtentAllocator, ExtentFile, aligned, allocate_ahead
from .ssd_io import PageIO
from .ssd_records import (
    RECORD_BYTES,
    IndexFull,
    oldest_reader,
    pack_record,
    parse_record,
)

__all__ = ["RECORD_BYTES", "LmdbTier", "default_lmdb_path", "parse_record"]

logger = logging.getLogger(__name__)

FORMAT = b"mooncake_sgl index+extents v2"
_DBS = (b"meta", b"pages")
# Keys per read transaction while scanning: short transactions let writers reuse freed space.
_SCAN_CHUNK = 4096  # arbitrary
# Index map: records are ~100-250 bytes per page with B-tree overhead and pages are >= 4 KiB on
# disk, so 1/8 of the capacity is generous; it is address space (a sparse file), not disk.
_INDEX_FRACTION = 8
_MIN_INDEX_MAP = 64 << 20
# Disk the index file must have allocated beyond its last used page before a write transaction:
# LMDB puts new pages there, and on a full file system a write into a hole is SIGBUS through the map
# (``writemap``: the process dies) or ENOSPC at commit (a full disk then blocks deletions too, so
# the store could never make room again). ``_index_room`` bounds what one transaction can add: a
# copy of each page on a record's path and as many again from splits, or for deletions at most a
# copy of every page of the tree (merges add none); the freed pages' list (8 bytes each) and the
# catalogue and meta pages fit in the slack. An upper bound, not a guess that is usually enough.
_INDEX_SLACK = 1 << 20
# The free log, in the meta database: _FREED + the id (8 bytes, big-endian) of a transaction that
# freed extents -> those extents, (offset, aligned length) each, merged where adjacent. More spans
# than _MAX_LOGGED_SPANS (a ``clear``) are logged as the one span that covers them all.
_FREED = b"freed:"
_SPAN = struct.Struct("<QQ")
_MAX_LOGGED_SPANS = 4096
# How often a writer frees the reader slots of dead processes when nothing else asked for it
# (arbitrary; the check is one lock test per process in the reader table).
_READER_CHECK_S = 10.0
# Bytes per reader slot in lock.mdb (a cache line; LMDB's header takes about three more).
_LMDB_READER_SLOT = 64


def default_lmdb_path() -> str:
    return str(default_cache_dir() / "lmdb")


class LmdbTier(Tier):
    """Persistent, checksummed pages: an LMDB index over a preallocated extent file."""

    name = "lmdb"
    kind = TierKind.SSD
    capabilities = TierCapabilities(persistent=True)

    def __init__(self, config: LmdbTierConfig) -> None:
        self._config = config
        self.path = config.path or default_lmdb_path()
        self._capacity = int(config.capacity)
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise open_failed(self.path, e) from None
        refuse_unwritable(self.path)
        self._index_fd = -1  # data.mdb, to allocate its disk ahead of LMDB (``_index_room``)
        self._lock_fd = -1  # lock.mdb, held open while the environment is (``_allocate_reader_table``)
        self._index_backed = 0  # bytes of it known to have disk allocated, from its start
        try:  # an index with no pages to name may be one another process is creating right now
            no_pages = os.path.getsize(os.path.join(self.path, "pages.bin")) == 0
        except OSError:
            no_pages = True
        damage = damage_of(self.path, len(_DBS), self._index_map_size(), config.writemap, empty_ok=no_pages)
        if damage is not None:
            set_aside(self.path, damage)
        self._env, self._meta, self._pages = self._open_index()
        try:
            self._resident = ResidentIndex(self._env, self._index_fd, self._lock_fd, self.path)
            self._resident.guard()
        except OSError as e:
            self._close_index()
            raise open_failed(self.path, e) from None
        self._max_key = self._env.max_key_size()
        try:
            self._file = ExtentFile(os.path.join(self.path, "pages.bin"))
        except OSError as e:
            self._close_index()
            raise open_failed(self.path, e) from None
        self._io = PageIO(self._file.path, self._file.fd, config.direct_io)
        self._alloc = ExtentAllocator(self._capacity)
        self._write_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._state = threading.Condition()
        self._active = 0
        self._closed = False
        self._counters = dict.fromkeys(
            ("get_hits", "get_misses", "get_size_mismatch", "corrupt_pages", "put_pages",
             "put_existing", "put_replaced", "put_full", "put_bad_key", "bytes_read",
             "bytes_written", "removed", "write_txns", "map_full_retries", "io_errors", "dead_readers",
             "foreign_writes", "dropped_at_open", "disk_full"), 0)
        # Seconds the write lock was held (puts, removals): its rate near 1 means the tier's writer
        # is never idle, so pages are offered faster than it stores them (``stats``: write_busy_s).
        self._write_busy_s = 0.0
        self._next_txn = 0
        self._next_reader_check = time.monotonic() + _READER_CHECK_S  # the open just checked
        try:
            self._sweep_and_rebuild()
        except BaseException:
            self._close_index()
            self._io.close()
            self._file.close()
            raise

    # --------------------------------------------------------------------------- plumbing

    def _open_index(self) -> tuple[lmdb.Environment, lmdb._Database, lmdb._Database]:
        for attempt in range(2):
            env = self._open_env()
            with env.begin(buffers=True) as txn:
                foreign = any(bytes(k) not in _DBS for k, _ in txn.cursor())
            if not foreign:
                meta = env.open_db(b"meta")
                pages = env.open_db(b"pages")
                if not self._index_room(env, pages, 1):
                    self._release(env)
                    raise TierError(f"cannot open LMDB tier at {self.path}: the file system is full "
                                    "(the index has no room for its first write). Free some space "
                                    "there or point the tier at another disk.")
                with env.begin(write=True, db=meta) as txn:
                    fmt = txn.get(b"format")
                    if fmt is None:
                        txn.put(b"format", FORMAT)
                if fmt in (None, FORMAT):
                    return env, meta, pages
            self._release(env)
            if attempt:
                break
            # An older layout (values inline in LMDB) or someone else's environment: it is a
            # cache, so keep it for a look and start empty rather than misread it.
            set_aside(self.path, "it holds an older or foreign layout")
        raise TierError(f"LMDB tier at {self.path}: cannot create a fresh index")

    def _open_env(self) -> lmdb.Environment:
        config = self._config
        self._reserve_lock_file()
        try:
            env = lmdb.open(
                self.path, map_size=self._index_map_size(),
                subdir=True, lock=True, writemap=config.writemap, sync=config.sync,
                metasync=config.sync, max_readers=config.max_readers, max_dbs=len(_DBS),
                meminit=False)
        except (OSError, lmdb.Error) as e:
            raise open_failed(self.path, e) from None
        try:
            # A process killed while reading leaves its reader slot behind, pinning old extents.
            env.reader_check()
            self._index_fd = os.open(os.path.join(self.path, "data.mdb"), os.O_RDWR | os.O_CLOEXEC)
            self._index_backed = 0
            self._lock_fd = self._allocate_reader_table()
        except (OSError, lmdb.Error) as e:
            self._release(env)
            raise open_failed(self.path, e) from None
        return env

    def _reserve_lock_file(self) -> None:
        """Give lock.mdb disk before LMDB maps it. LMDB creates the file sparse and writes its
        header through a map, so on a full file system its open was SIGBUS (measured: a fresh tier
        on a full tmpfs killed the process); here it is a refusal. A size above LMDB's own only
        leaves room for more readers. The descriptor is closed before the environment exists, so no
        lock of LMDB's is dropped by it (see ``_allocate_reader_table``)."""
        want = -(-(self._config.max_readers + 3) * _LMDB_READER_SLOT // 4096) * 4096
        try:
            fd = os.open(os.path.join(self.path, "lock.mdb"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.posix_fallocate(fd, 0, max(want, os.fstat(fd).st_size))
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise TierError(f"cannot open LMDB tier at {self.path}: the file system is full (no "
                                "room for its lock file). Free some space there or point the tier at "
                                "another disk.") from None
            raise open_failed(self.path, e) from None

    def _allocate_reader_table(self) -> int:
        """Give lock.mdb's reader table disk now. LMDB writes a reader's slot through a map of that
        sparse file; on a full file system the first reader in a slot past the first page was
        SIGBUS (measured: 200 read transactions held at once on a full tmpfs).

        Returns the descriptor used, which must stay open until the environment is closed: LMDB
        tells live processes from dead ones, and the first opener (who resets the reader table and
        the writer's mutex) from later ones, by POSIX locks on lock.mdb, and closing *any*
        descriptor of a file drops every such lock the process holds on it. Closed here, a second
        process opening the directory took itself for the only one and reset both under the live
        writer (SIGSEGV, SIGABRT or a corrupted index)."""
        lock = os.path.join(self.path, "lock.mdb")
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as e:
            logger.warning("LMDB tier at %s: no disk for its reader table (%s); on a full disk, "
                           "many readers at once could crash the process", self.path, e)
        return fd

    def _index_map_size(self) -> int:
        return max(self._capacity // _INDEX_FRACTION, _MIN_INDEX_MAP)

    def _index_room(self, env: lmdb.Environment, tree: lmdb._Database, records: int,
                    deleting: bool = False) -> bool:
        """Whether data.mdb has disk allocated for a write transaction on ``records`` records of
        ``tree`` (allocating it, ahead by a step, if the file system has room); ``False`` on a full
        disk, where LMDB must not write (see ``_INDEX_SLACK``). Called under the write lock."""
        psize = env.stat()["psize"]
        used = (env.info()["last_pgno"] + 1) * psize
        with env.begin() as txn:
            shape = txn.stat(tree)
        new_pages = records * 2 * (shape["depth"] + 1)
        if deleting:
            new_pages = min(new_pages, shape["branch_pages"] + shape["leaf_pages"] + shape["depth"] + 1)
        need = min(used + new_pages * psize + used // 256 + _INDEX_SLACK, self._index_map_size())
        if need <= self._index_backed:
            return True
        # From where this process's allocation ended (0 after an open: blocks the file already has
        # cost nothing to allocate again).
        got = allocate_ahead(self._index_fd, self._index_backed, need, self._index_map_size())
        if got is None:
            return False
        self._index_backed = got
        return True

    def _close_index(self) -> None:
        self._release(self._env)

    def _release(self, env: lmdb.Environment) -> None:
        """Close ``env``, then the descriptors this tier keeps on its files: lock.mdb's only after
        the environment (see ``_allocate_reader_table``)."""
        env.close()
        for name in ("_index_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def _sweep_and_rebuild(self) -> None:
        """At open: drop records that are not ours, name bytes past the end of ``pages.bin``
        (truncated) or bytes another record names, then rebuild the allocator from the rest.

        Other processes may be using the directory (the TP ranks of an MLA model, two servers, a
        restart overlapping the old process's exit), so all of it happens in one write
        transaction: no commit can fall between the records read, the file size, the drops and
        the transaction id the allocator is current with. Read apart, a commit in between counted
        as seen while its extents were unknown, and they were handed out again.

        Records past this process's capacity are kept: they may be another live process's pages
        (it has a larger capacity). After a lowered capacity the store evicts them, as they count
        as used; the allocator never hands out space past the capacity."""
        try:
            txn = self._env.begin(write=True, db=self._pages, buffers=True)
        except lmdb.Error as e:
            raise TierError(f"cannot open LMDB tier at {self.path}: {e}") from None
        dropped = 0
        try:
            tid = txn.id()
            size = os.path.getsize(self._file.path)
            extents, bad = self._live_extents(txn, size)
            freed = self._freed_log(txn)
            if bad and not self._index_room(self._env, self._pages, len(bad), deleting=True):
                # Their checksums still turn any read of them into a miss; a later open drops them.
                logger.warning("LMDB tier at %s: %d pages whose bytes are gone or out of bounds "
                               "stay named until there is disk to drop them", self.path, len(bad))
            elif bad:
                logger.warning("LMDB tier at %s: dropping %d pages whose bytes are gone or out of "
                               "bounds", self.path, len(bad))
                for k in bad:
                    txn.delete(k)
                dropped = len(bad)
            if dropped:
                txn.commit()
            else:
                txn.abort()
        except (lmdb.Error, OSError) as e:
            txn.abort()
            raise TierError(f"cannot open LMDB tier at {self.path}: {e}") from None
        except BaseException:
            txn.abort()
            raise
        self._counters["dropped_at_open"] = dropped
        # A reader of another process may still read extents freed recently: the free log says
        # which, and by what transaction.
        self._alloc.rebuild(extents, freed)
        self._next_txn = tid + 1 if dropped else tid

    def _live_extents(self, txn: lmdb.Transaction, size: int
                      ) -> tuple[list[tuple[int, int]], list[bytes]]:
        """``(offset, length)`` of every record of ``txn``'s index whose bytes lie within a page
        file of ``size`` bytes, and the keys of the records that cannot be served: not ours, past
        the end of the file, or naming bytes an earlier record names (a damaged offset: the first
        is kept, its checksum still decides whether it is readable; freeing the other later must
        not free live bytes). ``size`` is read inside the transaction: a committed record's bytes
        were written, within the file, before its commit."""
        bad: list[bytes] = []
        named: list[tuple[int, int, bytes]] = []
        for k, v in txn.cursor():
            rec = parse_record(v)
            if rec is None or rec[0] + rec[1] > size:
                bad.append(bytes(k))
            else:
                named.append((rec[0], rec[1], bytes(k)))
        extents: list[tuple[int, int]] = []
        end = 0
        for offset, length, key in sorted(named):
            if offset < end:
                bad.append(key)
            else:
                extents.append((offset, length))
                end = offset + aligned(length)
        return extents, bad

    def _begin_write(self) -> tuple[lmdb.Transaction, int]:
        """A write transaction and its id; first catches up with another process's writes.

        This is how several processes allocate extents of one ``pages.bin`` without handing out
        the same one twice: allocating happens only inside a write transaction, which LMDB's
        writer lock gives one process at a time, and a process whose last known id is not the
        transaction's own rebuilds its allocator from the index inside it first."""
        txn = self._env.begin(write=True, db=self._pages, buffers=True)
        tid = txn.id()
        if tid != self._next_txn:
            # Someone else committed since our last write: their extents are not in our
            # allocator. Space they freed may still be read by readers (of any process) older
            # than the transaction that freed it, which the free log names, so it waits for them.
            try:
                size = os.path.getsize(self._file.path)
                extents, _ = self._live_extents(txn, size)
                freed = self._freed_log(txn)
            except BaseException:
                txn.abort()
                raise
            self._alloc.rebuild(extents, freed)
            self._next_txn = tid
            self._count(foreign_writes=1)
        if time.monotonic() >= self._next_reader_check:
            self._clear_dead_readers()
        return txn, tid

    def _log_frees(self, txn: lmdb.Transaction, tid: int, extents: Sequence[tuple[int, int]]) -> None:
        """Record in ``txn`` that it frees ``extents``, and forget entries no reader can need.

        Why a log: a process that rebuilds its allocator from the index (another one wrote)
        learns which space is free, not since when. Taken as freed just now, all of it waited for
        every reader to catch up, and with readers always a few commits behind (the other ranks
        of an MLA model, a second server) space was never reused and writes were refused. With
        the log, only what was freed recently waits, for exactly the readers that may see it.
        An entry of transaction ``t`` is dropped once every reader's snapshot is ``t`` or newer
        (then, as for space freed before any entry, no reader can see those pages)."""
        if not extents:
            return
        spans: list[list[int]] = []
        for off, n in sorted((off, aligned(n)) for off, n in extents):
            if spans and spans[-1][0] + spans[-1][1] == off:
                spans[-1][1] += n
            else:
                spans.append([off, n])
        if len(spans) > _MAX_LOGGED_SPANS:
            spans = [[spans[0][0], spans[-1][0] + spans[-1][1] - spans[0][0]]]
        txn.put(_FREED + tid.to_bytes(8, "big"), b"".join(_SPAN.pack(o, n) for o, n in spans),
                db=self._meta)
        oldest = oldest_reader(self._env)
        # A reader starting now still gets snapshot ``tid - 1``, which sees what ``tid`` frees.
        bound = tid - 1 if oldest is None else min(oldest, tid - 1)
        cur = txn.cursor(db=self._meta)
        more = cur.set_range(_FREED)
        while more and bytes(cur.key()).startswith(_FREED) and \
                int.from_bytes(bytes(cur.key())[len(_FREED):], "big") <= bound:
            more = cur.delete()

    def _freed_log(self, txn: lmdb.Transaction) -> list[tuple[int, int, int]]:
        """``(offset, length, freeing transaction)`` of every extent in the free log."""
        out: list[tuple[int, int, int]] = []
        cur = txn.cursor(db=self._meta)
        more = cur.set_range(_FREED)
        while more:
            key = bytes(cur.key())
            if not key.startswith(_FREED):
                break
            tid = int.from_bytes(key[len(_FREED):], "big")
            value = bytes(cur.value())
            whole = len(value) - len(value) % _SPAN.size
            out += [(off, n, tid) for off, n in _SPAN.iter_unpack(value[:whole])]
            more = cur.next()
        return out

    def _committed(self, tid: int, changed: bool) -> None:
        """Transaction ``tid`` committed: the id our next write transaction gets if no other
        process writes in between. A commit without changes keeps its id (LMDB writes nothing).
        Asking LMDB for its last id instead races with the next writer: a foreign commit that
        took the id of our empty one counted as ours, and its extents were unknown."""
        self._next_txn = tid + 1 if changed else tid

    def _clear_dead_readers(self) -> int | None:
        """Free the reader slots of processes that died reading (LMDB tells them by their locks)
        and return the oldest snapshot a reader still holds. A dead reader's slot pins every
        extent freed after its snapshot, so without this a process killed mid-read left the
        others refusing every write for good. Run when an allocation fails for want of
        reusable space, and at most every ``_READER_CHECK_S`` at the start of a write."""
        self._next_reader_check = time.monotonic() + _READER_CHECK_S
        cleared = self._env.reader_check()
        if cleared:
            self._count(dead_readers=cleared)
            logger.info("LMDB tier at %s: freed %d reader slots of processes that died reading",
                        self.path, cleared)
        return oldest_reader(self._env)

    @contextmanager
    def _lmdb_errors(self, what: str) -> Iterator[None]:
        """Every use of the environment runs in here: the one place LMDB and I/O exceptions become
        tier errors, and a count of operations in flight that ``close`` waits for."""
        with self._state:
            if self._closed:
                raise TierClosed(f"lmdb tier at {self.path} is closed")
            self._active += 1
        try:
            self._resident.guard()  # a failing disk under the index: an error here, not SIGBUS there
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

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, d in deltas.items():
                self._counters[name] += d

    def _key_ok(self, key: PageKey) -> bool:
        """LMDB refuses empty keys and keys over its limit (511 bytes by default) with an error."""
        return 0 < len(key) <= self._max_key

    # ------------------------------------------------------------------------------ Tier API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        with self._lmdb_errors("contains"), self._env.begin(db=self._pages, buffers=True) as txn:
            # Existence only: checksums are verified when the bytes are actually read.
            return [self._key_ok(k) and txn.get(k) is not None for k in keys]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        results = [False] * len(keys)
        corrupt: list[tuple[PageKey, bytes]] = []
        misses = mismatched = hits = nread = 0
        # The whole read runs inside the read transaction: its snapshot keeps the extents it
        # reads from being reused by a writer until it ends.
        with self._lmdb_errors("get"), self._env.begin(db=self._pages, buffers=True) as txn:
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
            whole = self._io.read([key for _, key, _, _ in plan],
                                  [(rec[0], pages[i], rec[2]) for i, _, rec, _ in plan])
            for (i, key, (_, length, _), value), ok in zip(plan, whole):
                if not ok:  # short, unreadable or not the bytes its checksum names
                    corrupt.append((key, value))
                    continue
                results[i] = True
                hits += 1
                nread += length
        self._count(get_hits=hits, get_misses=misses + len(corrupt), get_size_mismatch=mismatched,
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
            self._count(corrupt_pages=self._deleting_txn("removing corrupt pages", len(found), body))
        except TierFull as e:  # they stay misses: every read of them fails the same check
            logger.warning("%s", e)

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        results = [False] * len(keys)
        todo = []
        for i, key in enumerate(keys):
            if not self._key_ok(key):
                self._count(put_bad_key=1)
            else:
                todo.append(i)
        with self._writer(), self._lmdb_errors("put"):
            # Retry with a shorter prefix of the batch while the index map is full: the pages
            # before the one that did not fit are committed, the rest are False.
            limit = len(todo)
            if limit and not self._index_room(self._env, self._pages, limit):
                self._count(disk_full=1)
                limit = 0  # every page refused; the index is untouched
            while limit:
                done = self._write_txn(keys, pages, todo[:limit])
                if isinstance(done, int):
                    self._count(map_full_retries=1)
                    self._env.reader_check()
                    limit = done if done < limit else limit // 2
                    continue
                written, existing, replaced = done
                for i in written + existing:
                    results[i] = True
                self._count(put_pages=len(written), put_existing=len(existing),
                            put_replaced=replaced, write_txns=1,
                            bytes_written=sum(page_nbytes(pages[i]) for i in written))
                break
        self._count(put_full=len(todo) - sum(results[i] for i in todo))
        return results

    def _write_txn(self, keys: Sequence[PageKey], pages: Sequence[PageView], todo: list[int]
                   ) -> tuple[list[int], list[int], int] | int:
        """Write ``todo`` in one transaction: ``(written, already present, replaced)`` once
        committed (pages without room are in neither list), or the item at which the index map
        filled (``len(todo)``: at commit) after an abort."""
        written: list[int] = []
        existing: list[int] = []
        allocated: list[tuple[int, int]] = []
        replaced: list[tuple[int, int]] = []
        txn, tid = self._begin_write()
        try:
            oldest = oldest_reader(self._env) if self._alloc.free_extents() else None
            # Allocate every page first, so pages in fresh extents go to disk in one pwritev.
            planned: list[tuple[int, int, int, tuple[int, int, int] | None]] = []
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
                    oldest = self._clear_dead_readers()
                    offset = self._alloc.allocate(nbytes, oldest)
                if offset is None:
                    continue
                if not self._file.reserve(offset + aligned(nbytes), self._alloc.capacity):
                    self._alloc.release(offset, nbytes)  # the file system is full
                    continue
                seen.add(keys[i])
                allocated.append((offset, nbytes))
                planned.append((pos, i, offset, old_rec))
            stored, digests = self._io.write([keys[i] for _, i, _, _ in planned],
                                             [(offset, pages[i]) for _, i, offset, _ in planned])
            for (pos, i, offset, old_rec), ok, digest in zip(planned, stored, digests):
                nbytes = page_nbytes(pages[i])
                if not ok:
                    self._count(io_errors=1)
                    continue
                try:
                    txn.put(keys[i], pack_record(offset, nbytes, digest))
                except lmdb.MapFullError:
                    raise IndexFull(pos) from None
                if old_rec is not None:
                    replaced.append(old_rec[:2])
                written.append(i)
            if written and self._config.sync:
                self._file.sync()  # the bytes are on disk before the index names them
            try:
                self._log_frees(txn, tid, replaced)
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
        self._committed(tid, bool(written))
        for (_, i, off, _), ok in reversed(list(zip(planned, stored))):
            if not ok:  # allocated, but its write failed: nothing names it
                self._alloc.release(off, page_nbytes(pages[i]))
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
            if not self._index_room(self._env, self._pages, records, deleting=True):
                self._count(disk_full=1)
                raise TierFull(f"lmdb tier at {self.path}: {what} needs disk for the index and the "
                               "file system is full", hint="free some space on that disk")
            for attempt in range(2):
                txn, tid = self._begin_write()
                try:
                    gone = body(txn)
                    self._log_frees(txn, tid, [e for e in gone if e is not None])
                    if gone:
                        txn.commit()
                    else:
                        txn.abort()  # nothing changed (a drop of an empty tree would commit)
                    break
                except lmdb.MapFullError:
                    txn.abort()
                    if attempt == 0 and self._env.reader_check():
                        continue
                    raise TierFull(f"lmdb tier at {self.path}: {what} needs free index pages and "
                                   "the index map is full", hint="a long-running reader may pin "
                                   "freed pages; raise the capacity of the lmdb tier") from None
                except BaseException:
                    txn.abort()
                    raise
            self._committed(tid, bool(gone))
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
        self._count(removed=removed)
        return removed

    def usage(self) -> TierUsage:
        with self._lmdb_errors("usage"), self._env.begin(db=self._pages) as txn:
            pages = txn.stat(self._pages)["entries"]
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
        disk = fs.f_bavail * fs.f_frsize - 2 * _INDEX_SLACK
        return max(0, self._file.allocated - self._alloc.used) + max(0, disk)

    def footprint(self, nbytes: int) -> int:
        return aligned(nbytes)

    def page_size_of(self, key: PageKey) -> int | None:
        if not self._key_ok(key):
            return None
        with self._lmdb_errors("page_size_of"), self._env.begin(db=self._pages, buffers=True) as txn:
            value = txn.get(key)
            rec = parse_record(value) if value is not None else None
            return None if rec is None else rec[1]

    def scan(self) -> Iterator[tuple[PageKey, int]]:
        """Every stored page, in key order, read in short transactions (no page bytes touched)."""
        last: bytes | None = None
        while True:
            chunk: list[tuple[PageKey, int]] = []
            with self._lmdb_errors("scan"), self._env.begin(db=self._pages, buffers=True) as txn:
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

    def stats(self) -> dict[str, float]:
        with self._stats_lock:
            out: dict[str, float] = dict(self._counters)
        out["free_extents"] = self._alloc.free_extents()
        out["direct_pages"] = self._io.direct_pages
        out["buffered_throttled"] = self._io.throttled
        out["disk_errors"] = self._io.disk_errors
        out["write_busy_s"] = self._write_busy_s
        out["index_locked_bytes"] = self._resident.locked_bytes
        return out

    def clear(self) -> None:
        def body(txn: lmdb.Transaction) -> list[tuple[int, int] | None]:
            gone = [r[:2] if r is not None else None
                    for r in map(parse_record, (v for _, v in txn.cursor()))]
            txn.drop(self._pages, delete=False)
            return gone

        self._deleting_txn("clear", 0, body)  # a drop frees pages; the freelist is counted

    def close(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._state.wait_for(lambda: self._active == 0)
        self._close_index()
        self._io.close()
        self._file.close()
