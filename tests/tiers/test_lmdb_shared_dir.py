"""Several processes on one LMDB tier directory (issue 22): the TP ranks of an MLA model share it by
design, two servers on one host share the default one, and a restart overlaps the old process's exit.

Every process here is a real one (``Agent``: a child holding a ``LmdbTier`` that runs commands read
from its stdin), so the interleavings that lost pages are reproduced exactly, without sleeps: a
child can be held inside a read, or between the open's snapshot and its allocator rebuild, while
another commits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

# One tier per process; one JSON command per stdin line, one JSON answer per stdout line. A held
# step ("hold") answers {"held": ...} and waits for any line before it goes on.
AGENT = textwrap.dedent("""
    import json, os, sys
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import tier as lmdb_mod
    from mooncake_sgl.tiers.ssd.extents import ExtentAllocator
    from mooncake_sgl.tiers.ssd.records import oldest_reader
    from tests.tiers.test_lmdb_tier import page_bytes

    def say(**kw):
        print(json.dumps(kw), flush=True)

    def hold(what):
        say(held=what)
        sys.stdin.readline()

    def held_once(owner, name, what):
        orig = getattr(owner, name)
        def wrapper(*a, **kw):
            setattr(owner, name, orig)
            hold(what)
            return orig(*a, **kw)
        setattr(owner, name, wrapper)

    path = sys.argv[1]
    tier = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op, keys = cmd["op"], [k.encode() for k in cmd.get("keys", [])]
        n = cmd.get("nbytes", 0)
        if op == "open":
            if cmd.get("hold_rebuild"):  # between the open's read of the index and its use
                held_once(ExtentAllocator, "rebuild", "rebuild")
            tier = lmdb_mod.LmdbTier(LmdbTierConfig(path=path, capacity=cmd["capacity"], sync=False))
            say(ok=True)
        elif op == "put":
            say(res=list(tier.put_from(keys, [[memoryview(page_bytes(k, n))] for k in keys]).ok))
        elif op == "get":
            if cmd.get("hold"):  # inside the read transaction, before the page bytes are read
                held_once(lmdb_mod, "parse_record", "reading")
            out = [[memoryview(bytearray(n))] for _ in keys]
            res = tier.get_into(keys, out)
            wrong = [k.decode() for k, ok, o in zip(keys, res, out) if ok and bytes(o[0]) != page_bytes(k, n)]
            say(res=res, wrong=wrong)
        elif op == "remove":
            say(n=tier.remove(keys))
        elif op == "state":
            u = tier.usage()
            readers = tier._index.env.readers().splitlines()[1:]
            pids = sorted({int(line.split()[0]) for line in readers if line.split()})
            lock_ino = os.stat(os.path.join(path, "lock.mdb")).st_ino
            with open("/proc/locks") as f:  # "1: POSIX ADVISORY WRITE <pid> <maj:min:inode> ..."
                held = [l.split() for l in f if "->" not in l]  # "->": a waiter, not a lock
            locks = sum(1 for p in held if p[4] == str(os.getpid()) and int(p[5].split(":")[2]) == lock_ino)
            say(stats=tier.stats().as_dict(), used=u.used_bytes, pages=u.pages, reader_pids=pids,
                oldest=oldest_reader(tier._index.env), locks=locks)
        elif op == "close":
            tier.close()
            say(ok=True)
            break
""")


class Agent:
    """A child process holding one ``LmdbTier`` on ``path``."""

    def __init__(self, path: Path) -> None:
        path_var = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path_var)
        self.proc = subprocess.Popen([sys.executable, "-c", AGENT, str(path)], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait(timeout=30)
            raise AssertionError(f"agent {self.proc.pid} died with status {rc}"
                                 + (f" (signal {signal.Signals(-rc).name})" if rc < 0 else ""))
        return json.loads(line)

    def __call__(self, op: str, **cmd: Any) -> dict[str, Any]:
        self.send(op=op, **cmd)
        return self.answer()

    def go_on(self) -> dict[str, Any]:
        """Release a held step; its command's answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> int:
        if self.proc.poll() is None:
            try:
                self("close")
            except (AssertionError, BrokenPipeError):
                pass
        try:
            return self.proc.wait(timeout=30)
        finally:
            for f in (self.proc.stdin, self.proc.stdout):
                if f is not None:
                    f.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def agents(tmp_path: Path):
    started: list[Agent] = []

    def start() -> Agent:
        a = Agent(tmp_path / "ssd")
        started.append(a)
        return a

    yield start
    for a in started:
        if a.proc.poll() is None:
            a.kill()


def names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:03d}" for i in range(n)]


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")
def test_an_open_tier_keeps_lmdbs_locks_on_its_lock_file(agents) -> None:
    # Closing a second descriptor of lock.mdb dropped every POSIX lock of the process: 0 locks
    # against 2 (the shared open lock, the reader's pid lock) for a plain lmdb.open.
    a = agents()
    assert a("open", capacity="64MiB") == {"ok": True}
    assert a("put", keys=["k"], nbytes=4096)["res"] == [True]
    assert a("get", keys=["k"], nbytes=4096)["res"] == [True]
    assert a("state")["locks"] == 2
    assert a.close() == 0


def test_a_second_opener_keeps_the_first_ones_reader_and_never_overwrites_what_it_reads(agents) -> None:
    # With the first process's locks gone, the second took itself for the only one and reset the
    # reader table (and the writer's mutex) under it: the live reader was forgotten and the
    # extent it was reading was handed out again.
    nbytes = 64 * 1024
    first, second = agents(), agents()
    assert first("open", capacity="64MiB") == {"ok": True}
    assert first("put", keys=names("p", 8), nbytes=nbytes)["res"] == [True] * 8
    first.send(op="get", keys=names("p", 8), nbytes=nbytes, hold=True)
    assert first.answer() == {"held": "reading"}
    assert second("open", capacity="64MiB") == {"ok": True}
    state = second("state")
    assert first.proc.pid in state["reader_pids"], state
    assert second("remove", keys=names("p", 8))["n"] == 8
    assert second("put", keys=names("q", 8), nbytes=nbytes)["res"] == [True] * 8
    got = first.go_on()
    assert got == {"res": [True] * 8, "wrong": []}
    assert second("get", keys=names("q", 8), nbytes=nbytes) == {"res": [True] * 8, "wrong": []}
    assert first.close() == 0 and second.close() == 0


def test_a_commit_while_another_process_opens_is_never_overwritten_by_it(agents) -> None:
    # The opener rebuilt its allocator from a snapshot but took the transaction id to be current
    # with later: a commit in between counted as seen, and its extents were handed out again.
    nbytes = 64 * 1024
    writer, opener = agents(), agents()
    assert writer("open", capacity="64MiB") == {"ok": True}
    assert writer("put", keys=names("w0", 8), nbytes=nbytes)["res"] == [True] * 8
    opener.send(op="open", capacity="64MiB", hold_rebuild=True)
    assert opener.answer() == {"held": "rebuild"}
    assert writer("put", keys=names("w1", 8), nbytes=nbytes)["res"] == [True] * 8
    assert opener.go_on() == {"ok": True}
    assert opener("put", keys=names("o", 8), nbytes=nbytes)["res"] == [True] * 8
    everything = names("w0", 8) + names("w1", 8) + names("o", 8)
    want = {"res": [True] * 24, "wrong": []}
    assert opener("get", keys=everything, nbytes=nbytes) == want
    assert writer("get", keys=everything, nbytes=nbytes) == want
    assert opener("state")["stats"]["foreign_writes"] == 1
    assert writer.close() == 0 and opener.close() == 0
    fresh = agents()
    assert fresh("open", capacity="64MiB") == {"ok": True}
    assert fresh("get", keys=everything, nbytes=nbytes) == want
    assert fresh.close() == 0


def test_a_process_killed_mid_read_does_not_pin_freed_space_for_the_survivor(agents) -> None:
    # Its reader slot outlives it; trusted as live, it kept every extent freed since from reuse,
    # and the survivor refused every write for good (127 puts, then 472 of 472 refused).
    nbytes = 256 * 1024
    survivor, victim = agents(), agents()
    assert survivor("open", capacity="4MiB") == {"ok": True}
    live = names("r0", 16)
    assert survivor("put", keys=live, nbytes=nbytes)["res"] == [True] * 16
    assert victim("open", capacity="4MiB") == {"ok": True}
    victim.send(op="get", keys=live[:1], nbytes=nbytes, hold=True)
    assert victim.answer() == {"held": "reading"}
    victim.kill()
    refused = 0
    for rnd in range(1, 6):  # churn at full capacity, as the store's evictions do
        assert survivor("remove", keys=live)["n"] == len(live)
        res = survivor("put", keys=names(f"r{rnd}", 16), nbytes=nbytes)["res"]
        refused += res.count(False)
        live = [k for k, ok in zip(names(f"r{rnd}", 16), res) if ok]
    assert refused == 0 and len(live) == 16
    state = survivor("state")
    assert state["stats"]["dead_readers"] == 1 and state["oldest"] is None
    assert survivor("get", keys=live, nbytes=nbytes) == {"res": [True] * 16, "wrong": []}
    assert survivor.close() == 0


def test_an_opener_with_a_smaller_capacity_keeps_another_processs_pages(agents) -> None:
    # The open-time sweep took records past its own capacity for stale ones of a lowered capacity
    # and deleted them: a live 64 MiB process then read 32 of its 100 pages.
    nbytes = 256 * 1024
    big, small = agents(), agents()
    assert big("open", capacity="64MiB") == {"ok": True}
    pages = names("big", 100)
    assert big("put", keys=pages, nbytes=nbytes)["res"] == [True] * 100
    assert small("open", capacity="8MiB") == {"ok": True}
    want = {"res": [True] * 100, "wrong": []}
    assert small("get", keys=pages, nbytes=nbytes) == want
    # Over its budget, it takes no space past it: its pages are refused, the others' kept.
    assert small("put", keys=names("small", 4), nbytes=nbytes)["res"] == [False] * 4
    assert small("state")["used"] == 100 * nbytes
    assert big("get", keys=pages, nbytes=nbytes) == want
    assert big("put", keys=names("big-more", 4), nbytes=nbytes)["res"] == [True] * 4
    assert small.close() == 0 and big.close() == 0


def test_after_another_process_writes_space_freed_before_the_oldest_reader_is_reused(agents) -> None:
    # Rebuilt after a foreign commit, every free extent counted as freed by the current
    # transaction, so any reader (here one that started after the pages were removed) kept all of
    # it from reuse: a full tier refused every page.
    nbytes = 64 * 1024
    writer, reader, other = agents(), agents(), agents()
    assert writer("open", capacity="1MiB") == {"ok": True}
    assert writer("put", keys=names("a", 16), nbytes=nbytes)["res"] == [True] * 16
    assert reader("open", capacity="1MiB") == {"ok": True}
    assert other("open", capacity="1MiB") == {"ok": True}
    assert writer("remove", keys=names("a", 4))["n"] == 4
    reader.send(op="get", keys=names("a", 16)[4:], nbytes=nbytes, hold=True)
    assert reader.answer() == {"held": "reading"}  # its snapshot is newer than the removal
    assert other("remove", keys=names("a", 16)[15:])["n"] == 1  # a foreign commit, after it
    assert writer("put", keys=names("b", 3), nbytes=nbytes)["res"] == [True] * 3
    assert reader.go_on() == {"res": [True] * 12, "wrong": []}
    assert writer("get", keys=names("a", 15)[4:] + names("b", 3), nbytes=nbytes) == \
        {"res": [True] * 14, "wrong": []}
    assert writer.close() == 0 and reader.close() == 0 and other.close() == 0


def test_an_index_another_process_is_creating_is_not_taken_for_damage(tmp_path: Path) -> None:
    # For a moment after another process created it, data.mdb is empty and no page file exists:
    # an empty index was "damaged", and the directory was moved aside under its creator.
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier

    ssd = tmp_path / "ssd"
    ssd.mkdir()
    (ssd / "data.mdb").write_bytes(b"")
    tier = LmdbTier(LmdbTierConfig(path=str(ssd), capacity="64MiB"))
    try:
        assert [p.name for p in tmp_path.iterdir()] == ["ssd"]
        assert tier.put_from([b"k"], [[memoryview(b"x" * 4096)]]).ok == (True,)
    finally:
        tier.close()
