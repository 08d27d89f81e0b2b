"""The SSD tier on a disk that starts failing: misses and one log line, never a dead process.

A real ext4 file system on a loop device holds the tier. Once a child process (standing in for
SGLang's scheduler) has stored its pages, the device is shrunk under the file system, so every read
of a block past the new end is an I/O error, the way a dying SSD or a detached volume answers. The
child then pages out its maps of the index (what memory pressure does, on demand:
``MADV_PAGEOUT``) and uses the tier. LMDB reads its index through those maps, where a page read
back from a failing disk was SIGBUS: the whole process died on the next ``contains``, with
``writemap`` on or off. Root only (loop devices and a mount), as CI runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NPAGES = 3000  # 4 KiB each; their records fill an index of several dozen pages, a B-tree of depth 2+

CHILD = textwrap.dedent("""
    import ctypes, json, logging, os, sys
    sys.path.insert(0, sys.argv[3])
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.errors import TierError
    from mooncake_sgl.tiers.ssd import LmdbTier

    logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(message)s")
    path, writemap = sys.argv[1], sys.argv[2] == "writemap"
    keys = [b"page-%05d" % i for i in range(int(sys.argv[4]))]
    def content(key):
        return key * (4096 // len(key)) + b"." * (4096 % len(key))
    tier = LmdbTier(LmdbTierConfig(path=path, capacity="48MiB", writemap=writemap))
    for i in range(0, len(keys), 128):
        batch = keys[i:i + 128]
        assert all(tier.put_from(batch, [[memoryview(content(k))] for k in batch]).ok), i
    os.sync()
    print("stored", flush=True)
    sys.stdin.readline()  # the parent has failed the disk

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    maps = 0
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith(("data.mdb", "lock.mdb")):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            maps += 1
            libc.madvise(lo, hi - lo, 21)  # MADV_PAGEOUT; a locked map refuses it (EINVAL)
    out = {"maps": maps, "calls": {}, "wrong": []}
    def call(name, fn):
        try:
            out["calls"][name] = fn()
        except TierError as e:
            out["calls"][name] = "TierError: " + str(e)
    call("contains", lambda: sum(tier.contains(keys)))
    dest = [[memoryview(bytearray(4096))] for _ in keys[:256]]
    def get():
        hits = tier.get_into(keys[:256], dest)
        out["wrong"] = [k.decode() for k, h, d in zip(keys, hits, dest) if h and bytes(d[0]) != content(k)]
        return sum(hits)
    call("get", get)
    call("put", lambda: sum(tier.put_from([b"after"], [[memoryview(content(b"after"))]]).ok))
    call("remove", lambda: tier.remove(keys[:10]))
    call("contains_again", lambda: sum(tier.contains(keys)))
    wanted = ("io_errors", "disk_errors", "index_locked_bytes")
    out["stats"] = {k: v for k, v in tier.stats().as_dict().items() if k in wanted}
    tier.close()
    print(json.dumps(out), flush=True)
""")


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture
def loop_fs(tmp_path: Path):
    """An ext4 file system on a loop device over a file, and a way to fail the device's tail."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a loop device and a mount stand in for the failing disk")
    if not all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "mount", "umount")):
        pytest.skip("needs util-linux's losetup and mount and e2fsprogs' mkfs.ext4")
    image = tmp_path / "disk.img"
    image.write_bytes(b"")
    os.truncate(image, 160 << 20)
    made = run(["losetup", "--find", "--show", str(image)])
    if made.returncode != 0:
        pytest.skip(f"this machine gives no loop device: {made.stderr.strip()}")
    dev = made.stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        assert run(["mkfs.ext4", "-q", "-F", dev]).returncode == 0
        mounted = run(["mount", dev, str(mnt)])
        if mounted.returncode != 0:
            pytest.skip(f"this machine lets no process mount a file system: {mounted.stderr.strip()}")

        def fail_disk() -> None:
            # Reads past 2 MiB (the file system's first metadata) now fail as a dying disk's do.
            os.truncate(image, 2 << 20)
            assert run(["losetup", "--set-capacity", dev]).returncode == 0
            Path("/proc/sys/vm/drop_caches").write_text("3\n")

        yield mnt, fail_disk
    finally:
        run(["umount", "-l", str(mnt)])
        run(["losetup", "-d", dev])


def use_tier_on_failing_disk(loop_fs, writemap: bool, wrapper: list[str]) -> tuple[dict, str]:
    mnt, fail_disk = loop_fs
    child = subprocess.Popen(
        [*wrapper, sys.executable, "-c", CHILD, str(mnt / "tier"),
         "writemap" if writemap else "pwrite", str(REPO), str(NPAGES)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "stored", child.stderr.read()
        fail_disk()
        stdout, stderr = child.communicate("go\n", timeout=120)
    finally:
        child.kill()
    assert child.returncode != -signal.SIGBUS, f"SIGBUS: the failing disk killed it\n{stderr[-2000:]}"
    assert child.returncode == 0, f"rc {child.returncode}: {stderr[-3000:]}"
    return json.loads(stdout.strip().splitlines()[-1]), stderr


def answers_or_misses(out: dict) -> None:
    """Every call answered: a count, or a tier error (which the store turns into a miss)."""
    for name, said in out["calls"].items():
        assert isinstance(said, int) or said.startswith("TierError: "), (name, said)
    assert out["wrong"] == [], out
    assert out["calls"]["contains"] in (NPAGES,) or str(out["calls"]["contains"]).startswith("TierError")


@pytest.mark.parametrize("writemap", [pytest.param(True, id="writemap"), pytest.param(False, id="pwrite")])
def test_a_failing_disk_under_a_paged_out_index_is_misses_not_sigbus(loop_fs, writemap: bool) -> None:
    out, stderr = use_tier_on_failing_disk(loop_fs, writemap, [])
    answers_or_misses(out)
    assert out["maps"] >= 2, out
    # The index stayed in memory (locked), so lookups still answer; page bytes are gone with the
    # disk, so reads are misses, counted, logged once, and nothing wrong was handed out.
    assert out["calls"]["contains"] == NPAGES, out
    assert out["calls"]["get"] == 0 and out["stats"]["disk_errors"] > 0, out
    assert stderr.count("SSD tier read failed, answering a miss") == 1, stderr
    assert "Input/output error" in stderr and "pages.bin" in stderr, stderr
    assert out["stats"]["index_locked_bytes"] > 0, out


def test_without_leave_to_lock_the_index_is_read_in_before_every_call(loop_fs) -> None:
    """No CAP_IPC_LOCK and a 64 KiB memlock limit (a default container): one warning, and the paged
    out index is read in again before each call, where the disk's error is an error."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs util-linux's setpriv to drop CAP_IPC_LOCK")
    wrapper = ["setpriv", "--bounding-set", "-ipc_lock", "prlimit", "--memlock=65536:65536"]
    if shutil.which("prlimit") is None:
        pytest.skip("needs util-linux's prlimit to lower the memlock limit")
    out, stderr = use_tier_on_failing_disk(loop_fs, False, wrapper)
    answers_or_misses(out)
    assert stderr.count("cannot lock its index in memory") == 1, stderr
    assert out["stats"]["index_locked_bytes"] < 65536, out
    failed = [name for name, said in out["calls"].items() if str(said).startswith("TierError")]
    assert "contains" in failed, out
    assert stderr.count("the disk failed reading the tier's index") == 1, stderr


def test_an_index_truncated_under_the_tier_is_refused_not_sigbus(tmp_path: Path) -> None:
    """Something outside the process (a tool, an operator's truncate, a copy over it) shrinks
    data.mdb below the pages LMDB uses: the next call is an error naming it, not SIGBUS."""
    code = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[2])
        from mooncake_sgl.config import LmdbTierConfig
        from mooncake_sgl.errors import TierError
        from mooncake_sgl.tiers.ssd import LmdbTier
        tier = LmdbTier(LmdbTierConfig(path=sys.argv[1], capacity="48MiB", writemap=False))
        keys = [b"page-%05d" % i for i in range(2000)]
        for i in range(0, len(keys), 200):
            tier.put_from(keys[i:i + 200], [[memoryview(bytes(4096))] for _ in keys[i:i + 200]])
        os.truncate(os.path.join(sys.argv[1], "data.mdb"), 8192)
        try:
            print("answered", sum(tier.contains(keys)))
        except TierError as e:
            print("refused", e)
    """)
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tier"), str(REPO)],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, f"rc {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.startswith("refused") and "truncated to 8192 bytes" in child.stdout, child.stdout
    assert "data.mdb was truncated to 8192 bytes under the tier" in child.stderr
