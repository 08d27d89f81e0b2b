"""``mooncake-sgl pool``: the READY line, ``stats``/``health`` against a running server, and config
errors that name the key and file."""

from __future__ import annotations

import json
import subprocess
import sys

from devtools.testing.pool_process import PoolProcess


def pool_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mooncake_sgl.pool", *args], capture_output=True,
                          text=True, timeout=30)


def test_stats_and_health_of_a_running_pool() -> None:
    with PoolProcess(capacity="8MiB", slab_size="1MiB", secret="abc") as pool:
        r = pool_cli("stats", pool.endpoint, "--secret", "abc", "--json")
        assert r.returncode == 0, r.stderr
        stats = json.loads(r.stdout)
        assert stats["capacity_bytes"] == 8 << 20 and stats["pages"] == 0
        r = pool_cli("health", pool.endpoint, "--secret", "abc")
        assert r.returncode == 0 and "ok, 0 pages" in r.stdout
        r = pool_cli("health", pool.endpoint, "--secret", "wrong")
        assert r.returncode == 1 and "wrong shared secret" in r.stderr
    r = pool_cli("health", pool.endpoint, "--timeout", "0.5")  # stopped: unreachable
    assert r.returncode == 1 and "unhealthy" in r.stderr


def test_bad_config_names_the_key_and_file(tmp_path) -> None:  # noqa: ANN001
    cfg = tmp_path / "pool.yaml"
    cfg.write_text("capcity: 1GiB\n")
    r = pool_cli("--config", str(cfg))
    assert r.returncode == 2 and "capcity" in r.stderr and str(cfg) in r.stderr
    cfg.write_text("capacity: 1KiB\n")
    r = pool_cli("--config", str(cfg))
    assert r.returncode == 2 and "at least one slab" in r.stderr
    cfg.write_text("capacity: 100TiB\nport: 0\n")  # never pre-fault past the machine's memory
    r = pool_cli("--config", str(cfg))
    assert r.returncode == 2 and "exceeds the" in r.stderr and "memory" in r.stderr


def test_stats_of_one_tenant_of_a_multi_tenant_pool() -> None:
    with PoolProcess(capacity="4MiB", slab_size="1MiB",
                     tenants=[{"name": "a", "secret": "sa", "capacity": "2MiB"},
                              {"name": "b", "secret": "sb", "capacity": "2MiB"}]) as pool:
        r = pool_cli("stats", pool.endpoint, "--tenant", "b", "--secret", "sb", "--json")
        assert r.returncode == 0, r.stderr
        stats = json.loads(r.stdout)
        assert stats["capacity_bytes"] == 2 << 20 and stats["tenants"] == 2
        r = pool_cli("health", pool.endpoint, "--tenant", "b", "--secret", "sa")
        assert r.returncode == 1 and "wrong shared secret" in r.stderr


def test_a_server_that_never_gets_ready_is_an_error_not_a_hang(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    import time

    import pytest

    from devtools.testing import pool_process

    # A stand-in interpreter that starts and then says nothing: what a server stuck before its
    # READY line (pre-faulting a huge segment, say) looks like from outside.
    mute = tmp_path / "mute-python"
    mute.write_text("#!/bin/sh\nexec sleep 30\n")
    mute.chmod(0o755)
    monkeypatch.setattr(pool_process.sys, "executable", str(mute))
    pool = pool_process.PoolProcess(startup_timeout=1.0, capacity="2MiB", slab_size="1MiB")
    t0 = time.monotonic()
    with pytest.raises(pool_process.PoolStartError, match="no READY line within 1s"):
        pool.start()
    assert time.monotonic() - t0 < 5
    pool.close()  # its work folder
