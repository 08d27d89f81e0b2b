"""A pool server (``python -m mooncake_sgl.pool``) in a subprocess, for tests and benchmarks.

    with PoolProcess(capacity="256MiB", secret="s") as pool:   # waits for the READY line
        client = PoolClient(pool.endpoint, secret="s")
        pool.kill()                                           # SIGKILL, as a crash
        pool.start()                                          # again, on the same port

Config keys are ``PoolServerConfig`` fields. Port 0 (the default) is a port picked below the
ephemeral range (``procs.pick_port``, beside this module), not the kernel's: the server keeps it
across restarts, and a kernel-picked port could be any process's outgoing port by the time of a
restart. ``prefix`` goes before the command (``["ip", "netns", "exec", "NS"]`` to run it on another
host). The server's log goes to ``log_path``; its tail is in every start error.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from mooncake_sgl.config_text import parse_config
from mooncake_sgl.pool.config import PoolServerConfig

from .procs import ServerProcess, pick_port


class PoolStartError(RuntimeError):
    pass


class PoolProcess(ServerProcess):
    def __init__(self, startup_timeout: float = 30.0, prefix: Sequence[str] = (), parent: str | None = None,
                 **config: Any):
        config.setdefault("port", 0)
        self.config: PoolServerConfig = parse_config(config, "PoolProcess", PoolServerConfig)
        super().__init__("mooncake_sgl_pool_", "pool.log", parent)
        self._startup_timeout = startup_timeout
        self._prefix = list(prefix)
        self._picked = self.config.port == 0
        self._ran = False  # became ready once: later starts keep the port clients know
        self.host = self.config.host
        self.port = self.config.port or self._pick()

    def _pick(self) -> int:
        return pick_port("0.0.0.0" if self._prefix else self.host)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> PoolProcess:
        """Start (on the port of the previous run, if any) and wait for READY."""
        if self.pid is not None:
            return self
        cfg_path = os.path.join(self.workdir, "pool.json")
        data = msgspec.to_builtins(self.config)
        env = dict(os.environ)
        # The checkout's root (devtools/testing/ is two folders below it), where mooncake_sgl is.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        deadline = time.monotonic() + self._startup_timeout
        first = not self._ran
        while True:
            data["port"] = self.port
            with open(cfg_path, "w") as f:
                json.dump(data, f)
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    [*self._prefix, sys.executable, "-m", "mooncake_sgl.pool", "--config", cfg_path],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env,
                    start_new_session=True)
            assert self._proc.stdout is not None
            # Bounded: a server that hangs before READY (stuck pre-faulting, say) is an error
            # naming its log, not a caller that waits forever.
            ready, _, _ = select.select([self._proc.stdout], [], [],
                                       max(0.0, deadline - time.monotonic()))
            if not ready:
                self._proc.kill()
                self._proc.wait()
                raise PoolStartError(f"pool server printed no READY line within "
                                     f"{self._startup_timeout:g}s:\n{self.log_tail()}")
            line = self._proc.stdout.readline().decode()
            if line.startswith("READY "):
                hostport = line.split()[1]
                self.host, _, port = hostport.rpartition(":")
                self.port = int(port)
                self._ran = True
                return self
            self._proc.wait()
            # A restart on a fixed port can race the old socket's release: retry until the deadline.
            # A first start on a port we picked takes another one instead.
            if time.monotonic() > deadline or "Address already in use" not in self.log_tail():
                raise PoolStartError(f"pool server exited with code {self._proc.returncode} before "
                                     f"READY:\n{self.log_tail()}")
            if first and self._picked:
                self.port = self._pick()
            time.sleep(0.2)

