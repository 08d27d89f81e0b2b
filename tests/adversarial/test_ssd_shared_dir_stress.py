"""Many processes on one SSD tier directory under load, killed with SIGKILL at random points (issue 22).

The shapes that share a directory in production: the TP ranks of an MLA model (one writer, the
others read what it stored), two servers on one host with the default directory (both write), and a
restart that overlaps the old process's exit. Here writer processes put, read back and remove
their own pages in mixed sizes while reader processes read everyone's and an opener process
restarts in a loop (open, write, read, remove, close); every ~0.5 s (seeded) one is
killed with SIGKILL, or stopped with SIGTERM, and a new one starts at once, often while the old one
is still exiting and while others open, so kills land in puts, reads and removals, and (one in
seven) in open-time sweeps and LMDB's probe.

Every process appends what it was told to a log: ``P key`` once ``put_from`` said True (the page
is acknowledged), ``R key`` before it asks to remove one. Counted, each must be 0:

- wrong bytes: a read that said True with bytes other than the page's (content is derived from
  the key, so any process can check any page);
- lost pages: an acknowledged page its writer never removed that a read misses, while running
  (by its own writer) or after recovery (by a fresh process reading every one);
- refused writes: a ``put_from`` that said False (the processes stay far below the capacity);
- crashes: a process that died of anything but our signal (SIGSEGV, LMDB's assertion) or raised;
- moves aside: the directory taken for damaged and moved away from under the live processes;
- lost locks: a process found without LMDB's POSIX locks on ``lock.mdb`` (by which LMDB tells
  live processes and the first opener apart; without them the next opener resets the lock file).

Run directly for other seeds or longer runs:
``python tests/adversarial/test_ssd_shared_dir_stress.py --seed 7 --duration 60``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent("""
    import os, random, signal, sys, zlib
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier
    from tests.tiers.test_lmdb_tier import page_bytes

    path, name, role, seed, log_path = sys.argv[1:6]
    sync, writemap = sys.argv[6] == "sync", sys.argv[7] == "writemap"
    rng = random.Random(seed)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    SIZES = (4096, 16384 + 100, 65536)
    QUOTA = 2 << 20  # live bytes of one writer: all of them stay far below the capacity

    def note(tag, keys):
        if keys:
            os.write(log, b"".join(b"%s %s\\n" % (tag, k) for k in keys))

    def size_of(key):
        return SIZES[zlib.crc32(key) % len(SIZES)]

    def read(keys):
        out = [[memoryview(bytearray(size_of(k)))] for k in keys]
        res = tier.get_into(keys, out)
        note(b"WRONG", [k for k, ok, o in zip(keys, res, out)
                        if ok and bytes(o[0]) != page_bytes(k, size_of(k))])
        note(b"READ", [b"%d" % sum(res)])
        return res

    def lmdb_locks():
        # LMDB's POSIX locks this process holds on lock.mdb (2 once it has read: the shared lock
        # every opener takes and its reader's pid lock); None without /proc/locks.
        try:
            ino = os.stat(os.path.join(path, "lock.mdb")).st_ino
            with open("/proc/locks") as f:
                held = [l.split() for l in f if "->" not in l]
        except OSError:
            return None
        return sum(1 for p in held if p[4] == str(os.getpid()) and int(p[5].split(":")[2]) == ino)

    def check_locks():
        n = lmdb_locks()
        if n is not None and n < 2:
            note(b"NOLOCKS", [b"%d" % n])

    def config():
        return LmdbTierConfig(path=path, capacity="128MiB", sync=sync, writemap=writemap)

    tier = LmdbTier(config())
    note(b"OPEN", [name.encode()])
    mine, live_bytes, seq, others = [], 0, 0, []
    while role == "opener" and not stop:  # a restart in a loop: open, write, read, remove, close
        batch = [b"%s-%06d" % (name.encode(), seq + i) for i in range(rng.randint(1, 4))]
        seq += len(batch)
        res = tier.put_from(batch, [[memoryview(page_bytes(k, size_of(k)))] for k in batch])
        note(b"P", [k for k, good in zip(batch, res.ok) if good])
        note(b"REFUSED", [k for k, good in zip(batch, res.ok) if not good])
        ok = [k for k, good in zip(batch, res.ok) if good]
        note(b"LOST", [k for k, hit in zip(ok, read(ok)) if not hit])
        check_locks()
        if rng.random() < 0.5:
            note(b"R", ok)
            tier.remove(ok)
        tier.close()
        tier = LmdbTier(config())
        note(b"REOPEN", [name.encode()])
    while not stop:
        r = rng.random()
        if r < 0.05:
            check_locks()
        if role == "reader" or r < 0.15:
            if not others or rng.random() < 0.1:
                others = [k for k, _ in tier.scan()]
            if others:
                read(rng.sample(others, min(len(others), rng.randint(1, 16))))
            continue
        if r < 0.55:
            batch = []
            for _ in range(rng.randint(1, 12)):
                batch.append(b"%s-%06d" % (name.encode(), seq))
                seq += 1
            while mine and live_bytes + sum(map(size_of, batch)) > QUOTA:
                gone = mine[:rng.randint(1, 8)]
                note(b"R", gone)
                tier.remove(gone)
                del mine[:len(gone)]
                live_bytes -= sum(map(size_of, gone))
            res = tier.put_from(batch, [[memoryview(page_bytes(k, size_of(k)))] for k in batch])
            ok = [k for k, good in zip(batch, res.ok) if good]
            note(b"P", ok)
            note(b"REFUSED", [k for k, good in zip(batch, res.ok) if not good])
            mine += ok
            live_bytes += sum(map(size_of, ok))
        elif mine and r < 0.9:
            keys = rng.sample(mine, min(len(mine), rng.randint(1, 16)))
            note(b"LOST", [k for k, ok in zip(keys, read(keys)) if not ok])
        elif mine:
            gone = rng.sample(mine, min(len(mine), rng.randint(1, 4)))
            note(b"R", gone)
            tier.remove(gone)
            mine = [k for k in mine if k not in gone]
            live_bytes -= sum(map(size_of, gone))
    tier.close()
    note(b"CLOSED", [name.encode()])
""")

# After recovery: a fresh process reads every acknowledged page, then writes new ones.
VERIFIER = textwrap.dedent("""
    import json, os, sys, zlib
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier
    from tests.tiers.test_lmdb_tier import page_bytes
    SIZES = (4096, 16384 + 100, 65536)
    size_of = lambda k: SIZES[zlib.crc32(k) % len(SIZES)]
    tier = LmdbTier(LmdbTierConfig(path=sys.argv[1], capacity="128MiB"))
    keys = [k.encode() for k in json.load(open(sys.argv[2]))]
    lost, wrong = [], []
    for i in range(0, len(keys), 64):
        batch = keys[i:i + 64]
        out = [[memoryview(bytearray(size_of(k)))] for k in batch]
        for k, ok, o in zip(batch, tier.get_into(batch, out), out):
            if not ok:
                lost.append(k.decode())
            elif bytes(o[0]) != page_bytes(k, size_of(k)):
                wrong.append(k.decode())
    fresh = [b"after-recovery-%03d" % i for i in range(64)]
    res = tier.put_from(fresh, [[memoryview(page_bytes(k, size_of(k)))] for k in fresh])
    out = [[memoryview(bytearray(size_of(k)))] for k in fresh]
    back = tier.get_into(fresh, out)
    print(json.dumps({"checked": len(keys), "lost": lost, "wrong": wrong,
                      "refused_after": res.ok.count(False),
                      "unreadable_after": sum(1 for ok, k, o in zip(back, fresh, out)
                                              if not ok or bytes(o[0]) != page_bytes(k, size_of(k))),
                      "stored": sum(1 for _ in tier.scan()), "stats": tier.stats().as_dict(),
                      "file_bytes": os.path.getsize(sys.argv[1] + "/pages.bin")}))
    tier.close()
""")


@dataclass
class Counts:
    processes: int = 0
    opens: int = 0  # tiers opened: one per process, and the openers' reopens
    sigkills: int = 0
    sigterms: int = 0
    crashes: list[str] = field(default_factory=list)
    wrong_bytes: int = 0
    lost_while_running: int = 0
    refused_writes: int = 0
    reads: int = 0
    pages_read: int = 0
    acknowledged: int = 0
    removed: int = 0
    checked_after: int = 0
    lost_after: int = 0
    wrong_after: int = 0
    refused_after: int = 0
    unreadable_after: int = 0
    locks_lost: int = 0  # checks that found a process without LMDB's locks on lock.mdb
    moved_aside: int = 0  # the directory taken for damaged and moved away under live processes
    verifier: dict = field(default_factory=dict)


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


def run_stress(root: Path, seed: int, duration_s: float, writers: int = 3, readers: int = 1,
               openers: int = 1, min_acked: int = 0) -> Counts:
    """Run the processes on ``root/ssd`` for ``duration_s`` seconds of kills and restarts (longer,
    up to 4x, until ``min_acked`` pages were acknowledged: a loaded machine starts processes
    slowly), then recover and check; never raises on a finding, it is counted."""
    rng = random.Random(seed)
    ssd, logs = root / "ssd", root / "logs"
    logs.mkdir(parents=True)
    counts = Counts()
    slots = [("writer", i) for i in range(writers)] + [("reader", i) for i in range(readers)] + \
        [("opener", i) for i in range(openers)]
    live: dict[int, tuple[subprocess.Popen, str]] = {}
    ended: list[tuple[subprocess.Popen, str, int | None]] = []  # (process, name, our signal)

    def start(slot: int) -> None:
        role, i = slots[slot]
        name = f"{role[0]}{i}i{counts.processes}"
        counts.processes += 1
        err = open(logs / f"{name}.err", "w")
        # Slot 0 commits with fsync; slot 1 maps the index writable: both modes share one directory.
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(ssd), name, role, f"{seed}-{name}", str(logs / f"{name}.log"),
             "sync" if slot == 0 else "nosync", "writemap" if slot == 1 else "pwrite"],
            cwd=REPO, env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        err.close()
        live[slot] = (proc, name)

    try:
        _churn(rng, counts, live, ended, start, len(slots), duration_s, lambda: _acked(logs) >= min_acked,
               logs)
    finally:
        for proc, name in live.values():
            proc.kill()
            counts.sigkills += 1
            ended.append((proc, name, signal.SIGKILL))
        _reap(ended, counts, logs)
    return _recover_and_check(root, ssd, logs, counts)


def _opened(logs: Path, name: str) -> bool:
    try:
        with open(logs / f"{name}.log", "rb") as f:
            return f.read(4) == b"OPEN"
    except FileNotFoundError:
        return False


def _acked(logs: Path) -> int:
    return sum(log.read_bytes().count(b"\nP ") for log in logs.glob("*.log"))


def _churn(rng: random.Random, counts: Counts, live: dict, ended: list, start, nslots: int,
           duration_s: float, enough, logs: Path) -> None:
    """Every ~0.5 s, SIGKILL (or SIGTERM) a random process and start its successor at once."""
    for slot in range(nslots):
        start(slot)
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < duration_s or (elapsed < 4 * duration_s and not enough()):
        time.sleep(rng.uniform(0.1, 0.9))
        for slot, (proc, name) in list(live.items()):
            if proc.poll() is not None:  # died on its own: a crash; keep the slot busy
                ended.append((proc, name, None))
                start(slot)
        # Mostly a process at work; sometimes one still starting (LMDB's probe, the open, the
        # sweep). Only the first would starve a loaded machine of any process that gets to work.
        anywhere = rng.random() < 0.15
        working = [s for s, (_, name) in live.items() if _opened(logs, name)]
        if not (anywhere or working):
            continue
        slot = rng.randrange(nslots) if anywhere else rng.choice(working)
        proc, name = live[slot]
        sig = signal.SIGKILL if rng.random() < 0.8 else signal.SIGTERM
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            counts.sigkills += 1
        else:
            counts.sigterms += 1
        ended.append((proc, name, sig))
        start(slot)  # at once: the new process opens while the old one may still be exiting


def _reap(ended: list, counts: Counts, logs: Path) -> None:
    """A process that ended other than by our signal (or by exiting 0 after SIGTERM) crashed."""
    for proc, name, sig in ended:
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait(timeout=30)
            counts.crashes.append(f"{name}: did not stop within 60 s of {sig!r}")
            continue
        if not (rc == 0 or (sig is not None and rc == -sig)):
            tail = (logs / f"{name}.err").read_text().strip().splitlines()[-3:]
            counts.crashes.append(f"{name}: status {rc} after {sig!r}: {' | '.join(tail)}")


def _recover_and_check(root: Path, ssd: Path, logs: Path, counts: Counts) -> Counts:
    """Tally the logs, then have a fresh process read every acknowledged page not removed."""
    acked: dict[str, None] = {}
    removed: set[str] = set()
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text().splitlines():
            tag, _, key = line.partition(" ")
            if tag == "P":
                acked[key] = None
            elif tag == "R":
                removed.add(key)
            elif tag == "WRONG":
                counts.wrong_bytes += 1
            elif tag == "LOST":
                counts.lost_while_running += 1
            elif tag == "REFUSED":
                counts.refused_writes += 1
            elif tag == "NOLOCKS":
                counts.locks_lost += 1
            elif tag in ("OPEN", "REOPEN"):
                counts.opens += 1
            elif tag == "READ":
                counts.reads += 1
                counts.pages_read += int(key)
    counts.acknowledged, counts.removed = len(acked), len(removed & acked.keys())
    counts.moved_aside = sum(1 for p in root.iterdir() if p.name.startswith("ssd.damaged-"))
    expected = [k for k in acked if k not in removed]
    (root / "expected.json").write_text(json.dumps(expected))
    done = subprocess.run([sys.executable, "-c", VERIFIER, str(ssd), str(root / "expected.json")], cwd=REPO,
                          env=_env(), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        counts.crashes.append(f"verifier: status {done.returncode}: {done.stderr.strip()[-500:]}")
        return counts
    found = json.loads(done.stdout)
    counts.checked_after = found["checked"]
    counts.lost_after, counts.wrong_after = len(found["lost"]), len(found["wrong"])
    counts.refused_after, counts.unreadable_after = found["refused_after"], found["unreadable_after"]
    counts.verifier = {"stored": found["stored"], "lost_examples": found["lost"][:5],
                       "dropped_at_open": found["stats"]["dropped_at_open"],
                       "page_file_bytes": found["file_bytes"]}
    return counts


def test_processes_sharing_one_directory_under_sigkill_lose_and_corrupt_nothing(tmp_path: Path) -> None:
    counts = run_stress(tmp_path, seed=22, duration_s=20.0, min_acked=500)
    print(json.dumps(counts.__dict__, indent=1))
    # Not vacuous: processes were killed, pages acknowledged, and some outlived their writers.
    assert counts.sigkills >= 10 and counts.acknowledged >= 300 and counts.checked_after >= 20, counts
    assert counts.crashes == [], counts.crashes
    running = (counts.wrong_bytes, counts.lost_while_running, counts.refused_writes)
    after = (counts.lost_after, counts.wrong_after, counts.refused_after, counts.unreadable_after)
    assert running == (0, 0, 0) and after == (0, 0, 0, 0), counts
    assert (counts.moved_aside, counts.locks_lost) == (0, 0), counts


if __name__ == "__main__":
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--openers", type=int, default=1)
    ap.add_argument("--min-acked", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        counts = run_stress(Path(tmp), args.seed, args.duration, args.writers, args.readers, args.openers,
                            args.min_acked)
        print(json.dumps(counts.__dict__, indent=1))
