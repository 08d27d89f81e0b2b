"""Tenants of one pool server, over TCP and shared memory: each reads, overwrites, removes,
clears and counts only its own pages under its own credentials, and a same-host client maps a
segment holding only its tenant's pages."""

from __future__ import annotations

import hmac
import socket
from collections.abc import Callable, Iterator

import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.errors import AuthError
from mooncake_sgl.pool.tenants import Tenant, authenticate
from mooncake_sgl.transfer import protocol as P
from mooncake_sgl.transfer.client import PoolClient
from mooncake_sgl.transfer.tcp import read_frame, send_buffers
from tests.pool.peers import error_reply, raw, raw_shm, segment_bytes

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
    assert a.put_batch([key, b"only-alpha"], [page(b"ALPHA"), page(b"ALPHA")]).ok == (True, True)
    assert b.put_batch([key], [page(b"BETA")]).ok == (True,)
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
    assert b.put_batch([b"beta-secret-page"], [page(marker)]).ok == (True,)
    conn = raw_shm(pool, TENANTS["alpha"], "alpha")
    seen = segment_bytes(conn)  # everything alpha's client can map
    assert conn.segment_size == 4 << 20 and marker not in seen
    own = raw_shm(pool, TENANTS["beta"], "beta")
    assert marker in segment_bytes(own)
    own.close()
    conn.close()
    b.close()


@pytest.mark.parametrize("tenant, secret", [
    ("alpha", TENANTS["beta"]),  # another tenant's secret
    ("gamma", TENANTS["alpha"]),  # no such tenant
    ("", TENANTS["alpha"]),  # the unnamed tenant does not exist here
    ("alpha", ""),  # no secret
])
def test_credentials_are_per_tenant(pool: PoolProcess, tenant: str, secret: str) -> None:
    with pytest.raises(AuthError, match="authentication failed"):
        raw(pool, secret, tenant)
    c = PoolClient(pool.endpoint, transport="shm", tenant=tenant, secret=secret)
    with pytest.raises(AuthError, match="authentication failed"):
        c.exists_batch([b"x"])
    c.close()


def refusal(pool: PoolProcess, tenant: str, mac: bytes | Callable[[bytes], bytes]) -> tuple[str, str]:
    """The (kind, message) of the ERROR frame a hand-made handshake as ``tenant`` gets; ``mac``
    is sent as is, or computed from the server's nonce."""
    s = socket.create_connection((pool.host, pool.port), timeout=5)
    _, meta = read_frame(s, max_meta=1 << 20, max_data=0)
    nonce = P.decode(meta, P.ServerHello).nonce
    send_buffers(s, [P.frame(P.Op.CLIENT_HELLO, P.ClientHello(
        mac if isinstance(mac, bytes) else mac(nonce), tenant=tenant))])
    msg = error_reply(s)
    return msg.kind, msg.message


def mac_of(secret: str, tenant: str) -> Callable[[bytes], bytes]:
    return lambda nonce: P.auth_mac(secret, nonce, tenant)


# Every way in without the right secret, for a tenant that exists and for one that does not.
REFUSALS = {
    "another tenant's secret": ("alpha", mac_of(TENANTS["beta"], "alpha")),
    "a MAC for another tenant": ("alpha", mac_of(TENANTS["beta"], "beta")),
    "no MAC": ("alpha", b""),
    "random MAC": ("alpha", bytes(range(32))),
    "short MAC": ("beta", b"abc"),
    "unknown tenant, a real secret": ("gamma", mac_of(TENANTS["alpha"], "gamma")),
    "unknown tenant, no MAC": ("gamma", b""),
    "unknown tenant, short MAC": ("gamma", b"abc"),
    "the unnamed tenant, no MAC": ("", b""),
    "the unnamed tenant, a real secret": ("", mac_of(TENANTS["alpha"], "")),
}


def test_refusals_before_authentication_do_not_tell_tenant_names_apart(pool: PoolProcess) -> None:
    answers = {why: refusal(pool, tenant, mac) for why, (tenant, mac) in REFUSALS.items()}
    assert len(set(answers.values())) == 1, answers
    kind, message = answers["no MAC"]
    assert kind == "auth" and message.startswith("authentication failed: ")
    assert "gamma" not in message and "alpha" not in message


def test_a_single_tenant_pool_with_a_secret_refuses_a_named_tenant_as_a_wrong_secret() -> None:
    with PoolProcess(capacity="2MiB", slab_size="1MiB", secret="s3cret") as single:
        answers = {refusal(single, "", b""), refusal(single, "", mac_of("guess", "")),
                   refusal(single, "alpha", b""), refusal(single, "alpha", mac_of("s3cret", "alpha"))}
    assert len(answers) == 1 and next(iter(answers))[0] == "auth", answers


def test_every_refusal_computes_and_compares_one_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same work whatever the reason (so timing does not tell a tenant name either): a MAC
    computed and compared in constant time, against a dummy secret for an unknown tenant."""
    tenants = {n: Tenant(n, s, None, None) for n, s in TENANTS.items()}  # type: ignore[arg-type]
    nonce = b"n" * 16
    hellos = [P.ClientHello(mac if isinstance(mac, bytes) else mac(nonce), tenant=tenant)
              for tenant, mac in REFUSALS.values()]
    calls: list[str] = []
    real_mac, real_compare = P.auth_mac, hmac.compare_digest
    monkeypatch.setattr(P, "auth_mac", lambda *a: calls.append("mac") or real_mac(*a))
    monkeypatch.setattr(hmac, "compare_digest", lambda *a: calls.append("compare") or real_compare(*a))
    for hello in hellos:
        calls.clear()
        with pytest.raises(AuthError):
            authenticate(tenants, hello, nonce)
        assert calls == ["mac", "compare"], hello
    good = P.ClientHello(P.auth_mac(TENANTS["beta"], nonce, "beta"), tenant="beta")
    assert authenticate(tenants, good, nonce) is tenants["beta"]


def test_a_single_tenant_pool_refuses_a_named_tenant() -> None:
    with PoolProcess(capacity="2MiB", slab_size="1MiB") as pool:
        with pytest.raises(AuthError, match="no tenant 'alpha'"):
            raw(pool, "", "alpha")
