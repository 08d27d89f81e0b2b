"""RDMA without a device: the transport imports, says plainly why it cannot run, and the pool and
client fall back (auto) or refuse with that reason (forced). The RDMA data path itself was never
run: no machine here has an RDMA device."""

from __future__ import annotations

import pytest

from mooncake_sgl.errors import TierUnavailable
from mooncake_sgl.pool.config import PoolServerConfig
from mooncake_sgl.pool.server import PoolServer
from mooncake_sgl.transfer import rdma
from mooncake_sgl.transfer.client import PoolClient


def test_reason_names_the_missing_piece() -> None:
    reason = rdma.unavailable_reason()
    if reason is None:
        pytest.skip("this host has an RDMA device: the guard has nothing to report")
    assert "no RDMA device" in reason or "pyverbs is not installed" in reason


def test_server_asked_for_rdma_without_a_device_serves_without_it() -> None:
    if rdma.unavailable_reason() is None:
        pytest.skip("this host has an RDMA device")
    server = PoolServer(PoolServerConfig(port=0, capacity="2MiB", slab_size="1MiB",
                                         rdma_device="")).start()
    try:
        assert not server.rdma and server.stats()["rdma"] == 0.0
        ep = f"{server.address[0]}:{server.address[1]}"
        forced = PoolClient(ep, transport="rdma")
        with pytest.raises(TierUnavailable, match="RDMA impossible: the server offers no RDMA"):
            forced.exists_batch([b"k"])
        forced.close()
        auto = PoolClient(ep, transport="auto")
        assert auto.exists_batch([b"k"]) == [False] and auto.mode == "shm"
        auto.close()
    finally:
        server.stop()
