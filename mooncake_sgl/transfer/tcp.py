"""Stream-socket plumbing shared by the TCP and Unix-socket paths: exact receives straight into
destination memory, scatter-gather sends, and one framed client connection.

Receives never allocate per page: ``recv_exact_into`` loops ``recv_into`` over a memoryview of the
destination (a caller's page segment, or the pool's segment on the server). Sends hand whole lists
of memoryviews to ``sendmsg`` so a batch leaves in a few large system calls, without joining.
Both release the GIL while blocked.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import msgspec

from ..errors import ProtocolError
from . import protocol as P

# Large socket buffers let one send of a multi-MiB page proceed without waiting for the reader's
# every recv; 4 MiB is an arbitrary size that filled loopback bandwidth in our measurements.
SOCKET_BUFFER_BYTES = 4 << 20
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
_DISCARD = bytearray(1 << 20)


def tune(sock: socket.socket) -> None:
    """Buffers and TCP_NODELAY (a batch's reply must not wait for Nagle)."""
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            pass
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` completely; ``ProtocolError`` if the peer closes first (a truncated frame)."""
    n = view.nbytes
    got = 0
    while got < n:
        r = sock.recv_into(view[got:], n - got)
        if r == 0:
            raise ProtocolError(f"connection closed after {got} of {n} bytes: truncated frame")
        got += r


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    if n:
        recv_exact_into(sock, memoryview(buf))
    return buf


def discard(sock: socket.socket, n: int) -> None:
    """Read and drop ``n`` bytes (a page the server will not store)."""
    view = memoryview(_DISCARD)
    while n > 0:
        k = min(n, len(_DISCARD))
        recv_exact_into(sock, view[:k])
        n -= k


def send_buffers(sock: socket.socket, bufs: Sequence[bytes | memoryview]) -> None:
    """Send every buffer in order with as few ``sendmsg`` calls as the kernel allows."""
    views = [memoryview(b).cast("B") for b in bufs if len(b)]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i:i + _IOV_MAX])
        # Skip the buffers sent completely; keep the unsent tail of a partly sent one.
        while i < len(views) and sent >= views[i].nbytes:
            sent -= views[i].nbytes
            i += 1
        if sent:
            views[i] = views[i][sent:]


def read_frame(sock: socket.socket, *, max_meta: int, max_data: int) -> tuple[P.Header, bytearray]:
    """One frame's header and meta; the caller reads ``header.data_len`` data bytes itself."""
    header = P.parse_header(recv_exact(sock, P.HEADER_SIZE), max_meta=max_meta, max_data=max_data)
    return header, recv_exact(sock, header.meta_len)


class FramedConnection:
    """A client's end of one authenticated connection to a pool (TCP or Unix socket).

    Not thread-safe: a ``PoolClient`` lends each connection to one thread at a time.
    """

    def __init__(self, sock: socket.socket, hello: P.ServerHello, segment_size: int = 0,
                 segment_fd: int | None = None):
        self.sock = sock
        self.hello = hello
        self.segment_size = segment_size
        self.segment_fd = segment_fd
        self._req = 0

    def send(self, op: P.Op, msg: msgspec.Struct, data: Sequence[bytes | memoryview] = (),
             data_len: int = 0, flags: int = 0) -> None:
        self._req = (self._req + 1) & 0xFFFFFFFF
        send_buffers(self.sock, [P.frame(op, msg, data_len, req_id=self._req, flags=flags), *data])

    def reply(self, op: P.Op, cls: type) -> tuple[msgspec.Struct, int]:
        """Read the reply to ``op``: (message, data length still to read)."""
        header, meta = read_frame(self.sock, max_meta=self.hello.max_meta, max_data=self.hello.max_data)
        if header.op == P.Op.ERROR:
            P.raise_error(P.decode(meta, P.ErrorMsg))
        if header.op != op | P.REPLY_BIT:
            raise ProtocolError(f"expected a reply to {op.name}, got op {header.op}")
        return P.decode(meta, cls), header.data_len

    def call(self, op: P.Op, msg: msgspec.Struct, cls: type) -> msgspec.Struct:
        self.send(op, msg)
        out, data_len = self.reply(op, cls)
        if data_len:
            raise ProtocolError(f"unexpected {data_len} data bytes in the reply to {op.name}")
        return out

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.segment_fd is not None:
                os.close(self.segment_fd)
                self.segment_fd = None


def open_connection(address: tuple[str, int] | str, *, secret: str, timeout: float,
                    want_shm: bool = False, client: str = "") -> FramedConnection:
    """Connect (``(host, port)`` for TCP, a ``"\\0name"`` string for an abstract Unix socket),
    run the handshake, and return the authenticated connection.

    Raises ``OSError`` (unreachable), ``AuthError`` (secret refused), ``ProtocolError``.
    """
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        tune(sock)
        header, meta = read_frame(sock, max_meta=P.DEFAULT_MAX_META_BYTES, max_data=0)
        if header.op == P.Op.ERROR:
            P.raise_error(P.decode(meta, P.ErrorMsg))
        if header.op != P.Op.SERVER_HELLO:
            raise ProtocolError(f"expected SERVER_HELLO, got op {header.op}")
        hello = P.decode(meta, P.ServerHello)
        mac = P.auth_mac(secret, hello.nonce)
        send_buffers(sock, [P.frame(P.Op.CLIENT_HELLO, P.ClientHello(mac, want_shm, client))])
        fd = None
        if want_shm and family == socket.AF_UNIX:
            raw, fds, _, _ = socket.recv_fds(sock, P.HEADER_SIZE, 1, socket.MSG_WAITALL)
            fd = fds[0] if fds else None
            if len(raw) < P.HEADER_SIZE:
                raise ProtocolError("connection closed during the handshake")
            header = P.parse_header(raw, max_meta=hello.max_meta, max_data=0)
            meta = recv_exact(sock, header.meta_len)
        else:
            header, meta = read_frame(sock, max_meta=hello.max_meta, max_data=0)
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
        return FramedConnection(sock, hello, ok.segment_size, fd)
    except BaseException:
        sock.close()
        raise
