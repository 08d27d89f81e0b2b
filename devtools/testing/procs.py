"""What every server subprocess we start shares: the ports it listens on and its life cycle.

``pick_port()``: a TCP port for a server that binds it only later (SGLang, ``mooncake_master``,
etcd, the router, a pool restarted on its old port). A port from the kernel's ``bind(0)`` is the
wrong choice: it comes from the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), which
every ``bind(0)`` and outgoing ``connect()`` of every process draws from, so between our release and
the server's bind it can be taken; it once was, by the SGLang scheduler's own listening socket
(``[Errno 98]`` in the HTTP server, the scheduler spinning). So the pick is random from below that
range and outside SGLang's own range for the ports it picks the same way (22000-29999), checked
free on every address, never handed out twice by this process; callers still retry on a bind
failure, since another process can take any port.

``ServerProcess``: the life cycle shared by the server subprocesses we start (our pool server,
the real ``mooncake_master``): a private work folder with the log, graceful stop with a SIGKILL
fallback, a crash-like kill, the log's tail for error messages, and use as a context manager.
Subclasses set ``_proc`` in ``start()`` and may keep other files in ``workdir``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from typing import Any

# Where picked ports come from: from here up to the ephemeral range (or SGLang's range, whichever
# is lower). Arbitrary; low enough to leave the range wide, above the well-known services' ports.
PORT_LOW = 10000
# SGLang's get_free_port_below_ephemeral draws from here (nccl_port and the like): keep out.
SGLANG_PORTS = range(22000, 30000)
_DEFAULT_EPHEMERAL_LOW = 32768

_handed_out: set[int] = set()
_handed_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (what ``bind(0)`` and ``connect()`` pick from)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL_LOW, 60999


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """Nothing bound to ``port`` on ``host`` (``0.0.0.0``: on any IPv4 address) right now.

    Without SO_REUSEADDR, so a port in TIME_WAIT counts as taken: a server that sets the option
    could bind it, one that does not (etcd, the master) could not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str = "0.0.0.0", low: int | None = None, high: int | None = None) -> int:
    """A free TCP port below the ephemeral range and outside SGLang's, for a server that binds
    it later; never one this process handed out before (while others are left).

    Args:
        host: the address the server will bind; ``0.0.0.0`` checks every local IPv4 address.
        low, high: the inclusive range to pick from (default: ``PORT_LOW`` up to the ephemeral
            range's start, less SGLang's range).
    Raises:
        OSError: no free port in the range.
    """
    eph_low, _ = ephemeral_range()
    low = PORT_LOW if low is None else low
    high = min(eph_low, SGLANG_PORTS.start) - 1 if high is None else high
    candidates = [p for p in range(low, high + 1) if p not in SGLANG_PORTS]
    if not candidates:
        raise OSError(f"no ports to pick from in {low}-{high} (ephemeral range starts at {eph_low})")
    random.shuffle(candidates)
    with _handed_lock:
        fresh = [p for p in candidates if p not in _handed_out]
        for port in fresh or candidates:
            if port_is_free(port, host) and (host == "0.0.0.0" or port_is_free(port)):
                _handed_out.add(port)
                return port
    raise OSError(f"no free TCP port in {low}-{high} on {host}")


BIND_FAILURE_MARKERS = ("address already in use", "errno 98", "eaddrinuse",
                        "error while attempting to bind")


def says_bind_failed(text: str) -> bool:
    """Does a server's log say it could not bind its port."""
    low = text.lower()
    return any(m in low for m in BIND_FAILURE_MARKERS)


def _all_threads_stopped(pid: int) -> bool:
    """Is every thread of ``pid`` in the stopped state (``T``) per /proc."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone: nothing left to answer
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                # The state follows the command name, which is in parentheses and may hold spaces.
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue  # a thread that ended meanwhile
        if state not in (b"T", b"t"):
            return False
    return True


class ServerProcess:
    def __init__(self, prefix: str, log_name: str, parent: str | None = None) -> None:
        # ``parent``: the folder to make the work directory in (the system's temporary folder by
        # default); a cluster gives its own, so a cluster killed before its teardown leaves one
        # folder, which the next cluster deletes whole.
        if parent is not None:
            os.makedirs(parent, exist_ok=True)
        self.workdir = tempfile.mkdtemp(prefix=prefix, dir=parent)
        self.log_path = os.path.join(self.workdir, log_name)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (clean shutdown), SIGKILL after ``timeout``."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, mid-request if one is in flight."""
        self._signal(signal.SIGKILL, 10.0)

    def freeze(self, timeout: float = 5.0) -> None:
        """SIGSTOP, returning once every thread of the process is stopped: ``kill`` returns before
        the target stops, and a request sent in that window is still answered."""
        pid = self.pid
        if pid is None:
            raise RuntimeError(f"{type(self).__name__} is not running")
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not _all_threads_stopped(pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pid {pid} did not stop within {timeout:.0f} s of SIGSTOP")
            time.sleep(0.005)

    def thaw(self) -> None:
        """SIGCONT after ``freeze``."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def _signal(self, sig: signal.Signals, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def log_tail(self, nbytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                return f.read().decode(errors="replace")
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """``stop``, then delete ``workdir`` (its log with it): the end of a process started without
        ``with``. ``stop`` alone keeps the directory for a restart or a look at the log."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
