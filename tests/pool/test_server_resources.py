"""The pool server when a resource runs out around it: the container's memory limit at start."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_sgl.errors import ConfigError
from mooncake_sgl.memory import MemoryRoots
from mooncake_sgl.pool.config import PoolServerConfig
from mooncake_sgl.pool.process import PoolProcess, PoolStartError
from mooncake_sgl.pool.server import PoolServer

MiB = 1 << 20


def container(tmp_path: Path, limit: int, in_use: int) -> MemoryRoots:
    """A host with plenty of memory, in a cgroup v2 container of ``limit`` bytes."""
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text(f"MemAvailable: {64 << 20} kB\n")
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/\n")
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup" / "memory.max").write_text(f"{limit}\n")
    (tmp_path / "cgroup" / "memory.current").write_text(f"{in_use}\n")
    return MemoryRoots(proc=str(tmp_path / "proc"), cgroup=str(tmp_path / "cgroup"))


def test_a_capacity_over_the_containers_memory_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    # The host's MemAvailable (64 GiB here) said yes; pre-faulting then met the cgroup's OOM killer.
    server = PoolServer(PoolServerConfig(port=0, capacity="64MiB", slab_size="1MiB"),
                        memory_roots=container(tmp_path, 48 * MiB, 8 * MiB))
    with pytest.raises(ConfigError, match=r"exceeds the 41943040 bytes of memory available \(bounded "
                                          r"by the cgroup limit memory.max of 50331648 bytes") as info:
        server.start()
    assert info.value.key == "capacity"


def test_without_populate_a_capacity_over_the_limit_starts_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = PoolServer(PoolServerConfig(port=0, capacity="64MiB", slab_size="1MiB", populate=False),
                        memory_roots=container(tmp_path, 48 * MiB, 8 * MiB))
    with caplog.at_level(logging.WARNING, "mooncake_sgl.pool"):
        server.start()
    server.stop()
    assert "OOM-killed once it fills" in caplog.text and "memory.max" in caplog.text


def test_a_capacity_within_the_limit_starts(tmp_path: Path) -> None:
    server = PoolServer(PoolServerConfig(port=0, capacity="16MiB", slab_size="1MiB"),
                        memory_roots=container(tmp_path, 48 * MiB, 8 * MiB)).start()
    assert server.capacity == 16 * MiB
    server.stop()


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A child of this process's own memory cgroup (v1, or v2 where its controller is delegated)
    limited to ``limit`` bytes; skips where none can be made (not root, no writable cgroup fs)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = next((ln.split(":", 2)[2] for ln in lines if "memory" in ln.split(":")[1].split(",")), None)
    v2 = next((ln.split(":", 2)[2] for ln in lines if ln.split(":")[1] == ""), None)
    for mount, own, limit_file in (("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"),
                                   ("/sys/fs/cgroup", v2, "memory.max")):
        parent = Path(mount, own.lstrip("/")) if own is not None else None
        if parent is None or not (parent / limit_file).exists() and not (parent / "memory.stat").exists():
            continue
        cg = parent / f"mooncake-sgl-test-{os.getpid()}"
        try:
            cg.mkdir()
            (cg / limit_file).write_text(str(limit))
        except OSError:
            with contextlib.suppress(OSError):
                cg.rmdir()
            continue
        try:
            yield cg
        finally:
            deadline = time.monotonic() + 10
            while True:  # a killed member leaves the cgroup a moment after its exit
                try:
                    cg.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        return
    pytest.skip("no memory cgroup can be made here (needs root and a writable cgroup file system)")


def test_in_a_real_memory_cgroup_the_pool_refuses_rather_than_being_oom_killed() -> None:
    # Before the fix: "pool server exited with code -9 before READY" and an empty log.
    with memory_cgroup(256 * MiB) as cg:
        join = ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"]
        pool = PoolProcess(capacity="512MiB", slab_size="32MiB", prefix=join)
        try:
            with pytest.raises(PoolStartError, match=r"exited with code 2 before READY:\n.*capacity "
                               r"of 536870912 bytes exceeds .*\(bounded by the cgroup limit"):
                pool.start()
        finally:
            shutil.rmtree(pool.workdir, ignore_errors=True)
