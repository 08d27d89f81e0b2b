"""Fixtures for tests against live SGLang servers on this host (no GPU needed).

Each server is ``scripts/serve_cpu.sh`` (what a user runs) on a free port, loading a tiny Llama with
seeded random weights, so outputs depend on every KV byte. A server takes 20-60 s to become healthy
on two cores; the tests start as few as they can.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.bench.server import LaunchedServer, free_port, stop_all
from devtools.tiny_model import write_tiny_llama
from mooncake_sgl_cpu.adaptations import HOST_RESERVE_ENV

from .probe import LiveClient

REPO = Path(__file__).resolve().parents[2]
SERVE = REPO / "scripts" / "serve_cpu.sh"
HEALTH_TIMEOUT_S = 420.0
# SGLang refuses any HiCache host pool while less than 10 GiB of RAM is free beside it (sized for a
# GPU host); these servers' pools are a few MiB, and a busy machine must not make them flaky.
# 512 MiB, not 1 GiB: SGLang checks minutes into a start on a loaded machine, and a test cluster's
# server was refused a 0.03 GB pool with 0.96 GiB free then.
TEST_HOST_RESERVE = "512MiB"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("model"))


def serve_command(port: int, model: Path, tiers: Path, extra: tuple[str, ...] = ()) -> list[str]:
    return ["bash", str(SERVE), str(port), str(model), str(tiers), "--max-total-tokens", "16384", *extra]


class Servers:
    """Starts servers with ``scripts/serve_cpu.sh``; stops every one at teardown."""

    def __init__(self, model: Path, logs: Path):
        self.model = model
        self.logs = logs
        self.started: list[LaunchedServer] = []

    def start(self, name: str, tiers: Path, extra: tuple[str, ...] = (),
              env: dict[str, str] | None = None, port: int | None = None) -> LaunchedServer:
        # A function of the port: the launcher starts again on another one if it cannot be bound.
        server = LaunchedServer(lambda p: serve_command(p, self.model, tiers, extra), port or free_port(),
                                self.logs / f"{name}.log", HEALTH_TIMEOUT_S,
                                env={**os.environ, "PYTHONPATH": str(REPO),
                                     HOST_RESERVE_ENV: TEST_HOST_RESERVE, **(env or {})})
        self.started.append(server)
        server.start()
        return server

    def start_many(self, specs: list[tuple[str, Path] | tuple[str, Path, tuple[str, ...]]],
                   extra: tuple[str, ...] = ()) -> list[LaunchedServer]:
        """Several servers at once (their start-ups overlap), each with ``extra`` flags and then its
        spec's own."""
        def start(spec: tuple) -> LaunchedServer:
            name, tiers, *own = spec
            return self.start(name, tiers, extra + (own[0] if own else ()))

        with ThreadPoolExecutor(len(specs)) as ex:
            return list(ex.map(start, specs))


@pytest.fixture
def servers(tiny_model: Path, tmp_path: Path) -> Iterator[Servers]:
    made = Servers(tiny_model, tmp_path / "logs")
    yield made
    stop_all(made.started)


@dataclass(frozen=True)
class SharedServer:
    server: LaunchedServer
    held_port: int  # the port its first attempt was given, held by another process's socket


# What a shared server's tests may rely on: our host tier alone, device and host pools of 32,768
# tokens, SGLang's step times in its replies.
SHARED_TIERS = "tiers:\n  - {kind: host, capacity: 512MiB}\n"
SHARED_FLAGS = ("--max-total-tokens", "32768", "--hicache-ratio", "2", "--enable-metrics")


@pytest.fixture(scope="session")
def shared_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServer]:
    """One server for the tests that only send their own prompts to it (each start costs 30-60 s of
    a two-core machine). It is started the way the launcher once failed (test_launcher.py): on a
    port another socket listens on, so SGLang's HTTP server cannot bind it."""
    root = tmp_path_factory.mktemp("shared-server")
    made = Servers(tiny_model, root / "logs")
    tiers = write_tiers(root / "tiers.yaml", SHARED_TIERS)
    try:
        with socket.socket() as held:
            held.bind(("127.0.0.1", free_port()))
            held.listen(1)
            port = held.getsockname()[1]
            server = made.start("shared", tiers, SHARED_FLAGS, port=port)
        yield SharedServer(server, port)
    finally:
        stop_all(made.started)


@pytest.fixture
def client_of() -> Callable[[LaunchedServer], LiveClient]:
    return lambda server: LiveClient(server.url)


def write_tiers(path: Path, text: str) -> Path:
    path.write_text(text)
    subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", "config", "check", str(path)], check=True,
                   capture_output=True)
    return path


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
