"""Slab allocator for the pool segment: fixed-size slabs, each carved into equal slots.

KV pages of one deployment all have the same size, so a slab class per (4 KiB-rounded) page size
wastes at most the tail of each slab and allocation is a list pop. A slab whose last slot is freed
goes back to the free-slab list and can serve another class, which is how the pool rebalances when
page sizes change (memcached's slab reassignment, without moving live objects). Not thread-safe:
the pool's index lock guards it.
"""

from __future__ import annotations

import heapq

ALIGN = 4096  # slots start on page boundaries so copies in and out stay aligned


def slot_size_for(nbytes: int) -> int:
    return max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)


class SlabAllocator:
    """Offsets into a segment of ``nslabs * slab_size`` bytes."""

    def __init__(self, capacity: int, slab_size: int):
        if slab_size < ALIGN or slab_size % ALIGN:
            raise ValueError(f"slab size must be a positive multiple of {ALIGN}, got {slab_size}")
        self.slab_size = slab_size
        self.nslabs = capacity // slab_size
        if self.nslabs < 1:
            raise ValueError(f"capacity {capacity} is smaller than one slab of {slab_size} bytes")
        self._free_slabs = list(range(self.nslabs - 1, -1, -1))
        self._slab_class = [0] * self.nslabs
        self._slab_free: list[list[int]] = [[] for _ in range(self.nslabs)]
        self._slab_used = [0] * self.nslabs
        # class (slot size) -> slabs of that class with at least one free slot, as a set and as a
        # min-heap with lazy deletion: allocation fills the lowest such slab, so high slabs empty
        # out and can go to another class.
        self._partial: dict[int, set[int]] = {}
        self._heap: dict[int, list[int]] = {}
        self.used_bytes = 0  # bytes in allocated slots

    @property
    def capacity(self) -> int:
        return self.nslabs * self.slab_size

    @property
    def free_slabs(self) -> int:
        return len(self._free_slabs)

    def fits(self, slot: int) -> bool:
        return slot <= self.slab_size

    def alloc(self, slot: int) -> int | None:
        """Offset of a free slot of size ``slot``, or ``None`` without evicting anything."""
        partial = self._partial.setdefault(slot, set())
        heap = self._heap.setdefault(slot, [])
        while heap and heap[0] not in partial:
            heapq.heappop(heap)  # stale: the slab filled up or went back to the free list
        if heap:
            s = heap[0]
        elif self._free_slabs:
            s = self._free_slabs.pop()
            self._slab_class[s] = slot
            self._slab_free[s] = list(range(self.slab_size // slot - 1, -1, -1))
            self._add_partial(slot, s)
        else:
            return None
        free = self._slab_free[s]
        idx = free.pop()
        if not free:
            partial.discard(s)
        self._slab_used[s] += 1
        self.used_bytes += slot
        return s * self.slab_size + idx * slot

    def free(self, offset: int, slot: int) -> None:
        s, rem = divmod(offset, self.slab_size)
        if self._slab_class[s] != slot or rem % slot:
            raise ValueError(f"offset {offset} is not a slot of size {slot}")
        self._slab_used[s] -= 1
        self.used_bytes -= slot
        if self._slab_used[s] == 0:
            self._partial[slot].discard(s)
            self._slab_free[s] = []
            self._slab_class[s] = 0
            self._free_slabs.append(s)
        else:
            self._slab_free[s].append(rem // slot)
            self._add_partial(slot, s)

    def _add_partial(self, slot: int, s: int) -> None:
        partial = self._partial[slot]
        if s not in partial:
            partial.add(s)
            heapq.heappush(self._heap[slot], s)

    def can_alloc(self, slot: int) -> bool:
        return bool(self._partial.get(slot)) or bool(self._free_slabs)

    def slab_of(self, offset: int) -> int:
        return offset // self.slab_size

    def used_slots(self, slab: int) -> int:
        """Slots of ``slab`` handed out and not yet freed (readable, being written, or held by a
        reader after removal)."""
        return self._slab_used[slab]
