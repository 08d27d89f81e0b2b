"""Hostile or broken peers against a pool server in a subprocess: wrong or missing secret,
wrong protocol version, bad magic, oversized and truncated frames, oversized batches. Each gets a
clear error (or a clean drop), nothing half-written becomes visible, and a well-behaved client
connected throughout keeps being served."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.errors import AuthError, ProtocolError
from mooncake_sgl.transfer import protocol as P
from mooncake_sgl.transfer.client import PoolClient
from mooncake_sgl.transfer.tcp import read_frame, recv_exact, send_buffers
from tests.pool.peers import error_reply, raw, raw_shm

SECRET = "s3cret"


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolProcess]:
    with PoolProcess(capacity="16MiB", slab_size="1MiB", secret=SECRET, max_frame_bytes="4MiB",
                     max_meta_bytes="64KiB", max_batch=64) as p:
        yield p


@pytest.fixture(scope="module")
def good(pool: PoolProcess) -> Iterator[PoolClient]:
    c = PoolClient(pool.endpoint, transport="tcp", secret=SECRET)
    yield c
    c.close()


def still_serving(client: PoolClient, tag: bytes) -> None:
    page = [memoryview(bytearray(tag * 1000))]
    assert client.put_batch([tag], [page]).ok == (True,)
    out = [memoryview(bytearray(len(tag) * 1000))]
    assert client.get_batch([tag], [out]) == [True] and bytes(out[0]) == tag * 1000


def test_wrong_secret_is_refused_before_any_data_moves(pool: PoolProcess, good: PoolClient) -> None:
    with pytest.raises(AuthError, match="wrong shared secret"):
        raw(pool, "guess")
    bad = PoolClient(pool.endpoint, transport="tcp", secret="guess")
    with pytest.raises(AuthError, match="wrong shared secret"):
        bad.put_batch([b"intruder"], [[memoryview(b"x" * 100)]])
    bad.close()
    nosecret = PoolClient(pool.endpoint, transport="shm")
    with pytest.raises(AuthError, match="requires a shared secret"):
        nosecret.exists_batch([b"intruder"])
    nosecret.close()
    assert good.exists_batch([b"intruder"]) == [False]
    assert good.stats()["auth_failures"] >= 3
    still_serving(good, b"after-auth")


def test_unknown_protocol_version_gets_a_clear_error(pool: PoolProcess, good: PoolClient) -> None:
    s = raw(pool, SECRET)
    meta = P.encode(P.Keys([b"a"]))
    send_buffers(s, [P.pack_header(P.Op.EXISTS, len(meta), version=99), meta])
    msg = error_reply(s)
    assert "unsupported protocol version 99" in msg.message and "version 1" in msg.message
    still_serving(good, b"after-version")


def test_bad_magic_is_named(pool: PoolProcess, good: PoolClient) -> None:
    s = raw(pool, SECRET)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert "bad frame magic" in error_reply(s).message
    still_serving(good, b"after-magic")


def test_oversized_frames_and_batches_are_refused(pool: PoolProcess, good: PoolClient) -> None:
    s = raw(pool, SECRET)
    send_buffers(s, [P.pack_header(P.Op.PUT, 10, 64 << 20)])  # 64 MiB > max_frame_bytes 4 MiB
    msg = error_reply(s)
    assert "exceeds the limit of 4194304 bytes (max_frame_bytes)" in msg.message
    s = raw(pool, SECRET)
    send_buffers(s, [P.pack_header(P.Op.EXISTS, 1 << 20)])  # meta past max_meta_bytes
    assert "max_meta_bytes" in error_reply(s).message
    s = raw(pool, SECRET)
    meta = P.encode(P.Keys([b"k%d" % i for i in range(65)]))
    send_buffers(s, [P.pack_header(P.Op.EXISTS, len(meta)), meta])
    assert "exceeds max_batch=64" in error_reply(s).message
    # The client splits a batch larger than the server's limits instead of tripping them.
    keys = [b"many-%d" % i for i in range(200)]
    assert good.put_batch(keys, [[memoryview(b"v" * 30_000)] for _ in keys]).ok == (True,) * 200
    assert good.exists_batch(keys) == [True] * 200
    assert good.remove(keys) == 200


def test_truncated_put_leaves_nothing_readable(pool: PoolProcess, good: PoolClient) -> None:
    s = raw(pool, SECRET)
    meta = P.encode(P.KeysSizes([b"torn-a", b"torn-b"], [100_000, 100_000]))
    # All of page a, a third of page b, then the connection drops.
    s.sendall(P.pack_header(P.Op.PUT, len(meta), 200_000) + meta + b"a" * 100_000 + b"b" * 30_000)
    s.close()
    # The server notices the drop, aborts both reservations, and keeps serving.
    assert good.exists_batch([b"torn-a", b"torn-b"]) == [False, False]
    still_serving(good, b"after-truncation")
    deadline = time.monotonic() + 5
    while good.stats()["writing"] and time.monotonic() < deadline:  # the abort is asynchronous
        time.sleep(0.01)
    assert good.stats()["writing"] == 0


def test_inconsistent_put_sizes_are_a_protocol_error(pool: PoolProcess, good: PoolClient) -> None:
    s = raw(pool, SECRET)
    meta = P.encode(P.KeysSizes([b"x"], [10]))
    send_buffers(s, [P.pack_header(P.Op.PUT, len(meta), 11), meta, b"y" * 11])
    assert "add up to 10 bytes but the frame carries 11" in error_reply(s).message
    s = raw(pool, SECRET)
    send_buffers(s, [P.pack_header(P.Op.GET, 3), b"\xc1\xc1\xc1"])  # not msgpack
    assert "malformed KeysSizes" in error_reply(s).message
    still_serving(good, b"after-garbage")
    assert good.stats()["protocol_errors"] >= 2


def test_client_side_truncation_is_a_protocol_error() -> None:
    a, b = socket.socketpair()
    a.sendall(b"12345")
    a.close()
    with pytest.raises(ProtocolError, match="after 5 of 24 bytes: truncated frame"):
        recv_exact(b, 24)
    b.close()


def test_a_client_that_never_releases_is_cut_off_and_its_leases_freed(pool: PoolProcess,
                                                                      good: PoolClient) -> None:
    still_serving(good, b"lease-me")
    s = raw_shm(pool, SECRET).sock
    meta = P.encode(P.KeysSizes([b"lease-me"], [8000]))
    for _ in range(64):
        send_buffers(s, [P.pack_header(P.Op.LEASE, len(meta)), meta])
        read_frame(s, max_meta=1 << 20, max_data=0)
    send_buffers(s, [P.pack_header(P.Op.LEASE, len(meta)), meta])
    assert "more than 64 open leases" in error_reply(s).message
    deadline = time.monotonic() + 5
    while good.stats()["leased"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert good.stats()["leased"] == 0


def test_a_new_client_learns_the_limits_before_its_first_batch(pool: PoolProcess) -> None:
    fresh = PoolClient(pool.endpoint, transport="shm", secret=SECRET)
    keys = [b"first-%d" % i for i in range(150)]  # past max_batch=64 on the very first call
    assert fresh.exists_batch(keys) == [False] * 150
    assert fresh.put_batch(keys, [[memoryview(b"v" * 5000)] for _ in keys]).ok == (True,) * 150
    assert fresh.remove(keys) == 150
    fresh.close()
