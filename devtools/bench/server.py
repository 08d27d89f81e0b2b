"""Starting live SGLang servers: the command line of each benchmark variant, on GPU and CPU hosts.

A *variant* is one server configuration of a side-by-side run:

- ``no-hicache``          plain SGLang (device radix cache only);
- ``hicache-l2``          ``--enable-hierarchical-cache`` (device + host pool, no storage);
- ``ours``                HiCache with our backend (``--hicache-storage-backend mooncake``) on the
                          embedded default tiers (no extra-config);
- ``ours:PATH.yaml``      the same over the tier set in PATH (``--hicache-storage-backend-extra-config
                          @PATH``).

On a host without a GPU every command gets the flags a CPU server needs (``CPU_FLAGS``, plus the
``direct`` io backend for HiCache variants, which is what the CPU-host distribution's
``mooncake_sgl_cpu.adaptations`` supplies ops for) and ``SGLANG_USE_CPU_ENGINE=1``.
``scripts/serve_cpu.sh`` runs ``python -m devtools.bench.server PORT MODEL_DIR TIERS_FILE
[flags...]``: one server in the foreground, stopped with everything it started on SIGTERM/SIGINT.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Union

from devtools.testing import tool_envs
from devtools.testing.procs import pick_port, says_bind_failed
from mooncake_sgl import envs

from .client import SglangClient

# What a CPU server needs (cpu_host/mooncake_sgl_cpu/ has the patches it also needs): the torch
# attention backend, no CUDA graphs, token-id prompts, a KV budget a CPU host can hold (SGLang would
# otherwise size it from RAM: 14.5M tokens), 64-token pages as on GPU deployments, and a scheduler
# that sleeps while it has nothing to do: an idle SGLang scheduler otherwise spins a core, so on a
# two-core host each idle server took CPU from the one at work (4 idle PD servers: 35-40% of a core
# each, decode at 3 tokens/s).
CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
             "--skip-tokenizer-init", "--max-total-tokens", "65536", "--page-size", "64",
             "--sleep-on-idle")
CPU_HICACHE_FLAGS = ("--hicache-io-backend", "direct", "--hicache-mem-layout", "page_first_direct")
GPU_FLAGS = ("--skip-tokenizer-init", "--page-size", "64")
GPU_HICACHE_FLAGS = ("--hicache-mem-layout", "page_first")
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", envs.MOONCAKE_SGL_CPU_ADAPTATIONS.name: "1"}
HICACHE = "--enable-hierarchical-cache"

# SGLang's own shutdown can hang on CPU (a scheduler waiting on a CUDA core-dump timeout); after
# this long a stop becomes SIGKILL of every process the server started.
STOP_GRACE_S = tool_envs.MOONCAKE_SGL_STOP_GRACE.get()


@dataclass(frozen=True)
class Variant:
    label: str
    args: tuple[str, ...]


def parse_variant(spec: str) -> Variant:
    """``no-hicache`` | ``hicache-l2`` | ``ours:PATH`` | ``LABEL=<one of those>``."""
    label, _, body = spec.partition("=") if "=" in spec else ("", "", spec)
    if body == "no-hicache":
        return Variant(label or body, ())
    if body == "hicache-l2":
        return Variant(label or body, (HICACHE,))
    if body == "ours":
        return Variant(label or body, ours_args(None))
    if body.startswith("ours:"):
        path = Path(body[5:]).expanduser()
        if not path.is_file():
            raise ValueError(f"variant {spec!r}: tier config {path} does not exist")
        return Variant(label or f"ours:{path.stem}", ours_args(path))
    raise ValueError(f"unknown variant {spec!r}: use no-hicache, hicache-l2, ours or ours:TIERS.yaml "
                     "(optionally LABEL=...)")


def ours_args(tiers: Path | None) -> tuple[str, ...]:
    """Our backend over ``tiers``, or over the embedded default when ``None``."""
    base = (HICACHE, "--hicache-storage-backend", "mooncake")
    if tiers is None:
        return base
    return base + ("--hicache-storage-backend-extra-config", f"@{Path(tiers).resolve()}")


# Device nodes of the drivers through which PyTorch reaches a GPU (NVIDIA, ROCm, WSL).
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def has_gpu(nodes: tuple[str, ...] = GPU_DEVICE_NODES) -> bool:
    """A CUDA device this process can use (decides the flags; nothing else here needs torch).

    Without any GPU driver's device node the answer is no, and torch is not imported: its import
    took 3.3 s of a two-core host's CPU in every ``serve_cpu.sh`` start, before SGLang's own."""
    if not any(os.path.exists(node) for node in nodes):
        return False
    import torch

    return torch.cuda.is_available()


def free_port() -> int:
    """A port for a server to bind later: below the ephemeral range, checked free (see
    ``devtools.testing.procs.pick_port``); the launcher still retries on a bind failure."""
    return pick_port()


def cpu_computes_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX). Without it PyTorch falls
    back to a scalar path: on an AVX2-only host a bf16 matmul of the tiny model's prefill took 75x
    its float32 time (912 against 12 ms), and a 4,096-token prefill 1.7x."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_dtype_flags(model_path: str, native_bf16: bool) -> tuple[str, ...]:
    """For a bfloat16 model on a CPU without native bf16: compute in float32, keep the KV cache in
    bfloat16, so pages (what our backend stores) keep their size and bytes while prefill runs at
    float32 speed. Any other model or CPU: nothing (SGLang's own choice)."""
    if native_bf16:
        return ()
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(config, dict) or config.get("torch_dtype") != "bfloat16":
        return ()
    return ("--dtype", "float32", "--kv-cache-dtype", "bf16")


def launch_command(model_path: str, port: int, variant_args: tuple[str, ...], *, cpu: bool,
                   extra: tuple[str, ...] = (), host: str = "127.0.0.1") -> list[str]:
    """``python -m sglang.launch_server`` for one variant; ``extra`` flags come last and win."""
    hicache = HICACHE in variant_args
    platform = ((CPU_FLAGS + cpu_dtype_flags(model_path, cpu_computes_bf16())
                 + (CPU_HICACHE_FLAGS if hicache else ())) if cpu else
        (GPU_FLAGS + (GPU_HICACHE_FLAGS if hicache else ())))
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
            "--host", host, "--port", str(port), *platform, *variant_args, *extra]


def server_env(cpu: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if cpu:
        env.update(CPU_ENV)
    env.update(extra or {})
    return env


def stop_tree(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM ``proc``, then SIGKILL it and every process it started that is still alive.

    The descendants are listed before the first signal: once the parent exits they are re-parented
    and can no longer be found from it.
    """
    import psutil

    if proc.poll() is not None:
        return
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)
    proc.wait()


# A command line for a port: a list (its ``--port`` value is replaced on a retry) or a function.
Command = Union[list[str], Callable[[int], list[str]]]
BIND_ATTEMPTS = 3
# What SGLang's HTTP server (uvicorn) logs when it could not bind its port, and when it gave up:
# the process itself can linger after that (its scheduler children keep it alive), so the log, not
# the exit, says the server is dead. Other lines saying "address already in use" are not enough:
# the transfer engine, for one, logs them while it tries ports of its own.
HTTP_BIND_FAILED = "error while attempting to bind on address"
HTTP_DEAD_MARKERS = (HTTP_BIND_FAILED, "Application startup failed")
POLL_S = 0.5


class ServerDied(RuntimeError):
    """The server's process exited, or its HTTP server did, before it became healthy."""


class LaunchedServer:
    """One live server in its own process group; waits for ``/health``; on exit stops the server
    and everything it started (scheduler and detokenizer children included).

    Start-up fails within about a second of the server's death: of its process, or of its HTTP
    server (found in its log: SGLang's process can stay alive after uvicorn gave up). When the
    port could not be bound, it starts again on a new one (``BIND_ATTEMPTS`` in all): ``port``
    and ``url`` are the ones in use after ``start()``.
    """

    def __init__(self, cmd: Command, port: int, log_path: Path, health_timeout_s: float = 900.0,
                 env: dict[str, str] | None = None, host: str = "127.0.0.1",
                 pick: Callable[[], int] = pick_port):
        self._cmd = cmd
        self.port = port
        self.host = host
        self.log_path = Path(log_path)
        self.health_timeout_s = health_timeout_s
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.attempts = 0
        self._pick = pick
        self._log: IO[bytes] | None = None

    @property
    def cmd(self) -> list[str]:
        """The command line for the current port."""
        if callable(self._cmd):
            return self._cmd(self.port)
        cmd = list(self._cmd)
        for i, arg in enumerate(cmd[:-1]):
            if arg == "--port":
                cmd[i + 1] = str(self.port)
        return cmd

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LaunchedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        deadline = time.monotonic() + self.health_timeout_s
        try:
            while True:
                self.attempts += 1
                offset = self._log.tell()
                self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True,
                                             env=self.env if self.env is not None else dict(os.environ))
                try:
                    self._wait_healthy(deadline, offset)
                    return self
                except ServerDied as e:
                    since = self._log_since(offset)
                    exited = self.proc.poll() is not None
                    bind = HTTP_BIND_FAILED in since or (exited and says_bind_failed(since))
                    if not bind or self.attempts >= BIND_ATTEMPTS:
                        raise
                    self._kill_attempt()
                    old, self.port = self.port, self._pick()
                    self._log.write(f"\n[launcher] {e}; port {old} could not be bound: starting again "
                                    f"on port {self.port}\n".encode())
                    self._log.flush()
        except BaseException as e:
            self.stop()
            raise RuntimeError(f"server on port {self.port} did not start: {e}\n--- log tail ---\n"
                               f"{self.log_tail()}") from e

    def _wait_healthy(self, deadline: float, offset: int) -> None:
        client = SglangClient(self.url)
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerDied(f"the server exited with code {self.proc.returncode}")
            if any(m in self._log_since(offset) for m in HTTP_DEAD_MARKERS):
                raise ServerDied("the server's HTTP server died (its log says so)")
            if client.healthy():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not healthy after {self.health_timeout_s:.0f}s")
            time.sleep(POLL_S)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _kill_attempt(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_tree(self.proc, grace_s=0.0)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self) -> LaunchedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                stop_tree(self.proc)
            try:  # stragglers of the group, should any have escaped the tree walk (or outlived
                # a parent that exited on its own)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, nbytes: int = 6000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-nbytes:].decode(errors="replace")


def stop_all(servers: Iterable[LaunchedServer]) -> None:
    """Stop several servers at once: each stop may wait out SGLang's shutdown, up to its grace."""
    servers = list(servers)
    if servers:
        with ThreadPoolExecutor(len(servers)) as ex:
            list(ex.map(LaunchedServer.stop, servers))


def serve_main(argv: list[str] | None = None) -> int:
    """``PORT MODEL_DIR TIERS_FILE [flags...]``: one server with our backend in the foreground."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        print("usage: serve_cpu.sh PORT MODEL_DIR TIERS_FILE [more sglang flags...]", file=sys.stderr)
        return 2
    port, model, tiers, extra = args[0], Path(args[1]), Path(args[2]), tuple(args[3:])
    if not port.isdigit() or not 0 < int(port) < 65536:
        print(f"serve_cpu: PORT must be a TCP port number, got {port!r}", file=sys.stderr)
        return 2
    if not (model / "config.json").is_file():
        print(f"serve_cpu: no config.json in MODEL_DIR {str(model)!r}", file=sys.stderr)
        return 2
    from mooncake_sgl.config_sources import our_file
    from mooncake_sgl.errors import ConfigError

    try:
        our_file(tiers)  # as the backend reads SGLang's @FILE form: SGLang's own keys are SGLang's
    except ConfigError as e:
        print(f"serve_cpu: {e}", file=sys.stderr)
        return 2
    cpu = not has_gpu()
    cmd = launch_command(str(model), int(port), ours_args(tiers), cpu=cpu, extra=extra)
    proc = subprocess.Popen(cmd, env=server_env(cpu))
    stop = threading.Event()
    # The handler only records the request: stopping waits on the child, which must not happen
    # inside a handler that interrupted another wait on it (both need Popen's wait lock).
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while proc.poll() is None:
        if stop.wait(0.2):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            stop_tree(proc)
    if stop.is_set():
        return 0
    return 128 - proc.returncode if proc.returncode < 0 else proc.returncode

if __name__ == "__main__":
    sys.exit(serve_main())
