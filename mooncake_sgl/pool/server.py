"""The pool server: pre-faulted DRAM segments (one per tenant) served over TCP, a Unix socket
(shared memory) and, where a device exists, RDMA.

Threads: one accept loop per listening socket (a failed accept or thread start costs that one
connection, never the loop: ``accept``), one thread per connection (socket calls and numpy
copies release the GIL, so connections overlap), one housekeeping thread (eviction, quarantine),
one thread that turns away connections over the limit. Each connection first runs the handshake
in ``protocol`` (secret checked before any page moves, the tenant bound), then serves frames in
order until the peer closes. A bad frame gets an ERROR reply naming the problem and closes only
that connection. When a connection ends, its open reservations are aborted and its leases released.

This module owns the server's sockets, threads and segments: it opens and closes every one, runs
the handshake and the wait between requests, and keeps the stats. Who is let in is ``accept``'s;
what one request does to the tenant's pages, and its reply, are ``requests``'s.

Limits, so that no peer can pin the server:

- before authentication: at most ``max_handshakes`` connections (a new one pushes out the oldest,
  and one over ``max_connections`` does too while any is unauthenticated), one deadline for the
  whole handshake, and a CLIENT_HELLO of at most ``protocol.HANDSHAKE_MAX_META`` bytes;
- after it: ``idle_timeout`` between requests; ``request_timeout`` (plus the data's time at
  ``requests.MIN_RATE``) for a request to arrive and its reply to be taken; ``hold_timeout`` for a
  reservation or lease, and at most ``max_hold_bytes`` held per client process (``conn``).

    server = PoolServer(PoolServerConfig(port=0)).start()   # in-process, returns at once
    server.address                                          # ('127.0.0.1', 40123)
    server.stop()
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from ..errors import AuthError, ConfigError, ProtocolError
from ..memory import MemoryRoots, memory_headroom
from ..tally import Tally
from ..transfer import protocol as P
from ..transfer.tcp import (
    kernel_timeouts,
    read_frame,
    recv_exact,
    recv_exact_into,
    send_buffers,
    tune,
    wait_readable,
)
from .accept import AcceptFailures, Admission, fit_descriptor_limit
from .config import PoolServerConfig
from .conn import Conn, HoldLedger
from .metrics import MetricsHttp, PoolMetrics
from .onesided import OneSided
from .refuse import Refuser
from .requests import MIN_RATE, Requests
from .tenants import Tenant, authenticate, build_tenants

log = logging.getLogger("mooncake_sgl.pool")


@dataclass(frozen=True)
class PoolServerStats:
    """What the server counts across tenants: connections, wire errors, bytes moved."""

    connections_total: int = 0
    auth_failures: int = 0
    protocol_errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    refused_connections: int = 0
    handshake_drops: int = 0
    accept_failures: int = 0
    timeouts: int = 0
    idle_closed: int = 0
    holds_expired: int = 0


class _Expired(Exception):
    """A connection held a reservation or lease past ``hold_timeout``."""


class PoolServer:
    def __init__(self, config: PoolServerConfig, memory_roots: MemoryRoots = MemoryRoots()):
        self.config = config
        self._memory_roots = memory_roots
        self.server_id = uuid.uuid4().hex
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._admission = Admission(config.max_connections, config.max_handshakes)
        self._listeners: list[socket.socket] = []
        self._refuser = Refuser(f"too many connections (max_connections={config.max_connections})",
                                self._stop)
        self.holds = HoldLedger()
        self.tenants: dict[str, Tenant] = {}
        self.address: tuple[str, int] = (config.host, config.port)
        self.unix_name = ""
        self.rdma: dict[str, object] = {}  # tenant -> its segment's RDMA registration
        self.started = 0.0
        self.counters = Tally(PoolServerStats)
        self.one_sided = OneSided(self.holds, config.hold_timeout, self.counters)
        # With ``metrics_port``: the /metrics endpoint and its per-op latency histogram.
        self.metrics: PoolMetrics | None = None
        self.metrics_http: MetricsHttp | None = None
        self._requests = Requests(config, self.counters, self.one_sided, self.rdma, self.stats)

    @property
    def capacity(self) -> int:
        return sum(t.segment.size for t in self.tenants.values())

    # -------------------------------------------------------------------------------- lifecycle

    def start(self) -> PoolServer:
        cfg = self.config
        t0 = time.monotonic()
        self._check_memory(sum(t.capacity for t in cfg.tenants) if cfg.tenants else cfg.capacity)
        fit_descriptor_limit(cfg.max_connections, log)
        self.tenants = build_tenants(cfg)
        log.info("%d segment(s), %d bytes, ready in %.2fs (populate=%s)", len(self.tenants),
                 self.capacity, time.monotonic() - t0, cfg.populate)
        if cfg.rdma_device != "off":  # before listening: every hello must tell the truth about it
            self._open_rdma()
        if cfg.metrics_port is not None:
            self.metrics = PoolMetrics(self.stats)
            try:
                self.metrics_http = self.metrics.serve(cfg.host, cfg.metrics_port)
            except OSError as e:
                raise ConfigError(f"cannot serve /metrics on {cfg.host}:{cfg.metrics_port}: {e}",
                                  key="metrics_port") from e
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((cfg.host, cfg.port))
        tcp.listen(128)
        self.address = tcp.getsockname()[:2]
        self._listeners.append(tcp)
        self._spawn(self._accept_loop, tcp, False)
        if cfg.shared_memory:
            # Abstract namespace: nothing on disk to leak when the server is killed.
            self.unix_name = f"\0mooncake-sgl-pool-{self.server_id}"
            ux = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            ux.bind(self.unix_name)
            ux.listen(128)
            self._listeners.append(ux)
            self._spawn(self._accept_loop, ux, True)
        self._spawn(self._housekeeping)
        self._spawn(self._refuser.run)
        self.started = time.time()
        log.info("pool %s listening on %s:%d (shared memory %s, tenants %s)", self.server_id[:8],
                 *self.address, "on" if self.unix_name else "off",
                 ", ".join(repr(n) for n in self.tenants) if cfg.tenants else
                 f"one, secret {'on' if cfg.secret else 'off'}")
        return self

    def _check_memory(self, capacity: int) -> None:
        """Pre-faulting more than the host or the container's cgroup gives would end in the OOM
        killer, not an error; without ``populate`` the segments fill up to it as pages arrive."""
        room = memory_headroom(self._memory_roots)
        if room is None or capacity <= room.nbytes:
            return
        what = (f"capacity of {capacity} bytes exceeds the {room.nbytes} bytes of memory available "
                f"(bounded by {room.bound})")
        if self.config.populate:
            raise ConfigError(f"{what}; lower capacity, or raise the limit", key="capacity")
        log.warning("%s: the pool will be OOM-killed once it fills; lower capacity", what)

    def _open_rdma(self) -> None:
        from ..transfer import rdma

        sides = {name: rdma.open_server_side(t.segment, self.config.rdma_device)
                 for name, t in self.tenants.items()}
        if any(side is None for side in sides.values()):
            log.warning("RDMA requested but off: %s", rdma.unavailable_reason(self.config.rdma_device))
            return
        self.rdma.update(sides)  # in place: ``Requests`` holds this dict
        log.info("RDMA: %s", "; ".join(s.describe() for s in sides.values()))  # type: ignore[attr-defined]

    def stop(self) -> None:
        """Stop accepting, drop every connection, free the segments. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        for s in self._listeners:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        if self.metrics_http is not None:
            self.metrics_http.close()
        for c in self._admission.open():
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        for t in self.tenants.values():
            t.segment.close()
        log.info("pool %s stopped", self.server_id[:8])

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def _spawn(self, fn, *args) -> None:  # noqa: ANN001
        t = threading.Thread(target=fn, args=args, daemon=True, name=f"pool-{fn.__name__}")
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _housekeeping(self) -> None:
        while not self._stop.wait(0.02):
            for t in self.tenants.values():
                if t.index.over_high_watermark():
                    n = t.index.evict_to_watermark()
                    if n:
                        log.debug("tenant %r: evicted %d pages down to the low watermark", t.name, n)
            self.holds.release_due()

    # ----------------------------------------------------------------------------------- accept

    def _accept_loop(self, listener: socket.socket, unix: bool) -> None:
        """Never blocks on a peer (a refusal is handed to the refuse thread) and never ends before
        ``stop()``: a failed accept or thread start costs that connection only (``accept``)."""
        failures = AcceptFailures(f"pool {'unix' if unix else 'tcp'} listener", log, self._stop)
        while not self._stop.is_set():
            try:
                sock, addr = listener.accept()
            except OSError as e:
                if not self._stop.is_set():
                    self.counters.add(accept_failures=1)
                    failures.wait("accept", e)
                continue
            c = Conn(sock, "unix" if unix else f"{addr[0]}:{addr[1]}", unix)
            if not self._admit(c):
                continue
            try:
                self._spawn(self._serve, c)
            except RuntimeError as e:  # no thread to be had (a pids limit): this connection only
                self._cleanup(c)
                self.counters.add(accept_failures=1)
                failures.wait("thread start", e)
                continue
            self.counters.add(connections_total=1)
            failures.succeeded()

    def _admit(self, c: Conn) -> bool:
        """Take ``c`` in (``Admission``), or hand it to the refuse thread (``False``)."""
        admitted, victim = self._admission.admit(c)
        if victim is not None:
            # The oldest unauthenticated connection gives way: its thread sees the shutdown.
            self.counters.add(handshake_drops=1)
            try:
                victim.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if not admitted:
            self.counters.add(refused_connections=1)
            self._refuser.refuse(c.sock)
        return admitted

    # ------------------------------------------------------------------------------- connection

    def _send_error(self, sock: socket.socket, kind: str, message: str) -> None:
        """Send an ERROR frame, then close gracefully: closing with unread input would reset the
        connection and could destroy the error before the peer reads it. Bounded in time."""
        deadline = time.monotonic() + 0.5  # arbitrary: a peer that reads nothing gets no more
        try:
            sock.settimeout(0.5)  # not the connection's kernel timeouts: this must not wait long
            send_buffers(sock, [P.frame(P.Op.ERROR, P.ErrorMsg(kind, message))], deadline)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(0.2)
            for _ in range(64):
                if time.monotonic() > deadline or not sock.recv(1 << 16):
                    break
        except OSError:
            pass

    def _handshake(self, c: Conn) -> None:
        cfg = self.config
        deadline = time.monotonic() + cfg.handshake_timeout
        c.sock.settimeout(cfg.handshake_timeout)  # a Python timeout: the deadline can cut a call
        nonce = os.urandom(16)
        send_buffers(c.sock, [P.frame(P.Op.SERVER_HELLO, P.ServerHello(
            P.PROTOCOL_VERSION, self.server_id, nonce, self.unix_name,
            any(t.secret for t in self.tenants.values()), bool(self.rdma), cfg.max_meta_bytes,
            cfg.max_frame_bytes, cfg.max_batch))], deadline)
        header, meta = read_frame(c.sock, max_meta=P.HANDSHAKE_MAX_META, max_data=0,
                                  deadline=deadline)
        if header.op != P.Op.CLIENT_HELLO:
            raise ProtocolError(f"expected CLIENT_HELLO first, got op {header.op}")
        hello = P.decode(meta, P.ClientHello)
        tenant = authenticate(self.tenants, hello, nonce)
        self._admission.authenticated(c)  # before HELLO_OK: a client told it is in stays in
        shm = c.unix and hello.want_shm
        ok = P.frame(P.Op.HELLO_OK, P.HelloOk(tenant.segment.size, shm, cfg.hold_timeout,
                                              tenant.max_hold_bytes, cfg.idle_timeout))
        if shm:
            c.sock.settimeout(max(0.001, deadline - time.monotonic()))
            socket.send_fds(c.sock, [ok], [tenant.segment.fd])
        else:
            send_buffers(c.sock, [ok], deadline)
        c.tenant, c.one_sided = tenant, shm
        if c.pid:
            self.holds.reconnected(c.pid, cfg.hold_timeout)
        log.debug("client %s (%s, tenant %r) connected from %s", hello.client,
                  "shm" if shm else "stream", tenant.name, c.peer)

    def _next_header(self, c: Conn) -> bytearray | None:
        """The next request's header, once it starts arriving (then within request_timeout);
        ``None`` on a clean close or after ``idle_timeout``; ``_Expired`` when a hold runs out.

        Waiting costs nothing per request: the receive itself waits, up to the socket's kernel
        timeout, and only a connection holding a reservation or lease polls first (its wait is
        bounded by the hold's age)."""
        cfg = self.config
        header = bytearray(P.HEADER_SIZE)
        idle_since = time.monotonic()
        while True:
            oldest = c.oldest_hold()
            if oldest is not None:
                wait = oldest + cfg.hold_timeout - time.monotonic()
                if wait <= 0:
                    raise _Expired
                if not wait_readable(c.sock, wait):
                    continue
            try:
                n = c.sock.recv_into(header)
                break
            except BlockingIOError:  # the kernel timeout passed with nothing received
                if c.oldest_hold() is None and time.monotonic() - idle_since >= cfg.idle_timeout:
                    self.counters.add(idle_closed=1)
                    log.debug("closing %s: idle for %.0fs", c.peer, cfg.idle_timeout)
                    return None
        if n == 0:
            return None  # clean close between requests
        recv_exact_into(c.sock, memoryview(header)[n:], time.monotonic() + cfg.request_timeout)
        return header

    def _serve(self, c: Conn) -> None:
        cfg = self.config
        try:
            if not c.unix:
                tune(c.sock)
            self._handshake(c)
            # Blocking from here on, with kernel timeouts: a request costs the system calls it
            # needs, with no poll before each (deadlines are still checked between calls).
            kernel_timeouts(c.sock, min(cfg.request_timeout, cfg.idle_timeout))
            while not self._stop.is_set():
                raw = self._next_header(c)
                if raw is None:
                    break
                deadline = time.monotonic() + cfg.request_timeout
                started = time.perf_counter()
                header = P.parse_header(raw, max_meta=cfg.max_meta_bytes,
                                        max_data=cfg.max_frame_bytes)
                meta = recv_exact(c.sock, header.meta_len, deadline)
                self._requests.handle(c, header, meta, deadline + header.data_len / MIN_RATE)
                if self.metrics is not None:
                    self.metrics.observe_op(header.op, time.perf_counter() - started)
        except AuthError as e:
            self.counters.add(auth_failures=1)
            log.warning("refused %s: %s", c.peer, e)
            self._send_error(c.sock, "auth", str(e))
        except ProtocolError as e:
            self.counters.add(protocol_errors=1)
            log.warning("protocol error from %s: %s", c.peer, e)
            self._send_error(c.sock, "protocol", str(e))
        except _Expired:
            self.counters.add(holds_expired=1)
            log.warning("closing %s: a reservation or lease was held past hold_timeout (%.0fs)",
                        c.peer, cfg.hold_timeout)
            self._cleanup(c, expired=True)
            return
        except TimeoutError:
            self.counters.add(timeouts=1)
            log.info("closing %s: %s", c.peer, "handshake not finished within handshake_timeout"
                     if c.tenant is None else "request not sent or reply not taken in time")
        except OSError as e:
            if not self._stop.is_set():
                log.info("connection from %s dropped: %s", c.peer, e)
        except Exception:
            log.exception("internal error serving %s", c.peer)
            self._send_error(c.sock, "internal", "internal server error (see the server log)")
        self._cleanup(c)

    def _cleanup(self, c: Conn, expired: bool = False) -> None:
        if c.rdma is not None:
            c.rdma.close()  # type: ignore[attr-defined]  # no remote write can land after this
        c.sock.close()
        self.one_sided.drop_all(c, expired)
        self._admission.discard(c)

    # ------------------------------------------------------------------------------------- stats

    def stats(self, tenant: str | None = None) -> dict[str, float]:
        """Counters of one tenant's pages (what its clients see), or of all tenants summed, plus
        the server's connection counters."""
        out: dict[str, float] = {}
        for t in self.tenants.values():
            if tenant is None or t.name == tenant:
                for k, v in t.index.snapshot().items():
                    out[k] = out.get(k, 0.0) + v
        out.update((k, float(v)) for k, v in self.counters.as_dict().items())
        out["connections"] = float(len(self._admission))
        out["quarantined_bytes"] = float(self.holds.quarantined_bytes())
        out["tenants"] = float(len(self.tenants))
        out["uptime_s"] = time.time() - self.started
        out["rdma"] = float(bool(self.rdma))
        out["shared_memory"] = float(bool(self.unix_name))
        return out
