"""The SSD tier against damaged files: the process that opens them must never die.

Every damaged directory is opened in a child process, standing in for SGLang's scheduler: a crash
there (LMDB's ``IS_LEAF`` assertion, rc 134; SIGBUS, rc 135) is a failed test, not a dead pytest.
The child reports what it found as one JSON line; the test checks that damage was either moved
aside (the tier starts empty and serves) or confined to misses, and that no read ever returned
bytes other than those written.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.tiers.ssd import LmdbTier

REPO = Path(__file__).resolve().parents[2]
NBYTES = 64 * 1024
NPAGES = 48

# Opens the tier, reads every page it can, writes and reads one more; prints what it saw.
OPENER = textwrap.dedent("""
    import json, sys
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier
    from tests.adversarial.test_lmdb_truncation import content, names
    path, writemap = sys.argv[1], sys.argv[2] == "writemap"
    tier = LmdbTier(LmdbTierConfig(path=path, capacity="64MiB", writemap=writemap))
    keys = names()
    out = [[memoryview(bytearray(len(content(k))))] for k in keys]
    hits = tier.get_into(keys, out)
    wrong = [k.decode() for k, h, o in zip(keys, hits, out) if h and bytes(o[0]) != content(k)]
    fresh = [memoryview(content(b"after-damage"))]
    put = list(tier.put_from([b"after-damage"], [fresh]).ok)
    back = [memoryview(bytearray(len(fresh[0])))]
    got = tier.get_into([b"after-damage"], [back]) == [True] and bytes(back[0]) == bytes(fresh[0])
    print(json.dumps({"hits": sum(hits), "wrong": wrong, "put": put, "read_back": got}), flush=True)
    tier.close()
""")


def names() -> list[bytes]:
    return [b"page-%03d" % i for i in range(NPAGES)]


def content(key: bytes) -> bytes:
    seed = int.from_bytes(key[-3:], "little") if key[-3:].isdigit() else 7
    return random.Random(seed).randbytes(NBYTES)


def fill(path: Path, writemap: bool) -> None:
    tier = LmdbTier(LmdbTierConfig(path=str(path), capacity="64MiB", writemap=writemap))
    keys = names()
    for i in range(0, NPAGES, 16):  # several transactions: a B-tree of more than one page
        batch = keys[i:i + 16]
        assert tier.put_from(batch, [[memoryview(content(k))] for k in batch]).ok == (True,) * len(batch)
    tier.close()


def child_env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


def mode(writemap: bool) -> str:
    return "writemap" if writemap else "pwrite"


def open_in_child(path: Path, writemap: bool) -> dict:
    child = subprocess.run([sys.executable, "-c", OPENER, str(path), mode(writemap)],
                           cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, f"the opening process died (rc {child.returncode}): {child.stderr[-2000:]}"
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["wrong"] == [], "a read returned bytes that were never written under its key"
    assert report["put"] == [True] and report["read_back"], "the tier did not serve after the damage"
    return report


def used_bytes(data: Path) -> int:
    """End of the last LMDB page holding anything but zeros."""
    raw = np.fromfile(data, dtype=np.uint8)
    raw = raw[:len(raw) // 4096 * 4096].reshape(-1, 4096)
    return (int(np.flatnonzero(raw.any(axis=1))[-1]) + 1) * 4096


def moved_aside(path: Path) -> int:
    return sum(1 for p in path.parent.iterdir() if p.name.startswith(path.name + ".damaged-"))


WRITEMAP = [pytest.param(True, id="writemap"), pytest.param(False, id="pwrite")]


@pytest.mark.parametrize("writemap", WRITEMAP)
@pytest.mark.parametrize("keep", [0, 4096, 2 * 4096 + 100, 0.5, 0.9], ids=lambda k: f"keep-{k}")
def test_a_truncated_index_is_moved_aside_without_crashing_the_opener(
        tmp_path: Path, writemap: bool, keep: float) -> None:
    # Before the fix this died of LMDB's IS_LEAF assertion (rc 134, writemap) or SIGBUS (rc 135).
    db = tmp_path / "db"
    fill(db, writemap)
    data = db / "data.mdb"
    used = used_bytes(data)  # with writemap the file is the whole (sparse) map
    os.truncate(data, int(used * keep) if isinstance(keep, float) else keep)
    report = open_in_child(db, writemap)
    assert report["hits"] == 0 and moved_aside(db) == 1


@pytest.mark.parametrize("writemap", WRITEMAP)
@pytest.mark.parametrize("keep", [0.0, 0.37, 0.99], ids=lambda k: f"keep-{k}")
def test_a_truncated_page_file_loses_only_the_pages_past_the_cut(
        tmp_path: Path, writemap: bool, keep: float) -> None:
    db = tmp_path / "db"
    fill(db, writemap)
    pages = db / "pages.bin"
    written = NPAGES * NBYTES  # pages lie back to back from offset 0, in batch order
    cut = int(written * keep)
    os.truncate(pages, cut)
    report = open_in_child(db, writemap)
    assert report["hits"] == cut // NBYTES and moved_aside(db) == 0


@pytest.mark.parametrize("writemap", WRITEMAP)
def test_flipped_bytes_anywhere_in_the_index_never_crash_or_give_wrong_bytes(
        tmp_path: Path, writemap: bool) -> None:
    rnd = random.Random(20261130)
    for trial in range(3):
        db = tmp_path / f"db{trial}"
        fill(db, writemap)
        data = db / "data.mdb"
        used = used_bytes(data)
        with open(data, "r+b") as f:
            for _ in range(8):  # into LMDB's meta, branch and leaf pages, keys and records alike
                at = rnd.randrange(used)
                f.seek(at)
                byte = f.read(1)[0] ^ (1 << rnd.randrange(8))
                f.seek(at)
                f.write(bytes([byte]))
        open_in_child(db, writemap)


WRITER = textwrap.dedent("""
    import sys
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier
    from tests.adversarial.test_lmdb_truncation import content
    tier = LmdbTier(LmdbTierConfig(path=sys.argv[1], capacity="256MiB", writemap=sys.argv[2] == "writemap"))
    b = 0
    while True:
        keys = [b"b%04d-%03d" % (b, i) for i in range(64)]
        assert tier.put_from(keys, [[memoryview(content(k))] for k in keys]).ok == (True,) * 64
        print(b, flush=True)
        b += 1
        tier.remove(keys[::3])  # freed extents are reused by the next batches
""")


@pytest.mark.parametrize("writemap", WRITEMAP)
def test_sigkill_mid_batch_leaves_every_acknowledged_page_readable(tmp_path: Path, writemap: bool) -> None:
    db = tmp_path / "db"
    env = child_env()
    rnd = random.Random(7)
    acked: list[int] = []
    for _ in range(2):  # killed at a different point of a batch each time
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(db), mode(writemap)],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            first = child.stdout.readline()
            assert first, child.stderr.read() if child.stderr else ""
            # A random moment inside a later batch (a batch takes ~10-50 ms here).
            subprocess.run(["sleep", f"{rnd.uniform(0.01, 0.2):.3f}"], check=True)
            child.send_signal(signal.SIGKILL)
            rest, _ = child.communicate(timeout=30)
            acked += [int(first)] + [int(x) for x in rest.split()]
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    tier = LmdbTier(LmdbTierConfig(path=str(db), capacity="256MiB", writemap=writemap))
    try:
        found = dict(tier.scan())
        keys = sorted(found)
        out = [[memoryview(bytearray(found[k]))] for k in keys]
        assert tier.get_into(keys, out) == [True] * len(keys)
        assert all(bytes(o[0]) == content(k) for k, o in zip(keys, out))
        # Each writer restarted at batch 0: a batch acknowledged by any of them is fully there
        # (less the pages it removed itself).
        for b in set(acked):
            want = [b"b%04d-%03d" % (b, i) for i in range(64) if i % 3]
            assert all(k in found for k in want), f"acknowledged batch {b} lost pages"
        assert tier.stats().counts.corrupt_pages == 0
    finally:
        tier.close()
