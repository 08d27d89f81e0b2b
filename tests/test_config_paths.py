"""Every way a user names a config file refuses a path that is no regular file at once, with a
``ConfigError`` naming the path and what it is: ``/dev/zero`` is never read (an unbounded read
filled the attaching scheduler's memory) and a FIFO never waited on (it blocked for good).

Each case runs in a fresh interpreter under a memory and a time limit, as an attaching scheduler
would meet it, so a reader that does neither holds no test process."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

# The statement that reads the config named by ``PATH``, per way of naming it.
ENTRY_POINTS = {
    "$MOONCAKE_SGL_CONFIG": "from mooncake_sgl.config_sources import resolve_config\n"
                            "resolve_config(environ={'MOONCAKE_SGL_CONFIG': PATH})",
    "extra-config config_file": "from mooncake_sgl.config_sources import resolve_config\n"
                                "resolve_config({'config_file': PATH}, environ={})",
    "$SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": "from mooncake_sgl.config_sources import resolve_config\n"
                                            "resolve_config(environ={"
                                            "'SGLANG_HICACHE_MOONCAKE_CONFIG_PATH': PATH})",
    "config check FILE": "from mooncake_sgl.cli import main\nsys.exit(main(['config', 'check', PATH]))",
    "config check --extra-config @FILE": "from mooncake_sgl.cli import main\n"
                                         "sys.exit(main(['config', 'check', '--extra-config', '@' + PATH]))",
    "pool --config FILE": "from mooncake_sgl.pool.cli import main\nsys.exit(main(['--config', PATH]))",
}
MEMORY_LIMIT = 512 << 20  # address space: the pool command line imports take about 160 MiB
TIME_LIMIT = 20.0  # seconds: the imports take one or two on a busy machine; the check none


def read_in_a_fresh_process(entry: str, path: str) -> tuple[int, str]:
    """(exit status, stdout + stderr) of reading ``path`` the ``entry`` way: 3 for a
    ``ConfigError`` (its text printed), 2 for the command line's exit on one. Fails the test if it
    is still reading after ``TIME_LIMIT``."""
    code = (f"import sys\nfrom mooncake_sgl.errors import ConfigError\nPATH = {path!r}\ntry:\n"
            + "".join(f"    {line}\n" for line in ENTRY_POINTS[entry].splitlines())
            + "except ConfigError as e:\n    print('ConfigError:', e)\n    sys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOONCAKE", "SGLANG"))}
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=TIME_LIMIT, stdin=subprocess.DEVNULL, preexec_fn=lambda: (
                               resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{entry}={path}: still reading after {TIME_LIMIT:g}s")
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_fifo_as_config_is_refused_at_once_naming_it(entry: str, tmp_path: Path) -> None:
    fifo = tmp_path / "tiers.json"  # .json: `config check` first asks whether it is the built-in's
    os.mkfifo(fifo)
    status, out = read_in_a_fresh_process(entry, str(fifo))
    assert status in (2, 3), out
    assert f"it is a FIFO (named pipe), not a regular file (in {fifo})" in out, out


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_dev_zero_as_config_is_refused_without_reading_it(entry: str) -> None:
    status, out = read_in_a_fresh_process(entry, "/dev/zero")
    assert status in (2, 3), out
    assert "it is a character device, not a regular file (in /dev/zero)" in out, out
