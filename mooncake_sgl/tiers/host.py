"""The host DRAM tier: one preallocated buffer carved into fixed-size slots.

Design. The whole capacity is one ``torch.uint8`` tensor, allocated once (page-locked with
``pin_memory`` when CUDA is present, so H2D/D2H copies into it run at DMA speed). It is cut into
``capacity // slot_size`` slots of one size; ``slot_size: auto`` takes the size of the first page
written, which for SGLang is the size of every page. Fixed slots make allocation O(1) and rule out
fragmentation (the pinned-pool fragmentation LMCache #1285 reports):

- free slots are a stack in one numpy int array (pop to allocate, push to free);
- the index is a dict ``key -> (slot, nbytes)``, the only per-page Python object;
- per-slot reader counts (a numpy array) keep a slot that is being copied out from being reused:
  ``remove`` of a page under a reader unlinks the key at once and frees the slot when the last
  reader finishes.

Writes are two-phase: a slot is reserved under the lock, filled outside it, and the key becomes
visible (committed) under the lock only once the bytes are in place, so ``contains`` never
answers for a half-written page. Copies run outside the lock (numpy releases the GIL for them), so
readers and writers on different slots proceed in parallel; a batch's pages are copied in as few
numpy calls as their addresses allow (``buffers.copy_batch``: every call is a GIL hand-off, which
costs up to 5 ms while SGLang's scheduler thread runs Python).

A page larger than ``slot_size`` is refused (per-key ``False``); a smaller one uses a whole slot,
and ``usage`` counts slots, not bytes, because slots are what runs out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api import (
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
from ..buffers import copy_batch
from ..config import HostTierConfig
from ..errors import TierClosed, TierError
from ..memory import memory_headroom
from ..tally import Tally

logger = logging.getLogger(__name__)
_NO_SLOT = -1


@dataclass(frozen=True)
class HostTierStats:
    """The host (and HBM) tier's own counts (``stats()``, beside its slot gauges): pages unless
    named bytes."""

    get_hits: int = 0
    get_misses: int = 0
    get_size_mismatch: int = 0  # asked at another size than stored: a miss
    put_pages: int = 0
    put_existing: int = 0  # already there: acknowledged, not rewritten
    put_full: int = 0  # refused: no free slot
    put_too_large: int = 0  # refused: larger than a slot
    bytes_read: int = 0
    bytes_written: int = 0
    removed: int = 0


@dataclass(frozen=True)
class HostTierReport(TierReport):
    """The host tier's ``stats()``: its counts and its slots now."""

    counts: HostTierStats
    slot_size: int  # bytes of one slot (the largest page it takes)
    slots: int
    slots_free: int
    pages: int


def _allocate_buffer(nbytes: int, pin: bool) -> tuple[object, np.ndarray]:
    """The backing tensor (kept alive by the tier) and a numpy view of it for copies."""
    import torch

    want_pin = pin and torch.cuda.is_available()
    _check_memory(nbytes, want_pin)
    try:
        tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=want_pin)
    except RuntimeError as e:
        raise TierError(f"host tier cannot allocate {nbytes} bytes (pin_memory={want_pin}): {e}. "
                        "Lower 'capacity' of the host tier.") from None
    return tensor, tensor.numpy()


def _check_memory(nbytes: int, pinned: bool) -> None:
    """More than the host or the container's cgroup gives ends in the OOM killer, with no message
    of ours: at once for pinned memory (committed when allocated), else once the tier fills."""
    room = memory_headroom()
    if room is None or nbytes <= room.nbytes:
        return
    what = (f"host tier capacity of {nbytes} bytes exceeds the {room.nbytes} bytes of memory "
            f"available (bounded by {room.bound})")
    if pinned:
        raise TierError(f"{what}; lower 'capacity' of the host tier")
    logger.warning("%s: the process will be OOM-killed once the tier fills; lower its capacity", what)


class HostTier(Tier):
    """Host DRAM pages in one preallocated (pinned when possible) buffer of fixed-size slots."""

    name = "host"
    kind = TierKind.HOST
    capabilities = TierCapabilities()

    def __init__(self, config: HostTierConfig) -> None:
        self._config = config
        self._capacity = int(config.capacity)
        self._lock = threading.Lock()
        self._closed = False
        self._index: dict[PageKey, tuple[int, int]] = {}
        self._counters = Tally(HostTierStats)
        # The buffer is allocated up front, so a capacity the machine cannot give fails at startup;
        # memory is only touched (faulted in) as slots are first written.
        self._tensor, self._buf = self._allocate(self._capacity)
        self._pinned = bool(self._tensor.is_pinned())
        self._slot_size = 0
        self._nslots = 0
        self._free = np.empty(0, dtype=np.int64)
        self._nfree = 0
        self._readers = np.empty(0, dtype=np.int32)
        self._doomed = np.empty(0, dtype=np.bool_)  # removed while being read: free on last reader
        if config.slot_size != "auto":
            self._carve(int(config.slot_size))

    @property
    def pinned(self) -> bool:
        """Whether the buffer is page-locked (only when CUDA is present and configured)."""
        return self._pinned

    @property
    def slot_size(self) -> int:
        """Bytes per slot; 0 until the first page fixes it under ``slot_size: auto``."""
        return self._slot_size

    def _carve(self, slot_size: int) -> None:
        if slot_size <= 0:
            raise TierError(f"{self.name} tier slot_size must be positive, got {slot_size}")
        self._slot_size = slot_size
        self._nslots = self._capacity // slot_size
        # Stack top is the end of the array; lowest slots are handed out first.
        self._free = np.arange(self._nslots - 1, -1, -1, dtype=np.int64)
        self._nfree = self._nslots
        self._readers = np.zeros(self._nslots, dtype=np.int32)
        self._doomed = np.zeros(self._nslots, dtype=np.bool_)

    def _check_open(self) -> None:
        if self._closed:
            raise TierClosed(f"{self.name} tier is closed")

    def _release(self, slot: int) -> None:
        """Return a slot to the free stack (lock held)."""
        self._free[self._nfree] = slot
        self._nfree += 1

    # Storage hooks: a subclass keeping its slots elsewhere (the HBM tier, on a device) overrides
    # these three and reuses all slot bookkeeping above.

    def _allocate(self, nbytes: int) -> tuple[object, Any]:
        """The backing tensor (kept alive by the tier) and the buffer the copy hooks address."""
        return _allocate_buffer(nbytes, self._config.pin_memory)

    def _read_slots(self, buf: Any, reads: list[tuple[int, PageView]]) -> None:
        """Copy each (slot, page) from the buffer into the page's segments (no lock held)."""
        copy_batch([(np.frombuffer(seg, dtype=np.uint8), buf[off:off + seg.nbytes])
                    for off, seg in self._segments(reads)])

    def _write_slots(self, buf: Any, writes: list[tuple[int, PageView]]) -> None:
        """Copy each (slot, page) from the page's segments into the buffer (no lock held)."""
        copy_batch([(buf[off:off + seg.nbytes], np.frombuffer(seg, dtype=np.uint8))
                    for off, seg in self._segments(writes)])

    def _segments(self, batch: list[tuple[int, PageView]]) -> list[tuple[int, memoryview]]:
        """(buffer offset, segment) of every segment of the batch: first segments of all pages,
        then second ones, and so on, so that pages in consecutive slots and host-pool pages form
        runs ``copy_batch`` copies at once."""
        out: list[tuple[int, int, memoryview]] = []
        for slot, page in batch:
            off = slot * self._slot_size
            for k, seg in enumerate(page):
                out.append((k, off, seg))
                off += seg.nbytes
        out.sort(key=lambda e: e[0])  # stable: page order within each segment position
        return [(off, seg) for _, off, seg in out]

    # ------------------------------------------------------------------------------ Tier API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        with self._lock:
            self._check_open()
            index = self._index
            return [k in index for k in keys]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        sizes = [page_nbytes(p) for p in pages]
        slots = [_NO_SLOT] * len(keys)
        misses = mismatched = 0
        with self._lock:
            self._check_open()
            buf = self._buf
            for i, key in enumerate(keys):
                entry = self._index.get(key)
                if entry is None:
                    misses += 1
                elif entry[1] != sizes[i]:
                    mismatched += 1
                else:
                    slots[i] = entry[0]
                    self._readers[entry[0]] += 1
        self._counters.add(get_misses=misses, get_size_mismatch=mismatched)
        try:
            self._read_slots(buf, [(slot, page) for slot, page in zip(slots, pages) if slot != _NO_SLOT])
        finally:
            hits = nread = 0
            with self._lock:
                for slot, n in zip(slots, sizes):
                    if slot == _NO_SLOT:
                        continue
                    hits += 1
                    nread += n
                    self._readers[slot] -= 1
                    if self._readers[slot] == 0 and self._doomed[slot]:
                        self._doomed[slot] = False
                        self._release(slot)
            self._counters.add(get_hits=hits, bytes_read=nread)
        return [s != _NO_SLOT for s in slots]

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *,
                 soft_pin: Sequence[bool] | None = None) -> PutResult:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        sizes = [page_nbytes(p) for p in pages]
        results = [False] * len(keys)
        reserved: list[tuple[int, int]] = []  # (position in batch, slot)
        existing = too_large = full = 0
        with self._lock:
            self._check_open()
            if not self._slot_size and sizes:
                self._carve(max(sizes[0], 1))
            pending: set[PageKey] = set()
            for i, key in enumerate(keys):
                if key in self._index or key in pending:
                    existing += 1
                    results[i] = True
                elif sizes[i] > self._slot_size:
                    too_large += 1
                elif self._nfree == 0:
                    full += 1
                else:
                    self._nfree -= 1
                    reserved.append((i, int(self._free[self._nfree])))
                    pending.add(key)
            buf = self._buf
        self._counters.add(put_existing=existing, put_too_large=too_large, put_full=full)
        committed = False
        try:
            self._write_slots(buf, [(slot, pages[i]) for i, slot in reserved])
            committed = True
        finally:
            written = nwritten = 0
            with self._lock:
                for i, slot in reserved:
                    key = keys[i]
                    # A concurrent writer of the same key may have committed first: keep theirs.
                    if not committed or self._closed or key in self._index:
                        self._release(slot)
                        results[i] = committed and not self._closed
                        continue
                    self._index[key] = (slot, sizes[i])
                    written += 1
                    nwritten += sizes[i]
                    results[i] = True
            self._counters.add(put_pages=written, bytes_written=nwritten)
        # Pages already here are not reported present: the store goes by its own record of this tier.
        return PutResult.written(results)

    def remove(self, keys: Sequence[PageKey]) -> int:
        removed = 0
        with self._lock:
            self._check_open()
            for key in keys:
                entry = self._index.pop(key, None)
                if entry is None:
                    continue
                removed += 1
                slot = entry[0]
                if self._readers[slot]:
                    self._doomed[slot] = True
                else:
                    self._release(slot)
        self._counters.add(removed=removed)
        return removed

    def usage(self) -> TierUsage:
        with self._lock:
            self._check_open()
            if not self._slot_size:
                return TierUsage(capacity_bytes=self._capacity, used_bytes=0, pages=0)
            in_use = self._nslots - self._nfree
            return TierUsage(capacity_bytes=self._nslots * self._slot_size,
                             used_bytes=in_use * self._slot_size, pages=len(self._index))

    def footprint(self, nbytes: int) -> int:
        # A page takes a whole slot; until the first page fixes the slot size, it will be that size.
        slot = self._slot_size
        return slot if slot and nbytes <= slot else nbytes

    def page_size_of(self, key: PageKey) -> int | None:
        with self._lock:
            self._check_open()
            entry = self._index.get(key)
        return None if entry is None else entry[1]

    def scan(self) -> Iterator[tuple[PageKey, int]]:
        """A snapshot of the stored pages (DRAM does not survive a restart; this serves ``clear``)."""
        with self._lock:
            self._check_open()
            snapshot = [(k, n) for k, (_, n) in self._index.items()]
        return iter(snapshot)

    def stats(self) -> HostTierReport:
        counts = self._counters.snapshot()
        with self._lock:
            return HostTierReport(counts, self._slot_size, self._nslots, self._nfree, len(self._index))

    def clear(self) -> None:
        with self._lock:
            self._check_open()
            keys = list(self._index)
        self.remove(keys)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._index.clear()
            # Readers still copying hold their own reference to the numpy view, so the memory
            # stays valid until they finish even though the tier drops its references here.
            self._tensor = None
            self._buf = np.empty(0, dtype=np.uint8)
