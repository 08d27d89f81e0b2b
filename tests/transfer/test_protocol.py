"""Wire format and socket plumbing: header checks, auth MACs, scatter-gather sends that the
kernel splits, and exact receives into caller memory."""

from __future__ import annotations

import socket
import threading

import pytest

from mooncake_sgl.errors import ProtocolError
from mooncake_sgl.transfer import protocol as P
from mooncake_sgl.transfer.tcp import recv_exact_into, send_buffers

LIMITS = {"max_meta": 1000, "max_data": 10_000}


def test_header_round_trip_and_reply_bit() -> None:
    raw = P.pack_header(P.Op.GET | P.REPLY_BIT, 12, 3456, req_id=7, flags=P.FLAG_NO_REPLY)
    assert len(raw) == P.HEADER_SIZE == 24
    h = P.parse_header(raw, **LIMITS)
    assert (h.op, h.meta_len, h.data_len, h.req_id, h.flags) == (P.Op.GET | 0x80, 12, 3456, 7, 1)


@pytest.mark.parametrize("raw, message", [
    (P.pack_header(P.Op.GET, 1, version=2), "unsupported protocol version 2"),
    (b"XXXX" + P.pack_header(P.Op.GET, 1)[4:], "bad frame magic"),
    (P.pack_header(P.Op.GET, 1001), "max_meta_bytes"),
    (P.pack_header(P.Op.PUT, 1, 10_001), "max_frame_bytes"),
])
def test_bad_headers_name_the_problem(raw: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        P.parse_header(raw, **LIMITS)


def test_messages_are_msgpack_structs_and_garbage_is_a_protocol_error() -> None:
    msg = P.KeysSizes([b"a", b"\x00\xff"], [1, 2])
    assert P.decode(P.encode(msg), P.KeysSizes) == msg
    assert b"pickle" not in P.encode(msg)
    with pytest.raises(ProtocolError, match="malformed Keys"):
        P.decode(b"\x93\x01", P.Keys)
    with pytest.raises(ProtocolError, match="unknown request op 99"):
        P.request_type(99)


def test_auth_mac_proves_the_secret_without_sending_it() -> None:
    nonce = b"n" * 16
    mac = P.auth_mac("secret", nonce)
    assert b"secret" not in mac and len(mac) == 32
    assert P.auth_mac("", nonce) == b""  # no secret configured: nothing to prove
    assert P.auth_mac("other", nonce) != mac
    assert P.auth_mac("secret", b"m" * 16) != mac  # a replayed MAC is worthless for another nonce
    assert P.auth_mac("secret", nonce, "alpha") != mac  # and for another tenant


def test_send_buffers_survives_partial_sends_and_recv_lands_in_place() -> None:
    # Many buffers, more than IOV_MAX, of odd sizes, through small socket buffers: sendmsg returns
    # short counts that must resume mid-buffer.
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    bufs = [bytes([i % 251]) * (1 + (i * 37) % 3000) for i in range(1500)]
    expected = b"".join(bufs)
    t = threading.Thread(target=send_buffers, args=(a, [memoryview(x) for x in bufs]))
    t.start()
    dst = bytearray(len(expected))
    recv_exact_into(b, memoryview(dst))
    t.join()
    assert dst == expected
    a.close()
    b.close()
