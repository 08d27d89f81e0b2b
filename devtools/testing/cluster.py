"""A cluster on one machine: each "host" a network namespace on one bridge, for tests and benches.

    with Cluster(3) as c:                              # 3 namespaces, 10.231.N.1-3 on bridge mcsglN
        pool = c.pool(c.hosts[2], capacity="1GiB")    # ``mooncake-sgl pool`` on host 2
        etcd = c.etcd(c.hosts[2])
        masters = [c.master(c.hosts[2], etcd), c.master(c.hosts[1], etcd)]   # leader + standby
        s0 = c.sglang(c.hosts[0], model, tiers_yaml)   # a live CPU server through our launcher
        router = c.router([s0.url, ...], "cache_aware")   # sglang-router, on this machine's side
        c.transport(c.hosts[0], pool.endpoint)         # "tcp": another host; "shm" on host 2
        c.cut(c.hosts[0]); c.reconnect(c.hosts[0])     # off the bridge and back
        c.limit_egress(c.hosts[2], 2e6)                # host 2 sends at 2 MB/s (None: unlimited)
        c.kill_host(c.hosts[2])                        # SIGKILL of everything running in it

Addresses: host ``i`` is ``10.231.N.(i+1)/24`` on its ``eth0``; the bridge, in this machine's own
namespace, is ``10.231.N.254`` (that is how tests, the router and clients here reach the hosts).
``N`` is the first subnet no other cluster on this machine uses. Nothing is routed anywhere else:
the addresses exist only on the bridge and inside the namespaces made here.

What a namespace changes for the components: SGLang cannot see the cgroup filesystem there, so its
HiCache host pool is given a size (``HICACHE_SIZING``; ``--hicache-size`` in ``extra`` also does);
shared memory between a pool and a client needs the same host, since the pool's Unix socket is in
the abstract namespace, which is per network namespace (``transport: auto`` then picks TCP, as
between real hosts).

Teardown: ``close()`` (also on ``__exit__``, Ctrl-C and interpreter exit) stops every component,
SIGKILLs whatever still runs in a namespace, and deletes the namespaces and the bridge. A cluster
whose process was SIGKILLed is cleaned by the next one (its owner file names a dead pid).

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; ``unavailable_reason()`` says what is
missing, and ``Cluster`` refuses with it (``ClusterUnavailable``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mooncake_sgl_cpu.adaptations import HOST_RESERVE_ENV

from ..bench.server import LaunchedServer, launch_command, ours_args, server_env
from .mooncake_master import MooncakeMaster
from .pool_process import PoolProcess
from .procs import pick_port

SUBNET = "10.231"
PREFIX = "mcsgl"  # of every bridge, namespace and veth made here
BRIDGE_HOST = 254
# SGLang's host pool is sized explicitly: its automatic size reads cgroup limits a namespace cannot
# see (it then refuses to start). A ratio, not ``--hicache-size`` (whole GB): twice the device pool,
# SGLang's own default ratio, is megabytes for a tiny model. Either flag given later wins.
HICACHE_SIZING = ("--hicache-ratio", "2")
_STATE = Path(tempfile.gettempdir()) / "mooncake-sgl-cluster"
WORKDIR_PREFIX = "mooncake-sgl-cluster-"  # of a work directory a cluster makes for itself
# A master's start on a loaded two-core machine; the 30 s default of a lone one is too tight here.
MASTER_START_S = 120.0


class ClusterUnavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode:
        raise ClusterUnavailable(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made on this machine, or ``None`` when they can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux-only (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"`ip netns add` is not allowed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One namespace: its name, its address on the bridge, and the root side of its cable."""
    index: int
    netns: str
    addr: str
    veth: str

    @property
    def prefix(self) -> list[str]:
        """What runs a command in this host."""
        return ["ip", "netns", "exec", self.netns]


class Etcd:
    """One etcd member in a host (the Mooncake masters elect their leader through it)."""

    def __init__(self, host: Host, workdir: Path) -> None:
        self.host = host
        self.workdir = workdir
        self.client_port = self.peer_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host.addr}:{self.client_port}"

    def start(self, timeout_s: float = 90.0) -> Etcd:
        """Start (again: on the same ports and data, as the masters know it) and wait for health."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        again = bool(self.client_port)
        for _ in range(1 if again else 3):  # a picked port can be taken meanwhile: pick again
            if not again:
                self.client_port, self.peer_port = pick_port(), pick_port()
            peer = f"http://{self.host.addr}:{self.peer_port}"
            client = f"http://{self.endpoint}"
            log = open(self.workdir / "etcd.log", "ab")
            self.proc = subprocess.Popen(
                [*self.host.prefix, "etcd", "--data-dir", str(self.workdir / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"default={peer}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                if _http_ok(f"{client}/health"):
                    return self
                time.sleep(0.2)
            self.stop()
            if "address already in use" not in (self.workdir / "etcd.log").read_text(errors="replace"):
                break
        raise RuntimeError(f"etcd did not start in {self.host.netns}:\n"
                           f"{(self.workdir / 'etcd.log').read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# The router's checks of its workers' /health. SGLang's /health runs a one-token generation and
# answers once the scheduler produces any output, 503 after 20 s without (SGLANG_HEALTH_CHECK_TIMEOUT);
# on a loaded CPU server that answer took up to 5.03 s (measured, bench_cluster's workload), which
# is the router's default timeout (5 s): a busy, healthy server failed checks. 30 s leaves the
# verdict to SGLang's own limit. ``extra`` flags given to ``router()`` come later and win.
ROUTER_HEALTH = ("--health-check-timeout-secs", "30")


def router_command(port: int, worker_urls: Sequence[str], policy: str,
                   extra: Sequence[str] = ()) -> list[str]:
    """``sglang-router`` on 127.0.0.1:``port`` with ``policy`` in front of ``worker_urls``."""
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
            "--port", str(port), "--policy", policy, "--worker-urls", *worker_urls,
            "--prometheus-port", str(pick_port()), *ROUTER_HEALTH, *extra]


def wait_router_ready(url: str, workers: int, timeout_s: float) -> None:
    """Until the router at ``url`` counts ``workers`` healthy workers (its ``/readiness``).

    Its ``/health`` is its own liveness: it answers 200 before a single worker is registered
    (measured: ``"workers": []`` for the first seconds), and a request sent then is a 503 "No
    available workers"; that is how bench_cluster's first requests of a cell failed."""
    import json

    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readiness", timeout=5) as r:
                body = json.loads(r.read())
            if body.get("healthy_workers", 0) >= workers:
                return
            last = str(body)
        except (OSError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise TimeoutError(f"router {url}: not {workers} healthy workers after {timeout_s:.0f} s ({last})")


def _http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


class Cluster:
    """``n`` hosts on one bridge and the components started in them; see the module docstring."""

    def __init__(self, n: int, workdir: Path | None = None) -> None:
        if n < 1:
            raise ValueError(f"a cluster needs at least one host, got {n}")
        self.n = n
        self._own_workdir = workdir is None  # made here, so deleted by close()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        self.hosts: list[Host] = []
        self.net = -1
        self.bridge = ""
        # (host or None for this machine's side, stop function), in start order
        self._stops: list[tuple[Host | None, Callable[[], None]]] = []
        self._closed = False

    # ---------------------------------------------------------------------------- the network

    @property
    def bridge_addr(self) -> str:
        """This machine's own address on the bridge (where the hosts reach it)."""
        return f"{SUBNET}.{self.net}.{BRIDGE_HOST}"

    def start(self) -> Cluster:
        reason = unavailable_reason()
        if reason:
            self.close()  # its work directory, made for nothing
            raise ClusterUnavailable(f"cannot make a cluster of network namespaces: {reason}")
        _clean_stale()
        atexit.register(self.close)
        try:
            self.net = self._claim_subnet()
            self.bridge = f"{PREFIX}{self.net}"
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.n):
                host = Host(i, f"{PREFIX}{self.net}h{i}", f"{SUBNET}.{self.net}.{i + 1}",
                            f"{PREFIX}{self.net}v{i}")
                _ip("netns", "add", host.netns)
                self.hosts.append(host)
                _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
                _ip("link", "set", host.veth, "master", self.bridge)
                _ip("link", "set", host.veth, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.addr}/24", "dev", "eth0")
                _ip("-n", host.netns, "link", "set", "eth0", "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _claim_subnet(self) -> int:
        _STATE.mkdir(parents=True, exist_ok=True)
        used = _ip("-o", "addr").stdout
        for net in range(256):
            owner = _STATE / f"{net}.pid"
            taken = _ip("link", "show", f"{PREFIX}{net}", check=False).returncode == 0
            if taken or f" {SUBNET}.{net}." in used:
                continue
            try:
                fd = os.open(owner, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            # The work directory made here, so that the next cluster deletes it if this process is
            # SIGKILLed (a directory given by the caller is never named).
            os.write(fd, f"{os.getpid()}\n{self.workdir if self._own_workdir else ''}\n".encode())
            os.close(fd)
            return net
        raise ClusterUnavailable(f"every subnet {SUBNET}.0-255.0/24 is in use on this machine")

    def cut(self, host: Host) -> None:
        """Unplug ``host`` from the bridge: it keeps running, nothing reaches it or leaves it."""
        _ip("link", "set", host.veth, "nomaster")

    def reconnect(self, host: Host) -> None:
        _ip("link", "set", host.veth, "master", self.bridge)
        _ip("link", "set", host.veth, "up")

    def limit_egress(self, host: Host, bytes_per_s: float | None) -> None:
        """Shape what ``host`` sends (a pool's replies: what its clients read) to ``bytes_per_s``
        with a token bucket (``tc tbf``) on its ``eth0``; ``None`` or 0 lifts the limit. A slow
        link, not a delayed one: ``netem``, which delays, is missing from some kernels (this VM's)."""
        if not bytes_per_s:
            self.run(host, ["tc", "qdisc", "del", "dev", "eth0", "root"])  # fails harmlessly when none
            return
        # The bucket holds 10 ms of traffic (at least 64 KiB) and queues up to 16 MiB before
        # dropping, so TCP sees a slow link rather than a lossy one.
        burst = max(64 << 10, int(bytes_per_s / 100))
        out = self.run(host, ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                              "rate", f"{int(bytes_per_s * 8)}bit", "burst", str(burst),
                              "limit", str(16 << 20)])
        if out.returncode:
            raise ClusterUnavailable(f"cannot shape {host.netns}'s link: {out.stderr.strip()}")

    def kill_host(self, host: Host) -> list[int]:
        """SIGKILL every process running in ``host`` (a host that lost power); their pids."""
        pids = [int(p) for p in _ip("netns", "pids", host.netns, check=False).stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def run(self, host: Host, argv: Sequence[str], timeout_s: float = 60.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A command in ``host``, to its end."""
        return subprocess.run([*host.prefix, *argv], capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {})})

    def transport(self, host: Host, endpoint: str, secret: str = "") -> str:
        """The transport ``transport: auto`` picks from ``host`` to the pool at ``endpoint``."""
        code = ("import sys; from mooncake_sgl.transfer.client import PoolClient; "
                "c = PoolClient(sys.argv[1], secret=sys.argv[2], connections=1); c.stats(); "
                "print(c.mode); c.close()")
        out = self.run(host, [sys.executable, "-c", code, endpoint, secret],
                       env={"PYTHONPATH": _package_root()})
        if out.returncode:
            raise RuntimeError(f"pool client in {host.netns} failed: {out.stderr[-2000:]}")
        return out.stdout.strip().splitlines()[-1]

    def disk(self, size: str) -> Path:
        """A file system of its own, ``size`` big (tmpfs: ``64m``), for a tier whose disk fills up.
        It is mounted on this machine's side, so every host sees it; it is unmounted at ``close()``,
        or by the next cluster if this one's process was SIGKILLed (its mounts file)."""
        path = self.workdir / f"disk-{len(self._stops)}"
        path.mkdir(parents=True)
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30)
        if out.returncode:
            raise ClusterUnavailable(f"cannot mount a {size} tmpfs at {path}: {out.stderr.strip()}")
        with open(_STATE / f"{self.net}.mounts", "a") as f:
            f.write(f"{path}\n")
        self._track(None, lambda: _umount(path))
        return path

    # ---------------------------------------------------------------------------- components

    def _track(self, host: Host | None, stop: Callable[[], None]) -> None:
        self._stops.append((host, stop))

    def pool(self, host: Host, startup_timeout: float = 60.0, **config: Any) -> PoolProcess:
        """A ``mooncake-sgl pool`` server in ``host``, on its address (``config``: its fields)."""
        pool = PoolProcess(startup_timeout=startup_timeout, prefix=host.prefix, parent=str(self.workdir),
                           host=host.addr, **config)
        self._track(host, pool.close)
        return pool.start()

    def etcd(self, host: Host) -> Etcd:
        workdir = self.workdir / f"etcd-{host.index}-{len(self._stops)}"
        workdir.mkdir(parents=True)
        etcd = Etcd(host, workdir)
        self._track(host, etcd.stop)
        return etcd.start()

    def master(self, host: Host, etcd: Etcd | None = None, extra_args: Sequence[str] = ()) -> MooncakeMaster:
        """A ``mooncake_master`` in ``host``; with ``etcd``, one of an HA set (leader or standby)."""
        ha = [] if etcd is None else [
            "--enable_ha=true", "--ha_backend_type=etcd", f"--ha_backend_connstring={etcd.endpoint}",
            f"--etcd_endpoints={etcd.endpoint}"]
        master = MooncakeMaster(host=host.addr, prefix=host.prefix, extra_args=[*ha, *extra_args],
                                startup_timeout=MASTER_START_S, parent=str(self.workdir))
        self._track(host, master.close)
        return master.start()

    def sglang(self, host: Host, model: Path | str, tiers: Path | None, extra: Sequence[str] = (),
               env: dict[str, str] | None = None, health_timeout_s: float = 900.0,
               name: str = "") -> LaunchedServer:
        """A live SGLang server with our backend over ``tiers`` (``None``: no HiCache) in ``host``,
        started through our launcher (CPU flags on a host without a GPU)."""
        from ..bench.server import has_gpu

        cpu = not has_gpu()
        args = ours_args(tiers) if tiers is not None else ()
        sizing = HICACHE_SIZING if tiers is not None else ()

        def cmd(port: int) -> list[str]:
            return [*host.prefix, *launch_command(str(model), port, args, cpu=cpu, host=host.addr,
                                                  extra=(*sizing, *extra))]

        name = name or f"sglang-{host.index}-{len(self._stops)}"
        server = LaunchedServer(cmd, pick_port(), self.workdir / f"{name}.log", health_timeout_s,
                                env=server_env(cpu, {"PYTHONPATH": _package_root(),
                                                     HOST_RESERVE_ENV: str(HOST_RESERVE), **(env or {})}),
                                host=host.addr)
        self._track(host, server.stop)
        if tiers is not None:
            _check_host_memory()
        return server.start()

    def router(self, worker_urls: Sequence[str], policy: str, extra: Sequence[str] = (),
               health_timeout_s: float = 300.0) -> LaunchedServer:
        """``sglang-router`` on this machine's side (127.0.0.1), in front of ``worker_urls``;
        returned once it routes to every one of them (``wait_router_ready``)."""
        import importlib.util

        if importlib.util.find_spec("sglang_router") is None:
            raise RuntimeError("sglang-router is not installed (pip install sglang-router)")

        def cmd(port: int) -> list[str]:
            return router_command(port, worker_urls, policy, extra)

        router = LaunchedServer(cmd, pick_port(), self.workdir / f"router-{len(self._stops)}.log",
                                health_timeout_s)
        self._track(None, router.stop)
        router.start()
        wait_router_ready(router.url, len(worker_urls), health_timeout_s)
        return router

    # ---------------------------------------------------------------------------- teardown

    def close(self) -> None:
        """Stop everything, delete the namespaces and the bridge; idempotent, never raises."""
        if self._closed:
            return
        self._closed = True
        for _, stop in reversed(self._stops):
            try:
                stop()
            except Exception:  # noqa: BLE001 - teardown goes on whatever one component does
                pass
        for host in self.hosts:
            self.kill_host(host)
            # Deleting our end deletes the pair now; left to the namespace, it goes only once the
            # last killed process in it has been reaped, and may outlive this call.
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.netns, check=False)
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
        if self.net >= 0:
            (_STATE / f"{self.net}.mounts").unlink(missing_ok=True)
            (_STATE / f"{self.net}.pid").unlink(missing_ok=True)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# What SGLang keeps back from a HiCache host pool's size check on the cluster's servers (its own
# 10 GiB is for a GPU server's host: on a machine shared with other servers it refuses the tiny
# pools of these whenever the others hold the RAM). Arbitrary, but not 1 GiB: SGLang checks minutes
# into a start on a loaded machine, and a server (of a fault test beside two other clusters) was
# refused a 0.03 GB pool with 0.96 GiB available then.
HOST_RESERVE = 512 << 20


def _check_host_memory() -> None:
    """Fail now, saying why, where SGLang would refuse the host pool after a minute of start-up."""
    import psutil

    available = psutil.virtual_memory().available
    if available < 2 * HOST_RESERVE:
        raise RuntimeError(f"too little RAM for another live server: {available / 2**30:.1f} GiB available")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def _clean_stale() -> None:
    """Remove what clusters whose process is gone left behind (it was SIGKILLed, say)."""
    if not _STATE.is_dir():
        return
    for owner in _STATE.glob("*.pid"):
        try:
            pid, *workdir = owner.read_text().split("\n")
            os.kill(int(pid), 0)
            continue
        except ProcessLookupError:
            pass
        except (ValueError, IndexError, PermissionError, OSError):
            continue
        net = owner.stem
        for ns in _ip("netns", "list", check=False).stdout.split("\n"):
            name = ns.split(" ")[0]
            if name.startswith(f"{PREFIX}{net}h"):
                for pid_s in _ip("netns", "pids", name, check=False).stdout.split():
                    try:
                        os.kill(int(pid_s), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                _ip("link", "del", f"{PREFIX}{net}v{name.removeprefix(f'{PREFIX}{net}h')}", check=False)
                _ip("netns", "del", name, check=False)
        _ip("link", "del", f"{PREFIX}{net}", check=False)
        mounts = _STATE / f"{net}.mounts"
        if mounts.is_file():
            for line in mounts.read_text().splitlines():
                _umount(Path(line))
            mounts.unlink(missing_ok=True)
        made = Path(workdir[0]) if workdir and workdir[0] else None
        if made and made.name.startswith(WORKDIR_PREFIX):
            shutil.rmtree(made, ignore_errors=True)
        owner.unlink(missing_ok=True)
