"""The SSD tier's index: one LMDB environment that names every page's extent, and what keeps it
honest across processes and disk failures.

Owns the environment (``data.mdb`` with its ``meta`` and ``pages`` databases, ``lock.mdb`` and its
reader table), its disk ahead of every write (``room``), the open-time sweep that rebuilds the
extent allocator from the records, write transactions that first catch up with another process's
commits (``begin_write``), the free log that says which extents which transaction freed, and the
maps kept resident (``resident``). It never touches page bytes: the tier (``tier``) moves those
through ``page_io`` into extents of ``extents.ExtentFile``; the allocator is the tier's, rebuilt
here whenever the index says it is stale. The package docstring says why each choice was made.

Thread context: ``begin_write``, ``room``, ``log_frees`` and ``committed`` run under the tier's
write lock; readers use ``env`` directly, in parallel.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence

import lmdb

from ...config import LmdbTierConfig
from ...errors import TierError
from .aside import set_aside
from .extents import ExtentAllocator, aligned, allocate_ahead
from .probe import damage_of, open_failed
from .records import oldest_reader, parse_record
from .resident import ResidentIndex

logger = logging.getLogger(__name__)

FORMAT = b"mooncake_sgl index+extents v2"
_DBS = (b"meta", b"pages")
# Index map: records are ~100-250 bytes per page with B-tree overhead and pages are >= 4 KiB on
# disk, so 1/8 of the capacity is generous; it is address space (a sparse file), not disk.
_INDEX_FRACTION = 8
_MIN_INDEX_MAP = 64 << 20
# Disk the index file must have allocated beyond its last used page before a write transaction:
# LMDB puts new pages there, and on a full file system a write into a hole is SIGBUS through the map
# (``writemap``: the process dies) or ENOSPC at commit (a full disk then blocks deletions too, so
# the store could never make room again). ``room`` bounds what one transaction can add: a
# copy of each page on a record's path and as many again from splits, or for deletions at most a
# copy of every page of the tree (merges add none); the freed pages' list (8 bytes each) and the
# catalogue and meta pages fit in the slack. An upper bound, not a guess that is usually enough.
INDEX_SLACK = 1 << 20
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




class LmdbIndex:
    """The LMDB environment of one SSD tier directory.

    Args:
        path: the tier's directory (it exists and is writable).
        config: the tier's config (map size from its capacity, ``writemap``, ``sync``, readers).
        alloc: the tier's extent allocator, rebuilt from the records at open and after another
            process's commits.
        pages_path: the tier's page file, whose size bounds the records that can be served.
        count: adds to the tier's counters (``foreign_writes``, ``dead_readers``,
            ``dropped_at_open``).

    Raises:
        TierError: the directory cannot hold an index (unwritable, full, foreign and stuck).
    """

    def __init__(self, path: str, config: LmdbTierConfig, alloc: ExtentAllocator, pages_path: str,
                 count: Callable[..., None]) -> None:
        self.path = path
        self._config = config
        self._capacity = int(config.capacity)
        self._alloc = alloc
        self._pages_path = pages_path
        self._count = count
        self._index_fd = -1  # data.mdb, to allocate its disk ahead of LMDB (``room``)
        self._lock_fd = -1  # lock.mdb, held open while the environment is (``_allocate_reader_table``)
        self._index_backed = 0  # bytes of it known to have disk allocated, from its start
        try:  # an index with no pages to name may be one another process is creating right now
            no_pages = os.path.getsize(pages_path) == 0
        except OSError:
            no_pages = True
        damage = damage_of(path, len(_DBS), self.map_size(), config.writemap, empty_ok=no_pages)
        if damage is not None:
            set_aside(path, damage)
        self.env, self.meta, self.pages = self._open()
        try:
            self.resident = ResidentIndex(self.env, self._index_fd, self._lock_fd, path)
            self.resident.guard()
        except OSError as e:
            self.close()
            raise open_failed(path, e) from None
        self.max_key = self.env.max_key_size()
        self._next_txn = 0
        self._next_reader_check = time.monotonic() + _READER_CHECK_S  # the open just checked

    def _open(self) -> tuple[lmdb.Environment, lmdb._Database, lmdb._Database]:
        for attempt in range(2):
            env = self._open_env()
            with env.begin(buffers=True) as txn:
                foreign = any(bytes(k) not in _DBS for k, _ in txn.cursor())
            if not foreign:
                meta = env.open_db(b"meta")
                pages = env.open_db(b"pages")
                if not self._room_in(env, pages, 1):
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
                self.path, map_size=self.map_size(),
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

    def map_size(self) -> int:
        return max(self._capacity // _INDEX_FRACTION, _MIN_INDEX_MAP)

    def room(self, records: int, deleting: bool = False) -> bool:
        """``_room_in`` the open environment's page tree."""
        return self._room_in(self.env, self.pages, records, deleting)

    def _room_in(self, env: lmdb.Environment, tree: lmdb._Database, records: int,
                 deleting: bool = False) -> bool:
        """Whether data.mdb has disk allocated for a write transaction on ``records`` records of
        ``tree`` (allocating it, ahead by a step, if the file system has room); ``False`` on a full
        disk, where LMDB must not write (see ``INDEX_SLACK``). Called under the write lock."""
        psize = env.stat()["psize"]
        used = (env.info()["last_pgno"] + 1) * psize
        with env.begin() as txn:
            shape = txn.stat(tree)
        new_pages = records * 2 * (shape["depth"] + 1)
        if deleting:
            new_pages = min(new_pages, shape["branch_pages"] + shape["leaf_pages"] + shape["depth"] + 1)
        need = min(used + new_pages * psize + used // 256 + INDEX_SLACK, self.map_size())
        if need <= self._index_backed:
            return True
        # From where this process's allocation ended (0 after an open: blocks the file already has
        # cost nothing to allocate again).
        got = allocate_ahead(self._index_fd, self._index_backed, need, self.map_size())
        if got is None:
            return False
        self._index_backed = got
        return True

    def close(self) -> None:
        self._release(self.env)

    def _release(self, env: lmdb.Environment) -> None:
        """Close ``env``, then the descriptors this tier keeps on its files: lock.mdb's only after
        the environment (see ``_allocate_reader_table``)."""
        env.close()
        for name in ("_index_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def sweep_and_rebuild(self) -> None:
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
            txn = self.env.begin(write=True, db=self.pages, buffers=True)
        except lmdb.Error as e:
            raise TierError(f"cannot open LMDB tier at {self.path}: {e}") from None
        dropped = 0
        try:
            tid = txn.id()
            size = os.path.getsize(self._pages_path)
            extents, bad = self._live_extents(txn, size)
            freed = self._freed_log(txn)
            if bad and not self.room(len(bad), deleting=True):
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
        self._count(dropped_at_open=dropped)
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

    def begin_write(self) -> tuple[lmdb.Transaction, int]:
        """A write transaction and its id; first catches up with another process's writes.

        This is how several processes allocate extents of one ``pages.bin`` without handing out
        the same one twice: allocating happens only inside a write transaction, which LMDB's
        writer lock gives one process at a time, and a process whose last known id is not the
        transaction's own rebuilds its allocator from the index inside it first."""
        txn = self.env.begin(write=True, db=self.pages, buffers=True)
        tid = txn.id()
        if tid != self._next_txn:
            # Someone else committed since our last write: their extents are not in our
            # allocator. Space they freed may still be read by readers (of any process) older
            # than the transaction that freed it, which the free log names, so it waits for them.
            try:
                size = os.path.getsize(self._pages_path)
                extents, _ = self._live_extents(txn, size)
                freed = self._freed_log(txn)
            except BaseException:
                txn.abort()
                raise
            self._alloc.rebuild(extents, freed)
            self._next_txn = tid
            self._count(foreign_writes=1)
        if time.monotonic() >= self._next_reader_check:
            self.clear_dead_readers()
        return txn, tid

    def log_frees(self, txn: lmdb.Transaction, tid: int, extents: Sequence[tuple[int, int]]) -> None:
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
                db=self.meta)
        oldest = oldest_reader(self.env)
        # A reader starting now still gets snapshot ``tid - 1``, which sees what ``tid`` frees.
        bound = tid - 1 if oldest is None else min(oldest, tid - 1)
        cur = txn.cursor(db=self.meta)
        more = cur.set_range(_FREED)
        while (more and bytes(cur.key()).startswith(_FREED) and
                int.from_bytes(bytes(cur.key())[len(_FREED):], "big") <= bound):
            more = cur.delete()

    def _freed_log(self, txn: lmdb.Transaction) -> list[tuple[int, int, int]]:
        """``(offset, length, freeing transaction)`` of every extent in the free log."""
        out: list[tuple[int, int, int]] = []
        cur = txn.cursor(db=self.meta)
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

    def committed(self, tid: int, changed: bool) -> None:
        """Transaction ``tid`` committed: the id our next write transaction gets if no other
        process writes in between. A commit without changes keeps its id (LMDB writes nothing).
        Asking LMDB for its last id instead races with the next writer: a foreign commit that
        took the id of our empty one counted as ours, and its extents were unknown."""
        self._next_txn = tid + 1 if changed else tid

    def clear_dead_readers(self) -> int | None:
        """Free the reader slots of processes that died reading (LMDB tells them by their locks)
        and return the oldest snapshot a reader still holds. A dead reader's slot pins every
        extent freed after its snapshot, so without this a process killed mid-read left the
        others refusing every write for good. Run when an allocation fails for want of
        reusable space, and at most every ``_READER_CHECK_S`` at the start of a write."""
        self._next_reader_check = time.monotonic() + _READER_CHECK_S
        cleared = self.env.reader_check()
        if cleared:
            self._count(dead_readers=cleared)
            logger.info("LMDB tier at %s: freed %d reader slots of processes that died reading",
                        self.path, cleared)
        return oldest_reader(self.env)
