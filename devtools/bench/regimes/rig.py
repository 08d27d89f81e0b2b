"""One run of the regime benchmark: its processes, its phases, what each phase measured.

A run starts everything it uses fresh (a ``mooncake_master`` for the built-in, a pool for ours
in ``instances``, one or two SGLang servers, ``sglang-router`` in front of two) on an empty disk
folder, and stops all of it at its end, so no run finds another's pages or pays for its
clean-up (Lifeboat's ``clear()`` keeps its pages on purpose: a fresh folder is the only cold
start that treats every backend alike).

Phases: ``run`` sends every turn. In ``restart`` the ``before`` phase sends the first turns, the
servers are killed (SIGKILL of each process group: a crashed instance) after ``settle_s`` for
SGLang's write-through to land, started again on the same storage, and the ``after`` phase sends
the remaining turns of the same conversations.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mooncake_sgl.tiers.ssd.aside import disk_bytes
from mooncake_sgl_cpu.adaptations import HOST_RESERVE_ENV

from ..client import RequestResult, SglangClient
from ..console import stamped
from ..server import LaunchedServer, free_port, has_gpu, launch_command, server_env, stop_all
from ..workloads import BenchRequest
from . import metrics
from .backends import Launch, Services, full_dram, launch
from .budget import Budget
from .schedule import Cell
from .workload import Sent, Shape, Thread, drive

ROOT = Path(__file__).resolve().parents[3]
# One request per server before measuring, past SGLang's prefetch_threshold (256) so that the
# storage lookup runs too: its one-time costs (SGLang's page-hash extension) fall outside a phase.
WARMUP_TOKENS = 512
INSTANCES = 2
# What our backend logs when a storage call failed and SGLang was answered a miss.
FAILED_CALL = "failed, answering a miss"
# libgomp's default wait spins a core for a while before it sleeps. On a host with more runnable
# threads than cores that spin takes the core the other OpenMP thread needs, unless the process
# happens to have run torch on a second Python thread (libgomp then counts more threads than cores
# and spins little): measured, decode at 5-10 tokens/s for ours, the built-in and HiCache without
# storage, 33 for Lifeboat (whose storage threads run torch), and 35-36 for all four with PASSIVE.
# The same for every server, unless the caller set it.
OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")


@dataclass(frozen=True)
class RigConfig:
    model: Path
    flags: tuple[str, ...]  # every server's SGLang flags, after the platform's (the last one wins)
    workdir: Path
    host_reserve: str
    health_timeout_s: float
    request_timeout_s: float
    max_parallel: int
    page: int
    restart_after: int  # turns sent before the restart
    settle_s: float
    offload: bool  # the built-in's SSD offload (where the wheel has it)
    progress: bool
    # ``instances`` behind sglang-router where it is installed; without (or with this off) the
    # client alternates the servers itself (``server_of``), and each turn's server is known.
    router: bool = True


@dataclass
class Phase:
    name: str
    load: float  # the 1-minute load average as it began
    counters: dict[str, float] | None = None  # SGLang's (metrics.COUNTERS) over the phase
    sent: list[Sent] = field(default_factory=list)
    wall_s: float = 0.0


def router_available() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def backend_failures(logs: Path, run: str) -> int:
    """Storage calls our backend answered with a miss because they failed (its servers' logs): a
    run with any measured a broken backend, not a regime."""
    return sum(line.count(FAILED_CALL) for f in logs.glob(f"{run}-*.log")
               for line in f.read_text(errors="replace").splitlines())


def start_server(cfg: RigConfig, launch_: Launch, log_path: Path, run_dir: Path,
                 started: list[LaunchedServer]) -> LaunchedServer:
    """A server, healthy and warmed up; in ``started`` before it starts, so that whoever stops
    ``started`` stops it too."""
    cpu = not has_gpu()
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = server_env(cpu, {"PYTHONPATH": path, "SGLANG_HOST_IP": "127.0.0.1",
                           HOST_RESERVE_ENV: cfg.host_reserve, "XDG_CACHE_HOME": str(run_dir / "cache"),
                           "OMP_WAIT_POLICY": OMP_WAIT_POLICY,
                           **launch_.env})

    def cmd(port: int) -> list[str]:
        return launch_command(str(cfg.model), port, launch_.args, cpu=cpu, extra=cfg.flags)

    server = LaunchedServer(cmd, free_port(), log_path, cfg.health_timeout_s, env=env)
    started.append(server)
    server.start()
    SglangClient(server.url, cfg.request_timeout_s).generate(
        BenchRequest("warm-up", -1, list(range(10, 10 + WARMUP_TOKENS)), 1, 0))
    return server


def start_all(cfg: RigConfig, launches: list[Launch], run_dir: Path, tag: str,
              started: list[LaunchedServer]) -> list[LaunchedServer]:
    logs = cfg.workdir / "logs"
    with ThreadPoolExecutor(len(launches)) as ex:
        futures = [ex.submit(start_server, cfg, lc, logs / f"{run_dir.name}-{tag}{i}.log", run_dir, started)
                   for i, lc in enumerate(launches)]
        return [f.result() for f in futures]


def crash(server: LaunchedServer) -> None:
    """SIGKILL of the server's whole process group, as a crashed host would leave it."""
    if server.proc is not None:
        try:
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.stop()


def server_of(thread: int, turn: int, servers: int) -> int:
    """The server a turn goes to where the client alternates ``servers`` itself (no router): never
    twice in a row to one, so each turn's history was last extended on another server."""
    return (thread + turn) % servers


def sender(urls: list[str], cfg: RigConfig, output_tokens: int, seed: int
           ) -> Callable[[int, int, list[int]], RequestResult]:
    """One URL: every request there (a server, or the router in front of two). Several (no router):
    turn ``t`` of thread ``c`` goes to server ``server_of(c, t, n)``."""
    clients = [SglangClient(u, cfg.request_timeout_s) for u in urls]

    def send(c: int, t: int, prompt: list[int]) -> RequestResult:
        return clients[server_of(c, t, len(clients))].generate(
            BenchRequest(f"s{seed}-c{c}-t{t}", t, prompt, output_tokens, 0))
    return send


def run_phase(name: str, cfg: RigConfig, shape: Shape, threads: list[Thread], turns: range,
              histories: dict[int, list[int]], send_urls: list[str], metric_urls: list[str],
              seed: int, desc: str, run_dir: Path) -> Phase:
    """One phase; every server's ``/metrics`` at its end is kept in ``run_dir``."""
    phase = Phase(name, os.getloadavg()[0])
    before = metrics.read(metric_urls)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(threads) * len(turns), desc=f"{desc} {name}", unit="req", file=sys.stderr)

    def record(s: Sent) -> None:
        phase.sent.append(s)
        if bar is not None:
            bar.update(1)

    t0 = time.monotonic()
    try:
        drive(threads, turns, histories, sender(send_urls, cfg, shape.output_tokens, seed),
              cfg.max_parallel, cfg.page, record)
    finally:
        if bar is not None:
            bar.close()
    phase.wall_s = time.monotonic() - t0
    phase.counters = metrics.delta(before, metrics.read(metric_urls, run_dir / f"metrics-{name}"))
    return phase


def run_cell(cell: Cell, index: int, total: int, shape: Shape, b: Budget, cfg: RigConfig, disk_root: Path
             ) -> dict[str, Any]:
    """One run, start to stop: its phases and what it left on disk."""
    run_dir = cfg.workdir / "runs" / f"{index:02d}-{cell.regime}-{cell.shape}-{cell.backend}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    disk_dir = disk_root / run_dir.name
    shutil.rmtree(disk_dir, ignore_errors=True)
    disk_dir.mkdir(parents=True)
    desc = f"{index}/{total} {cell.regime} {cell.shape} {cell.backend} s{cell.seed}"
    n = INSTANCES if cell.regime == "instances" else 1
    started: list[LaunchedServer] = []
    out: dict[str, Any] = {"cell": cell, "phases": [], "router": False, "servers": n, "page": cfg.page}
    with ExitStack() as stack:
        stack.callback(stop_all, started)
        services = Services()
        master = None
        if cell.backend in ("builtin", "builtin-dram"):
            from devtools.testing.mooncake_master import MooncakeMaster

            offload = cfg.offload and cell.regime != "instances" and cell.backend == "builtin"
            master = stack.enter_context(MooncakeMaster(extra_args=["--enable_offload=true"] * offload))
            # The master's log lives in a folder removed at its stop: keep a copy.
            keep = cfg.workdir / "logs" / f"{run_dir.name}-master.log"
            stack.callback(lambda: shutil.copy(master.log_path, keep))
            services = Services(master_rpc=master.rpc_address)
        elif cell.backend == "ours" and cell.regime == "instances":
            from devtools.testing.pool_process import PoolProcess

            pool = stack.enter_context(PoolProcess(capacity=full_dram(b)))
            services = Services(pool_endpoint=pool.endpoint)
        launches = [launch(cell.backend, cell.regime, b, run_dir, disk_dir, services, n, cfg.offload)
                    for _ in range(n)]
        servers = start_all(cfg, launches, run_dir, "server", started)
        urls = [s.url for s in servers]
        send_urls = urls
        if n > 1 and cfg.router and router_available():
            from devtools.testing.cluster import router_command, wait_router_ready

            router = LaunchedServer(lambda port: router_command(port, urls, "round_robin"), free_port(),
                                    cfg.workdir / "logs" / f"{run_dir.name}-router.log", cfg.health_timeout_s)
            started.append(router)
            router.start()
            wait_router_ready(router.url, n, cfg.health_timeout_s)
            send_urls, out["router"] = [router.url], True
        threads = shape.threads_for(cell.seed)
        histories: dict[int, list[int]] = {}
        if cell.regime == "restart":
            k = cfg.restart_after
            out["phases"].append(run_phase("before", cfg, shape, threads, range(0, k), histories,
                                           send_urls, urls, cell.seed, desc, run_dir))
            time.sleep(cfg.settle_s)
            for s in servers:
                crash(s)
            stamped(f"[{desc}] killed after {k} turns; starting again on the same storage")
            t0 = time.monotonic()
            servers = start_all(cfg, launches, run_dir, "restarted", started)
            out["restart_s"] = time.monotonic() - t0
            urls = send_urls = [s.url for s in servers]
            out["phases"].append(run_phase("after", cfg, shape, threads, range(k, shape.turns), histories,
                                           send_urls, urls, cell.seed, desc, run_dir))
        else:
            out["phases"].append(run_phase("run", cfg, shape, threads, range(shape.turns), histories,
                                           send_urls, urls, cell.seed, desc, run_dir))
        out["disk_used"] = disk_bytes(disk_dir)
        if master is not None:  # a master that died mid-run turns every later lookup into a miss
            out["master_alive"] = master.healthy()
    out["load_end"] = os.getloadavg()[0]
    out["backend_failures"] = backend_failures(cfg.workdir / "logs", run_dir.name)
    shutil.rmtree(disk_dir, ignore_errors=True)
    return out
