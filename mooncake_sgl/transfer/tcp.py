"""Stream-socket plumbing shared by the TCP and Unix-socket paths: exact receives straight into
destination memory, scatter-gather sends, and one framed client connection.

Receives never allocate per page: ``recv_exact_into`` loops ``recv_into`` over a memoryview of the
destination (a caller's page segment, or the pool's segment on the server). Sends hand whole lists
of memoryviews to ``sendmsg`` so a batch leaves in a few large system calls, without joining.
Both release the GIL while blocked.

Deadlines. Every receive and send here takes an optional ``deadline`` (a ``time.monotonic()``
instant) that bounds the whole operation, not each system call: a peer that trickles one byte at a
time still runs out of time. Past it they raise ``TimeoutError`` (an ``OSError``). On a socket with
a Python timeout, each call's timeout is set to what is left (Python then polls before every
system call). A busy server instead keeps its sockets blocking with kernel timeouts
(``kernel_timeouts``: one system call per receive, as without deadlines) and checks the deadline
after each call, so a trickling peer overruns it by at most one kernel timeout.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Sequence

import msgspec

from ..errors import ProtocolError
from . import protocol as P
from .resolve import resolve

# Large socket buffers let one send of a multi-MiB page proceed without waiting for the reader's
# every recv; 4 MiB is an arbitrary size that filled loopback bandwidth in our measurements.
SOCKET_BUFFER_BYTES = 4 << 20
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
_DISCARD = bytearray(1 << 20)
# Control messages longer than this are received in pieces as their bytes arrive, so memory follows
# what a peer actually sent, not what its header claims. Arbitrary.
_GROW_BYTES = 64 << 10
# TCP keepalive on pool connections: a peer that vanished (power loss, cable) is found in about
# KEEPIDLE + KEEPCNT * KEEPINTVL seconds instead of never. Arbitrary.
KEEPIDLE, KEEPINTVL, KEEPCNT = 30, 10, 3


def tune(sock: socket.socket) -> None:
    """Buffers and TCP_NODELAY (a batch's reply must not wait for Nagle)."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            pass
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", KEEPIDLE), ("TCP_KEEPINTVL", KEEPINTVL),
                           ("TCP_KEEPCNT", KEEPCNT)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking, with the kernel ending any single receive or send that waits
    ``seconds`` (it then fails with ``TimeoutError`` here)."""
    sock.settimeout(None)
    tv = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _arm(sock: socket.socket, deadline: float | None) -> None:
    """Before a call: on a socket with a Python timeout, set it to what is left until
    ``deadline``; on any socket, raise once the deadline has passed. A blocking socket is taken
    to have kernel timeouts (``kernel_timeouts``); without them a deadline could not interrupt
    a call, so give every other socket a Python timeout before using deadlines on it."""
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    if sock.gettimeout() is not None:
        sock.settimeout(left)


def recv_exact_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill ``view`` completely; ``ProtocolError`` if the peer closes first (a truncated frame)."""
    n = view.nbytes
    got = 0
    while got < n:
        _arm(sock, deadline)
        try:
            r = sock.recv_into(view[got:], n - got)
        except BlockingIOError:  # a kernel timeout (SO_RCVTIMEO) on a blocking socket
            raise TimeoutError(f"no data for the kernel timeout after {got} of {n} bytes") from None
        if r == 0:
            raise ProtocolError(f"connection closed after {got} of {n} bytes: truncated frame")
        got += r


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytearray:
    if n <= _GROW_BYTES:
        buf = bytearray(n)
        if n:
            recv_exact_into(sock, memoryview(buf), deadline)
        return buf
    buf = bytearray()
    while len(buf) < n:
        piece = bytearray(min(max(len(buf), _GROW_BYTES), n - len(buf)))
        recv_exact_into(sock, memoryview(piece), deadline)
        buf += piece
    return buf


def discard(sock: socket.socket, n: int, deadline: float | None = None) -> None:
    """Read and drop ``n`` bytes (a page the server will not store)."""
    view = memoryview(_DISCARD)
    while n > 0:
        k = min(n, len(_DISCARD))
        recv_exact_into(sock, view[:k], deadline)
        n -= k


def send_buffers(sock: socket.socket, bufs: Sequence[bytes | memoryview],
                 deadline: float | None = None) -> None:
    """Send every buffer in order with as few ``sendmsg`` calls as the kernel allows."""
    views = [memoryview(b).cast("B") for b in bufs if len(b)]
    i = 0
    while i < len(views):
        _arm(sock, deadline)
        try:
            sent = sock.sendmsg(views[i:i + _IOV_MAX])
        except BlockingIOError:  # a kernel timeout (SO_SNDTIMEO): the peer reads nothing
            raise TimeoutError("the peer took no data for the kernel timeout") from None
        # Skip the buffers sent completely; keep the unsent tail of a partly sent one.
        while i < len(views) and sent >= views[i].nbytes:
            sent -= views[i].nbytes
            i += 1
        if sent:
            views[i] = views[i][sent:]


def read_frame(sock: socket.socket, *, max_meta: int, max_data: int,
               deadline: float | None = None) -> tuple[P.Header, bytearray]:
    """One frame's header and meta; the caller reads ``header.data_len`` data bytes itself."""
    header = P.parse_header(recv_exact(sock, P.HEADER_SIZE, deadline), max_meta=max_meta,
                            max_data=max_data)
    return header, recv_exact(sock, header.meta_len, deadline)


def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """True once ``sock`` has a byte (or EOF) to read, False after ``timeout`` seconds."""
    poller = select.poll()  # not select(): descriptors past 1024 are normal on a busy server
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


class FramedConnection:
    """A client's end of one authenticated connection to a pool (TCP or Unix socket).

    Not thread-safe: a ``PoolClient`` lends each connection to one thread at a time.
    """

    def __init__(self, sock: socket.socket, hello: P.ServerHello, ok: P.HelloOk,
                 segment_fd: int | None = None):
        self.sock = sock
        self.hello = hello
        self.ok = ok
        self.segment_size = ok.segment_size
        self.segment_fd = segment_fd
        self._req = 0
        self.last_used = time.monotonic()

    def send(self, op: P.Op, msg: msgspec.Struct, data: Sequence[bytes | memoryview] = (),
             data_len: int = 0, flags: int = 0) -> None:
        self._req = (self._req + 1) & 0xFFFFFFFF
        self.last_used = time.monotonic()
        send_buffers(self.sock, [P.frame(op, msg, data_len, req_id=self._req, flags=flags), *data])

    def reply(self, op: P.Op, cls: type, first_byte: float | None = None) -> tuple[msgspec.Struct, int]:
        """Read the reply to ``op``: (message, data length still to read).

        ``first_byte``: seconds the reply may take to start (a stopped server answers nothing at
        all; a live one starts its reply at once); ``TimeoutError`` past it.
        """
        raw = bytearray(P.HEADER_SIZE)
        if first_byte is None:
            recv_exact_into(self.sock, memoryview(raw))
        else:
            # The same poll Python makes before every receive, just with a shorter timeout: no
            # extra system call.
            timeout = self.sock.gettimeout()
            self.sock.settimeout(first_byte)
            try:
                recv_exact_into(self.sock, memoryview(raw))
            except TimeoutError:
                raise TimeoutError(f"no reply to {op.name} within {first_byte:g}s") from None
            finally:
                self.sock.settimeout(timeout)
        header = P.parse_header(raw, max_meta=self.hello.max_meta, max_data=self.hello.max_data)
        meta = recv_exact(self.sock, header.meta_len)
        if header.op == P.Op.ERROR:
            P.raise_error(P.decode(meta, P.ErrorMsg))
        if header.op != op | P.REPLY_BIT:
            raise ProtocolError(f"expected a reply to {op.name}, got op {header.op}")
        return P.decode(meta, cls), header.data_len

    def call(self, op: P.Op, msg: msgspec.Struct, cls: type,
             first_byte: float | None = None) -> msgspec.Struct:
        self.send(op, msg)
        out, data_len = self.reply(op, cls, first_byte)
        if data_len:
            raise ProtocolError(f"unexpected {data_len} data bytes in the reply to {op.name}")
        return out

    def stale(self) -> bool:
        """True when the server is about to close this idle connection: idle for half the
        server's idle timeout, so a request never races that close. (A connection a restarted
        server dropped is found by its first use; checking every borrow would cost a system
        call per request.)"""
        return time.monotonic() - self.last_used > self.ok.idle_timeout / 2

    def drop_segment_fd(self) -> None:
        if self.segment_fd is not None:
            os.close(self.segment_fd)
            self.segment_fd = None

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            self.drop_segment_fd()


def open_connection(address: tuple[str, int] | str, *, secret: str, timeout: float,
                    want_shm: bool = False, client: str = "", tenant: str = "",
                    connect_timeout: float | None = None) -> FramedConnection:
    """Connect (``(host, port)`` for TCP, a ``"\\0name"`` string for an abstract Unix socket),
    run the handshake as ``tenant``, and return the authenticated connection.

    ``connect_timeout`` bounds resolving a host name, the connect and the whole handshake together
    (default: ``timeout``): a stopped server still completes TCP connects from its backlog but never
    says hello, and a resolver whose DNS is down takes its own time (``resolve``).

    Raises ``OSError`` (unreachable, or no hello in time), ``AuthError`` (refused), ``ProtocolError``.
    """
    deadline = time.monotonic() + (connect_timeout or timeout)
    if isinstance(address, str):
        family, sockaddr = socket.AF_UNIX, address
    else:
        family, sockaddr = resolve(address[0], address[1], deadline)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.connect(sockaddr)
        tune(sock)
        header, meta = read_frame(sock, max_meta=P.HANDSHAKE_MAX_META, max_data=0,
                                  deadline=deadline)
        if header.op == P.Op.ERROR:
            P.raise_error(P.decode(meta, P.ErrorMsg))
        if header.op != P.Op.SERVER_HELLO:
            raise ProtocolError(f"expected SERVER_HELLO, got op {header.op}")
        hello = P.decode(meta, P.ServerHello)
        mac = P.auth_mac(secret, hello.nonce, tenant)
        send_buffers(sock, [P.frame(P.Op.CLIENT_HELLO, P.ClientHello(mac, want_shm, client, tenant))],
                     deadline)
        fd = None
        if want_shm and family == socket.AF_UNIX:
            _arm(sock, deadline)
            raw, fds, _, _ = socket.recv_fds(sock, P.HEADER_SIZE, 1, socket.MSG_WAITALL)
            fd = fds[0] if fds else None
            if len(raw) < P.HEADER_SIZE:
                raise ProtocolError("connection closed during the handshake")
            header = P.parse_header(raw, max_meta=hello.max_meta, max_data=0)
            meta = recv_exact(sock, header.meta_len, deadline)
        else:
            header, meta = read_frame(sock, max_meta=hello.max_meta, max_data=0, deadline=deadline)
        if header.op == P.Op.ERROR:
            if fd is not None:
                os.close(fd)
            P.raise_error(P.decode(meta, P.ErrorMsg))
        ok = P.decode(meta, P.HelloOk)
        if want_shm and ok.shm and fd is None:
            raise ProtocolError("server offered shared memory but sent no segment descriptor")
        # The same limit then applies to every blocking send/recv of a call: a peer that moves no
        # byte for that long is treated as dead. Keep it above the server's put_wait (a put
        # waiting for room sends nothing meanwhile).
        sock.settimeout(timeout or None)
        return FramedConnection(sock, hello, ok, fd)
    except BaseException:
        sock.close()
        raise
