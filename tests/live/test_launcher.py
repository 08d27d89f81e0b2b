"""The launcher of live servers (``devtools.bench.server.LaunchedServer``) and its ports.

A port picked from the ephemeral range and released was once taken by the SGLang scheduler's own
socket before the HTTP server bound it: the server never became healthy and the test waited for
its 420 s health timeout. These pin the fixes: ports come from below the ephemeral range, a port
that cannot be bound is replaced, and a dead HTTP server fails the start within seconds.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from devtools.bench.server import LaunchedServer, free_port

from .conftest import REPO, SharedServer
from .probe import LiveClient, prompt

LINGERING = [sys.executable, "-m", "tests.live.lingering_http"]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process's socket listens on, as the scheduler's did."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        s.listen(1)
        yield s.getsockname()[1]


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_a_port_held_by_another_socket_makes_the_launcher_start_on_another(held_port: int,
                                                                           tmp_path: Path) -> None:
    server = LaunchedServer(lambda port: [*LINGERING, str(port)], held_port, tmp_path / "s.log",
                            health_timeout_s=60, env=_env())
    t0 = time.monotonic()
    with server:
        assert server.port != held_port and server.attempts == 2
        assert time.monotonic() - t0 < 20
        log = server.log_path.read_text()
        assert "error while attempting to bind" in log and f"starting again on port {server.port}" in log


def test_a_list_command_gets_its_port_flag_replaced_on_a_retry(held_port: int, tmp_path: Path) -> None:
    # What the benchmarks pass: launch_command's list, whose --port value is the one to change.
    script = ("import sys, runpy; sys.argv = ['x', sys.argv[2]]; "
              "runpy.run_module('tests.live.lingering_http', run_name='__main__')")
    server = LaunchedServer([sys.executable, "-c", script, "--port", str(held_port)], held_port,
                            tmp_path / "s.log", health_timeout_s=60, env=_env())
    with server:
        assert server.port != held_port
        assert server.cmd[-1] == str(server.port)


def test_a_dead_http_server_fails_the_start_within_seconds(held_port: int, tmp_path: Path) -> None:
    # Always the same (taken) port: every attempt's HTTP server dies while its process lingers.
    server = LaunchedServer([*LINGERING, str(held_port)], held_port, tmp_path / "s.log",
                            health_timeout_s=300, env=_env())
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="HTTP server died"):
        server.start()
    assert time.monotonic() - t0 < 30, "waited for the health timeout instead"
    assert server.attempts == 3
    assert not psutil.pid_exists(server.proc.pid) or \
        psutil.Process(server.proc.pid).status() == psutil.STATUS_ZOMBIE


def test_free_ports_are_below_the_ephemeral_range_and_outside_sglangs() -> None:
    from devtools.testing.procs import SGLANG_PORTS, ephemeral_range

    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert all(p < low and p not in SGLANG_PORTS for p in ports)
    assert len(set(ports)) == len(ports), "a port handed out twice"


def test_pick_port_skips_a_port_in_use() -> None:
    from devtools.testing.procs import pick_port, port_is_free

    # A range of two ports, one of them taken: every pick is the other one. The neighbour must be
    # free too, and with other suites on the machine an ephemeral port's neighbour is often in use
    # or in TIME_WAIT (that made this test fail once, with two suites running side by side).
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            taken = s.getsockname()[1]
            if port_is_free(taken + 1):
                assert pick_port("0.0.0.0", taken, taken + 1) == taken + 1
                return
    pytest.fail("no bound port with a free neighbour in 100 tries")


def test_a_live_server_whose_port_is_held_comes_up_on_another(shared_server: SharedServer) -> None:
    """The incident itself, with SGLang: its HTTP server cannot bind the port it was given (the
    shared server is started that way)."""
    server = shared_server.server
    assert server.port != shared_server.held_port and server.attempts == 2
    log = server.log_path.read_text()
    assert "error while attempting to bind" in log
    assert log.count("[launcher]") == 1
    assert LiveClient(server.url).generate(prompt(128, seed=5)).output_ids  # and it serves
