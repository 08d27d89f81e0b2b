"""Tenants of one pool server, over TCP and shared memory: each reads, overwrites, removes,
clears and counts only its own pages under its own credentials, and a same-host client maps a
segment holding only its tenant's pages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mooncake_sgl.errors import AuthError
from mooncake_sgl.pool.process import PoolProcess
from mooncake_sgl.transfer.client import PoolClient
from tests.pool.peers import raw, raw_shm, segment_bytes

PAGE = 16 * 1024
TENANTS = {"alpha": "alpha-secret", "beta": "beta-secret"}


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolProcess]:
    with PoolProcess(capacity="8MiB", slab_size="1MiB",
                     tenants=[{"name": n, "secret": s, "capacity": "4MiB"}
                              for n, s in TENANTS.items()]) as p:
        yield p


def client(pool: PoolProcess, tenant: str, transport: str) -> PoolClient:
    return PoolClient(pool.endpoint, transport=transport, tenant=tenant, secret=TENANTS[tenant])


def page(tag: bytes) -> list[memoryview]:
    return [memoryview((tag * (PAGE // len(tag) + 1))[:PAGE])]


def read(c: PoolClient, key: bytes) -> bytes | None:
    out = [memoryview(bytearray(PAGE))]
    return bytes(out[0]) if c.get_batch([key], [out]) == [True] else None


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_each_tenant_sees_reads_and_clears_only_its_own_pages(pool: PoolProcess,
                                                              transport: str) -> None:
    a, b = client(pool, "alpha", transport), client(pool, "beta", transport)
    assert a.mode is None and a.stats() is not None and a.mode == transport
    key = b"same-key-" + transport.encode()
    # The same key in both tenants: two pages, neither overwrites the other.
    assert a.put_batch([key, b"only-alpha"], [page(b"ALPHA"), page(b"ALPHA")]) == [True, True]
    assert b.put_batch([key], [page(b"BETA")]) == [True]
    assert read(a, key) == bytes(page(b"ALPHA")[0]) and read(b, key) == bytes(page(b"BETA")[0])
    assert b.exists_batch([b"only-alpha"]) == [False] and read(b, b"only-alpha") is None
    assert b.remove([b"only-alpha"]) == 0
    beta_pages = b.stats()["pages"]
    assert a.clear() == 2  # alpha's two pages, nothing of beta's
    assert read(b, key) == bytes(page(b"BETA")[0]) and b.stats()["pages"] == beta_pages
    assert a.stats()["pages"] == 0
    a.close()
    b.close()


def test_shared_memory_maps_only_the_tenants_own_segment(pool: PoolProcess) -> None:
    b = client(pool, "beta", "shm")
    marker = b"BETA-PRIVATE-PAGE-MARKER"
    assert b.put_batch([b"beta-secret-page"], [page(marker)]) == [True]
    conn = raw_shm(pool, TENANTS["alpha"], "alpha")
    seen = segment_bytes(conn)  # everything alpha's client can map
    assert conn.segment_size == 4 << 20 and marker not in seen
    own = raw_shm(pool, TENANTS["beta"], "beta")
    assert marker in segment_bytes(own)
    own.close()
    conn.close()
    b.close()


@pytest.mark.parametrize("tenant, secret, why", [
    ("alpha", TENANTS["beta"], "wrong shared secret"),  # another tenant's secret
    ("gamma", TENANTS["alpha"], "wrong shared secret"),  # no such tenant: same answer
    ("", TENANTS["alpha"], "wrong shared secret"),  # the unnamed tenant does not exist here
    ("alpha", "", "presented none"),
])
def test_credentials_are_per_tenant(pool: PoolProcess, tenant: str, secret: str, why: str) -> None:
    with pytest.raises(AuthError, match=why):
        raw(pool, secret, tenant)
    c = PoolClient(pool.endpoint, transport="shm", tenant=tenant, secret=secret)
    with pytest.raises(AuthError, match=why):
        c.exists_batch([b"x"])
    c.close()


def test_a_single_tenant_pool_refuses_a_named_tenant() -> None:
    with PoolProcess(capacity="2MiB", slab_size="1MiB") as pool:
        with pytest.raises(AuthError, match="no tenant 'alpha'"):
            raw(pool, "", "alpha")
