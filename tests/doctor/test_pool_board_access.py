"""``mooncake-sgl doctor --pool`` on pools that ask for a secret, and on a multi-tenant pool: it
reads the board with ``--pool-secret`` / ``$MOONCAKE_SGL_POOL_SECRET`` and ``--pool-tenant``, as
``mooncake-sgl pool stats`` does, and a pool that refuses it is reported as a refusal naming the
cause, at once, not as a pool that did not answer. Real pool server processes on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.config import PoolTierConfig
from mooncake_sgl.hicache.namespace_board import NamespaceRecord, post
from mooncake_sgl.tiers.pool import PoolTier

from .endpoints import HEALTHY_PAGE, SERVER_INFO, doctor, endpoint, namespace_info

SECRET = "board-secret"
TENANTS = {"alpha": "alpha-secret", "beta": "beta-secret"}


@pytest.fixture(scope="module")
def secret_pool() -> Iterator[PoolProcess]:
    with PoolProcess(capacity="8MiB", slab_size="1MiB", secret=SECRET) as pool:
        yield pool


@pytest.fixture(scope="module")
def tenant_pool() -> Iterator[PoolProcess]:
    with PoolProcess(capacity="8MiB", slab_size="1MiB",
                     tenants=[{"name": n, "secret": s, "capacity": "4MiB"} for n, s in TENANTS.items()]) as p:
        yield p


def post_record(pool: PoolProcess, page_size: int, secret: str, tenant: str = "") -> None:
    """Another configuration's record on the pool's board, as an attaching instance posts it."""
    tier = PoolTier(PoolTierConfig(endpoints=[pool.endpoint], transport="tcp", secret=secret, tenant=tenant))
    try:
        post(tier, NamespaceRecord(role="colocated", model="m", weights="w", dtype="bf16",
                                   layout="page_first", page_size=page_size, key_tp="1", pp_size=1,
                                   cp_size=1, tag="", host="other-host", seen=time.time()))
    finally:
        tier.close()


def server_on(pool: PoolProcess):  # noqa: ANN201 (a context manager of the server's URL)
    """A stand-in SGLang server keyed into ``pool`` with page size 64."""
    page = HEALTHY_PAGE + namespace_info("64", f"pool:{pool.endpoint}")
    return endpoint({"/metrics": page, "/get_server_info": SERVER_INFO})


def by_code(doc: dict) -> dict[str, dict]:
    return {f["code"]: f for f in doc["findings"]}


def test_a_pool_with_a_secret_is_read_with_pool_secret(secret_pool: PoolProcess) -> None:
    post_record(secret_pool, 32, SECRET)
    with server_on(secret_pool) as server:
        rc, doc = doctor(server, "--pool", secret_pool.endpoint, "--pool-secret", SECRET, "--window", "0")
    found = by_code(doc)
    assert "pool_refused" not in found and "pool_unreadable" not in found, doc
    other = found["namespace_other"]
    assert f"pool:{secret_pool.endpoint}" in other["says"] and "page size 64 here, 32 there" in other["says"]
    assert rc == 0  # the board's other configuration is information, not a warning


def test_the_pool_secret_comes_from_the_environment(secret_pool: PoolProcess,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    post_record(secret_pool, 32, SECRET)
    monkeypatch.setenv("MOONCAKE_SGL_POOL_SECRET", SECRET)
    with server_on(secret_pool) as server:
        _, doc = doctor(server, "--pool", secret_pool.endpoint, "--window", "0")
    assert set(by_code(doc)) == {"namespace_other"}, doc


def test_a_refusal_is_reported_at_once_as_a_refusal_naming_its_cause(
        secret_pool: PoolProcess, tenant_pool: PoolProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_SGL_POOL_SECRET", raising=False)
    cases = [(secret_pool, (), "presented no secret and no tenant"),
             (secret_pool, ("--pool-secret", "wrong"), "presented a secret and no tenant"),
             (tenant_pool, ("--pool-secret", TENANTS["alpha"], "--pool-tenant", "gamma"),
              "presented a secret and tenant 'gamma'"),
             (tenant_pool, ("--pool-secret", TENANTS["beta"], "--pool-tenant", "alpha"),
              "presented a secret and tenant 'alpha'")]
    with server_on(secret_pool) as server:
        for pool, options, presented in cases:
            t = time.monotonic()
            rc, doc = doctor(server, "--pool", pool.endpoint, *options, "--timeout", "5", "--window", "0")
            took = time.monotonic() - t
            refused = by_code(doc).get("pool_refused")
            assert rc == 1 and refused is not None, (options, doc)
            assert refused["server"] == f"pool:{pool.endpoint}"
            assert refused["says"].startswith("the pool refused the doctor: ") and "secret" in refused["says"]
            assert refused["evidence"] == [presented] and "--pool-secret" in refused["fix"]
            assert took < 3, f"{options}: a refusal took {took:.1f} s to report"
        # A pool that is not there is still that, not a refusal.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
            rc, doc = doctor(server, "--pool", f"127.0.0.1:{s.getsockname()[1]}", "--pool-secret", SECRET,
                             "--timeout", "2", "--window", "0")
        assert rc == 1 and "pool_unreadable" in by_code(doc) and "pool_refused" not in by_code(doc), doc


def test_a_tenants_board_is_read_with_pool_tenant(tenant_pool: PoolProcess) -> None:
    post_record(tenant_pool, 16, TENANTS["beta"], tenant="beta")
    with server_on(tenant_pool) as server:
        _, doc = doctor(server, "--pool", tenant_pool.endpoint, "--pool-tenant", "beta",
                        "--pool-secret", TENANTS["beta"], "--window", "0")
        [other] = [f for f in doc["findings"] if f["code"] == "namespace_other"]
        assert "page size 64 here, 16 there" in other["says"], doc
        # Alpha's board is alpha's own: beta's record is not on it.
        _, doc = doctor(server, "--pool", tenant_pool.endpoint, "--pool-tenant", "alpha",
                        "--pool-secret", TENANTS["alpha"], "--window", "0")
    assert doc["findings"] == [], doc
