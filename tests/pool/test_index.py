"""The pool's index and allocator, white-box: slab reuse across size classes, two-phase writes,
leases that block eviction and slot reuse, LRU eviction order and the bounded wait for room."""

from __future__ import annotations

import threading
import time

import pytest

from mooncake_sgl.pool.allocator import SlabAllocator
from mooncake_sgl.pool.index import NO_ROOM, PRESENT, Entry, PoolIndex, PoolIndexStats
from mooncake_sgl.tally import Tally

KIB = 1024


def put(store: PoolIndex, key: bytes, size: int = 64 * KIB) -> Entry | str | None:
    (r,) = store.reserve([key], [size])
    if isinstance(r, Entry):
        store.commit([r], [True])
    return r


def test_allocator_hands_out_distinct_aligned_slots_and_recycles_empty_slabs() -> None:
    a = SlabAllocator(4 * 256 * KIB, 256 * KIB)
    offs = [a.alloc(64 * KIB) for _ in range(16)]
    assert None not in offs and len(set(offs)) == 16 and all(o % 4096 == 0 for o in offs)
    assert a.alloc(64 * KIB) is None and a.alloc(128 * KIB) is None  # every slab taken by 64 KiB
    for o in offs[:4]:  # empty the first slab entirely: it becomes free for another class
        a.free(o, 64 * KIB)
    assert a.free_slabs == 1
    assert a.alloc(128 * KIB) is not None
    with pytest.raises(ValueError):
        a.free(offs[5] + 4096, 64 * KIB)  # not a slot boundary: a bug, loudly


def test_allocator_never_hands_out_overlapping_slots_under_random_churn() -> None:
    import random

    rng = random.Random(7)
    a = SlabAllocator(8 * 256 * KIB, 256 * KIB)
    live: dict[int, int] = {}  # offset -> slot size
    for _ in range(5000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live))
            a.free(off, live.pop(off))
            continue
        slot = rng.choice((64 * KIB, 96 * KIB, 128 * KIB))
        off = a.alloc(slot)
        if off is not None:
            assert all(off + slot <= o or o + n <= off for o, n in live.items()), "overlap"
            assert off // a.slab_size == (off + slot - 1) // a.slab_size, "slot crosses a slab"
            live[off] = slot
    assert a.used_bytes == sum(live.values())


def test_reserved_page_is_invisible_until_commit_and_abort_frees_it() -> None:
    s = PoolIndex(1 << 20, 256 * KIB)
    (e,) = s.reserve([b"k"], [1000])
    assert isinstance(e, Entry)
    assert s.contains([b"k"]) == b"\x00"
    s.abort([e])
    assert s.contains([b"k"]) == b"\x00" and s.alloc.used_bytes == 0
    assert isinstance(put(s, b"k", 1000), Entry)
    assert s.contains([b"k"]) == b"\x01"
    assert put(s, b"k", 1000) is PRESENT  # idempotent


def test_concurrent_writers_of_one_key_never_wait_and_the_first_commit_wins() -> None:
    s = PoolIndex(1 << 20, 256 * KIB, put_wait=30.0)
    t0 = time.monotonic()
    (a,) = s.reserve([b"k"], [1000])
    (b,) = s.reserve([b"k"], [1000])  # while "a" is still being written: a slot of its own
    assert time.monotonic() - t0 < 1.0
    assert isinstance(a, Entry) and isinstance(b, Entry) and a.offset != b.offset
    assert s.snapshot()["writing"] == 2
    s.commit([b], [True])  # the second writer lands first: its copy is the readable one
    assert s.lease([b"k"]) == [b]
    s.release([b])
    s.commit([a], [True])  # the slower one finds the key stored and gives its slot back
    assert s.lease([b"k"]) == [b]
    s.release([b])
    snap = s.snapshot()
    assert snap["pages"] == 1 and snap["writing"] == 0 and snap["put_dup_writes"] == 1
    assert s.alloc.used_bytes == 4096 and snap["aborts"] == 0


def test_a_batch_naming_a_key_twice_stores_it_once_without_waiting() -> None:
    s = PoolIndex(1 << 20, 256 * KIB, put_wait=30.0)
    res = s.reserve([b"x", b"y", b"x"], [1000] * 3)
    assert all(isinstance(r, Entry) for r in res)
    s.commit(res, [True] * 3)
    assert s.contains([b"x", b"y"]) == b"\x01\x01"
    assert s.snapshot()["pages"] == 2 and s.alloc.used_bytes == 2 * 4096


def test_an_aborted_writer_does_not_spoil_a_concurrent_writer_of_the_same_key() -> None:
    s = PoolIndex(1 << 20, 256 * KIB)
    (a,) = s.reserve([b"k"], [1000])
    (b,) = s.reserve([b"k"], [1000])
    s.abort([a])  # e.g. its client died mid-copy
    assert s.contains([b"k"]) == b"\x00"
    s.commit([b], [True])
    assert s.contains([b"k"]) == b"\x01" and s.alloc.used_bytes == 4096


def test_eviction_takes_least_recently_read_first() -> None:
    s = PoolIndex(4 * 64 * KIB, 64 * KIB)
    for k in (b"a", b"b", b"c", b"d"):
        put(s, k)
    s.release(s.lease([b"a"]))  # a read makes "a" the most recent
    put(s, b"e")  # full: evicts the least recently used, "b"
    assert s.contains([b"a", b"b", b"c", b"d", b"e"]) == bytes([1, 0, 1, 1, 1])
    assert s.counters["evictions"] == 1


def test_a_leased_page_is_never_evicted_or_its_slot_reused() -> None:
    s = PoolIndex(2 * 64 * KIB, 64 * KIB, put_wait=0.1)
    put(s, b"a")
    put(s, b"b")
    held = s.lease([b"a", b"b"])  # both being read
    assert s.reserve([b"c"], [64 * KIB]) == [NO_ROOM]  # waited put_wait, then said so
    assert s.counters["put_waits"] == 1
    assert s.remove([b"a"]) == 1  # unlinked at once ...
    assert s.contains([b"a"]) == b"\x00"
    assert s.reserve([b"c"], [64 * KIB]) == [NO_ROOM]  # ... but its slot stays with the reader
    s.release(held)
    r = put(s, b"c")
    assert isinstance(r, Entry) and r.offset == held[0].offset


def test_a_full_pool_put_waits_for_a_reader_to_finish_instead_of_failing() -> None:
    s = PoolIndex(64 * KIB, 64 * KIB, put_wait=5.0)
    put(s, b"a")
    held = s.lease([b"a"])
    threading.Timer(0.2, s.release, args=(held,)).start()
    t0 = time.monotonic()
    assert isinstance(put(s, b"b"), Entry)
    assert 0.15 < time.monotonic() - t0 < 4.0


def test_mixed_page_sizes_take_slabs_from_other_classes() -> None:
    s = PoolIndex(4 * 256 * KIB, 256 * KIB)
    for i in range(16):
        put(s, b"small%d" % i, 64 * KIB)  # all four slabs hold 64 KiB slots
    r = put(s, b"big", 256 * KIB)  # needs a whole empty slab: old small pages go
    assert isinstance(r, Entry)
    assert s.contains([b"big"]) == b"\x01"
    assert s.counters["evictions"] >= 4


def test_background_eviction_brings_usage_to_the_low_watermark() -> None:
    s = PoolIndex(20 * 64 * KIB, 64 * KIB, high_watermark=0.9, low_watermark=0.5)
    for i in range(20):
        put(s, b"k%d" % i)
    assert s.over_high_watermark()
    assert s.evict_to_watermark() == 10
    assert s.alloc.used_bytes <= 0.5 * s.alloc.capacity
    assert s.contains([b"k0", b"k19"]) == b"\x00\x01"  # oldest went first


def test_background_eviction_leaves_a_page_larger_than_the_room_it_keeps_to_a_put() -> None:
    # A fresh clone's run under load read back nothing from a one-slab pool: the evictor's next
    # pass had evicted the only page (keeping 10% free means emptying the slab) before the get.
    s = PoolIndex(256 * KIB, 256 * KIB)
    put(s, b"whole", 256 * KIB)
    assert s.over_high_watermark()
    assert s.evict_to_watermark() == 0
    assert s.contains([b"whole"]) == b"\x01"
    assert isinstance(put(s, b"next", 256 * KIB), Entry)  # a put still makes its room
    assert s.contains([b"whole", b"next"]) == b"\x00\x01"


def test_page_larger_than_a_slab_is_refused_not_stored() -> None:
    s = PoolIndex(1 << 20, 256 * KIB)
    assert s.reserve([b"huge"], [512 * KIB]) == [NO_ROOM]
    assert s.reserve([b"empty"], [0]) == [NO_ROOM]


def test_index_counts_take_only_declared_names_and_snapshot_a_copy() -> None:
    c = Tally(PoolIndexStats)
    c.add(gets=3)
    snap = c.snapshot()
    c.add(gets=1)
    assert snap == PoolIndexStats(gets=3) and c["gets"] == 4
    with pytest.raises(KeyError, match="getz"):
        c.add(getz=1)  # a misspelt counter is a bug, not a new series


def test_a_put_at_another_size_replaces_the_page_and_leaves_a_reader_its_old_slot() -> None:
    s = PoolIndex(1 << 20, 256 * KIB)
    old = put(s, b"k", 1000)
    held = s.lease([b"k"], [1000])  # a reader of the old size is mid-copy
    new = put(s, b"k", 9000)  # acknowledged ...
    assert isinstance(new, Entry) and new.offset != old.offset
    assert s.lease([b"k"], [9000]) == [new]  # ... so readable at the new size
    assert s.lease([b"k"], [1000]) == [None]
    assert s.alloc.used_bytes == 4096 + 12288  # the old slot stays with its reader ...
    s.release(held)
    assert s.alloc.used_bytes == 12288  # ... until it is done
    assert s.snapshot()["put_replaced"] == 1


def _fill_with_reads_reordered(s: PoolIndex, n: int) -> list[bytes]:
    keys = [b"page%d" % i for i in range(n)]
    for k in keys:
        put(s, k)
    # Reads of every other page put the oldest pages of the LRU into every slab.
    s.release(s.lease(keys[::2]))
    return keys


def test_a_put_of_a_new_size_class_into_a_full_pool_evicts_one_slab_not_pages_of_every_slab() -> None:
    s = PoolIndex(8 * 256 * KIB, 256 * KIB)  # 8 slabs of 4 slots of 64 KiB
    keys = _fill_with_reads_reordered(s, 32)
    assert isinstance(put(s, b"odd", 128 * KIB), Entry)
    assert s.counters["evictions"] == 4  # one slab's pages, the coldest slab
    assert sum(s.contains(keys)) == 28


def test_a_board_record_never_evicts_a_page_of_a_full_pool() -> None:
    from mooncake_sgl.keys import board_key

    s = PoolIndex(8 * 256 * KIB, 256 * KIB)
    keys = _fill_with_reads_reordered(s, 32)
    t0 = time.monotonic()
    assert put(s, board_key(3), 4 * KIB) is NO_ROOM
    assert time.monotonic() - t0 < 0.5  # no wait for room either
    assert s.counters["evictions"] == 0
    assert sum(s.contains(keys)) == 32


def test_a_slab_of_board_records_is_given_up_before_any_page_is_evicted() -> None:
    from mooncake_sgl.keys import board_key

    s = PoolIndex(8 * 256 * KIB, 256 * KIB)
    assert isinstance(put(s, board_key(0), 4 * KIB), Entry)  # an empty pool: a slab of its own
    assert isinstance(put(s, board_key(1), 4 * KIB), Entry)  # the same slab
    keys = [b"page%d" % i for i in range(32)]  # 7 free slabs hold 28 pages, then room is needed
    for k in keys:
        assert isinstance(put(s, k), Entry)
    assert s.counters["evictions"] == 2  # the two records, not a page
    assert sum(s.contains(keys)) == 32
    assert s.contains([board_key(0), board_key(1)]) == b"\x00\x00"
