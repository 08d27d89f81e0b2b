"""``direct_io: auto``'s choice per write batch (``write_route``): the page cache while it takes
batches faster than the disk does, O_DIRECT once the kernel throttles it, back once the kernel
has written back, and the disk's rate measured rather than assumed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.tiers.ssd import LmdbTier, page_io, write_route
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
    r, room, _ = route()
    room.dirty_bytes = 1 << 30
    assert [write(r, 0.5, 1.5) for _ in range(4)] == [True, False, True, False]
    assert r.throttled == 1


def test_a_slow_batch_with_little_dirty_is_cpu_contention_not_throttling() -> None:
    r, room, _ = route()
    assert [write(r, 3.0, 1.0) for _ in range(2)] == [True, False]
    room.dirty_bytes = 64 * MIB  # below write_route._THROTTLE_MIN_DIRTY
    assert [write(r, 0.3, 1.0) for _ in range(3)] == [True] * 3
    assert r.throttled == 0


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


def test_a_tier_whose_buffered_writes_are_throttled_moves_to_o_direct_and_reads_back_exact(
        tmp_path: Path, monkeypatch) -> None:
    import mmap
    import time

    tier = LmdbTier(LmdbTierConfig(path=str(tmp_path), capacity="1GiB", direct_io="auto"))
    if not tier._io.direct:
        tier.close()
        pytest.skip(f"the file system under {tmp_path} has no O_DIRECT")
    page, n = 1 * MIB, 32  # 32 MiB batches: each one judged (write_route._JUDGED_BYTES)
    buf = np.frombuffer(mmap.mmap(-1, 4 * n * page), dtype=np.uint8)
    buf[:] = np.random.default_rng(5).integers(0, 256, buf.size, dtype=np.uint8)
    mv = memoryview(buf)
    monkeypatch.setattr(write_route.DirtyRoom, "takes", lambda self, nbytes: True)
    monkeypatch.setattr(write_route.DirtyRoom, "dirty", lambda self: 2 << 30)
    write = page_io._pwritev_all
    throttle = {"on": False}

    def kernel(fd: int, segments, offset: int) -> None:
        if throttle["on"] and fd == tier._file.fd:
            time.sleep(0.5)  # balance_dirty_pages holding a buffered writer
        write(fd, segments, offset)

    monkeypatch.setattr(page_io, "_pwritev_all", kernel)
    names = [b"route-%02d" % i for i in range(4 * n)]
    pages = [[mv[i * page:(i + 1) * page]] for i in range(4 * n)]
    for b in range(4):
        throttle["on"] = b == 2  # the first batch buffered, the second direct (the disk's rate)
        assert tier.put_from(names[b * n:(b + 1) * n], pages[b * n:(b + 1) * n]) == [True] * n
    stats = tier.stats()
    assert stats["buffered_throttled"] == 1
    assert stats["direct_pages"] == 2 * n  # the probe and the batch after the throttled one
    out = np.zeros_like(buf)
    dst = memoryview(out)
    assert tier.get_into(names, [[dst[i * page:(i + 1) * page]] for i in range(4 * n)]) == [True] * (4 * n)
    assert np.array_equal(out, buf)
    tier.close()


def test_a_rate_probe_writes_only_its_first_window_with_o_direct(tmp_path: Path, monkeypatch) -> None:
    """The route learns the disk's rate from one judged window, not a whole batch: a 128 MiB batch
    sent O_DIRECT on a 300 MB/s disk took 0.43 s where the page cache took it as a memory copy
    (``bench_tiers.py --modes throttled``), so a probe is its batch's first ``PROBE_BYTES``."""
    import mmap

    tier = LmdbTier(LmdbTierConfig(path=str(tmp_path), capacity="1GiB", direct_io="auto"))
    if not tier._io.direct:
        tier.close()
        pytest.skip(f"the file system under {tmp_path} has no O_DIRECT")
    page = 1 * MIB
    n = 4 * write_route.PROBE_BYTES // page  # a batch four probes long
    buf = np.frombuffer(mmap.mmap(-1, 2 * n * page), dtype=np.uint8)
    buf[:] = np.random.default_rng(7).integers(0, 256, buf.size, dtype=np.uint8)
    mv = memoryview(buf)
    monkeypatch.setattr(write_route.DirtyRoom, "takes", lambda self, nbytes: True)
    names = [b"probe-%03d" % i for i in range(2 * n)]
    pages = [[mv[i * page:(i + 1) * page]] for i in range(2 * n)]
    # The first batch goes through the page cache and is judged; the next one probes the disk.
    for b in range(2):
        assert tier.put_from(names[b * n:(b + 1) * n], pages[b * n:(b + 1) * n]) == [True] * n
    assert tier.stats()["direct_pages"] == write_route.PROBE_BYTES // page
    out = np.zeros_like(buf)
    dst = memoryview(out)
    assert tier.get_into(names, [[dst[i * page:(i + 1) * page]] for i in range(2 * n)]) == [True] * (2 * n)
    assert np.array_equal(out, buf)
    tier.close()
