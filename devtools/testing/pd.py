"""Prefill/decode disaggregation on this host: live SGLang prefill and decode servers around our
backend, with SGLang's mini load balancer (``sglang_router --pd-disaggregation --mini-lb``) in
front of each prefill/decode pair.

What each role runs (sglang 0.5.23, ``mooncake_tcp`` transfer, everything on 127.0.0.1):

- ``prefill``: HiCache with our backend over ``tiers`` (reads storage before computing, backs the
  prompt up after the transfer).
- ``decode-offload``: ``--disaggregation-decode-enable-offload-kvcache``: a second backend instance
  writes the pages of generated tokens. SGLang parses that instance's extra-config with a bare
  ``json.loads``, so the tiers file is passed as ``{"config_file": PATH}``, never ``@PATH``.
- ``decode-radix``: ``--disaggregation-decode-enable-radix-cache`` with HiCache: the decode restores
  a prefix from our tiers itself and the prefill sends only the rest.

Without ``tiers`` a prefill or decode runs PD alone (no HiCache storage): the baseline PD
deployment. ``colocated`` starts a plain (non-PD) server over our tiers, and ``router`` puts
sglang-router in front of such servers, for the colocated cells of ``scripts/bench_pd.py``.

On a host without a GPU the servers get the CPU flags and ``MOONCAKE_SGL_CPU_ADAPTATIONS=1``
(``devtools.bench.server``), whose PD part is ``mooncake_sgl_cpu.disaggregation`` (``cpu_host/``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..bench.server import (
    CPU_HICACHE_FLAGS,
    LaunchedServer,
    has_gpu,
    launch_command,
    ours_args,
    server_env,
    stop_all,
)
from .cluster import router_command, wait_router_ready
from .procs import pick_port

TRANSFER = ("--disaggregation-transfer-backend", "mooncake_tcp")
ROLES = ("prefill", "decode-offload", "decode-radix")


def role_args(role: str, tiers: Path | None,
              bootstrap_port: int | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(variant args, extra flags) of one PD role over ``tiers`` (``None``: PD without storage)."""
    if role not in ROLES:
        raise ValueError(f"unknown PD role {role!r}: use one of {', '.join(ROLES)}")
    if role == "prefill":
        if bootstrap_port is None:
            raise ValueError("a prefill needs its bootstrap port")
        return ours_args(tiers) if tiers else (), ("--disaggregation-mode", "prefill", *TRANSFER,
                                                   "--disaggregation-bootstrap-port", str(bootstrap_port))
    if tiers is None:
        return (), ("--disaggregation-mode", "decode", *TRANSFER)
    if role == "decode-offload":
        inline = json.dumps({"config_file": str(Path(tiers).resolve())})
        return (("--hicache-storage-backend", "mooncake", "--hicache-storage-backend-extra-config", inline),
                ("--disaggregation-mode", "decode", *TRANSFER,
                 "--disaggregation-decode-enable-offload-kvcache", *CPU_HICACHE_FLAGS))
    return ours_args(tiers), ("--disaggregation-mode", "decode", *TRANSFER,
                              "--disaggregation-decode-enable-radix-cache")


class PdServers:
    """Starts PD servers and mini load balancers; ``close()`` stops every one."""

    def __init__(self, model: Path, logs: Path, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, health_timeout_s: float = 600.0) -> None:
        self.model = Path(model)
        self.logs = Path(logs)
        self.extra = extra
        self.env = env or {}
        self.health_timeout_s = health_timeout_s
        self.cpu = not has_gpu()
        self.started: list[LaunchedServer] = []
        self.bootstrap: dict[str, int] = {}  # a prefill's URL -> its bootstrap port

    def _env(self) -> dict[str, str]:
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        # The transfer engine and SGLang's ZMQ sockets bind the address SGLang finds for this host,
        # which need not be loopback: everything here stays on 127.0.0.1.
        return server_env(self.cpu, {"PYTHONPATH": path, "SGLANG_HOST_IP": "127.0.0.1", **self.env})

    def server(self, name: str, role: str, tiers: Path | None,
               extra: tuple[str, ...] = ()) -> LaunchedServer:
        """One PD server of ``role`` (``ROLES``) over ``tiers`` (``None``: no storage), healthy."""
        bootstrap = pick_port() if role == "prefill" else None
        variant, flags = role_args(role, tiers, bootstrap)
        server = self._start(name, variant, (*flags, *extra))
        if bootstrap is not None:
            self.bootstrap[server.url] = bootstrap
        return server

    def colocated(self, name: str, tiers: Path) -> LaunchedServer:
        """A plain (non-PD) server with HiCache over ``tiers``, healthy."""
        return self._start(name, ours_args(tiers), ())

    def _start(self, name: str, variant: tuple[str, ...], flags: tuple[str, ...]) -> LaunchedServer:
        def cmd(port: int) -> list[str]:
            return launch_command(str(self.model), port, variant, cpu=self.cpu,
                                  extra=(*flags, *self.extra))

        server = LaunchedServer(cmd, pick_port(), self.logs / f"{name}.log", self.health_timeout_s,
                                env=self._env())
        self.started.append(server)
        return server.start()

    def balancer(self, name: str, prefills: Sequence[LaunchedServer],
                 decodes: Sequence[LaunchedServer]) -> LaunchedServer:
        """SGLang's mini load balancer in front of ``prefills`` and ``decodes`` (it picks one of
        each at random per request)."""
        def cmd(port: int) -> list[str]:
            args = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--mini-lb"]
            for p in prefills:
                args += ["--prefill", p.url, str(self.bootstrap[p.url])]
            for d in decodes:
                args += ["--decode", d.url]
            return [*args, "--host", "127.0.0.1", "--port", str(port)]

        return self._front(name, cmd)

    def router(self, name: str, servers: Sequence[LaunchedServer], policy: str = "round_robin"
               ) -> LaunchedServer:
        """sglang-router (``policy``) in front of plain servers, returned once it routes to every
        one of them (its ``/health`` answers before the first worker registers)."""
        urls = [s.url for s in servers]
        router = self._front(name, lambda port: router_command(port, urls, policy))
        wait_router_ready(router.url, len(urls), 120.0)
        return router

    def _front(self, name: str, cmd: Callable[[int], list[str]]) -> LaunchedServer:
        lb = LaunchedServer(cmd, pick_port(), self.logs / f"{name}.log", 120.0, env=self._env())
        self.started.append(lb)
        return lb.start()

    def close(self) -> None:
        stop_all(self.started)
        self.started.clear()

