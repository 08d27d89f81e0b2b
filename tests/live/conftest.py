"""Fixtures for tests against live SGLang servers on this host (no GPU needed).

Each server is ``scripts/serve_cpu.sh`` (what a user runs) on a free port, loading a tiny Llama with
seeded random weights, so outputs depend on every KV byte. A server takes 20-60 s to become healthy
on two cores; the tests start as few as they can.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
              env: dict[str, str] | None = None) -> LaunchedServer:
        # A function of the port: the launcher starts again on another one if it cannot be bound.
        server = LaunchedServer(lambda port: serve_command(port, self.model, tiers, extra), free_port(),
                                self.logs / f"{name}.log", HEALTH_TIMEOUT_S,
                                env={**os.environ, "PYTHONPATH": str(REPO),
                                     HOST_RESERVE_ENV: TEST_HOST_RESERVE, **(env or {})})
        self.started.append(server)
        server.start()
        return server

    def start_many(self, specs: list[tuple[str, Path]], extra: tuple[str, ...] = ()) -> list[LaunchedServer]:
        """Several servers at once (their start-ups overlap), each with ``extra`` flags."""
        with ThreadPoolExecutor(len(specs)) as ex:
            return list(ex.map(lambda s: self.start(*s, extra), specs))


@pytest.fixture
def servers(tiny_model: Path, tmp_path: Path) -> Iterator[Servers]:
    made = Servers(tiny_model, tmp_path / "logs")
    yield made
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
