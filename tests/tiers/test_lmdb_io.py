"""The SSD tier's page data path (``page_io``, ``direct``): O_DIRECT from and into any memory (a bounce
buffer where it is not aligned), the page cache where it is faster, cold reads with O_DIRECT and
warm ones from the page cache, checksums made alongside the writes and verified on every read, and
the seconds the tier's writer is busy reaching ``/metrics``."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.metrics.source import tier_sample
from mooncake_sgl.store.stats import StoreTierReport
from mooncake_sgl.tiers.ssd import LmdbTier, direct, page_io, readers, write_route
from tests.page_cache import drop_from

PAGE = 256 << 10


def aligned_pages(n: int, seed: int) -> tuple[np.ndarray, list[list[memoryview]]]:
    """``n`` pages in page-aligned memory, two segments each (K and V), as SGLang's host pool."""
    buf = np.frombuffer(mmap.mmap(-1, n * PAGE), dtype=np.uint8)
    buf[:] = np.random.default_rng(seed).integers(0, 256, n * PAGE, dtype=np.uint8)
    mv, half = memoryview(buf), PAGE // 2
    return buf, [[mv[i * PAGE:i * PAGE + half], mv[i * PAGE + half:(i + 1) * PAGE]] for i in range(n)]


def tier_at(path: Path, mode: str) -> LmdbTier:
    tier = LmdbTier(LmdbTierConfig(path=str(path), capacity="64MiB", direct_io=mode))
    if mode != "buffered" and not tier._io.direct:
        tier.close()
        pytest.skip(f"the file system under {path} has no O_DIRECT")
    return tier


def read_all(tier: LmdbTier, names: list[bytes], n: int) -> tuple[list[bool], np.ndarray]:
    out = np.zeros(n * PAGE, dtype=np.uint8)
    mv = memoryview(out)
    return tier.get_into(names, [[mv[i * PAGE:(i + 1) * PAGE]] for i in range(n)]), out


def test_aligned_pages_go_to_disk_with_o_direct_and_read_back_exact(tmp_path: Path) -> None:
    tier = tier_at(tmp_path, "direct")
    buf, pages = aligned_pages(12, seed=1)
    names = [b"direct-%02d" % i for i in range(12)]
    assert tier.put_from(names, pages).ok == (True,) * 12
    assert tier.stats().direct_pages == 12 and tier.stats().write_busy_s > 0
    ok, out = read_all(tier, names, 12)
    assert ok == [True] * 12 and np.array_equal(out, buf)
    tier.close()
    tier = tier_at(tmp_path, "direct")  # what a new process finds
    ok, out = read_all(tier, names, 12)
    assert ok == [True] * 12 and np.array_equal(out, buf)
    tier.close()


def test_unaligned_pages_go_o_direct_through_a_bounce_buffer_beside_aligned_ones(tmp_path: Path,
                                                                                monkeypatch) -> None:
    tier = tier_at(tmp_path, "direct")
    buf, pages = aligned_pages(4, seed=2)
    odd = bytearray(PAGE + 1)
    odd[:] = os.urandom(PAGE + 1)
    shifted = memoryview(odd)[1:]  # one byte past a page boundary: O_DIRECT cannot take it as it is
    tail = memoryview(bytearray(os.urandom(5000)))  # not whole 4 KiB blocks: padded in the bounce
    batch = [pages[0], [shifted], pages[1], [tail], pages[2], pages[3]]
    names = [b"mixed-%d" % i for i in range(len(batch))]
    written: list[int] = []
    write = direct.pwritev_all

    def noted(fd: int, segments, offset: int) -> None:
        write(fd, segments, offset)  # the kernel refuses the segments as they are: EINVAL
        if fd == tier._io._direct_fd:
            assert offset % 4096 == 0 and all(s.nbytes % 4096 == 0 for s in segments)
            written.append(len(segments))

    monkeypatch.setattr(direct, "pwritev_all", noted)
    assert tier.put_from(names, batch).ok == (True,) * len(batch)
    assert tier.stats().direct_pages == len(batch) and written == [1]  # one request, bounced
    for name, page in zip(names, batch):
        want = b"".join(bytes(s) for s in page)
        out = memoryview(bytearray(len(want)))
        assert tier.get_into([name], [[out]]) == [True] and bytes(out) == want
    tier.close()


def test_auto_writes_through_the_page_cache_until_it_would_throttle(tmp_path: Path,
                                                                    monkeypatch) -> None:
    tier = tier_at(tmp_path, "auto")
    buf, pages = aligned_pages(8, seed=3)
    monkeypatch.setattr(write_route.DirtyRoom, "takes", lambda self, nbytes: True)
    assert tier.put_from([b"free-%d" % i for i in range(4)], pages[:4]).ok == (True,) * 4
    assert tier.stats().direct_pages == 0
    monkeypatch.setattr(write_route.DirtyRoom, "takes", lambda self, nbytes: False)
    assert tier.put_from([b"full-%d" % i for i in range(4)], pages[4:]).ok == (True,) * 4
    assert tier.stats().direct_pages == 4
    ok, out = read_all(tier, [b"free-%d" % i for i in range(4)] + [b"full-%d" % i for i in range(4)], 8)
    assert ok == [True] * 8 and np.array_equal(out, buf)
    tier.close()


def test_buffered_mode_never_uses_o_direct(tmp_path: Path) -> None:
    tier = tier_at(tmp_path, "buffered")
    _, pages = aligned_pages(4, seed=4)
    assert tier.put_from([b"b-%d" % i for i in range(4)], pages).ok == (True,) * 4
    assert tier.stats().direct_pages == 0 and not tier._io.direct
    tier.close()


def test_the_dirty_ceiling_is_halfway_between_the_kernels_thresholds(monkeypatch) -> None:
    gib = 1 << 30
    monkeypatch.setattr(write_route, "_meminfo", lambda: {"MemAvailable": 10 * gib, "Dirty": gib,
                                                     "Writeback": gib // 2})
    room = write_route.DirtyRoom()
    room._bytes, room._ratios = (0, 0), (10, 20)  # background 1 GiB, limit 2 GiB: free run < 1.5 GiB
    assert not room.takes(1)  # 1.5 GiB dirty or being written back already
    monkeypatch.setattr(write_route, "_meminfo", lambda: {"MemAvailable": 10 * gib, "Dirty": gib // 4,
                                                     "Writeback": 0})
    assert room.takes(gib) and not room.takes(gib + gib // 4)
    room._bytes = (gib // 8, gib // 4)  # vm.dirty_*_bytes win over the ratios
    assert not room.takes(1)


@pytest.mark.parametrize("mode", ["direct", "buffered"])
def test_a_flipped_byte_written_either_way_is_a_counted_miss(tmp_path: Path, mode: str) -> None:
    tier = tier_at(tmp_path, mode)
    _, pages = aligned_pages(3, seed=5)
    names = [b"flip-%d" % i for i in range(3)]
    assert tier.put_from(names, pages).ok == (True,) * 3
    with open(tmp_path / "pages.bin", "r+b") as f:
        f.seek(PAGE + 7)  # inside the second page (extents follow each other from offset 0)
        byte = f.read(1)
        f.seek(PAGE + 7)
        f.write(bytes([byte[0] ^ 0x40]))
    ok, _ = read_all(tier, names, 3)
    assert ok == [True, False, True]
    assert tier.stats().counts.corrupt_pages == 1 and tier.contains(names) == [True, False, True]
    tier.close()


def test_seconds_at_the_disks_speed_reach_the_tier_sample() -> None:
    entry = StoreTierReport.from_plain({"store": {}, "usage": {},
                                        "tier": {"write_busy_s": 2.5, "corrupt_pages": 1}})
    assert tier_sample(entry, 3).write_busy_seconds == 2.5


def test_a_device_refusing_the_o_direct_alignment_gets_the_pages_buffered(tmp_path: Path,
                                                                          monkeypatch) -> None:
    tier = tier_at(tmp_path, "direct")
    buf, pages = aligned_pages(4, seed=6)
    write = direct.pwritev_all

    def refuse_direct(fd: int, segments, offset: int) -> None:
        if fd == tier._io._direct_fd:  # a device whose logical block is larger than 4 KiB
            raise OSError(errno.EINVAL, "Invalid argument")
        write(fd, segments, offset)

    monkeypatch.setattr(direct, "pwritev_all", refuse_direct)
    names = [b"einval-%d" % i for i in range(4)]
    assert tier.put_from(names, pages).ok == (True,) * 4
    ok, out = read_all(tier, names, 4)
    assert ok == [True] * 4 and np.array_equal(out, buf)
    tier.close()


def test_reads_warm_and_cold_leave_readahead_to_the_kernel(tmp_path: Path, monkeypatch) -> None:
    """No ``POSIX_FADV_WILLNEED`` from a read, cached or not: a hint per run, issued by the reader
    before its read, made cold reads 2-3x slower than the kernel's own readahead (``page_io``)."""
    tier = tier_at(tmp_path, "buffered")
    n = (32 << 20) // PAGE  # a batch the pool's threads share (``page_io._GANG_MIN_BYTES``)
    buf, pages = aligned_pages(n, seed=7)
    names = [b"ahead-%03d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n
    hints: list[int] = []
    advise = os.posix_fadvise

    def counted(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED:
            hints.append(length)
        advise(fd, offset, length, advice)

    monkeypatch.setattr(page_io.os, "posix_fadvise", counted)
    ok, out = read_all(tier, names, n)  # just written: every byte is in the page cache
    assert ok == [True] * n and np.array_equal(out, buf)
    fd = os.open(tmp_path / "pages.bin", os.O_RDONLY)
    try:
        os.fdatasync(fd)
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    ok, out = read_all(tier, names, n)  # from the disk
    assert ok == [True] * n and np.array_equal(out, buf)
    assert hints == []
    tier.close()


def test_a_batch_is_read_by_the_calling_thread_and_the_pool_alike(tmp_path: Path, monkeypatch) -> None:
    import threading
    import time

    tier = tier_at(tmp_path, "buffered")
    n = (32 << 20) // PAGE  # large enough to be shared (``page_io._GANG_MIN_BYTES``)
    buf, pages = aligned_pages(n, seed=8)
    names = [b"gang-%03d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n
    readers: set[str] = set()
    read = direct.preadv_all

    def noted(fd: int, segments, offset: int) -> int:
        readers.add(threading.current_thread().name)
        time.sleep(0.02)  # long enough for a pool thread to wake and take a run
        return read(fd, segments, offset)

    monkeypatch.setattr(direct, "preadv_all", noted)
    ok, out = read_all(tier, names, n)
    assert ok == [True] * n and np.array_equal(out, buf)
    assert threading.current_thread().name in readers
    assert any(name.startswith("mooncake-sgl-ssd-io") for name in readers)
    tier.close()


def test_readers_of_a_shared_batch_each_read_through_a_descriptor_of_their_own(tmp_path: Path,
                                                                               monkeypatch) -> None:
    """The kernel keeps readahead state per open file: readers sharing the writer's descriptor
    at different offsets made each other look random to it (``page_io``: cold 8 MiB reads)."""
    import threading
    import time

    tier = tier_at(tmp_path, "buffered")
    n = (32 << 20) // PAGE  # large enough to be shared (``page_io._GANG_MIN_BYTES``)
    buf, pages = aligned_pages(n, seed=10)
    names = [b"own-fd-%03d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n
    reads: list[tuple[str, int, int]] = []
    read = direct.preadv_all

    def noted(fd: int, segments, offset: int) -> int:
        reads.append((threading.current_thread().name, fd, offset))
        time.sleep(0.02)  # long enough for a pool thread to wake and take a run
        return read(fd, segments, offset)

    monkeypatch.setattr(direct, "preadv_all", noted)
    used: list[set[int]] = []
    for _ in range(2):
        reads.clear()
        ok, out = read_all(tier, names, n)
        assert ok == [True] * n and np.array_equal(out, buf)
        fds_of: dict[str, set[int]] = {}
        for thread, fd, _ in reads:
            fds_of.setdefault(thread, set()).add(fd)
        assert len(fds_of) >= 2 and all(len(fds) == 1 for fds in fds_of.values())
        used.append(set().union(*fds_of.values()))
        assert len(used[-1]) == len(fds_of)  # no two readers on one descriptor
        assert tier._file.fd not in used[-1]
    assert len(used[0] | used[1]) <= 1 + page_io._GANG_HELPERS  # the second batch reused them
    tier.close()
    for fd in used[0] | used[1]:  # the tier's close closes them
        with pytest.raises(OSError):
            os.fstat(fd)


def test_each_reader_takes_its_own_stretch_in_order_then_the_ends_of_the_others() -> None:
    both = readers.Stretches(10, 2)
    assert [(both.next(0), both.next(1)) for _ in range(5)] == [(i, 5 + i) for i in range(5)]
    assert both.next(0) is None and both.next(1) is None
    alone = readers.Stretches(10, 2)  # the helper never started: the caller takes it all
    assert [alone.next(0) for _ in range(11)] == [0, 1, 2, 3, 4, 9, 8, 7, 6, 5, None]
    three = readers.Stretches(9, 3)
    assert three.next(2) == 6 and [three.next(0) for _ in range(3)] == [0, 1, 2]
    assert three.next(0) == 5  # the stretch with the most left gives up its last task
    taken = [three.next(w) for w in (1, 2, 0, 1, 2)]
    assert sorted(t for t in taken if t is not None) == [3, 4, 7, 8]


def test_reads_fall_back_to_the_shared_descriptor_when_none_can_be_opened(tmp_path: Path,
                                                                          monkeypatch) -> None:
    tier = tier_at(tmp_path, "buffered")
    n = (32 << 20) // PAGE
    buf, pages = aligned_pages(n, seed=11)
    names = [b"no-fd-%03d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n
    real_open = os.open

    def out_of_descriptors(path, flags, *args):
        if flags & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args)

    monkeypatch.setattr(page_io.os, "open", out_of_descriptors)
    ok, out = read_all(tier, names, n)
    assert ok == [True] * n and np.array_equal(out, buf)
    tier.close()


@pytest.mark.parametrize("where", [0, 3 * (1 << 20) + 5, (8 << 20) - 1])
def test_a_flipped_byte_anywhere_in_a_large_page_is_a_miss(tmp_path: Path, where: int) -> None:
    tier = LmdbTier(LmdbTierConfig(path=str(tmp_path), capacity="64MiB", direct_io="buffered"))
    size = 8 << 20  # read and hashed in pieces
    data = np.random.default_rng(9).integers(0, 256, 2 * size, dtype=np.uint8)
    mv = memoryview(data)
    names = [b"big-0", b"big-1"]
    assert tier.put_from(names, [[mv[:size // 2], mv[size // 2:size]], [mv[size:]]]).ok == (True, True)
    with open(tmp_path / "pages.bin", "r+b") as f:  # the first page's extent starts at 0
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0x01]))
    out = np.zeros(2 * size, dtype=np.uint8)
    dst = memoryview(out)
    assert tier.get_into(names, [[dst[:size]], [dst[size:]]]) == [False, True]
    assert np.array_equal(out[size:], data[size:])
    assert tier.stats().counts.corrupt_pages == 1
    tier.close()


def _read_file(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def test_a_cold_batch_is_read_with_o_direct_and_a_warm_one_from_the_page_cache(tmp_path: Path,
                                                                              monkeypatch) -> None:
    """On a disk with the kernel's usual 128 KiB readahead, runs not wholly in the page cache go
    O_DIRECT straight into aligned memory; other memory is read buffered; cached runs are memory
    copies."""
    monkeypatch.setattr(direct, "readahead_of", lambda fd: 128 << 10)
    tier = tier_at(tmp_path, "direct")
    n = (32 << 20) // PAGE  # a batch the pool's threads share (``page_io._GANG_MIN_BYTES``)
    buf, pages = aligned_pages(n, seed=12)
    names = [b"cold-%03d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n  # O_DIRECT: nothing of it is in the page cache
    reads: list[tuple[bool, int]] = []
    read = direct.preadv_all

    def noted(fd: int, segments, offset: int) -> int:
        got = read(fd, segments, offset)  # a refused O_DIRECT read raises before it is noted
        reads.append((fd == tier._io._direct_fd, got))
        return got

    monkeypatch.setattr(direct, "preadv_all", noted)
    out, dst = aligned_pages(n, seed=0)  # SGLang's host pool: page-aligned
    assert tier.get_into(names, dst) == [True] * n and np.array_equal(out, buf)
    # Adjacent pages, one request of page_io._DIRECT_READ bytes each, all O_DIRECT.
    assert reads == [(True, page_io._DIRECT_READ)] * ((32 << 20) // page_io._DIRECT_READ)
    reads.clear()
    raw = np.zeros(n * PAGE + 4096 + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 4096 + 64  # where malloc puts a large array: never on a block
    shifted = memoryview(raw[start:start + n * PAGE])
    assert tier.get_into(names, [[shifted[i * PAGE:(i + 1) * PAGE]] for i in range(n)]) == [True] * n
    assert np.array_equal(raw[start:start + n * PAGE], buf)
    assert reads and not any(through_direct for through_direct, _ in reads)
    reads.clear()
    _read_file(tmp_path / "pages.bin")  # now every page is in the page cache
    ok, out = read_all(tier, names, n)
    assert ok == [True] * n and np.array_equal(out, buf)
    assert reads and not any(through_direct for through_direct, _ in reads)
    tier.close()


def test_a_disk_reading_ahead_as_far_as_a_request_keeps_cold_reads_buffered(tmp_path: Path,
                                                                            monkeypatch) -> None:
    """The kernel's asynchronous readahead keeps an O_DIRECT request's worth in flight itself there
    (the development VM's disk: ``read_ahead_kb`` 8192), and leaves the pages cached."""
    monkeypatch.setattr(direct, "readahead_of", lambda fd: page_io._DIRECT_READ)
    tier = tier_at(tmp_path, "direct")
    n = (32 << 20) // PAGE
    buf, pages = aligned_pages(n, seed=15)
    names = [b"ahead-%03d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n
    fds: list[int] = []
    read = direct.preadv_all

    def noted(fd: int, segments, offset: int) -> int:
        fds.append(fd)
        return read(fd, segments, offset)

    monkeypatch.setattr(direct, "preadv_all", noted)
    out, dst = aligned_pages(n, seed=0)
    assert tier.get_into(names, dst) == [True] * n and np.array_equal(out, buf)
    assert fds and tier._io._direct_fd not in fds
    tier.close()


def test_a_device_refusing_o_direct_reads_gets_them_buffered(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(direct, "readahead_of", lambda fd: None)  # no block device to ask
    tier = tier_at(tmp_path, "direct")
    n = (32 << 20) // PAGE
    buf, pages = aligned_pages(n, seed=13)
    names = [b"einval-read-%03d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n
    read = direct.preadv_all
    refused: list[int] = []

    def refuse_direct(fd: int, segments, offset: int) -> int:
        if fd == tier._io._direct_fd:  # a logical block larger than 4 KiB
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return read(fd, segments, offset)

    monkeypatch.setattr(direct, "preadv_all", refuse_direct)
    out, dst = aligned_pages(n, seed=0)
    assert tier.get_into(names, dst) == [True] * n and np.array_equal(out, buf)
    assert refused and tier.stats().disk_errors == 0
    tier.close()


@pytest.mark.parametrize("call", ["cachestat", "mincore"])
def test_residency_says_whether_a_range_is_wholly_in_the_page_cache(tmp_path: Path, call: str) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(4 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        resident = direct.Residency(fd)
        resident._cachestat = call == "cachestat"
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert resident.cached(0, 4 << 20) is False
        os.pread(fd, 1 << 20, 1 << 20)  # the second MiB only (no readahead past it: see below)
        os.posix_fadvise(fd, 2 << 20, 2 << 20, os.POSIX_FADV_DONTNEED)
        assert resident.cached(1 << 20, 1 << 20) is True
        assert resident.cached((1 << 20) + 4096, 8192) is True
        assert resident.cached(0, 4 << 20) is False
        _read_file(path)
        assert resident.cached(0, 4 << 20) is True
    finally:
        os.close(fd)


def test_bounced_writes_move_every_byte_at_any_alignment(tmp_path: Path) -> None:
    try:
        fd = os.open(tmp_path / "b.bin", os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o644)
    except OSError as e:
        pytest.skip(f"the file system under {tmp_path} has no O_DIRECT ({e})")
    size = 2 * direct.BOUNCE_BYTES + 5000  # three bounce loads, the last one padded with zeros
    end = -(-size // 4096) * 4096
    data = np.random.default_rng(14).integers(0, 256, size + 3, dtype=np.uint8)
    mv = memoryview(data)
    try:
        os.posix_fallocate(fd, 0, end + 4096)
        direct.write_direct(fd, [mv[3:1001], mv[1001:size - 7000], mv[size - 7000:]], 0)  # odd addresses
        direct.write_direct(fd, [memoryview(bytes(data[:4096]))], end)  # read-only memory
    finally:
        os.close(fd)
    written = (tmp_path / "b.bin").read_bytes()
    assert written[:size] == data[3:].tobytes()
    assert written[size:end] == bytes(end - size)
    assert written[end:end + 4096] == data[:4096].tobytes()


def test_a_read_from_memory_takes_what_the_page_cache_holds_and_never_waits_for_the_rest(
        tmp_path: Path) -> None:
    """``get_into_cached`` (where the store reads first when it must be able to give a read up): pages
    in the page cache read and verified on the calling thread, the others not read, and neither
    counted as misses nor taken for damage."""
    tier = tier_at(tmp_path, "buffered")
    n = 16
    buf, pages = aligned_pages(n, seed=21)
    names = [b"cached-%d" % i for i in range(n)]
    assert tier.put_from(names, pages).ok == (True,) * n
    drop_from(tmp_path / "pages.bin", 8 * PAGE)  # the last eight (extents follow each other from 0)
    before = tier.stats().counts
    out, dst = aligned_pages(n, seed=0)
    assert tier.get_into_cached(names, dst) == [True] * 8 + [False] * 8
    assert np.array_equal(out[:8 * PAGE], buf[:8 * PAGE])
    after = tier.stats().counts
    assert (after.get_hits - before.get_hits, after.get_misses, after.corrupt_pages) == (8, 0, 0)
    assert tier.contains(names) == [True] * n
    ok, got = read_all(tier, names, n)  # the read that waits takes them all
    assert ok == [True] * n and np.array_equal(got, buf)
    tier.close()


def test_a_flipped_byte_read_from_memory_is_a_counted_miss(tmp_path: Path) -> None:
    tier = tier_at(tmp_path, "buffered")
    _, pages = aligned_pages(3, seed=22)
    names = [b"cached-flip-%d" % i for i in range(3)]
    assert tier.put_from(names, pages).ok == (True,) * 3
    with open(tmp_path / "pages.bin", "r+b") as f:  # through the page cache: the page stays in it
        f.seek(PAGE + 7)
        byte = f.read(1)
        f.seek(PAGE + 7)
        f.write(bytes([byte[0] ^ 0x40]))
    _, dst = aligned_pages(3, seed=0)
    assert tier.get_into_cached(names, dst) == [True, False, True]
    assert tier.stats().counts.corrupt_pages == 1 and tier.contains(names) == [True, False, True]
    tier.close()


def test_a_file_system_that_cannot_read_without_waiting_leaves_every_read_to_wait(
        tmp_path: Path, monkeypatch) -> None:
    tier = tier_at(tmp_path, "buffered")
    buf, pages = aligned_pages(2, seed=23)
    names = [b"nowait-%d" % i for i in range(2)]
    assert tier.put_from(names, pages).ok == (True,) * 2
    asked: list[int] = []

    def unsupported(fd: int, segments, offset: int) -> int:
        asked.append(offset)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(direct, "preadv_cached", unsupported)
    _, dst = aligned_pages(2, seed=0)
    assert tier.get_into_cached(names, dst) == [False, False]
    assert tier.get_into_cached(names, dst) == [False, False]
    assert len(asked) == 1  # asked once, then never again
    assert tier.stats().disk_errors == 0
    ok, got = read_all(tier, names, 2)
    assert ok == [True, True] and np.array_equal(got, buf)
    tier.close()
