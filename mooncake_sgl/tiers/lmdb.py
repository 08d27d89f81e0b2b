"""The LMDB tier: checksummed KV pages on local disk that survive crashes and restarts.

Design. One LMDB environment (a directory holding ``data.mdb`` and ``lock.mdb``), the main
database mapping ``PageKey -> header || page bytes``. Pages are large (64 KiB to several MiB), so
each value lives in LMDB overflow pages and the B-tree stays small. The header is 24 bytes:

    magic "MSGP" | version u8 | flags u8 | reserved u16 | payload length u64 | xxh3_64(payload) u64

Why each choice:

- *Warm restart.* LMDB commits are atomic and the index is the B-tree itself, so whatever a
  committed transaction wrote is found again by a new process (``scan`` yields it for the store to
  seed its policy) -- the failure LMCache #1175 and SGLang #26886 report for file-per-page tiers
  whose index lives only in memory. A process killed mid-transaction leaves nothing of that
  transaction behind; its stale reader slot is cleared with ``reader_check`` at open.
- *Integrity.* LMDB checks the structure of its B-tree but not value bytes. The checksum is
  verified on every read, over the bytes as they landed in the destination; a mismatch is a miss,
  counted, and the page is deleted, so corrupt KV is never handed to the model (Mooncake #2236,
  SGLang #27504 show what silently wrong KV does).
- *Batched writes.* One write transaction per ``put_from`` batch: one commit (one fsync with
  ``sync``) for up to 128 pages instead of one per page.
- *Capacity.* ``capacity`` is a budget on the pages the data occupies, checked inside each write
  transaction; a page over budget is a per-key ``False``, which the store answers by evicting. The
  map itself is larger by a headroom, because LMDB needs spare pages that a budget at 100 % of the
  map would not leave: for copy-on-write of the B-tree, for its free list, and for pages freed by
  the last transaction, which LMDB reuses only one transaction later (so after a removal the tier
  commits one tiny transaction to make the freed pages reusable by the very next write). Should the
  map still fill, ``MapFullError`` never escapes: the batch is retried with the pages that fit.
- *Reads* use ``buffers=True`` (zero-copy views into the map) and copy into the caller's segments
  before the read transaction ends, because those views die with it.
- ``writemap`` is on by default: LMDB writes values straight into the map instead of copying
  every page into freshly malloc'd buffers and ``pwrite``-ing them at commit, 2-4x faster puts
  (``scripts/bench_tiers.py``). A stray write through the map could reach the file, but the
  checksum turns that into a miss. ``sync`` is off by default (SGLang's own file backend never
  fsyncs): a killed process loses nothing; a machine crash may lose recent pages or damage the
  B-tree, which is found at open (every key is walked) and answered by moving the directory aside
  and starting empty. ``lock=True`` lets several processes share one environment.

Thread context: reads run in parallel (LMDB readers never block); writes take one in-process lock
so a write transaction stays on one thread, and LMDB's own lock serialises writers across processes.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import lmdb
import numpy as np
import xxhash

from ..api import PageKey, PageView, Tier, TierCapabilities, TierKind, TierUsage, page_nbytes
from ..config import LmdbTierConfig, default_cache_dir
from ..errors import TierClosed, TierError, TierFull

logger = logging.getLogger(__name__)

# What LMDB raises when its own structures (meta, branch, leaf pages) are damaged.
_STRUCTURAL_DAMAGE = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
                      lmdb.BadRslotError, lmdb.PanicError)

_HEADER = struct.Struct("<4sBBHQQ")
HEADER_BYTES = _HEADER.size
MAGIC = b"MSGP"
VERSION = 1
# Keys per read transaction while scanning: short transactions let writers reuse freed pages.
_SCAN_CHUNK = 4096  # arbitrary
# Map size beyond the capacity budget (see the module docstring); arbitrary but generous.
_HEADROOM_FRACTION = 8
_MIN_HEADROOM = 16 << 20
# LMDB's header in front of every overflow run (struct MDB_page).
_LMDB_PAGE_HEADER = 16
# Written and deleted in one transaction, never visible: only advances LMDB's transaction id.
_BUMP_KEY = b"\x00mooncake_sgl.advance-txn"


def default_lmdb_path() -> str:
    return str(default_cache_dir() / "lmdb")


def _checksum(page: Sequence[memoryview]) -> int:
    if len(page) == 1:
        return xxhash.xxh3_64_intdigest(page[0])
    h = xxhash.xxh3_64()
    for seg in page:
        h.update(seg)
    return h.intdigest()


class LmdbTier(Tier):
    """Persistent, checksummed pages in one LMDB environment on local disk."""

    name = "lmdb"
    kind = TierKind.SSD
    capabilities = TierCapabilities(persistent=True)

    def __init__(self, config: LmdbTierConfig) -> None:
        self._config = config
        self.path = config.path or default_lmdb_path()
        self._capacity = int(config.capacity)
        try:
            self._env = self._open()
            self._check_structure()
        except _STRUCTURAL_DAMAGE as e:
            # The B-tree itself is damaged (a machine crash with ``sync: false``, a bad disk):
            # page checksums cannot help there. It is a cache, so keep the damaged files for a
            # post-mortem, start empty and say so, rather than refuse to serve.
            damaged = getattr(self, "_env", None)
            if damaged is not None:
                damaged.close()
            aside = f"{self.path}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            logger.error("LMDB tier at %s is damaged (%s); moved it to %s and starting empty",
                         self.path, e, aside)
            os.rename(self.path, aside)
            self._env = self._open()
        self._db = self._env.open_db()
        self._max_key = self._env.max_key_size()
        self._psize = self._env.stat()["psize"]
        self._write_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._state = threading.Condition()
        self._active = 0
        self._closed = False
        # Reused for every encoded value (under the write lock): no allocation per page.
        self._scratch = bytearray()
        self._counters = dict.fromkeys(
            ("get_hits", "get_misses", "get_size_mismatch", "corrupt_pages", "put_pages",
             "put_existing", "put_full", "put_bad_key", "bytes_read", "bytes_written", "removed",
             "write_txns", "map_full_retries"), 0)

    # --------------------------------------------------------------------------- plumbing

    def _open(self) -> lmdb.Environment:
        config = self._config
        try:
            os.makedirs(self.path, exist_ok=True)
            headroom = max(self._capacity // _HEADROOM_FRACTION, _MIN_HEADROOM)
            env = lmdb.open(
                self.path, map_size=self._capacity + headroom, subdir=True, lock=True,
                writemap=config.writemap, sync=config.sync, metasync=config.sync,
                max_readers=config.max_readers, max_dbs=0,
                # Values are written whole, so LMDB need not zero its dirty buffers first.
                meminit=False)
            # A process killed while reading leaves its reader slot behind, pinning old pages.
            env.reader_check()
            return env
        except _STRUCTURAL_DAMAGE:
            raise
        except (OSError, lmdb.Error) as e:
            raise TierError(f"cannot open LMDB tier at {self.path}: {e}. Check that the directory "
                            "is writable and on a local filesystem.") from None

    def _check_structure(self) -> None:
        """Walk every key (not the values): damaged branch or leaf pages raise here, at start,
        instead of in the middle of SGLang's traffic."""
        with self._env.begin() as txn:
            for _ in txn.cursor().iternext(keys=True, values=False):
                pass

    @contextmanager
    def _lmdb_errors(self, what: str) -> Iterator[None]:
        """Every use of the environment runs in here: the one place LMDB exceptions become tier
        errors, and a count of operations in flight that ``close`` waits for (closing unmaps the
        file, which would crash a thread still copying out of it)."""
        with self._state:
            if self._closed:
                raise TierClosed(f"lmdb tier at {self.path} is closed")
            self._active += 1
        try:
            yield
        except lmdb.Error as e:
            raise TierError(f"lmdb tier at {self.path}: {what} failed: {e}. If the file is "
                            "damaged, delete the directory; its pages will be recomputed.") from e
        finally:
            with self._state:
                self._active -= 1
                if not self._active:
                    self._state.notify_all()

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, d in deltas.items():
                self._counters[name] += d

    def _encode(self, page: PageView, nbytes: int) -> memoryview:
        """``header || page`` in the scratch buffer (valid until the next call)."""
        total = HEADER_BYTES + nbytes
        if len(self._scratch) < total:
            self._scratch = bytearray(total)
        value = memoryview(self._scratch)[:total]
        dst = np.frombuffer(value, dtype=np.uint8)
        off = HEADER_BYTES
        for seg in page:
            n = seg.nbytes
            np.copyto(dst[off:off + n], np.frombuffer(seg, dtype=np.uint8))
            off += n
        _HEADER.pack_into(value, 0, MAGIC, VERSION, 0, 0, nbytes,
                          xxhash.xxh3_64_intdigest(value[HEADER_BYTES:]))
        return value

    def _key_ok(self, key: PageKey) -> bool:
        """LMDB refuses empty keys and keys over its limit (511 bytes by default) with an error."""
        return 0 < len(key) <= self._max_key

    @staticmethod
    def _header_ok(value: memoryview) -> int | None:
        """Payload length the header declares, or ``None`` if the header is not ours/intact."""
        if len(value) < HEADER_BYTES:
            return None
        magic, version, _, _, length, _ = _HEADER.unpack_from(value)
        if magic != MAGIC or version != VERSION or length != len(value) - HEADER_BYTES:
            return None
        return length

    @classmethod
    def _intact(cls, value: memoryview) -> bool:
        if cls._header_ok(value) is None:
            return False
        return _HEADER.unpack_from(value)[5] == xxhash.xxh3_64_intdigest(value[HEADER_BYTES:])

    # ------------------------------------------------------------------------------ Tier API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        with self._lmdb_errors("contains"), self._env.begin(buffers=True) as txn:
            # Existence only: checksums are verified when the bytes are actually read.
            return [self._key_ok(k) and txn.get(k) is not None for k in keys]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        results = [False] * len(keys)
        corrupt: list[PageKey] = []
        misses = mismatched = hits = nread = 0
        with self._lmdb_errors("get"), self._env.begin(buffers=True) as txn:
            for i, (key, page) in enumerate(zip(keys, pages)):
                value = txn.get(key) if self._key_ok(key) else None
                if value is None:
                    misses += 1
                    continue
                length = self._header_ok(value)
                if length is None:
                    corrupt.append(key)
                    continue
                if length != page_nbytes(page):
                    mismatched += 1
                    continue
                # Copy out while the view is valid, then check what the caller will actually see.
                src = np.frombuffer(value, dtype=np.uint8)
                off = HEADER_BYTES
                for seg in page:
                    n = seg.nbytes
                    np.copyto(np.frombuffer(seg, dtype=np.uint8), src[off:off + n])
                    off += n
                if _checksum(page) != _HEADER.unpack_from(value)[5]:
                    corrupt.append(key)
                    continue
                results[i] = True
                hits += 1
                nread += length
        self._count(get_hits=hits, get_misses=misses + len(corrupt), get_size_mismatch=mismatched,
                    bytes_read=nread)
        if corrupt:
            self._drop_corrupt(corrupt)
        return results

    def _drop_corrupt(self, keys: list[PageKey]) -> None:
        """Delete pages that failed their check, unless another writer replaced them since."""
        def body(txn: lmdb.Transaction) -> int:
            removed = 0
            for key in keys:
                value = txn.get(key)
                if value is not None and not self._intact(value):
                    txn.delete(key)
                    removed += 1
            return removed

        self._count(corrupt_pages=self._freeing_txn("removing corrupt pages", body))

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
        with self._write_lock, self._lmdb_errors("put"):
            # Retry with a shorter prefix of the batch while the map is full: the pages before the
            # one that did not fit are committed, the rest are False and the store evicts.
            limit = len(todo)
            while limit:
                written, existing, failed_at = self._write_txn(keys, pages, todo[:limit])
                if failed_at is None:
                    for i in written + existing:
                        results[i] = True
                    self._count(put_pages=len(written), put_existing=len(existing), write_txns=1,
                                bytes_written=sum(page_nbytes(pages[i]) for i in written))
                    break
                self._count(map_full_retries=1)
                # A dead process's reader slot may be what pins the pages; clear it and go on.
                self._env.reader_check()
                limit = failed_at if failed_at < limit else limit // 2
        self._count(put_full=len(todo) - sum(results[i] for i in todo))
        return results

    def _write_txn(self, keys: Sequence[PageKey], pages: Sequence[PageView], todo: list[int]
                   ) -> tuple[list[int], list[int], int | None]:
        """Write ``todo`` in one transaction: (written, already present, None) once committed (pages
        over the capacity budget are in neither list), or ``([], [], n)`` after an abort because the
        map filled at item ``n`` (``len(todo)``: at commit)."""
        written: list[int] = []
        existing: list[int] = []
        over_budget = 0
        txn = self._env.begin(write=True, buffers=True)
        try:
            st = txn.stat(self._db)
            budget = self._capacity // self._psize - (
                st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"])
            for i in todo:
                if txn.get(keys[i]) is not None:
                    existing.append(i)
                    continue
                nbytes = page_nbytes(pages[i])
                need = self._pages_for(nbytes)
                if need > budget:
                    over_budget += 1
                    continue
                txn.put(keys[i], self._encode(pages[i], nbytes))
                budget -= need
                written.append(i)
            txn.commit()
        except lmdb.MapFullError:
            txn.abort()
            # Items handled before the one that failed; all of them when the commit failed.
            return [], [], len(written) + len(existing) + over_budget
        except BaseException:
            txn.abort()
            raise
        return written, existing, None

    def _freeing_txn(self, what: str, body: Callable[[lmdb.Transaction], int]) -> int:
        """Run ``body`` (which deletes and returns how many) in one write transaction.

        Deleting needs a few free pages itself (copy-on-write of the B-tree, the free-list record).
        Should the map be full because a dead process's reader slot pins old pages, the slot is
        cleared and the transaction retried once; otherwise the tier is full for good.

        Raises:
            TierFull: the map has no page left even for a deletion.
        """
        with self._write_lock, self._lmdb_errors(what):
            for attempt in range(2):
                txn = self._env.begin(write=True, buffers=True)
                try:
                    n = body(txn)
                    txn.commit()
                    break
                except lmdb.MapFullError:
                    txn.abort()
                    if attempt == 0 and self._env.reader_check():
                        continue
                    raise TierFull(f"lmdb tier at {self.path}: {what} needs free pages and the map is "
                                   "full", hint="a long-running reader may pin freed pages; raise the "
                                   "capacity of the lmdb tier") from None
                except BaseException:
                    txn.abort()
                    raise
            if n:
                # LMDB reuses pages freed by a transaction only after one more has committed; commit
                # a tiny one now so the very next put can use them.
                try:
                    with self._env.begin(write=True) as bump:
                        bump.put(_BUMP_KEY, b"")
                        bump.delete(_BUMP_KEY)
                except lmdb.MapFullError:
                    self._count(map_full_retries=1)  # the deletion stands; reuse comes a txn later
        return n

    def remove(self, keys: Sequence[PageKey]) -> int:
        def body(txn: lmdb.Transaction) -> int:
            return sum(1 for key in keys if self._key_ok(key) and txn.delete(key))

        removed = self._freeing_txn("remove", body)
        self._count(removed=removed)
        return removed

    def usage(self) -> TierUsage:
        with self._lmdb_errors("usage"):
            st = self._env.stat()
        used = (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
        # The budget, not the map: the map is larger by the headroom LMDB itself needs.
        return TierUsage(capacity_bytes=self._capacity, used_bytes=used, pages=st["entries"])

    def footprint(self, nbytes: int) -> int:
        return self._pages_for(nbytes) * self._psize

    def _pages_for(self, nbytes: int) -> int:
        """LMDB pages a stored page occupies: one overflow run holding header and bytes."""
        return -(-(_LMDB_PAGE_HEADER + HEADER_BYTES + nbytes) // self._psize)

    def page_size_of(self, key: PageKey) -> int | None:
        if not self._key_ok(key):
            return None
        with self._lmdb_errors("page_size_of"), self._env.begin(buffers=True) as txn:
            value = txn.get(key)
            return None if value is None or len(value) < HEADER_BYTES else len(value) - HEADER_BYTES

    def scan(self) -> Iterator[tuple[PageKey, int]]:
        """Every stored page, in key order, read in short transactions (no value bytes touched)."""
        last: bytes | None = None
        while True:
            chunk: list[tuple[PageKey, int]] = []
            with self._lmdb_errors("scan"), self._env.begin(buffers=True) as txn:
                cur = txn.cursor()
                more = cur.set_range(last) if last is not None else cur.first()
                if more and last is not None and bytes(cur.key()) == last:
                    more = cur.next()
                while more and len(chunk) < _SCAN_CHUNK:
                    n = len(cur.value()) - HEADER_BYTES
                    if n >= 0:
                        chunk.append((bytes(cur.key()), n))
                    last = bytes(cur.key())
                    more = cur.next()
            yield from chunk
            if not more:
                return

    def stats(self) -> dict[str, float]:
        with self._stats_lock:
            return dict(self._counters)

    def clear(self) -> None:
        def body(txn: lmdb.Transaction) -> int:
            had = txn.stat(self._db)["entries"]
            txn.drop(self._db, delete=False)
            return had

        self._freeing_txn("clear", body)

    def close(self) -> None:
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._state.wait_for(lambda: self._active == 0)
        self._env.close()
