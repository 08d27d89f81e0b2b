"""The pool's index: which key lives at which segment offset, in which state, and who reads it.

Design. One lock guards the index, the slab allocator and per-class LRU lists; bytes are always
copied outside it. A page moves through three states:

    reserved (slot allocated, being written, invisible)  --commit-->  readable  --evict/remove-->  gone
                                                          --abort-->   gone

A read takes a lease (a count on the entry) before its bytes leave the segment and drops it after:
a leased entry is never evicted, and a removed leased entry keeps its slot until the last lease
goes, so a read in flight is never overwritten. A readable slot never changes under anyone: a put
of a stored key at the same size is an idempotent no-op, and one at another size writes a new slot
that replaces the old entry when it commits (the old slot is freed once its last reader is done),
so an acknowledged put is readable at the size it was written with.

Concurrent puts of one key (several SGLang instances storing the same prefix, or one batch naming
a key twice) each write their own reserved slot; the first commit makes its copy readable and
every later one frees its slot and reports success, since the key is then readable. No writer ever
waits for another: waiting made a put fail when the other writer was slow, and deadlocked a
shared-memory batch that named a key twice on itself until the wait ran out.

Room. Above the high watermark a background thread evicts least-recently-read pages down to the
low watermark (a page larger than that room is left for a put to evict). A reservation that still
finds no slot evicts inline: first the oldest page of its own size class, else every page of the
coldest whole slab (the one whose most recently read page is oldest). Freeing other classes' pages
oldest first until some slab emptied would scatter over every slab once reads have reordered the
LRU: one page of a new size evicted 97% of a full pool that way. If everything left is leased or
being written, it waits on the lock's condition up to ``put_wait`` and only then reports the page as
not stored; a put never fails silently or half-writes (Mooncake answers -200 at once).

Namespace board records (``keys.is_board_key``) are a diagnostic: they never evict a page and never
wait. One takes a free slot or a free slab, else it is not stored; and a put that needs room takes a
slab holding only board records before it evicts a single page.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..api import PageKey
from ..keys import is_board_key
from ..tally import Tally
from .allocator import SlabAllocator, slot_size_for


class Entry:
    __slots__ = ("key", "offset", "size", "slot", "leases", "dropped", "tick")

    def __init__(self, key: PageKey, offset: int, size: int, slot: int):
        self.key = key
        self.offset = offset
        self.size = size
        self.slot = slot
        self.leases = 0
        self.dropped = False  # removed from the index; slot freed when the last lease goes
        self.tick = 0


PRESENT = "present"  # reserve(): the key is already readable at that size (a no-op success)
NO_ROOM = None  # reserve(): nothing could be freed within put_wait


@dataclass(frozen=True)
class PoolIndexStats:
    """What a tenant's index counts (the pool's /metrics exports each as a counter)."""

    puts: int = 0
    put_present: int = 0
    put_no_room: int = 0
    put_waits: int = 0
    put_dup_writes: int = 0
    put_replaced: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    removes: int = 0
    gets: int = 0
    get_hits: int = 0
    exists_checks: int = 0
    aborts: int = 0
    clears: int = 0


class PoolIndex:
    """Index, allocation, leases and eviction over a segment of ``capacity`` bytes.

    Thread-safe. ``reserve``/``commit``/``abort`` are the two-phase write; ``lease``/``release``
    bracket every read.
    """

    def __init__(self, capacity: int, slab_size: int, *, high_watermark: float = 0.95,
                 low_watermark: float = 0.90, put_wait: float = 2.0):
        self.alloc = SlabAllocator(capacity, slab_size)
        self.high = high_watermark
        self.low = low_watermark
        self.put_wait = put_wait
        self._cond = threading.Condition(threading.Lock())
        self._index: dict[PageKey, Entry] = {}  # readable entries
        self._board: dict[PageKey, Entry] = {}  # the readable namespace board records among them
        self._writing = 0  # reserved entries not yet committed or aborted
        self._lru: dict[int, OrderedDict[PageKey, Entry]] = {}  # slot size -> readable, oldest first
        self._tick = 0
        self._leased = 0  # entries with at least one lease
        self._leased_bytes = 0  # their sizes (the pool's /metrics shows it)
        self.stored_bytes = 0
        self.counters = Tally(PoolIndexStats)

    # ------------------------------------------------------------------------------------ writes

    def reserve(self, keys: Sequence[PageKey], sizes: Sequence[int]) -> list[Entry | str | None]:
        """Per key: a reserved ``Entry`` to write, ``PRESENT`` or ``NO_ROOM``. A key another
        writer is writing right now, or one stored at another size, gets an ``Entry`` of its own
        (see the module docstring)."""
        out: list[Entry | str | None] = []
        deadline: float | None = None
        count = self.counters.add
        with self._cond:
            count(puts=len(keys))
            for key, size in zip(keys, sizes):
                stored = self._index.get(key)
                if stored is not None and stored.size == size:
                    out.append(PRESENT)
                    count(put_present=1)
                    continue
                slot = slot_size_for(size)
                if size <= 0 or not self.alloc.fits(slot):
                    out.append(NO_ROOM)
                    count(put_no_room=1)
                    continue
                board = is_board_key(key)
                offset = self.alloc.alloc(slot)
                while offset is None and not board:
                    offset = self._evict_for(slot)
                    if offset is not None:
                        break
                    if deadline is None:
                        deadline = time.monotonic() + self.put_wait
                        count(put_waits=1)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    # Leases released, writes committed or aborted all notify.
                    self._cond.wait(left)
                    offset = self.alloc.alloc(slot)
                if offset is None:
                    out.append(NO_ROOM)
                    count(put_no_room=1)
                    continue
                e = Entry(key, offset, size, slot)
                self._writing += 1
                self.stored_bytes += size
                out.append(e)
        return out

    def commit(self, entries: Sequence[Entry], written: Sequence[bool]) -> None:
        """Make completely written entries readable; free the others. A written entry whose key
        another writer made readable first at the same size is freed too: the key is stored
        either way. One at another size replaces the stored entry."""
        with self._cond:
            for e, ok in zip(entries, written):
                self._writing -= 1
                stored = self._index.get(e.key) if ok else None
                if stored is not None and stored.size == e.size:
                    self.counters.add(put_dup_writes=1)
                    self._free(e)
                    continue
                if stored is not None:
                    self.counters.add(put_replaced=1)
                    self._drop(stored)
                if ok:
                    self._tick += 1
                    e.tick = self._tick
                    self._index[e.key] = e
                    if is_board_key(e.key):
                        self._board[e.key] = e
                    self._lru.setdefault(e.slot, OrderedDict())[e.key] = e
                else:
                    self.counters.add(aborts=1)
                    self._free(e)
            self._cond.notify_all()

    def abort(self, entries: Sequence[Entry]) -> None:
        self.commit(entries, [False] * len(entries))

    # ------------------------------------------------------------------------------------- reads

    def lease(self, keys: Sequence[PageKey], sizes: Sequence[int] | None = None) -> list[Entry | None]:
        """Pin each readable page whose size matches (``None`` otherwise) and mark it recently used."""
        out: list[Entry | None] = []
        with self._cond:
            self.counters.add(gets=len(keys))
            for i, key in enumerate(keys):
                e = self._index.get(key)
                if e is None or (sizes is not None and sizes[i] != e.size):
                    out.append(None)
                    continue
                e.leases += 1
                if e.leases == 1:
                    self._leased += 1
                    self._leased_bytes += e.size
                self._tick += 1
                e.tick = self._tick
                self._lru[e.slot].move_to_end(key)
                out.append(e)
            self.counters.add(get_hits=sum(e is not None for e in out))
        return out

    def release(self, entries: Sequence[Entry | None]) -> None:
        with self._cond:
            for e in entries:
                if e is None:
                    continue
                e.leases -= 1
                if e.leases == 0:
                    self._leased -= 1
                    self._leased_bytes -= e.size
                    if e.dropped:
                        self._release_slot(e)
            self._cond.notify_all()

    def contains(self, keys: Sequence[PageKey]) -> bytes:
        index = self._index
        # A dict lookup per key under the GIL is atomic; no lock needed for a snapshot answer.
        self.counters.add(exists_checks=len(keys))
        return bytes(k in index for k in keys)

    # ---------------------------------------------------------------------------------- removal

    def remove(self, keys: Sequence[PageKey]) -> int:
        n = 0
        with self._cond:
            for key in keys:
                e = self._index.get(key)
                if e is not None:
                    self._drop(e)
                    n += 1
            self.counters.add(removes=n)
            self._cond.notify_all()
        return n

    def clear(self) -> int:
        with self._cond:
            entries = list(self._index.values())
            for e in entries:
                self._drop(e)
            self.counters.add(clears=1)
            self._cond.notify_all()
        return len(entries)

    def evict_to_watermark(self) -> int:
        """Evict oldest pages while above the high watermark, down to the low one; returns count.

        A page whose slot is larger than the room kept ahead (``1 - low`` of capacity) is left to a
        put that needs its room (``reserve`` evicts inline): in a pool of a few slabs, keeping room
        ahead would evict such a page as soon as it was stored (a one-slab pool held nothing for
        longer than the evictor's next pass)."""
        cap = self.alloc.capacity
        ahead = (1.0 - self.low) * cap
        n = 0
        with self._cond:
            if self.alloc.used_bytes <= self.high * cap:
                return 0
            while self.alloc.used_bytes > self.low * cap:
                victim = self._oldest(None)
                if victim is None or victim.slot > ahead:
                    break
                self._evict(victim)
                n += 1
            if n:
                self._cond.notify_all()
        return n

    def over_high_watermark(self) -> bool:
        return self.alloc.used_bytes > self.high * self.alloc.capacity

    # --------------------------------------------------------------------------------- internals

    def _oldest(self, slot: int | None) -> Entry | None:
        """Least recently used unleased readable entry, of class ``slot`` or of any class."""
        best: Entry | None = None
        classes = [self._lru.get(slot, {})] if slot is not None else self._lru.values()
        for lru in classes:
            for e in lru.values():  # leased entries are rare and short-lived: skip past them
                if e.leases == 0:
                    if best is None or e.tick < best.tick:
                        best = e
                    break
        return best

    def _evict_for(self, slot: int) -> int | None:
        board_only = self._coldest_slab(self._board.values())
        if board_only is not None:
            for e in board_only:
                self._evict(e)
            return self.alloc.alloc(slot)
        victim = self._oldest(slot)
        if victim is not None:
            self._evict(victim)
            return self.alloc.alloc(slot)
        slab = self._coldest_slab(self._index.values())
        if slab is None:
            return None
        for e in slab:
            self._evict(e)
        return self.alloc.alloc(slot)

    def _coldest_slab(self, entries: Iterable[Entry]) -> list[Entry] | None:
        """Among slabs whose every slot holds one of ``entries``, readable and unleased (evicting
        them frees the slab), the entries of the one whose most recently read page is oldest;
        ``None`` when no slab qualifies."""
        by_slab: dict[int, list[Entry]] = {}
        for e in entries:
            by_slab.setdefault(self.alloc.slab_of(e.offset), []).append(e)
        best: list[Entry] | None = None
        best_tick = 0
        for s, held in by_slab.items():
            if len(held) != self.alloc.used_slots(s) or any(e.leases for e in held):
                continue
            newest = max(e.tick for e in held)
            if best is None or newest < best_tick:
                best, best_tick = held, newest
        return best

    def _evict(self, e: Entry) -> None:
        self.counters.add(evictions=1)
        self.counters.add(evicted_bytes=e.size)
        self._drop(e)

    def _drop(self, e: Entry) -> None:
        del self._index[e.key]
        self._board.pop(e.key, None)
        del self._lru[e.slot][e.key]
        e.dropped = True
        if e.leases == 0:
            self._release_slot(e)

    def _release_slot(self, e: Entry) -> None:
        self.stored_bytes -= e.size
        self.alloc.free(e.offset, e.slot)

    def _free(self, e: Entry) -> None:
        e.dropped = True
        self._release_slot(e)

    # ------------------------------------------------------------------------------------- stats

    def snapshot(self) -> dict[str, float]:
        with self._cond:
            out = {k: float(v) for k, v in self.counters.as_dict().items()}
            out.update(capacity_bytes=float(self.alloc.capacity), used_bytes=float(self.alloc.used_bytes),
                       stored_bytes=float(self.stored_bytes), pages=float(len(self._index)),
                       writing=float(self._writing),
                       leased=float(self._leased), leased_bytes=float(self._leased_bytes),
                       free_slabs=float(self.alloc.free_slabs), slabs=float(self.alloc.nslabs),
                       size_classes=float(sum(1 for lru in self._lru.values() if lru)))
        return out
