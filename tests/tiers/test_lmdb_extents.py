"""The SSD tier's extent file and allocator: replacing pages, reuse of freed space, other writers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.tiers.ssd import LmdbTier
from mooncake_sgl.tiers.ssd.extents import ALIGN, ExtentAllocator

from .test_lmdb_tier import page_bytes

REPO = Path(__file__).resolve().parents[2]


def tier_at(path: Path, capacity: str = "64MiB") -> LmdbTier:
    return LmdbTier(LmdbTierConfig(path=str(path), capacity=capacity))


def test_a_put_at_a_new_size_is_readable_at_that_size(tmp_path: Path) -> None:
    # Issue 10, defect 8: the second put answered True but a read at the new size missed.
    tier = tier_at(tmp_path)
    small, large = page_bytes(b"a", 4096), page_bytes(b"b", 3 * 4096 + 100)
    assert tier.put_from([b"k"], [[memoryview(small)]]).ok == (True,)
    assert tier.put_from([b"k"], [[memoryview(large)]]).ok == (True,)
    out = memoryview(bytearray(len(large)))
    assert tier.get_into([b"k"], [[out]]) == [True] and bytes(out) == large
    assert tier.get_into([b"k"], [[memoryview(bytearray(4096))]]) == [False]
    assert tier.page_size_of(b"k") == len(large) and tier.stats().counts.put_replaced == 1
    assert tier.usage().used_bytes == tier.footprint(len(large))
    tier.close()
    tier = tier_at(tmp_path)
    out = memoryview(bytearray(len(large)))
    assert tier.get_into([b"k"], [[out]]) == [True] and bytes(out) == large
    tier.close()


def test_freed_extents_coalesce_and_serve_a_larger_page() -> None:
    alloc = ExtentAllocator(16 * ALIGN)
    offs = [alloc.allocate(ALIGN, None) for _ in range(16)]
    assert offs == [i * ALIGN for i in range(16)] and alloc.allocate(1, None) is None
    for off in offs[4:8]:
        alloc.free(off, ALIGN, txn=5)
    assert alloc.free_extents() == 1
    assert alloc.allocate(4 * ALIGN, oldest_reader=4) is None  # a reader may still see them
    assert alloc.allocate(4 * ALIGN, oldest_reader=5) == 4 * ALIGN
    assert alloc.used == 16 * ALIGN


def test_rebuild_treats_gaps_as_free_and_keeps_the_high_water_mark() -> None:
    alloc = ExtentAllocator(64 * ALIGN)
    alloc.rebuild([(0, ALIGN), (3 * ALIGN, 2 * ALIGN - 7)])
    assert (alloc.hwm, alloc.used) == (5 * ALIGN, 3 * ALIGN)
    assert alloc.allocate(2 * ALIGN, None) == ALIGN  # the gap, not the top
    alloc.rebuild([(0, ALIGN)], freed_by=9)
    assert alloc.hwm == 5 * ALIGN  # space above may still be read by someone
    assert alloc.allocate(ALIGN, oldest_reader=8) == 5 * ALIGN
    assert alloc.allocate(ALIGN, oldest_reader=9) == ALIGN


FOREIGN = ("import sys; from mooncake_sgl.tiers.ssd import LmdbTier; from mooncake_sgl.config import "
           "LmdbTierConfig; from tests.tiers.test_lmdb_tier import page_bytes; "
           "t = LmdbTier(LmdbTierConfig(path=sys.argv[1], capacity='64MiB')); "
           "ks = [b'child-%d' % i for i in range(8)]; "
           "assert t.put_from(ks, [[memoryview(page_bytes(k, 65536))] for k in ks]).ok == (True,) * 8; "
           "t.remove([b'parent-0']); t.close()")


def test_pages_written_by_another_process_are_never_overwritten(tmp_path: Path) -> None:
    # Our allocator only knows our own writes; the transaction ids tell us someone else wrote.
    tier = tier_at(tmp_path)
    mine = [b"parent-%d" % i for i in range(8)]
    assert tier.put_from(mine, [[memoryview(page_bytes(k, 65536))] for k in mine]).ok == (True,) * 8
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    subprocess.run([sys.executable, "-c", FOREIGN, str(tmp_path)], cwd=REPO, env=env, check=True, timeout=60)
    more = [b"parent-more-%d" % i for i in range(8)]
    assert tier.put_from(more, [[memoryview(page_bytes(k, 65536))] for k in more]).ok == (True,) * 8
    assert tier.stats().counts.foreign_writes == 1
    live = mine[1:] + more + [b"child-%d" % i for i in range(8)]
    out = [[memoryview(bytearray(65536))] for _ in live]
    assert tier.get_into(live, out) == [True] * len(live)
    assert all(bytes(o[0]) == page_bytes(k, 65536) for k, o in zip(live, out))
    assert tier.contains([b"parent-0"]) == [False]
    tier.close()


def test_an_environment_of_the_older_inline_layout_is_moved_aside(tmp_path: Path) -> None:
    import lmdb

    db = tmp_path / "db"
    env = lmdb.open(str(db), map_size=64 << 20)
    with env.begin(write=True) as txn:  # the old layout: header || page bytes in the main DB
        txn.put(b"old-page", b"MSGP" + bytes(4096))
    env.close()
    tier = tier_at(db)
    try:
        assert tier.contains([b"old-page"]) == [False]
        assert [p.name.startswith("db.damaged-") for p in tmp_path.iterdir()].count(True) == 1
        assert tier.put_from([b"new"], [[memoryview(page_bytes(b"new", 4096))]]).ok == (True,)
    finally:
        tier.close()


def test_a_probe_that_cannot_start_opens_the_index_unchecked(tmp_path: Path, monkeypatch) -> None:
    from mooncake_sgl.tiers.ssd import probe

    tier_at(tmp_path).close()
    monkeypatch.setattr(probe.sys, "executable", str(tmp_path / "no-such-python"))
    assert probe.damage_of(str(tmp_path), 2, 64 << 20, True) is None
    tier = tier_at(tmp_path)
    assert tier.put_from([b"k"], [[memoryview(b"x" * 4096)]]).ok == (True,)
    tier.close()


def test_records_naming_overlapping_bytes_keep_only_the_first(tmp_path: Path) -> None:
    from mooncake_sgl.tiers.ssd import records

    tier = tier_at(tmp_path)
    names = [b"a", b"b", b"c"]
    assert tier.put_from(names, [[memoryview(page_bytes(k, 8192))] for k in names]).ok == (True,) * 3
    with tier._index.env.begin(write=True, db=tier._index.pages) as txn:  # white-box: damage b's offset
        off_a, length, digest = records.parse_record(txn.get(b"a"))
        b_digest = records.parse_record(txn.get(b"b"))[2]
        txn.put(b"b", records.pack_record(off_a + 4096, length, b_digest))
    tier.close()
    tier = tier_at(tmp_path)
    assert tier.stats().counts.dropped_at_open == 1 and tier.contains(names) == [True, False, True]
    more = [b"d", b"e", b"f"]  # reuse must not land on a's bytes
    assert tier.put_from(more, [[memoryview(page_bytes(k, 8192))] for k in more]).ok == (True,) * 3
    live = [b"a", b"c"] + more
    out = [[memoryview(bytearray(8192))] for _ in live]
    assert tier.get_into(live, out) == [True] * 5
    assert all(bytes(o[0]) == page_bytes(k, 8192) for k, o in zip(live, out))
    tier.close()


def test_the_page_file_takes_disk_as_pages_arrive_not_the_whole_capacity(tmp_path: Path) -> None:
    # Preallocating 256 MiB at the first put filled a shared disk when many small tiers (a test
    # run's) each took that much; the step now doubles with the file, so the disk a tier holds stays
    # within twice what it stores (plus the first 4 MiB step).
    tier = tier_at(tmp_path, capacity="4GiB")
    pages_bin = next(tmp_path.rglob("pages.bin"))

    def on_disk() -> int:
        return os.stat(pages_bin).st_blocks * 512

    small = [page_bytes(b"s%d" % i, 64 << 10) for i in range(3)]
    assert tier.put_from([b"s%d" % i for i in range(3)], [[memoryview(p)] for p in small]).ok == (True,) * 3
    assert 3 * (64 << 10) <= on_disk() <= 4 << 20
    big = [page_bytes(b"b%d" % i, 256 << 10) for i in range(100)]
    keys = [b"b%d" % i for i in range(100)]
    assert tier.put_from(keys, [[memoryview(p)] for p in big]).ok == (True,) * 100
    stored = 3 * (64 << 10) + 100 * (256 << 10)
    assert stored <= on_disk() <= 2 * stored + (4 << 20)
    out = memoryview(bytearray(256 << 10))
    assert tier.get_into([b"b99"], [[out]]) == [True] and bytes(out) == big[99]
    tier.close()


def test_a_released_allocation_at_the_top_goes_back_to_the_top() -> None:
    # A page refused because the file could not grow: its space must not stay a free extent past
    # the end of the file, where it would be the best fit for every later page of that size.
    alloc = ExtentAllocator(16 * ALIGN)
    first = [alloc.allocate(ALIGN, None) for _ in range(4)]
    alloc.free(first[0], ALIGN, txn=3)  # backed space a later page can reuse
    top = alloc.allocate(2 * ALIGN, None)
    assert top == 4 * ALIGN
    alloc.release(top, 2 * ALIGN)
    assert (alloc.hwm, alloc.used, alloc.free_extents()) == (4 * ALIGN, 3 * ALIGN, 1)
    assert alloc.allocate(ALIGN, None) == first[0]
    alloc.release(first[1], ALIGN)  # not at the top: a free extent no reader ever saw
    assert alloc.allocate(ALIGN, oldest_reader=0) == first[1]


def test_rebuild_keeps_waiting_only_for_space_the_free_log_names() -> None:
    # Rebuilt after another process wrote, all free space used to count as freed just now, so it
    # waited for every reader to catch up: with readers always a few commits behind, never.
    alloc = ExtentAllocator(64 * ALIGN)
    alloc.rebuild([(0, ALIGN), (4 * ALIGN, ALIGN)], freed=[(2 * ALIGN, ALIGN, 7), (6 * ALIGN, ALIGN, 9)])
    assert alloc.hwm == 7 * ALIGN  # past the last extent freed: never-used space
    assert alloc.allocate(ALIGN, oldest_reader=3) == ALIGN
    assert alloc.allocate(ALIGN, oldest_reader=3) == 3 * ALIGN  # not the one freed by 7
    assert alloc.allocate(ALIGN, oldest_reader=7) == 2 * ALIGN
    assert alloc.allocate(ALIGN, oldest_reader=7) == 5 * ALIGN
    assert alloc.allocate(ALIGN, oldest_reader=7) == 7 * ALIGN  # 6 waits for reader 9


def test_space_freed_next_to_an_older_free_extent_does_not_keep_it_waiting() -> None:
    alloc = ExtentAllocator(8 * ALIGN)
    offs = [alloc.allocate(ALIGN, None) for _ in range(8)]
    alloc.free(offs[2], ALIGN, txn=5)
    alloc.free(offs[3], ALIGN, txn=9)  # merged at max(5, 9), 2 waited for reader 9 too
    assert alloc.allocate(ALIGN, oldest_reader=6) == 2 * ALIGN
    alloc.free(offs[2], ALIGN, txn=10)
    assert alloc.allocate(2 * ALIGN, oldest_reader=9) is None
    # Once no reader can see either, they coalesce and serve a larger page.
    assert alloc.allocate(2 * ALIGN, oldest_reader=10) == 2 * ALIGN
