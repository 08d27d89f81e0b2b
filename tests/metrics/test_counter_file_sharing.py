"""Several processes writing counters into one directory for one rank (issue 22's class: files that
several processes share). Two servers on one host with the default directory, or a restart that
overlaps the old process's exit, used to overwrite each other's file every few seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from mooncake_sgl.metrics.persist import counter_file_name, find_counter_files, read_counters

REPO = Path(__file__).resolve().parents[2]
RANK = "tp0_pp0_dp0_cp0"

# Persists {"host": hits=<argv[2]>} every 50 ms until stdin closes, then closes the persister.
WRITER = textwrap.dedent("""
    import sys
    from mooncake_sgl.metrics.persist import CounterPersister
    from mooncake_sgl.store.stats import StoreReport
    report = StoreReport.from_plain({"tiers": {"host": {"store": {"hits": float(sys.argv[2])}}}})
    p = CounterPersister(lambda: report, sys.argv[1], "tp0_pp0_dp0_cp0", interval_s=0.05).start()
    print("started", flush=True)
    sys.stdin.read()
    p.close()
""")


def start_writer(directory: Path, hits: int) -> subprocess.Popen:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(hits)], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "started\n"
    return proc


def stop(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0


def rows(directory: Path) -> dict[str, float]:
    snap = read_counters([str(directory)])
    return {rank: s.hits for (rank, _), s in snap.tiers.items()}


def wait_for(cond, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_two_live_processes_on_one_rank_each_keep_their_counters(tmp_path: Path) -> None:
    first = start_writer(tmp_path, 3)
    second = start_writer(tmp_path, 5)
    try:
        pid_row = f"{RANK} pid {second.pid}"
        wait_for(lambda: rows(tmp_path) == {RANK: 3.0, pid_row: 5.0}, "both processes' counters")
        for _ in range(10):  # and they stay apart: neither overwrites the other
            assert rows(tmp_path) == {RANK: 3.0, pid_row: 5.0}
            time.sleep(0.05)
        stop(first)
        # The survivor takes the rank's file over and drops its own.
        wait_for(lambda: rows(tmp_path) == {RANK: 5.0}, "the survivor owning the rank's file")
        assert [os.path.basename(p) for p in find_counter_files([str(tmp_path)])] == [counter_file_name(RANK)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                stop(p)


def test_a_killed_writers_leftovers_are_cleared_by_the_next_owner(tmp_path: Path) -> None:
    owner = start_writer(tmp_path, 1)
    extra = start_writer(tmp_path, 2)
    wait_for(lambda: len(find_counter_files([str(tmp_path)])) == 2, "a file per process")
    extra.kill()
    extra.wait(timeout=30)
    stale_tmp = tmp_path / (counter_file_name(RANK) + "abc.tmp")
    stale_tmp.write_text("{")
    os.utime(stale_tmp, (time.time() - 3600, time.time() - 3600))
    stop(owner)
    again = start_writer(tmp_path, 7)
    try:
        wait_for(lambda: rows(tmp_path) == {RANK: 7.0}, "only the new owner's counters")
        assert not stale_tmp.exists()
    finally:
        stop(again)
