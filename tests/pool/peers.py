"""Hand-driven pool peers for tests that play a hostile or broken client: raw authenticated
connections over TCP and over the Unix socket (segment mapped), the server's reply to a bad frame,
and a server process's resident memory."""

from __future__ import annotations

import errno
import mmap
import os
import socket
import threading

import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.transfer import protocol as P
from mooncake_sgl.transfer.tcp import FramedConnection, open_connection, read_frame, send_buffers


def raw(pool: PoolProcess, secret: str = "", tenant: str = "") -> socket.socket:
    """An authenticated raw TCP connection (handshake done by hand)."""
    s = socket.create_connection((pool.host, pool.port), timeout=5)
    header, meta = read_frame(s, max_meta=1 << 20, max_data=0)
    if header.op == P.Op.ERROR:  # refused before the handshake (over max_connections)
        s.close()
        P.raise_error(P.decode(meta, P.ErrorMsg))
    hello = P.decode(meta, P.ServerHello)
    # Tenant arguments only when one is named: the same helper then drives single-tenant servers
    # of older protocol revisions too (how the regression tests were checked against them).
    named = {"tenant": tenant} if tenant else {}
    send_buffers(s, [P.frame(P.Op.CLIENT_HELLO, P.ClientHello(
        P.auth_mac(secret, hello.nonce, *named.values()), **named))])
    header, meta = read_frame(s, max_meta=1 << 20, max_data=0)
    if header.op == P.Op.ERROR:
        s.close()
        P.raise_error(P.decode(meta, P.ErrorMsg))
    return s


def unix_name(pool: PoolProcess) -> str:
    s = socket.create_connection((pool.host, pool.port), timeout=5)
    _, meta = read_frame(s, max_meta=1 << 20, max_data=0)
    s.close()
    return P.decode(meta, P.ServerHello).unix_name


def raw_shm(pool: PoolProcess, secret: str = "", tenant: str = "") -> FramedConnection:
    """An authenticated connection over the server's Unix socket with the segment's descriptor
    (RESERVE and LEASE are for such clients only)."""
    named = {"tenant": tenant} if tenant else {}
    conn = open_connection(unix_name(pool), secret=secret, timeout=5, want_shm=True, **named)
    assert conn.segment_fd is not None
    return conn


def segment_bytes(conn: FramedConnection) -> bytes:
    """Everything the segment handed to ``conn`` holds."""
    assert conn.segment_fd is not None
    with mmap.mmap(conn.segment_fd, conn.segment_size, prot=mmap.PROT_READ) as mm:
        return bytes(mm)


def request(s: socket.socket, op: P.Op, msg: object, data: bytes = b"") -> socket.socket:
    send_buffers(s, [P.frame(op, msg, len(data)), data])  # type: ignore[arg-type]
    return s


def reply(s: socket.socket, cls: type) -> object:
    header, meta = read_frame(s, max_meta=1 << 24, max_data=1 << 31)
    if header.op == P.Op.ERROR:
        P.raise_error(P.decode(meta, P.ErrorMsg))
    return P.decode(meta, cls)


def error_reply(s: socket.socket) -> P.ErrorMsg:
    """The ERROR frame the server answered with; the server then closes the connection."""
    header, meta = read_frame(s, max_meta=1 << 20, max_data=0)
    assert header.op == P.Op.ERROR, header
    msg = P.decode(meta, P.ErrorMsg)
    assert s.recv(1) == b""
    s.close()
    return msg


def closed_by_server(s: socket.socket, within: float) -> bool:
    """True when the server closes ``s`` (EOF or reset) within ``within`` seconds."""
    s.settimeout(within)
    try:
        while s.recv(1 << 16):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def fail_accepts(monkeypatch: pytest.MonkeyPatch, thread: str, times: int = 3) -> list[int]:
    """``accept()`` in the thread named ``thread`` raises EMFILE its next ``times`` calls (out of
    descriptors); the returned one-item list counts down the failures still to come."""
    real, left = socket.socket.accept, [times]

    def out_of_descriptors(sock: socket.socket) -> tuple[socket.socket, object]:
        if threading.current_thread().name == thread and left[0] > 0:
            left[0] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(sock)

    monkeypatch.setattr(socket.socket, "accept", out_of_descriptors)
    return left
