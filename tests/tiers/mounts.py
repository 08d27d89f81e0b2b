"""A Python child in a private mount namespace, for tests that need a small or a read-only file
system (``unshare -m``: root only; what it mounts vanishes with it and is never seen outside)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_with_mounts(mounts: list[str], code: str, *args: str, timeout: float = 120
                    ) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``args`` as ``sys.argv[1:]``) after the ``mount`` command lines
    ``mounts``; skips the test where no private mount namespace can be made."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private mount namespace")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    script = " && ".join([*mounts, 'exec "$@"'])
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-c", code, *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
