"""The pool server when a resource runs out around it: descriptors (a failed ``accept``), threads
(a failed thread start), idle connections to its metrics port, the container's memory limit."""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.testing.pool_process import PoolProcess, PoolStartError
from devtools.testing.procs import pick_port
from mooncake_sgl.errors import ConfigError, TierUnavailable
from mooncake_sgl.memory import MemoryRoots
from mooncake_sgl.pool.accept import SPARE_DESCRIPTORS
from mooncake_sgl.pool.config import PoolServerConfig
from mooncake_sgl.pool.server import PoolServer
from mooncake_sgl.transfer.client import PoolClient

from .peers import fail_accepts

MiB = 1 << 20


def small_pool(**config: object) -> PoolServer:
    return PoolServer(PoolServerConfig(port=0, capacity="8MiB", slab_size="1MiB", shared_memory=False,
                                       **config)).start()


def served(endpoint: str, connect_timeout: float = 5.0) -> bool:
    """Does a fresh client get an answer (its handshake done, a request answered)?"""
    client = PoolClient(endpoint, transport="tcp", connections=1, connect_timeout=connect_timeout)
    try:
        return client.exists_batch([b"some-page"]) == [False]
    except TierUnavailable:
        return False
    finally:
        client.close()


def test_the_accept_loop_survives_a_failed_accept(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    # One EMFILE ended the loop: the process stayed up, every client after it timed out for good.
    fail_accepts(monkeypatch, "pool-_accept_loop")
    with caplog.at_level(logging.ERROR, "mooncake_sgl.pool"):
        server = small_pool()
        try:
            host, port = server.address
            assert served(f"{host}:{port}") and served(f"{host}:{port}")
            assert server.stats()["accept_failures"] == 3
        finally:
            server.stop()
    lines = [r.getMessage() for r in caplog.records if "accept failed" in r.getMessage()]
    assert len(lines) == 1 and "Too many open files" in lines[0], lines  # once per interval


def test_a_failed_thread_start_closes_that_connection_and_the_next_is_served(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A container's pids limit: the RuntimeError from Thread.start ended the accept loop.
    real, left = threading.Thread.start, [1]

    def no_threads(thread: threading.Thread) -> None:
        if thread.name == "pool-_serve" and left[0] > 0:
            left[0] -= 1
            raise RuntimeError("can't start new thread")
        real(thread)

    monkeypatch.setattr(threading.Thread, "start", no_threads)
    server = small_pool()
    try:
        host, port = server.address
        assert not served(f"{host}:{port}")  # its connection is closed, not left hanging
        assert served(f"{host}:{port}")
        stats = server.stats()
        assert stats["accept_failures"] == 1 and stats["connections"] <= 1
    finally:
        server.stop()


def limited(nofile: int) -> list[str]:
    """A command prefix that runs the pool with at most ``nofile`` descriptors (``ulimit -n``)."""
    return ["sh", "-c", f'ulimit -n {nofile} && exec "$@"', "sh"]


def test_clients_past_the_descriptor_limit_are_served_once_descriptors_free() -> None:
    # About 1,016 clients at ulimit -n 1024 made accept() fail with EMFILE; here 64 descriptors.
    with PoolProcess(capacity="8MiB", slab_size="1MiB", shared_memory=False, prefix=limited(64)) as pool:
        clients = []
        while len(clients) < 200:
            c = PoolClient(pool.endpoint, transport="tcp", connections=1, connect_timeout=0.5)
            clients.append(c)
            try:
                c.exists_batch([b"some-page"])
            except TierUnavailable:
                break  # out of descriptors
        assert len(clients) < 200, "the descriptor limit was never reached"
        for c in clients:
            c.close()
        assert served(pool.endpoint)
        with open(pool.log_path) as f:
            assert "accept failed (OSError: [Errno 24] Too many open files" in f.read()


def test_idle_metrics_connections_neither_block_a_scrape_nor_use_up_the_pools_descriptors() -> None:
    # prometheus_client's server kept a thread and a descriptor per idle connection, without limit.
    metrics_port = pick_port("127.0.0.1")
    with PoolProcess(capacity="8MiB", slab_size="1MiB", shared_memory=False, metrics_port=metrics_port,
                     prefix=limited(64)) as pool:
        idle = [socket.create_connection(("127.0.0.1", metrics_port), timeout=5) for _ in range(120)]
        try:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                assert r.status == 200 and b"mooncake_sgl_pool_capacity_bytes" in r.read()
            assert served(pool.endpoint)
        finally:
            for s in idle:
                s.close()


def open_files_limit(pid: int) -> tuple[int, int]:
    line = next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if ln.startswith("Max open files"))
    return int(line.split()[3]), int(line.split()[4])


def test_the_descriptor_limit_is_raised_to_fit_max_connections() -> None:
    # At the common soft limit of 1024 the default max_connections (1024) could never be reached.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    need = 1024 + SPARE_DESCRIPTORS
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard descriptor limit here ({hard}) is below {need}")
    with PoolProcess(capacity="8MiB", slab_size="1MiB", shared_memory=False,
                     prefix=["sh", "-c", 'ulimit -S -n 512 && exec "$@"', "sh"]) as pool:
        assert open_files_limit(pool.pid)[0] == need


def test_a_hard_descriptor_limit_below_max_connections_is_a_warning_naming_both(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    with caplog.at_level(logging.WARNING, "mooncake_sgl.pool"):
        small_pool(max_connections=1024).stop()
    assert f"max_connections=1024 needs about {1024 + SPARE_DESCRIPTORS} descriptors but this process " \
           "may open 1024" in caplog.text


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
            pool.close()
