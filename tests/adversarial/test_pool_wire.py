"""The pool server against hostile frames: one-sided ops on a plain TCP connection (which used to
serve a removed page's stale bytes under a new key), a negative page size, a re-put at a new size,
and a bounded fuzzer of mutated real frames. Throughout, a well-behaved client's pages stay
byte-exact and the server keeps serving."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator

import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.transfer import protocol as P
from mooncake_sgl.transfer.client import PoolClient
from tests.pool.peers import error_reply, raw, raw_shm, reply, request

SECRET = "wire-secret"
PAGE = 8192


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolProcess]:
    with PoolProcess(capacity="8MiB", slab_size="1MiB", secret=SECRET, max_frame_bytes="4MiB",
                     max_meta_bytes="64KiB", max_batch=64) as p:
        yield p


def page(tag: bytes, size: int = PAGE) -> list[memoryview]:
    return [memoryview((tag * (size // len(tag) + 1))[:size])]


def read(client: PoolClient, key: bytes, size: int = PAGE) -> bytes | None:
    out = [memoryview(bytearray(size))]
    return bytes(out[0]) if client.get_batch([key], [out]) == [True] else None


def test_reserve_and_commit_over_tcp_cannot_publish_a_slot_nobody_wrote(pool: PoolProcess) -> None:
    # Story: a tenant stores a page and removes it; its bytes stay in the freed slot. A peer on a
    # plain TCP connection (it cannot write the segment) RESERVEs a key of the same size, which
    # lands in that slot, and COMMITs it as written: the key would then serve the removed bytes.
    owner = PoolClient(pool.endpoint, transport="tcp", secret=SECRET)
    assert owner.put_batch([b"private"], [page(b"PRIVATE-BYTES!")]).ok == (True,)
    assert owner.remove([b"private"]) == 1
    s = raw(pool, SECRET)
    request(s, P.Op.RESERVE, P.KeysSizes([b"stolen"], [PAGE]))
    assert "use PUT and GET" in error_reply(s).message
    s = raw(pool, SECRET)
    request(s, P.Op.LEASE, P.KeysSizes([b"stolen"], [PAGE]))
    assert "use PUT and GET" in error_reply(s).message
    assert read(owner, b"stolen") is None
    owner.close()


def test_a_negative_page_size_is_refused_as_such(pool: PoolProcess) -> None:
    s = raw(pool, SECRET)
    request(s, P.Op.PUT, P.KeysSizes([b"a", b"b"], [10, -5]), b"x" * 5)
    msg = error_reply(s).message
    assert "page size -5 of key #1 is negative" in msg and "add up" not in msg


def test_an_oversized_key_is_refused_not_kept_in_the_index(pool: PoolProcess) -> None:
    # Keys live in the server's index outside the segment's capacity: a 60 KiB key per page
    # would grow the server's memory without bound.
    s = raw(pool, SECRET)
    request(s, P.Op.PUT, P.KeysSizes([b"k" * (P.MAX_KEY_BYTES + 1)], [4]), b"data")
    assert f"keys are at most {P.MAX_KEY_BYTES} bytes" in error_reply(s).message


def test_a_get_larger_than_a_frame_is_refused(pool: PoolProcess) -> None:
    # Its pages stay leased while the reply goes out; an unbounded reply (one key named 4096
    # times) would pin them for as long as a slow reader cares to take.
    s = raw(pool, SECRET)
    request(s, P.Op.GET, P.KeysSizes([b"k"] * 64, [1 << 20] * 64))
    assert "exceeds the limit of 4194304 bytes (max_frame_bytes)" in error_reply(s).message


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_put_at_a_new_size_is_readable_at_that_size(pool: PoolProcess, transport: str) -> None:
    client = PoolClient(pool.endpoint, transport=transport, secret=SECRET)
    key = b"resized-" + transport.encode()
    assert client.put_batch([key], [page(b"small", 4096)]).ok == (True,)
    assert client.put_batch([key], [page(b"LARGER", 3 * 4096)]).ok == (True,)  # True = readable
    assert read(client, key, 3 * 4096) == bytes(page(b"LARGER", 3 * 4096)[0])
    assert read(client, key, 4096) is None  # the old size is gone, not served half-updated
    assert client.put_batch([key], [page(b"LARGER", 3 * 4096)]).ok == (True,)  # same size: no-op
    client.close()


# ---------------------------------------------------------------------------------- fuzzing

def _real_frames() -> list[bytes]:
    """One of each request a real client sends, header, meta and data."""
    k, d = [b"fuzz-a", b"fuzz-b"], b"\x11" * 300 + b"\x22" * 200
    return [
        P.frame(P.Op.PUT, P.KeysSizes(k, [300, 200]), len(d)) + d,
        P.frame(P.Op.GET, P.KeysSizes(k, [300, 200])),
        P.frame(P.Op.EXISTS, P.Keys(k)),
        P.frame(P.Op.REMOVE, P.Keys(k[:1])),
        P.frame(P.Op.STATS, P.Empty()),
        P.frame(P.Op.RESERVE, P.KeysSizes(k, [300, 200])),
        P.frame(P.Op.COMMIT, P.CommitReq(1, b"\x01\x01")),
        P.frame(P.Op.LEASE, P.KeysSizes(k, [300, 200])),
        P.frame(P.Op.RELEASE, P.ReleaseReq(1), flags=P.FLAG_NO_REPLY),
        P.frame(P.Op.CLEAR, P.Empty()),
    ]


def _mutate(rng: random.Random, frame: bytes) -> bytes:
    b = bytearray(frame)
    kind = rng.randrange(6)
    if kind == 0:  # flip bits anywhere
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # a header field replaced by an extreme value
        field = rng.choice([(4, 1), (5, 1), (6, 2), (12, 4), (16, 8)])
        off, n = field
        b[off:off + n] = rng.choice([b"\xff" * n, b"\x00" * n, rng.randbytes(n)])
    elif kind == 2:  # truncated
        del b[rng.randrange(1, len(b)):]
    elif kind == 3:  # meta bytes garbled
        for i in range(P.HEADER_SIZE, min(len(b), P.HEADER_SIZE + 16)):
            if rng.random() < 0.3:
                b[i] = rng.randrange(256)
    elif kind == 4:  # trailing garbage, or two frames glued
        b += rng.randbytes(rng.randint(1, 64)) if rng.random() < 0.5 else frame
    else:  # op swapped for another (or an unknown one)
        b[5] = rng.choice([*list(P.Op), 0x7F, 0xFF])
    return bytes(b)


@pytest.fixture(scope="module")
def shared_pool() -> Iterator[PoolProcess]:
    """Two tenants: the fuzzer is one, the well-behaved client the other (the fuzzer's CLEARs and
    REMOVEs are its own business; its bytes must never reach the other tenant)."""
    with PoolProcess(capacity="8MiB", slab_size="1MiB", max_frame_bytes="4MiB",
                     max_meta_bytes="64KiB", max_batch=64,
                     tenants=[{"name": "fuzz", "secret": "f", "capacity": "4MiB"},
                              {"name": "good", "secret": "g", "capacity": "4MiB"}]) as p:
        yield p


def test_mutated_real_frames_never_crash_the_server_or_change_anyone_elses_bytes(
        shared_pool: PoolProcess) -> None:
    pool = shared_pool
    good = PoolClient(pool.endpoint, transport="tcp", secret="g", tenant="good")
    keys = [b"good-%d" % i for i in range(16)]
    assert good.put_batch(keys, [page(k) for k in keys]).ok == (True,) * 16
    rng = random.Random(20261130)
    frames = _real_frames()
    for case in range(400):
        s = raw_shm(pool, "f", "fuzz").sock if case % 4 == 0 else raw(pool, "f", "fuzz")
        s.sendall(_mutate(rng, rng.choice(frames)))
        s.shutdown(socket.SHUT_WR)  # whatever the server still waits for never comes
        s.settimeout(5)
        while s.recv(1 << 16):  # the server answers and/or closes; it never hangs
            pass
        s.close()
        if case % 50 == 49:
            assert pool.pid is not None, "the pool server died"
            for k in keys:
                got = read(good, k)
                assert got is None or got == bytes(page(k)[0]), f"case {case}: {k!r} changed"
    assert [read(good, k) for k in keys] == [bytes(page(k)[0]) for k in keys]
    fuzzer = PoolClient(pool.endpoint, transport="tcp", secret="f", tenant="fuzz")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # connections' cleanups run after their EOF
        stats = fuzzer.stats()
        if stats["writing"] == 0 and stats["leased"] == 0:
            break
        time.sleep(0.05)
    assert stats["writing"] == 0 and stats["leased"] == 0, "a reservation or lease leaked"
    s = raw(pool, "f", "fuzz")
    request(s, P.Op.EXISTS, P.Keys([b"still-alive"]))
    assert reply(s, P.Flags).flags == b"\x00"
    s.close()
    fuzzer.close()
    good.close()
