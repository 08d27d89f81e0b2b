"""``direct_io: auto``'s choice per write batch (``write_route``): the page cache while it takes
batches faster than the disk does, O_DIRECT once the kernel throttles it or the disk is faster,
back once the kernel has written back, both rates measured rather than assumed, and a large batch
timing the ways it has no recent rate for before it writes the rest the faster one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.tiers.ssd import LmdbTier, direct, write_route
from mooncake_sgl.tiers.ssd.write_route import WriteRoute

MIB = 1 << 20
GB = 1e9
BATCH = 128 * MIB  # long enough to be timed


class Room:
    """The page cache as the route sees it: dirty bytes, and whether a batch fits below the ceiling."""

    def __init__(self) -> None:
        self.dirty_bytes: int | None = 0
        self.room = True

    def dirty(self) -> int | None:
        return self.dirty_bytes

    def takes(self, nbytes: int) -> bool:
        return self.room


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def route() -> tuple[WriteRoute, Room, Clock]:
    room, clock = Room(), Clock()
    return WriteRoute(room, clock), room, clock


def throttled_route() -> tuple[WriteRoute, Room, Clock]:
    """A route that measured the disk, then saw a buffered batch throttled with 2 GiB dirty."""
    r, room, clock = route()
    write(r, 3.0, 1.0)
    write(r, 3.0, 1.0)
    room.dirty_bytes = 2 << 30
    write(r, 0.4, 1.0)
    assert r.throttled == 1
    return r, room, clock


def write(r: WriteRoute, gbps_buffered: float, gbps_direct: float) -> bool:
    """One batch the way the route sends it, at the given speed for that way; the way it went."""
    way = r.buffered(BATCH)
    r.wrote(way, BATCH, BATCH / ((gbps_buffered if way else gbps_direct) * GB))
    return way


def test_the_disks_rate_is_measured_once_after_the_first_buffered_batch() -> None:
    r, _, _ = route()
    ways = [write(r, 3.0, 1.0) for _ in range(6)]
    assert ways == [True, False, True, True, True, True]
    assert r.throttled == 0


def test_a_throttled_page_cache_sends_batches_direct_until_half_its_dirty_bytes_are_written_back() -> None:
    r, room, _ = route()
    assert [write(r, 3.0, 1.0) for _ in range(2)] == [True, False]
    room.dirty_bytes = 2 << 30
    assert write(r, 0.45, 1.0)  # the kernel throttled this one
    assert r.throttled == 1
    assert [write(r, 0.45, 1.0) for _ in range(3)] == [False] * 3
    room.dirty_bytes = 1 << 30  # exactly half: still waiting
    assert not write(r, 0.45, 1.0)
    room.dirty_bytes = (1 << 30) - 1
    assert write(r, 3.0, 1.0)


def test_a_page_cache_throttled_from_its_first_batch_is_found_out_by_the_disks_rate() -> None:
    r, room, clock = route()
    room.dirty_bytes = 1 << 30
    assert [write(r, 0.5, 1.5) for _ in range(4)] == [True, False, False, False]
    clock.now += write_route._RETRY_S  # both rates old: the page cache is timed again, and is throttled
    assert [write(r, 0.5, 1.5) for _ in range(3)] == [False, True, False]
    assert r.throttled == 1


def test_a_slow_batch_with_little_dirty_is_cpu_contention_not_throttling() -> None:
    """A busy CPU slows the page cache's copy, not the disk: no writeback to wait for, but once the
    page cache's recent rate is below the disk's, the batches go O_DIRECT."""
    r, room, clock = route()
    assert [write(r, 3.0, 1.0) for _ in range(2)] == [True, False]
    room.dirty_bytes = 64 * MIB  # below write_route._THROTTLE_MIN_DIRTY
    assert [write(r, 0.3, 1.0) for _ in range(4)] == [True, True, False, False]
    assert r.throttled == 0
    clock.now += write_route._RETRY_S  # the CPU may be free again: both ways are timed again
    assert [write(r, 3.0, 1.0) for _ in range(3)] == [False, True, True]


def test_the_page_cache_is_tried_again_after_the_retry_time_when_dirty_bytes_never_drain() -> None:
    r, _, clock = throttled_route()
    clock.now += write_route._RETRY_S - 1
    assert not write(r, 0.4, 1.0)
    clock.now += 1
    assert write(r, 0.4, 1.0)  # tried again, and throttled again
    assert r.throttled == 2 and not write(r, 0.4, 1.0)


def test_unknown_dirty_bytes_while_throttled_keep_batches_direct_until_the_retry() -> None:
    r, room, clock = throttled_route()
    room.dirty_bytes = None
    assert not write(r, 3.0, 1.0)
    clock.now += write_route._RETRY_S
    room.dirty_bytes = 0
    assert [write(r, 3.0, 1.0) for _ in range(2)] == [False, True]  # the disk's rate is old too


def test_the_disks_rate_is_measured_again_once_it_is_old() -> None:
    r, _, clock = route()
    assert [write(r, 3.0, 1.0) for _ in range(3)] == [True, False, True]
    clock.now += write_route._RETRY_S
    assert [write(r, 3.0, 1.0) for _ in range(2)] == [False, True]


def test_small_batches_are_judged_together_once_they_add_up() -> None:
    r, room, _ = route()
    small = write_route._JUDGED_BYTES // 4
    for _ in range(4):  # fast, then judged as one: the disk's rate is wanted next
        assert r.buffered(small)
        r.wrote(True, small, small / (3.0 * GB))
    for _ in range(4):  # the disk's rate, over as many bytes
        assert not r.buffered(small)
        r.wrote(False, small, small / (1.0 * GB))
    room.dirty_bytes = 2 << 30
    for _ in range(3):  # slow, but not enough of them to say so yet
        assert r.buffered(small)
        r.wrote(True, small, small / (0.4 * GB))
    assert r.throttled == 0
    r.wrote(True, small, small / (0.4 * GB))
    assert r.throttled == 1 and not r.buffered(small)


def test_no_room_below_the_ceiling_means_direct_whatever_the_rates() -> None:
    r, room, _ = route()
    room.room = False
    assert [write(r, 3.0, 1.0) for _ in range(3)] == [False] * 3


def test_a_large_batch_times_each_way_it_has_no_recent_rate_for_first() -> None:
    r, room, clock = route()
    assert r.probes(BATCH) == [False, True]  # a fresh tier: the disk first, then the page cache
    r.wrote(False, write_route.PROBE_BYTES, write_route.PROBE_BYTES / (1.0 * GB))
    r.wrote(True, write_route.PROBE_BYTES, write_route.PROBE_BYTES / (3.0 * GB))
    assert r.probes(BATCH) == [] and r.buffered(BATCH)  # the faster way for the rest
    clock.now += write_route._RETRY_S
    assert r.probes(BATCH) == [False, True]
    room.room = False
    assert r.probes(BATCH) == [False]  # the page cache may not take it: only the disk is timed
    r2, room2, _ = throttled_route()
    assert r2.probes(BATCH) == []  # throttled: O_DIRECT, its rate fresh


def _tier_and_pages(tmp_path: Path, batches: int, n: int, seed: int):
    import mmap

    tier = LmdbTier(LmdbTierConfig(path=str(tmp_path), capacity="1GiB", direct_io="auto"))
    if not tier._io.direct:
        tier.close()
        pytest.skip(f"the file system under {tmp_path} has no O_DIRECT")
    buf = np.frombuffer(mmap.mmap(-1, batches * n * MIB), dtype=np.uint8)
    buf[:] = np.random.default_rng(seed).integers(0, 256, buf.size, dtype=np.uint8)
    mv = memoryview(buf)
    return tier, buf, [[mv[i * MIB:(i + 1) * MIB]] for i in range(batches * n)]


def _slowed(monkeypatch, tier: LmdbTier, delays: dict[str, float]) -> None:
    """Each write request through the page cache (``"buffered"``) or O_DIRECT (``"direct"``)
    sleeps as long as ``delays`` says at the time."""
    import time

    write = direct.pwritev_all

    def kernel(fd: int, segments, offset: int) -> None:
        time.sleep(delays["buffered" if fd == tier._file.fd else "direct"])
        write(fd, segments, offset)

    monkeypatch.setattr(direct, "pwritev_all", kernel)


def _read_back(tier: LmdbTier, buf: np.ndarray, names: list[bytes]) -> None:
    out = np.zeros_like(buf)
    dst = memoryview(out)
    pages = [[dst[i * MIB:(i + 1) * MIB]] for i in range(len(names))]
    assert tier.get_into(names, pages) == [True] * len(names)
    assert np.array_equal(out, buf)


def test_a_fresh_tiers_first_large_batch_times_both_ways_then_writes_the_rest_the_faster(
        tmp_path: Path, monkeypatch) -> None:
    """One large batch into a new directory (a fresh server's first write-through): 32 MiB
    O_DIRECT, 32 MiB through the page cache, the rest the faster way; never both at once (on one
    file they contend for its inode lock)."""
    n = 128  # 128 MiB: two probes and as much again
    probe = write_route.PROBE_BYTES // MIB
    for slow, direct_pages in (("direct", probe), ("buffered", n - probe)):
        d = tmp_path / slow
        d.mkdir()
        tier, buf, pages = _tier_and_pages(d, 1, n, seed=5)
        monkeypatch.setattr(write_route.DirtyRoom, "takes", lambda self, nbytes: True)
        monkeypatch.setattr(write_route.DirtyRoom, "dirty", lambda self: 0)
        _slowed(monkeypatch, tier, {"buffered": 0.0, "direct": 0.0, slow: 0.05})
        names = [b"fresh-%03d" % i for i in range(n)]
        assert tier.put_from(names, pages).ok == (True,) * n
        assert tier.stats().direct_pages == direct_pages, slow
        assert tier.stats().buffered_throttled == 0
        _read_back(tier, buf, names)
        tier.close()


def test_a_tier_whose_buffered_writes_are_throttled_moves_to_o_direct_and_reads_back_exact(
        tmp_path: Path, monkeypatch) -> None:
    n = 96  # 96 MiB batches: the first one probes both ways
    tier, buf, pages = _tier_and_pages(tmp_path, 3, n, seed=6)
    monkeypatch.setattr(write_route.DirtyRoom, "takes", lambda self, nbytes: True)
    # Nothing dirty at first: a buffered window a loaded CPU slows is contention, not the kernel's
    # throttling, and must change nothing; then 2 GiB dirty, as when the kernel throttles.
    dirty = {"bytes": 0}
    monkeypatch.setattr(write_route.DirtyRoom, "dirty", lambda self: dirty["bytes"])
    delays = {"buffered": 0.0, "direct": 0.05}  # a page cache faster than the disk (4 in flight: 320 MB/s)
    _slowed(monkeypatch, tier, delays)
    names = [b"route-%02d" % i for i in range(3 * n)]
    assert tier.put_from(names[:n], pages[:n]).ok == (True,) * n
    probe = write_route.PROBE_BYTES // MIB
    assert tier.stats().direct_pages == probe and tier.stats().buffered_throttled == 0
    dirty["bytes"] = 2 << 30
    delays["buffered"] = 0.03  # balance_dirty_pages holding the writer: 4 MiB per 30 ms
    assert tier.put_from(names[n:2 * n], pages[n:2 * n]).ok == (True,) * n  # through the page cache
    assert tier.stats().direct_pages == probe and tier.stats().buffered_throttled == 1
    assert tier.put_from(names[2 * n:], pages[2 * n:]).ok == (True,) * n  # O_DIRECT alone
    assert tier.stats().direct_pages == probe + n
    _read_back(tier, buf, names)
    tier.close()
