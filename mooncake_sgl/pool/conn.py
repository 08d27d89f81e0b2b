"""A pool server connection's state, and what it holds in the pool.

Holds. A one-sided client (shared memory, RDMA) reserves slots before it writes them and leases
pages before it reads them; each reservation or lease is a ``Hold`` that pins slots until its
COMMIT or RELEASE. Holds are bounded twice over: in time (``hold_timeout``; past it the server
voids the hold and closes the connection) and in bytes (``HoldLedger``: one client process may
hold at most its tenant's ``max_hold_bytes`` over all its connections), so a stalled or greedy
client cannot pin the pool.

Quarantine. A same-host client keeps the segment mapped after its connection closes, so a client
that was stopped mid-copy may still write into a reservation the server voided. Such slots are
not reused until that process has exited, or has reconnected and had ``hold_timeout`` to finish
any copy it was in; only then are they freed. (TCP clients cannot write outside a PUT frame, and
an RDMA client's queue pair is destroyed before its slots are freed.)
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from .index import Entry, PoolIndex
from .tenants import Tenant

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_pid(sock: socket.socket) -> int:
    """The connected Unix-socket peer's process id (0 if unknown, e.g. another pid namespace)."""
    try:
        pid, _, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return 0
    return max(pid, 0)


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie's memory, mappings included, is already gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] == b"Z"


@dataclass
class Hold:
    """One open reservation (``res``: per key of the request) or lease."""
    entries: list[Entry | None]
    nbytes: int
    since: float = field(default_factory=time.monotonic)
    res: list[object] | None = None


class Conn:
    """Per-connection state. ``tenant`` is set once the handshake proved its secret."""

    def __init__(self, sock: socket.socket, peer: str, unix: bool):
        self.sock = sock
        self.peer = peer
        self.unix = unix
        self.pid = peer_pid(sock) if unix else 0
        self.tenant: Tenant | None = None
        self.one_sided = False  # the client maps the tenant's segment (shm) or reaches it by RDMA
        self.tickets: dict[int, Hold] = {}
        self.leases: dict[int, Hold] = {}
        self.rdma: object | None = None

    @property
    def holder(self) -> tuple[str, object]:
        """Who a hold is charged to: the client process when the kernel names it, else this
        connection."""
        assert self.tenant is not None
        return (self.tenant.name, self.pid or id(self))

    def oldest_hold(self) -> float | None:
        holds = [h.since for h in (*self.tickets.values(), *self.leases.values())]
        return min(holds) if holds else None


@dataclass
class _Quarantined:
    pid: int
    index: PoolIndex
    entries: list[Entry]
    release_at: float | None  # None until the process reconnects


class HoldLedger:
    """Bytes held per holder (see ``Conn.holder``), and the slots in quarantine. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, object], int] = {}
        self._quarantine: list[_Quarantined] = []

    def take(self, holder: tuple[str, object], sizes: list[int], limit: int) -> int:
        """How many of ``sizes`` (a prefix) fit under ``limit``; charges them to ``holder``."""
        with self._lock:
            held = self._held.get(holder, 0)
            n = 0
            for size in sizes:
                if held + size > limit:
                    break
                held += max(size, 0)
                n += 1
            self._held[holder] = held
        return n

    def give_back(self, holder: tuple[str, object], nbytes: int) -> None:
        with self._lock:
            left = self._held.get(holder, 0) - nbytes
            if left > 0:
                self._held[holder] = left
            else:
                self._held.pop(holder, None)

    def quarantine(self, pid: int, index: PoolIndex, entries: list[Entry], grace: float) -> None:
        """Keep ``entries``' slots out of use until ``pid`` exits or reconnects (plus ``grace``);
        a process the kernel did not name gets ``grace`` from now."""
        with self._lock:
            self._quarantine.append(_Quarantined(pid, index, entries,
                                                 None if pid else time.monotonic() + grace))

    def reconnected(self, pid: int, grace: float) -> None:
        with self._lock:
            for q in self._quarantine:
                if q.pid == pid and q.release_at is None:
                    q.release_at = time.monotonic() + grace

    def release_due(self) -> int:
        """Free the quarantined slots whose process is gone or whose grace ran out."""
        with self._lock:
            if not self._quarantine:
                return 0
            now = time.monotonic()
            keep, due = [], []
            for q in self._quarantine:
                gone = (q.release_at is not None and now >= q.release_at) or (
                    q.pid and process_gone(q.pid))
                (due if gone else keep).append(q)
            self._quarantine = keep
        for q in due:
            q.index.abort(q.entries)
        return len(due)

    def quarantined_bytes(self) -> int:
        with self._lock:
            return sum(e.size for q in self._quarantine for e in q.entries)
