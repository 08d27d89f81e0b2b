"""A real ``mooncake_master`` on free 127.0.0.1 ports, for tests and benchmarks.

    with MooncakeMaster() as m:              # starts, waits for GET /health, stops on exit
        store.setup("127.0.0.1", m.metadata_url, seg, buf, "tcp", "", m.rpc_address)
        m.kill()                             # SIGKILL: the master loses every object's metadata
        m.restart()                          # same ports, so clients find it again
        m.metrics()["master_evicted_key_count"]  # the master's /metrics as a dict

Ports are picked free, below the ephemeral range, just before the first start (and re-picked if
another process takes one meanwhile), so read the addresses after ``start()``/``__enter__``. The
binary comes from the installed wheel (``mooncake-transfer-engine[-non-cuda]``), or from
``$MOONCAKE_MASTER_BIN``. It needs ``libibverbs.so.1`` (Debian: ``apt-get install libibverbs1``).
The master's log goes to a temporary file (``log_path``); its tail is in every start error.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from . import tool_envs
from .procs import ServerProcess, pick_port

MASTER_BIN_ENV = tool_envs.MOONCAKE_MASTER_BIN.name


class MasterStartError(RuntimeError):
    """The master binary is missing or did not become healthy in time."""


class _EarlyExit(Exception):
    """The master process died during startup (typically: a port was taken meanwhile)."""


_START_ATTEMPTS = 3


def find_master_binary() -> str:
    """Path of the ``mooncake_master`` executable; ``MasterStartError`` says how to get one."""
    env = tool_envs.MOONCAKE_MASTER_BIN.get()
    if env:
        return env
    # Locate the package without importing it: ``import mooncake.store`` needs libibverbs.
    spec = importlib.util.find_spec("mooncake")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(loc) / "mooncake_master"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(candidate.stat().st_mode | 0o111)
            return str(candidate)
    on_path = shutil.which("mooncake_master")
    if on_path:
        return on_path
    raise MasterStartError("mooncake_master not found: pip install 'mooncake-sgl[mooncake]' "
                           f"(or set ${MASTER_BIN_ENV} to the binary)")


def _die_with_parent() -> None:
    # Runs in the child before exec: a test process that crashes (Mooncake can segfault) must
    # not leave a master holding ports. Linux only; elsewhere the master simply outlives us.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now, below the ephemeral range (``procs.pick_port``: a
    kernel-picked one could be taken by any process's next connect before the master binds it)."""
    return pick_port(host)


class MooncakeMaster(ServerProcess):
    """One ``mooncake_master`` subprocess with RPC, metrics and HTTP metadata on 127.0.0.1.

    ``lease_ttl`` (e.g. ``"1s"``) shortens Mooncake's 10 s read lease so eviction tests run fast;
    ``extra_args`` are passed through verbatim (``["--eviction_high_watermark_ratio=0.8"]``);
    ``prefix`` goes before the command (``["ip", "netns", "exec", "NS"]`` for another host).
    Ports are chosen once and kept across ``restart()``. The master is SIGKILLed if the thread
    that started it dies, so start it from a long-lived thread (the test's or the benchmark's).
    """

    def __init__(self, *, host: str = "127.0.0.1", lease_ttl: str | None = None,
                 client_ttl_s: int | None = None, extra_args: Sequence[str] = (),
                 startup_timeout: float = 30.0, prefix: Sequence[str] = (),
                 parent: str | None = None) -> None:
        self.host = host
        self._prefix = list(prefix)
        # Run under a prefix (``ip netns exec NS``), ``host`` is not an address of ours to check.
        self._pick_host = "0.0.0.0" if prefix else host
        self.rpc_port, self.metrics_port, self.http_metadata_port = self._pick_ports()
        self._lease_ttl = lease_ttl
        self._client_ttl_s = client_ttl_s
        self._extra_args = list(extra_args)
        self._startup_timeout = startup_timeout
        self._binary = find_master_binary()
        super().__init__("mooncake_master_", "master.log", parent)
        self._started_once = False

    # -------------------------------------------------------------------------------- addresses

    @property
    def rpc_address(self) -> str:
        """``host:port`` for ``MooncakeDistributedStore.setup(master_server_addr=...)``."""
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        """The master's embedded HTTP metadata server, for ``setup(metadata_server=...)``."""
        return f"http://{self.host}:{self.http_metadata_port}/metadata"

    @property
    def metrics_url(self) -> str:
        """Base URL of the admin HTTP server (``/health``, ``/metrics``, ``/get_all_keys``...)."""
        return f"http://{self.host}:{self.metrics_port}"

    # -------------------------------------------------------------------------------- lifecycle

    def _pick_ports(self) -> tuple[int, int, int]:
        return pick_port(self._pick_host), pick_port(self._pick_host), pick_port(self._pick_host)

    def _argv(self) -> list[str]:
        argv = [*self._prefix, self._binary,
                f"--rpc_address={self.host}", f"--rpc_port={self.rpc_port}",
                f"--metrics_host={self.host}", f"--metrics_port={self.metrics_port}",
                "--enable_http_metadata_server=true",
                f"--http_metadata_server_host={self.host}",
                f"--http_metadata_server_port={self.http_metadata_port}",
                "--logtostderr=true"]
        if self._lease_ttl is not None:
            argv.append(f"--default_kv_lease_ttl={self._lease_ttl}")
        if self._client_ttl_s is not None:
            argv.append(f"--client_ttl={self._client_ttl_s}")
        return argv + self._extra_args

    def start(self) -> MooncakeMaster:
        """Start the master and wait until ``/health`` answers; no-op while it runs.

        A free port can be taken by another process between choosing and binding it; a first
        start that dies early therefore retries on new ports (``restart`` keeps its ports)."""
        if self.pid is not None:
            return self
        for attempt in range(_START_ATTEMPTS):
            try:
                return self._start_once()
            except _EarlyExit as e:
                if self._started_once or attempt == _START_ATTEMPTS - 1:
                    raise MasterStartError(str(e)) from None
                self.rpc_port, self.metrics_port, self.http_metadata_port = self._pick_ports()
        raise AssertionError("unreachable")

    def _start_once(self) -> MooncakeMaster:
        env = dict(os.environ)
        env["GLOG_minloglevel"] = "0"  # its own log file: keep everything a failure might need
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self._argv(), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                          preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise _EarlyExit(f"mooncake_master exited with code {self._proc.returncode} during "
                                 f"startup ({self!r}):\n{self.log_tail()}")
            if self.healthy():
                self._started_once = True
                return self
            time.sleep(0.05)
        self.kill()
        raise MasterStartError(f"mooncake_master not healthy within {self._startup_timeout:.0f}s "
                               f"on {self.metrics_url}/health:\n{self.log_tail()}")

    def healthy(self) -> bool:
        """Does ``/health`` answer 200 right now."""
        try:
            with urllib.request.urlopen(f"{self.metrics_url}/health", timeout=0.5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> dict[str, float]:
        """The master's Prometheus gauges and counters without labels (``master_key_count``,
        ``master_evicted_key_count``, ``master_allocated_bytes``...)."""
        with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name and not name.startswith("#") and "{" not in name:
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out

    def restart(self) -> MooncakeMaster:
        """Kill if running, then start again on the same ports."""
        self.kill()
        return self.start()

    def role(self) -> str:
        """``leader`` or ``standby`` for a master of an HA set; ``""`` when it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.metrics_url}/role", timeout=2) as r:
                return r.read().decode().strip()
        except OSError:
            return ""


    def __repr__(self) -> str:
        return f"MooncakeMaster(rpc={self.rpc_address}, metadata={self.metadata_url}, pid={self.pid})"


@contextmanager
def ha_masters(workdir: Path, n: int = 2) -> Iterator[tuple[str, list[MooncakeMaster]]]:
    """Mooncake's HA deployment on 127.0.0.1: one etcd and ``n`` masters electing a leader through
    it. Yields the ``master`` a client is given (``etcd://host:port``) and the masters; on exit
    every master is resumed (a test may have SIGSTOPped one) and stopped, then etcd."""
    if shutil.which("etcd") is None:
        raise MasterStartError("etcd not found (Debian: apt-get install etcd-server)")
    client_port, peer_port = pick_port(), pick_port()
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    etcd = subprocess.Popen(
        ["etcd", "--data-dir", str(workdir / "etcd"), "--listen-client-urls", client,
         "--advertise-client-urls", client, "--listen-peer-urls", peer,
         "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    endpoint = f"127.0.0.1:{client_port}"
    ha = ["--enable_ha=true", "--ha_backend_type=etcd", f"--ha_backend_connstring={endpoint}",
          f"--etcd_endpoints={endpoint}"]
    masters = [MooncakeMaster(extra_args=ha) for _ in range(n)]
    try:
        deadline = time.monotonic() + 10
        while not _etcd_healthy(client):
            if etcd.poll() is not None or time.monotonic() > deadline:
                raise MasterStartError(f"etcd did not start on {client}")
            time.sleep(0.1)
        for m in masters:
            m.start()
        yield f"etcd://{endpoint}", masters
    finally:
        for m in masters:
            with suppress(ProcessLookupError):  # gone meanwhile
                m.thaw()
            m.close()
        etcd.kill()
        etcd.wait(10)


def _etcd_healthy(client_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{client_url}/health", timeout=0.5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False
