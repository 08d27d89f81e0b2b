"""The LMDB tier on real LMDB files: conformance, warm restart after SIGKILL, corruption, full map."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from mooncake_sgl.api import Tier
from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.errors import TierClosed, TierError
from mooncake_sgl.tiers import build_tier
from mooncake_sgl.tiers.ssd import RECORD_BYTES, LmdbTier, aside
from mooncake_sgl.tiers.ssd import tier as lmdb_mod

from .conformance import ParkedPage, TierConformance, empty_like, key, make_page, same
from .mounts import run_with_mounts

REPO = Path(__file__).resolve().parents[2]


def lmdb_tier(path: Path, capacity: int | str = "64MiB", sync: bool = True,
              writemap: bool = False) -> LmdbTier:
    return LmdbTier(LmdbTierConfig(path=str(path), capacity=capacity, sync=sync, writemap=writemap))


def page_bytes(name: bytes, nbytes: int) -> bytes:
    """Deterministic, key-specific page content (the killed writer and the reader agree on it)."""
    block = hashlib.blake2b(name, digest_size=64).digest()
    return (block * (nbytes // 64 + 1))[:nbytes]


class TestLmdbConformance(TierConformance):
    writemap = False

    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.n = 0

    def make_tier(self, capacity_bytes: int) -> Tier:
        self.n += 1  # LMDB's map has a 1 MiB floor in the config; the suite's small tier still fills
        return lmdb_tier(self.tmp / f"t{self.n}", capacity=max(capacity_bytes, 1 << 20), sync=False,
                         writemap=self.writemap)


class TestLmdbWritemapConformance(TestLmdbConformance):
    writemap = True


# A writer that acknowledges each committed batch on stdout and keeps writing until it is killed.
WRITER = textwrap.dedent("""
    import sys
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier
    from tests.tiers.test_lmdb_tier import page_bytes
    path, per_batch, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sync, writemap = sys.argv[4] == "sync", sys.argv[5] == "writemap"
    tier = LmdbTier(LmdbTierConfig(path=path, capacity="1GiB", sync=sync, writemap=writemap))
    b = 0
    while True:
        keys = [b"batch%06d-page%03d" % (b, i) for i in range(per_batch)]
        pages = [[memoryview(page_bytes(k, nbytes))] for k in keys]
        assert tier.put_from(keys, pages).ok == (True,) * per_batch
        print(b, flush=True)
        b += 1
""")


@pytest.mark.parametrize("sync", ["sync", "nosync"])
@pytest.mark.parametrize("writemap", ["writemap", "pwrite"])
def test_pages_survive_sigkill_of_the_writer_and_are_found_by_a_new_process(
        tmp_path: Path, sync: str, writemap: str) -> None:
    per_batch, nbytes = 32, 128 * 1024
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), str(per_batch), str(nbytes), sync, writemap],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked: list[int] = []
    try:
        assert child.stdout is not None
        while len(acked) < 6:
            line = child.stdout.readline()
            assert line, f"writer died early: {child.stderr.read() if child.stderr else ''}"
            acked.append(int(line))
        # Killed while it is writing the next batch: that transaction must vanish whole.
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
        acked += [int(x) for x in rest.split()]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL

    tier = lmdb_tier(tmp_path)
    found = dict(tier.scan())
    batches: dict[int, int] = {}
    for k, n in found.items():
        assert n == nbytes
        batches[int(k[5:11])] = batches.get(int(k[5:11]), 0) + 1
    assert set(acked) <= set(batches), "an acknowledged batch was lost"
    assert all(c == per_batch for c in batches.values()), f"a batch was torn: {batches}"
    keys = sorted(found)
    out = [[memoryview(bytearray(nbytes))] for _ in keys]
    assert tier.get_into(keys, out) == [True] * len(keys)
    assert all(bytes(o[0]) == page_bytes(k, nbytes) for k, o in zip(keys, out))
    assert tier.stats().counts.corrupt_pages == 0
    # The writer may have died holding LMDB's write lock: a new writer must still get it.
    fresh = [b"after-restart-%d" % i for i in range(4)]
    assert tier.put_from(fresh, [[memoryview(page_bytes(k, 4096))] for k in fresh]).ok == (True,) * 4
    assert tier.remove(fresh[:1]) == 1
    tier.close()


def test_flipped_bytes_in_the_file_are_a_counted_miss_and_the_page_is_removed(tmp_path: Path) -> None:
    nbytes = 64 * 1024
    names = [b"payload-flip", b"checksum-flip", b"magic-flip", b"intact"]
    tier = lmdb_tier(tmp_path)
    assert tier.put_from(names, [[memoryview(page_bytes(k, nbytes))] for k in names]).ok == (True,) * 4
    with tier._index.env.begin(db=tier._index.pages) as txn:  # white-box: where each record sits
        records = {k: txn.get(k) for k in names}
    tier.close()

    pages_file = tmp_path / "pages.bin"
    raw = bytearray(pages_file.read_bytes())
    page = page_bytes(b"payload-flip", nbytes)
    off = raw.find(page)
    assert off >= 0 and raw.find(page, off + 1) == -1
    raw[off + nbytes // 2] ^= 0x01  # one bit in the middle of the KV bytes
    pages_file.write_bytes(bytes(raw))

    index_file = tmp_path / "data.mdb"
    raw = bytearray(index_file.read_bytes())

    def record_at(name: bytes) -> int:
        at = raw.find(records[name])
        assert at > 0 and raw.find(records[name], at + 1) == -1
        return at

    raw[record_at(b"checksum-flip") + RECORD_BYTES - 1] ^= 0xFF  # top byte of the stored checksum
    raw[record_at(b"magic-flip")] ^= 0x20  # first byte of the magic
    index_file.write_bytes(bytes(raw))

    tier = lmdb_tier(tmp_path)
    # A record that is not ours is dropped at open; existence alone does not read page bytes.
    assert tier.stats().counts.dropped_at_open == 1
    assert tier.contains(names) == [True, True, False, True]
    out = [[memoryview(bytearray(nbytes))] for _ in names]
    assert tier.get_into(names, out) == [False, False, False, True]
    assert bytes(out[3][0]) == page_bytes(b"intact", nbytes)
    assert tier.stats().counts.corrupt_pages == 2
    assert tier.contains(names) == [False, False, False, True]
    tier.close()
    # The removal was committed: a restart does not find the corrupt pages again.
    tier = lmdb_tier(tmp_path)
    assert [k for k, _ in tier.scan()] == [b"intact"]
    tier.close()


def test_a_full_tier_refuses_the_pages_that_do_not_fit_without_raising(tmp_path: Path) -> None:
    tier = lmdb_tier(tmp_path, capacity="4MiB", sync=False)
    names = [b"p%03d" % i for i in range(40)]
    pages = [[memoryview(page_bytes(k, 256 * 1024))] for k in names]
    res = tier.put_from(names, pages).ok
    fitted = res.count(True)
    assert 0 < fitted < 40 and res == (True,) * fitted + (False,) * (40 - fitted)
    assert tier.stats().counts.put_full == 40 - fitted
    usage = tier.usage()
    assert usage.capacity_bytes == 4 << 20 and usage.pages == fitted
    # What the store sizes evictions with matches what the pages take.
    assert fitted * tier.footprint(256 * 1024) <= usage.used_bytes <= usage.capacity_bytes
    assert usage.free_bytes < tier.footprint(256 * 1024)
    out = [[memoryview(bytearray(256 * 1024))] for _ in range(fitted)]
    assert tier.get_into(names[:fitted], out) == [True] * fitted
    tier.close()


def test_pages_removed_from_a_full_tier_make_room_for_the_very_next_put(tmp_path: Path) -> None:
    # What the store does when a put comes back False: evict, then put again. LMDB reuses freed
    # pages only a transaction later; the tier must hide that, round after round.
    tier = lmdb_tier(tmp_path, capacity="4MiB", sync=False)
    nbytes = 256 * 1024
    live: list[bytes] = []
    for rnd in range(6):
        names = [b"r%d-p%03d" % (rnd, i) for i in range(8)]
        res = tier.put_from(names, [[memoryview(page_bytes(k, nbytes))] for k in names]).ok
        live += [k for k, ok in zip(names, res) if ok]
        missing = [k for k, ok in zip(names, res) if not ok]
        if missing:
            victims, live = live[:len(missing)], live[len(missing):]
            assert tier.remove(victims) == len(victims)
            again = tier.put_from(missing, [[memoryview(page_bytes(k, nbytes))] for k in missing]).ok
            assert again == (True,) * len(missing), f"round {rnd}: freed pages were not reusable"
            live += missing
    assert sorted(k for k, _ in tier.scan()) == sorted(live)
    out = [[memoryview(bytearray(nbytes))] for _ in live]
    assert tier.get_into(live, out) == [True] * len(live)
    assert all(bytes(o[0]) == page_bytes(k, nbytes) for k, o in zip(live, out))
    assert os.path.getsize(tmp_path / "pages.bin") <= 4 << 20
    tier.close()


def test_space_an_old_reader_may_still_read_is_not_reused_and_puts_are_per_key_false(
        tmp_path: Path) -> None:
    # A reader holding an old snapshot may still read the extents of pages removed since: they
    # must not be overwritten under it, so churn under the capacity budget runs out of room, and
    # that must surface as False, never as an exception.
    tier = lmdb_tier(tmp_path, capacity="4MiB", sync=False)
    nbytes = 256 * 1024
    first = [b"first-%02d" % i for i in range(8)]
    assert tier.put_from(first, [[memoryview(page_bytes(k, nbytes))] for k in first]).ok == (True,) * 8
    old_reader = tier._index.env.begin(db=tier._index.pages)  # white-box: a slow reader in another process
    refused, live = 0, first
    for rnd in range(6):
        tier.remove(live)
        names = [b"r%02d-p%02d" % (rnd, i) for i in range(12)]
        res = tier.put_from(names, [[memoryview(page_bytes(k, nbytes))] for k in names]).ok
        refused += res.count(False)
        live = [k for k, ok in zip(names, res) if ok]
    assert refused and tier.stats().counts.put_full == refused
    # The old snapshot still reads the first pages' bytes, intact.
    for k in first:
        rec = lmdb_mod.parse_record(old_reader.get(k))
        assert rec is not None
        with open(tmp_path / "pages.bin", "rb") as f:
            assert os.pread(f.fileno(), nbytes, rec[0]) == page_bytes(k, nbytes)
    old_reader.abort()
    tier.remove(live)
    names = [b"after-%02d" % i for i in range(12)]
    assert tier.put_from(names, [[memoryview(page_bytes(k, nbytes))] for k in names]).ok == (True,) * 12
    tier.close()


def test_a_second_process_sees_pages_committed_by_another(tmp_path: Path) -> None:
    tier = lmdb_tier(tmp_path)
    code = ("import sys; from mooncake_sgl.tiers.ssd import LmdbTier; from mooncake_sgl.config import "
            "LmdbTierConfig; t = LmdbTier(LmdbTierConfig(path=sys.argv[1], capacity='64MiB')); "
            "assert t.put_from([b'from-child'], [[memoryview(b'x' * 5000)]]).ok == (True,); t.close()")
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=env, check=True, timeout=60)
    out = [memoryview(bytearray(5000))]
    assert tier.get_into([b"from-child"], [out]) == [True] and bytes(out[0]) == b"x" * 5000
    tier.close()


def test_warm_restart_scan_lists_every_page_across_scan_chunks(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmdb_mod, "_SCAN_CHUNK", 3)  # force several read transactions
    tier = lmdb_tier(tmp_path, sync=False)
    pages = {key(i): make_page(i, 1000 + i, nseg=1) for i in range(10)}
    assert tier.put_from(list(pages), list(pages.values())).ok == (True,) * 10
    tier.close()
    tier = lmdb_tier(tmp_path)
    assert dict(tier.scan()) == {k: 1000 + i for i, k in enumerate(pages)}
    assert tier.page_size_of(key(3)) == 1003 and tier.page_size_of(key(99)) is None
    out = empty_like(pages[key(7)])
    assert tier.get_into([key(7)], [out]) == [True] and same(pages[key(7)], out)
    tier.close()


def test_wrong_size_destination_is_a_miss_but_the_page_is_kept(tmp_path: Path) -> None:
    tier = lmdb_tier(tmp_path, sync=False)
    tier.put_from([key(1)], [make_page(1, 4096)])
    assert tier.get_into([key(1)], [[memoryview(bytearray(4096))]]) == [False]
    s = tier.stats().counts
    assert s.get_size_mismatch == 1 and s.corrupt_pages == 0
    assert tier.contains([key(1)]) == [True]
    tier.close()


def test_oversized_key_is_a_per_key_false(tmp_path: Path) -> None:
    tier = lmdb_tier(tmp_path, sync=False)
    page = make_page(1, 1024)
    assert tier.put_from([b"k" * 600, b"", key(1)], [page, page, page]).ok == (False, False, True)
    assert tier.contains([b"k" * 600, b""]) == [False, False]
    assert tier.get_into([b""], [empty_like(page)]) == [False] and tier.remove([b""]) == 0
    tier.close()


def test_build_tier_gives_each_rank_its_own_environment(tmp_path: Path) -> None:
    cfg = LmdbTierConfig(path=str(tmp_path / "cache"), capacity="16MiB", sync=False)
    t0, t1 = build_tier(cfg, rank_suffix="tp0"), build_tier(cfg, rank_suffix="tp1")
    assert isinstance(t0, LmdbTier) and isinstance(t1, LmdbTier)
    assert (t0.path, t1.path) == (str(tmp_path / "cache" / "tp0"), str(tmp_path / "cache" / "tp1"))
    assert t0.put_from([key(1)], [make_page(1, 1024)]).ok == (True,)
    assert t1.contains([key(1)]) == [False]
    t0.close()
    t1.close()
    assert (tmp_path / "cache" / "tp0" / "data.mdb").exists()


def test_unwritable_path_is_a_clear_tier_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(TierError, match="cannot open LMDB tier"):
        lmdb_tier(blocker / "sub")


def test_close_waits_for_a_read_in_flight_and_refuses_new_calls(tmp_path: Path) -> None:
    # Closing unmaps the file; a reader still copying out of the map must finish first.
    tier = lmdb_tier(tmp_path, sync=False)
    page = make_page(1, 4096)
    assert tier.put_from([key(1)], [page]).ok == (True,)
    dst = ParkedPage(empty_like(page))
    result: list[list[bool]] = []
    reader = threading.Thread(target=lambda: result.append(tier.get_into([key(1)], [dst])))
    reader.start()
    assert dst.parked.wait(10)
    closer = threading.Thread(target=tier.close)
    closer.start()
    deadline = time.monotonic() + 10
    while not tier._closed and time.monotonic() < deadline:  # white-box: close() has begun
        time.sleep(0.01)
    closer.join(0.2)
    assert closer.is_alive(), "close must wait for the read in flight"
    with pytest.raises(TierClosed):
        tier.contains([key(1)])
    dst.go.set()
    reader.join(10)
    closer.join(10)
    assert not closer.is_alive() and result == [[True]] and same(page, dst)


def test_a_tier_with_damaged_lmdb_structure_starts_empty_and_keeps_the_damaged_files(tmp_path: Path) -> None:
    # A machine crash with sync off can leave LMDB's own pages (not ours, which are checksummed)
    # inconsistent. The tier must still start: empty, with the damaged files moved aside.
    tier = lmdb_tier(tmp_path / "db", sync=False)
    assert tier.put_from([key(i) for i in range(4)], [make_page(i, 4096) for i in range(4)]).ok == (True,) * 4
    tier.close()
    data = tmp_path / "db" / "data.mdb"
    with open(data, "r+b") as f:  # both meta pages
        f.write(os.urandom(2 * 4096))
    reopened = lmdb_tier(tmp_path / "db", sync=False)
    try:
        assert reopened.contains([key(i) for i in range(4)]) == [False] * 4
        assert [p.name.startswith("db.damaged-") for p in tmp_path.iterdir()].count(True) == 1
        page = make_page(9, 4096)
        assert reopened.put_from([key(9)], [page]).ok == (True,)
        out = empty_like(page)
        assert reopened.get_into([key(9)], [out]) == [True] and same(page, out)
    finally:
        reopened.close()


def damage_index(db: Path) -> None:
    """Overwrite both LMDB meta pages, as a machine crash with sync off can leave them."""
    with open(db / "data.mdb", "r+b") as f:
        f.write(os.urandom(2 * 4096))


def fill_and_damage(db: Path, pages: int = 8, seg_bytes: int = 32 << 10) -> None:
    tier = lmdb_tier(db, sync=False)
    assert tier.put_from([key(i) for i in range(pages)],
                         [make_page(i, seg_bytes) for i in range(pages)]).ok == (True,) * pages
    tier.close()
    damage_index(db)


def moved_aside(db: Path) -> list[Path]:
    return sorted(p for p in db.parent.iterdir() if p.name.startswith(db.name + ".damaged-"))


def test_damaged_directories_release_their_page_files_and_only_the_newest_few_stay(tmp_path: Path) -> None:
    # Each one kept its whole preallocated pages.bin, and nothing deleted them: after two damage
    # events a 320 MiB disk could store 0 of 200 pages.
    db = tmp_path / "db"
    for _ in range(aside.KEEP + 2):
        fill_and_damage(db)
        lmdb_tier(db, sync=False).close()  # moves it aside
    kept = moved_aside(db)
    assert len(kept) == aside.KEEP
    assert [p for p in kept if (p / "pages.bin").exists()] == []
    # The index stays for a post-mortem, with why it was moved.
    assert all((p / "data.mdb").exists() and "probe process" in (p / "DAMAGED.txt").read_text()
               for p in kept)


def test_a_damaged_directory_an_older_version_left_loses_its_page_file(tmp_path: Path) -> None:
    db = tmp_path / "db"
    old = tmp_path / "db.damaged-20240101-000000-1234"
    old.mkdir()
    (old / "pages.bin").write_bytes(b"\0" * (1 << 20))
    (old / "data.mdb").write_bytes(b"index")
    fill_and_damage(db)
    lmdb_tier(db, sync=False).close()
    assert len(moved_aside(db)) == 2 and not (old / "pages.bin").exists() and (old / "data.mdb").exists()


def test_two_damage_events_within_one_second_are_both_moved_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The name had the time to the second and the pid: the second rename met the first's directory.
    monkeypatch.setattr(time, "strftime", lambda fmt, *args: "20250101-000000")
    db = tmp_path / "db"
    for _ in range(2):
        fill_and_damage(db)
        tier = lmdb_tier(db, sync=False)
        assert tier.contains([key(0)]) == [False]
        tier.close()
    assert len(moved_aside(db)) == 2


# Rounds of filling a tier on a small disk, each ended by damage to its index.
FILL_ROUNDS = textwrap.dedent("""
    import json, os, sys, time
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier
    db, rounds, npages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stored = []
    for r in range(rounds):
        tier = LmdbTier(LmdbTierConfig(path=db, capacity="48MiB", direct_io="buffered"))
        keys = [b"round%d-page%04d" % (r, i) for i in range(npages)]
        stored.append(sum(tier.put_from(keys, [[memoryview(os.urandom(128 << 10))] for _ in keys]).ok))
        tier.close()
        with open(os.path.join(db, "data.mdb"), "r+b") as f:
            f.write(os.urandom(2 * 4096))
        if r + 1 < rounds:
            time.sleep(1.1)  # a new second: this test is about disk, not the names (see above)
    print(json.dumps(stored))
""")


def test_after_damage_events_a_small_disk_still_takes_a_full_tier(tmp_path: Path) -> None:
    # 64 MiB of disk, 30 MiB of pages per round: the page files kept aside left no room by round 3.
    mnt = tmp_path / "disk"
    mnt.mkdir()
    child = run_with_mounts([f"mount -t tmpfs -o size=64m tmpfs {mnt}"], FILL_ROUNDS,
                            str(mnt / "db"), "3", "240")
    assert child.returncode == 0, child.stderr[-2000:]
    assert json.loads(child.stdout.splitlines()[-1]) == [240, 240, 240]


# Opens the tier at argv[1] and reports the error, if any; the log goes to stderr.
OPEN_REPORT = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.INFO)
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.errors import TierError
    from mooncake_sgl.tiers.ssd import LmdbTier
    try:
        LmdbTier(LmdbTierConfig(path=sys.argv[1], capacity="8MiB")).close()
        print(json.dumps({"error": None}))
    except TierError as e:
        print(json.dumps({"error": str(e)}))
""")


def filled(db: Path) -> list[memoryview]:
    tier = lmdb_tier(db, capacity="8MiB")
    page = make_page(1, 4096)
    assert tier.put_from([key(1)], [page]).ok == (True,)
    tier.close()
    return page


def assert_intact(db: Path, page: list[memoryview]) -> None:
    assert moved_aside(db) == []
    tier = lmdb_tier(db, capacity="8MiB")
    out = empty_like(page)
    assert tier.get_into([key(1)], [out]) == [True] and same(page, out)
    tier.close()


def test_an_intact_tier_on_a_read_only_file_system_is_named_so_and_left_as_it_is(tmp_path: Path) -> None:
    # It was called damaged: the log said it was moved aside (it was not) and the error told the
    # operator to delete an intact cache.
    src, ro = tmp_path / "src", tmp_path / "ro"
    ro.mkdir()
    page = filled(src / "db")
    child = run_with_mounts([f"mount --bind {src} {ro}", f"mount -o remount,bind,ro {ro}"],
                            OPEN_REPORT, str(ro / "db"))
    assert child.returncode == 0, child.stderr[-2000:]
    error = json.loads(child.stdout.splitlines()[-1])["error"]
    assert error is not None and "is on a read-only file system" in error and "nothing is damaged" in error
    assert "damaged (" not in error and "Delete" not in error and "moved" not in child.stderr
    assert_intact(src / "db", page)


@pytest.mark.parametrize("failure", [
    pytest.param(lambda path: OSError(errno.EROFS, os.strerror(errno.EROFS), path), id="oserror"),
    pytest.param(lambda path: lmdb.Error(f"{path}: {os.strerror(errno.EROFS)}"), id="lmdb-error"),
])
def test_an_open_refused_by_a_read_only_file_system_is_named_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Callable[[str], Exception]) -> None:
    page = filled(tmp_path / "db")

    def refuse(path: str, **_: object) -> None:
        raise failure(path)

    monkeypatch.setattr(lmdb, "open", refuse)
    with pytest.raises(TierError, match=r"db is on a read-only file system\. Its files were left as they "
                                        r"are \(nothing is damaged\): mount it read-write"):
        lmdb_tier(tmp_path / "db", capacity="8MiB")
    monkeypatch.undo()
    assert_intact(tmp_path / "db", page)


def test_a_directory_this_process_may_not_write_is_named_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Permissions stop no root process, so this one is simulated.
    page = filled(tmp_path / "db")
    lock = str(tmp_path / "db" / "lock.mdb")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: p != lock and real(p, mode, **kw))
    with pytest.raises(TierError, match=rf"not writable by this process \(no write permission on {lock}\)"
                                        ".*give this user write permission there"):
        lmdb_tier(tmp_path / "db", capacity="8MiB")
    monkeypatch.undo()
    assert_intact(tmp_path / "db", page)


def test_a_damaged_tier_that_cannot_be_moved_aside_is_not_logged_as_moved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fill_and_damage(tmp_path / "db")

    def refuse(src: str, dst: str) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), src)

    monkeypatch.setattr(os, "rename", refuse)
    with caplog.at_level(logging.INFO), pytest.raises(TierError, match=r"is damaged \(.*\) and is on a "
                                                      r"read-only file system, so it cannot be moved aside"):
        lmdb_tier(tmp_path / "db")
    assert "moved it to" not in caplog.text
