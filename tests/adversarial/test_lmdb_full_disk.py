"""The SSD tier on a full file system: pages are refused, the process never dies, nothing stored is
lost, room made by removing pages is used again, and the store evicts there to keep writing (the
tier stays a cache of the newest pages the disk can hold, not a freezer of the oldest).

Each case runs in a child process on its own 16 MiB tmpfs, mounted in a private mount namespace
(``unshare``): the one way to fill a real file system here without filling the machine's disk. A
SIGBUS in the child (LMDB writing through its memory map into a hole of a full file system) shows
as its exit status."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_MOUNT = 97  # the child's exit status when the mount namespace or the mount was refused

CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[3])
from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.tiers.ssd import LmdbTier

root, writemap = sys.argv[1], sys.argv[2] == "writemap"
PAGE = 256 << 10
def page(i):
    return bytes([i % 251]) * PAGE
def key(i):
    return f"page-{i}".encode()
def readable(tier, ids):
    bad = []
    for i in ids:
        out = memoryview(bytearray(PAGE))
        if tier.get_into([key(i)], [[out]]) != [True] or bytes(out) != page(i):
            bad.append(i)
    return bad

out = {}
tier = LmdbTier(LmdbTierConfig(path=os.path.join(root, "t"), capacity="64MiB", writemap=writemap))
# More pages than the file system holds: the tier's budget (64 MiB) is not what stops them.
stored = [i for i in range(64) if tier.put_from([key(i)], [[memoryview(page(i))]]).ok == (True,)]
out["stored"] = len(stored)
out["refused_contained"] = sum(tier.contains([key(i) for i in range(64) if i not in stored]))
out["unreadable"] = readable(tier, stored)
# Whatever else lives on that disk takes the rest of it.
with open(os.path.join(root, "hog"), "wb") as f:
    try:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    except OSError:
        pass
out["free_after_hog"] = os.statvfs(root).f_bavail
# Readers at once, each in its own slot of lock.mdb's reader table (a page of it holds ~60).
readers = [tier._index.env.begin() for _ in range(200)]
out["readers_held"] = len(readers)
for txn in readers:
    txn.abort()
# Room made by eviction (the store's answer to a refusal) takes new pages again.
gone = stored[: len(stored) // 2]
out["removed"] = tier.remove([key(i) for i in gone])
kept = stored[len(stored) // 2:]
new = list(range(100, 100 + len(gone)))
out["new_stored"] = sum(tier.put_from([key(i)], [[memoryview(page(i))]]).ok == (True,) for i in new)
out["one_more"] = list(tier.put_from([key(999)], [[memoryview(page(999))]]).ok)
out["unreadable_after"] = readable(tier, kept + new)
tier.close()
tier = LmdbTier(LmdbTierConfig(path=os.path.join(root, "t"), capacity="64MiB", writemap=writemap))
out["reopened_pages"] = sum(1 for _ in tier.scan())
out["unreadable_reopened"] = readable(tier, kept + new)
tier.close()
print(json.dumps(out))
"""


STORE_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
from mooncake_sgl.config_sources import load_config
from mooncake_sgl.store import build_store

root = sys.argv[1]
PAGE = 256 << 10
store = build_store(load_config({"tiers": [{"kind": "host", "capacity": "1MiB"},
                                           {"kind": "lmdb", "path": os.path.join(root, "t"),
                                            "capacity": "64MiB"}]}))
puts = [store.put_from([f"page-{i}".encode()], [[memoryview(bytes([i % 251]) * PAGE)]])
        for i in range(120)]
held = []
for i in range(120):
    out = memoryview(bytearray(PAGE))
    if store.get_into([f"page-{i}".encode()], [[out]]) == [True]:
        assert bytes(out) == bytes([i % 251]) * PAGE, i
        held.append(i)
lmdb = store.stats().tiers["lmdb"].as_dict()
store.close()
print(json.dumps({"accepted": sum(map(all, puts)), "held": held, "evictions": lmdb["store"]["evictions"],
                  "refused": lmdb["tier"]["put_full"], "usage": lmdb["usage"]}))
"""


def on_full_tmpfs(tmp_path: Path, child_code: str, *args: str) -> dict:
    if shutil.which("unshare") is None:
        pytest.fail("needs unshare (util-linux) to mount a small tmpfs")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    script = tmp_path / "child.py"
    script.write_text(child_code)
    shell = (f"mount -t tmpfs -o size=16m tmpfs {mnt} || exit {NO_MOUNT}; exec {sys.executable} {script} "
             f"{mnt} {' '.join(args)}")
    child = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", shell],
                           capture_output=True, text=True, timeout=300)
    if child.returncode == NO_MOUNT or child.stderr.startswith("unshare:"):
        pytest.skip(f"this machine lets no process mount a private tmpfs: {child.stderr.strip()}")
    assert child.returncode == 0, f"child died (rc {child.returncode}): {child.stderr[-3000:]}"
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("writemap", [pytest.param(True, id="writemap"), pytest.param(False, id="pwrite")])
def test_a_full_disk_refuses_pages_never_kills_the_process_and_room_made_is_used_again(
        tmp_path: Path, writemap: bool) -> None:
    out = on_full_tmpfs(tmp_path, CHILD, "writemap" if writemap else "pwrite", str(REPO))
    # The disk (16 MiB) stopped the puts, well under the tier's budget, with refusals, not errors.
    assert 8 <= out["stored"] < 48, out
    assert out["refused_contained"] == 0 and out["unreadable"] == [], out
    assert out["free_after_hog"] == 0 and out["readers_held"] == 200, out
    # Before: a refused page's extent stayed free past the end of the file and was the best fit for
    # every later page, so nothing was stored again; with writemap, the removal was a SIGBUS, and
    # so was a reader in an unallocated slot of the reader table, either way.
    assert out["removed"] == out["stored"] // 2 == out["new_stored"], out
    assert out["one_more"] == [False], out  # the disk is still full: a refusal again
    assert out["unreadable_after"] == [] and out["unreadable_reopened"] == [], out
    assert out["reopened_pages"] == out["stored"], out


def test_on_a_full_disk_the_store_evicts_old_ssd_pages_to_keep_the_newest(tmp_path: Path) -> None:
    out = on_full_tmpfs(tmp_path, STORE_CHILD, str(REPO))
    # 120 pages of 256 KiB (30 MiB) through a 1 MiB host tier into an LMDB tier whose 64 MiB budget
    # the 16 MiB disk cannot hold. Before: the tier kept its first pages and refused every later one.
    assert out["accepted"] == 120, out
    assert out["evictions"] > 0 and out["refused"] <= 10, out
    # What operators see (``mooncake_sgl_tier_holdable_bytes``): the disk's size, not the budget.
    usage = out["usage"]
    assert usage["capacity_bytes"] == 64 << 20 and usage["holdable_bytes"] < 16 << 20, usage
    # Pages written long after the disk filled (the first ~30 fill it), the last one included;
    # which of them the placement policy keeps is its own choice. As many as the disk holds, less
    # the store's headroom: kept as a share of the 64 MiB budget, the headroom took a third of
    # the disk (23 pages held).
    held = out["held"]
    assert len(held) >= 28 and all(i >= 60 for i in held) and 119 in held, out


OPEN_FULL_CHILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[2])
from mooncake_sgl.config import LmdbTierConfig
from mooncake_sgl.errors import TierError
from mooncake_sgl.tiers.ssd import LmdbTier

root = sys.argv[1]
with open(os.path.join(root, "hog"), "wb", buffering=0) as f:
    for size in (1 << 20, 4096):
        try:
            while True:
                f.write(b"\0" * size)
        except OSError:
            pass
free = os.statvfs(root).f_bavail
try:
    LmdbTier(LmdbTierConfig(path=os.path.join(root, "t"), capacity="8MiB"))
    error = ""
except TierError as e:
    error = str(e)
print(json.dumps({"free": free, "error": error}))
"""


def test_a_tier_opened_on_a_full_disk_is_refused_with_the_reason_not_a_crash(tmp_path: Path) -> None:
    # Before: LMDB created lock.mdb sparse and wrote it through its map: SIGBUS inside lmdb.open.
    out = on_full_tmpfs(tmp_path, OPEN_FULL_CHILD, str(REPO))
    assert out["free"] == 0, out
    assert "the file system is full" in out["error"], out
