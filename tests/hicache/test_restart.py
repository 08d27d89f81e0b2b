"""Warm restart: pages written through the backend survive a SIGKILL of the writing process and are
read back, byte for byte, through the backend in a new process (LMDB tier)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

from . import restart_worker

REPO = Path(__file__).resolve().parents[2]


def test_pages_survive_sigkill_of_the_writer(tmp_path) -> None:
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    writer = ctx.Process(target=restart_worker.write, args=(tmp_path, theirs), daemon=True)
    writer.start()
    try:
        assert ours.poll(120), "writer did not report within 120 s"
        assert (msg := ours.recv()) == "READY", msg
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
        assert writer.exitcode == -signal.SIGKILL
    finally:
        if writer.is_alive():
            writer.kill()
            writer.join()

    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    reader = subprocess.run([sys.executable, "-m", "tests.hicache.restart_worker", "read", str(tmp_path)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert reader.returncode == 0, reader.stderr[-3000:]
    done = [line.split()[1] for line in reader.stdout.splitlines() if line.startswith("OK")]
    assert done == [f"{kind}-{layout}" for kind, layout in restart_worker.PLAN]
