"""The pool server: a pre-faulted DRAM segment served over TCP, a Unix socket (shared memory) and,
where a device exists, RDMA.

Threads: one accept loop per listening socket, one thread per connection (socket calls and numpy
copies release the GIL, so connections overlap), one eviction thread. Each connection first runs
the handshake in ``protocol`` (secret checked before any page moves), then serves frames in order
until the peer closes. A bad frame gets an ERROR reply naming the problem and closes only that
connection. When a connection ends, its open reservations are aborted and its leases released.

    server = PoolServer(PoolServerConfig(port=0)).start()   # in-process, returns at once
    server.address                                          # ('127.0.0.1', 40123)
    server.stop()
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid

from ..errors import AuthError, ConfigError, ProtocolError
from ..transfer import protocol as P
from ..transfer.shm import Segment
from ..transfer.tcp import discard, read_frame, recv_exact_into, send_buffers, tune
from .config import PoolServerConfig
from .store import PRESENT, Entry, PoolStore

log = logging.getLogger("mooncake_sgl.pool")

# Reservations or leases one connection may hold open at once. A client keeps one of each per
# request in flight; more means it forgot to COMMIT/RELEASE and would pin the pool. Arbitrary.
MAX_OPEN_PER_CONNECTION = 64


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class _Conn:
    """Per-connection state: open one-sided reservations and leases."""

    def __init__(self, sock: socket.socket, peer: str, unix: bool):
        self.sock = sock
        self.peer = peer
        self.unix = unix
        self.tickets: dict[int, tuple[list[object], list[Entry]]] = {}
        self.leases: dict[int, list[Entry | None]] = {}
        self.rdma: object | None = None


class PoolServer:
    def __init__(self, config: PoolServerConfig):
        self.config = config
        self.server_id = uuid.uuid4().hex
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set[_Conn] = set()
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self.segment: Segment | None = None
        self.store: PoolStore | None = None
        self.address: tuple[str, int] = (config.host, config.port)
        self.unix_name = ""
        self.rdma = None
        self.started = 0.0
        self.counters = dict.fromkeys(("connections_total", "auth_failures", "protocol_errors",
                                       "bytes_in", "bytes_out", "refused_connections"), 0)

    # -------------------------------------------------------------------------------- lifecycle

    def start(self) -> PoolServer:
        cfg = self.config
        t0 = time.monotonic()
        capacity = cfg.capacity // cfg.slab_size * cfg.slab_size
        avail = _mem_available()
        if cfg.populate and avail is not None and capacity > avail:
            # Pre-faulting more than the machine has would end in the OOM killer, not an error.
            raise ConfigError(f"capacity of {capacity} bytes exceeds the {avail} bytes of memory "
                              "available; lower it", key="capacity")
        self.segment = Segment(capacity, populate=cfg.populate)
        self.store = PoolStore(capacity, cfg.slab_size, high_watermark=cfg.high_watermark,
                               low_watermark=cfg.low_watermark, put_wait=cfg.put_wait)
        log.info("segment of %d bytes ready in %.2fs (populate=%s)", capacity, time.monotonic() - t0,
                 cfg.populate)
        if cfg.rdma_device != "off":  # before listening: every hello must tell the truth about it
            from ..transfer import rdma

            self.rdma = rdma.open_server_side(self.segment, cfg.rdma_device)
            if self.rdma is None:
                log.warning("RDMA requested but off: %s", rdma.unavailable_reason(cfg.rdma_device))
            else:
                log.info("RDMA: %s", self.rdma.describe())
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
        self._spawn(self._evict_loop)
        self.started = time.time()
        log.info("pool %s listening on %s:%d (shared memory %s, secret %s)", self.server_id[:8],
                 *self.address, "on" if self.unix_name else "off", "on" if cfg.secret else "off")
        return self

    def stop(self) -> None:
        """Stop accepting, drop every connection, free the segment. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        for s in self._listeners:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        if self.segment is not None:
            self.segment.close()
        log.info("pool %s stopped", self.server_id[:8])

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def _spawn(self, fn, *args) -> None:  # noqa: ANN001
        t = threading.Thread(target=fn, args=args, daemon=True, name=f"pool-{fn.__name__}")
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _evict_loop(self) -> None:
        assert self.store is not None
        while not self._stop.wait(0.02):
            if self.store.over_high_watermark():
                n = self.store.evict_to_watermark()
                if n:
                    log.debug("evicted %d pages down to the low watermark", n)

    def _accept_loop(self, listener: socket.socket, unix: bool) -> None:
        while not self._stop.is_set():
            try:
                sock, addr = listener.accept()
            except OSError:
                return
            peer = "unix" if unix else f"{addr[0]}:{addr[1]}"
            with self._lock:
                full = len(self._conns) >= self.config.max_connections
            if full:
                self.counters["refused_connections"] += 1
                self._send_error(sock, "limit", f"too many connections (max_connections="
                                 f"{self.config.max_connections})")
                sock.close()
                continue
            self.counters["connections_total"] += 1
            self._spawn(self._serve, _Conn(sock, peer, unix))

    # ------------------------------------------------------------------------------- connection

    def _send_error(self, sock: socket.socket, kind: str, message: str) -> None:
        """Send an ERROR frame, then close gracefully: closing with unread input would reset the
        connection and could destroy the error before the peer reads it."""
        try:
            send_buffers(sock, [P.frame(P.Op.ERROR, P.ErrorMsg(kind, message))])
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(0.2)  # drain what the peer already sent, briefly (arbitrary bound)
            for _ in range(64):
                if not sock.recv(1 << 16):
                    break
        except OSError:
            pass

    def _handshake(self, c: _Conn) -> None:
        cfg = self.config
        c.sock.settimeout(cfg.handshake_timeout)
        nonce = os.urandom(16)
        send_buffers(c.sock, [P.frame(P.Op.SERVER_HELLO, P.ServerHello(
            P.PROTOCOL_VERSION, self.server_id, nonce, self.unix_name, bool(cfg.secret),
            self.rdma is not None, cfg.max_meta_bytes, cfg.max_frame_bytes, cfg.max_batch))])
        header, meta = read_frame(c.sock, max_meta=cfg.max_meta_bytes, max_data=0)
        if header.op != P.Op.CLIENT_HELLO:
            raise ProtocolError(f"expected CLIENT_HELLO first, got op {header.op}")
        hello = P.decode(meta, P.ClientHello)
        P.check_auth(cfg.secret, nonce, hello.mac)
        assert self.segment is not None
        shm = c.unix and hello.want_shm
        ok = P.frame(P.Op.HELLO_OK, P.HelloOk(self.segment.size, shm))
        if shm:
            socket.send_fds(c.sock, [ok], [self.segment.fd])
        else:
            send_buffers(c.sock, [ok])
        c.sock.settimeout(None)
        log.debug("client %s (%s) connected from %s", hello.client, "shm" if shm else "stream", c.peer)

    def _serve(self, c: _Conn) -> None:
        with self._lock:
            self._conns.add(c)
        try:
            if not c.unix:
                tune(c.sock)
            self._handshake(c)
            while not self._stop.is_set():
                first = c.sock.recv(1, socket.MSG_PEEK)
                if not first:
                    return  # clean close between frames
                header, meta = read_frame(c.sock, max_meta=self.config.max_meta_bytes,
                                          max_data=self.config.max_frame_bytes)
                self._dispatch(c, header, meta)
        except AuthError as e:
            self.counters["auth_failures"] += 1
            log.warning("refused %s: %s", c.peer, e)
            self._send_error(c.sock, "auth", str(e))
        except ProtocolError as e:
            self.counters["protocol_errors"] += 1
            log.warning("protocol error from %s: %s", c.peer, e)
            self._send_error(c.sock, "protocol", str(e))
        except OSError as e:
            if not self._stop.is_set():
                log.info("connection from %s dropped: %s", c.peer, e)
        except Exception:
            log.exception("internal error serving %s", c.peer)
            self._send_error(c.sock, "internal", "internal server error (see the server log)")
        finally:
            self._cleanup(c)

    def _cleanup(self, c: _Conn) -> None:
        assert self.store is not None
        for _, entries in c.tickets.values():
            self.store.abort(entries)
        for entries in c.leases.values():
            self.store.release(entries)
        c.tickets.clear()
        c.leases.clear()
        if c.rdma is not None:
            c.rdma.close()  # type: ignore[attr-defined]
        c.sock.close()
        with self._lock:
            self._conns.discard(c)

    def _check_batch(self, keys: list[bytes], sizes: list[int] | None = None) -> None:
        if len(keys) > self.config.max_batch:
            raise ProtocolError(f"batch of {len(keys)} keys exceeds max_batch={self.config.max_batch}")
        if sizes is not None and len(sizes) != len(keys):
            raise ProtocolError(f"{len(keys)} keys but {len(sizes)} sizes")

    @staticmethod
    def _check_open(table: dict, what: str) -> None:
        if len(table) >= MAX_OPEN_PER_CONNECTION:
            raise ProtocolError(f"more than {MAX_OPEN_PER_CONNECTION} open {what} on one connection")

    def _reply(self, c: _Conn, op: int, msg: object, data: list[memoryview] | None = None) -> None:
        n = sum(v.nbytes for v in data) if data else 0
        send_buffers(c.sock, [P.frame(op | P.REPLY_BIT, msg, n), *(data or [])])  # type: ignore[arg-type]
        self.counters["bytes_out"] += n

    def _dispatch(self, c: _Conn, header: P.Header, meta: bytearray) -> None:
        op = header.op
        msg = P.decode(meta, P.request_type(op))
        store = self.store
        assert store is not None and self.segment is not None
        if header.data_len and op != P.Op.PUT:
            raise ProtocolError(f"op {P.Op(op).name} carries no data, got {header.data_len} bytes")
        if op == P.Op.PUT:
            self._check_batch(msg.keys, msg.sizes)
            if sum(msg.sizes) != header.data_len or min(msg.sizes, default=1) < 0:
                raise ProtocolError(f"PUT sizes add up to {sum(msg.sizes)} bytes but the frame carries "
                                    f"{header.data_len}")
            self._reply(c, op, P.Flags(self._put(c, msg.keys, msg.sizes)))
        elif op == P.Op.GET:
            self._check_batch(msg.keys, msg.sizes)
            entries = store.lease(msg.keys, msg.sizes)
            try:
                view = self.segment.view
                self._reply(c, op, P.GetReply([e.size if e else -1 for e in entries]),
                            [view[e.offset:e.offset + e.size] for e in entries if e is not None])
            finally:
                store.release(entries)
        elif op == P.Op.EXISTS:
            self._check_batch(msg.keys)
            self._reply(c, op, P.Flags(store.contains(msg.keys)))
        elif op == P.Op.REMOVE:
            self._check_batch(msg.keys)
            self._reply(c, op, P.Count(store.remove(msg.keys)))
        elif op == P.Op.CLEAR:
            self._reply(c, op, P.Count(store.clear()))
        elif op == P.Op.STATS:
            self._reply(c, op, P.Stats(self.stats()))
        elif op == P.Op.RESERVE:
            self._check_batch(msg.keys, msg.sizes)
            self._check_open(c.tickets, "reservations (RESERVE without COMMIT)")
            self._reply(c, op, self._reserve(c, msg.keys, msg.sizes))
        elif op == P.Op.COMMIT:
            self._reply(c, op, P.Flags(self._commit(c, msg.ticket, msg.written)))
        elif op == P.Op.LEASE:
            self._check_batch(msg.keys, msg.sizes)
            self._check_open(c.leases, "leases (LEASE without RELEASE)")
            entries = store.lease(msg.keys, msg.sizes)
            lease = next(self._ids)
            c.leases[lease] = entries
            self._reply(c, op, P.Lease(lease, [e.offset if e else 0 for e in entries],
                                       [e.size if e else -1 for e in entries]))
        elif op == P.Op.RELEASE:
            store.release(c.leases.pop(msg.lease, []))
        elif op == P.Op.RDMA_CONNECT:
            if self.rdma is None:
                raise ProtocolError("this pool offers no RDMA (no device, or rdma_device: off)")
            c.rdma, reply = self.rdma.connect(msg)  # type: ignore[attr-defined]
            self._reply(c, op, reply)
        else:
            raise ProtocolError(f"op {op} is not a request")

    # ------------------------------------------------------------------------------------ writes

    def _put(self, c: _Conn, keys: list[bytes], sizes: list[int]) -> bytes:
        store = self.store
        assert store is not None and self.segment is not None
        res = store.reserve(keys, sizes)
        entries = [r for r in res if isinstance(r, Entry)]
        view = self.segment.view
        try:
            for r, size in zip(res, sizes):
                if isinstance(r, Entry):
                    recv_exact_into(c.sock, view[r.offset:r.offset + size])
                else:
                    discard(c.sock, size)
        except BaseException:
            store.abort(entries)  # a truncated PUT leaves nothing readable
            raise
        self.counters["bytes_in"] += sum(sizes)
        store.commit(entries, [True] * len(entries))
        return bytes(r is PRESENT or isinstance(r, Entry) for r in res)

    def _reserve(self, c: _Conn, keys: list[bytes], sizes: list[int]) -> P.Reservation:
        store = self.store
        assert store is not None
        res = store.reserve(keys, sizes)
        status = bytes(P.RESERVE_WRITE if isinstance(r, Entry) else
                       P.RESERVE_PRESENT if r is PRESENT else P.RESERVE_NO_ROOM for r in res)
        ticket = next(self._ids)
        c.tickets[ticket] = (res, [r for r in res if isinstance(r, Entry)])
        return P.Reservation(ticket, status, [r.offset if isinstance(r, Entry) else 0 for r in res])

    def _commit(self, c: _Conn, ticket: int, written: bytes) -> bytes:
        assert self.store is not None
        if ticket not in c.tickets:
            raise ProtocolError(f"COMMIT of unknown reservation {ticket}")
        res, entries = c.tickets.pop(ticket)
        if len(written) != len(res):
            self.store.abort(entries)
            raise ProtocolError(f"COMMIT names {len(written)} pages, the reservation has {len(res)}")
        ok = [bool(written[i]) for i, r in enumerate(res) if isinstance(r, Entry)]
        self.store.commit(entries, ok)
        self.counters["bytes_in"] += sum(e.size for e, w in zip(entries, ok) if w)
        return bytes(bool(written[i]) if isinstance(r, Entry) else r is PRESENT
                     for i, r in enumerate(res))

    # ------------------------------------------------------------------------------------- stats

    def stats(self) -> dict[str, float]:
        assert self.store is not None
        out = self.store.snapshot()
        out.update({k: float(v) for k, v in self.counters.items()})
        with self._lock:
            out["connections"] = float(len(self._conns))
        out["uptime_s"] = time.time() - self.started
        out["rdma"] = float(self.rdma is not None)
        out["shared_memory"] = float(bool(self.unix_name))
        return out

