"""The remote pool tier: the conformance suite over shared memory and over TCP (real servers,
real sockets), plus rendezvous placement and endpoint failure / return."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.api import Tier, page_nbytes
from mooncake_sgl.config import HostTierConfig, PoolTierConfig
from mooncake_sgl.errors import TierClosed
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.pool.config import PoolServerConfig
from mooncake_sgl.pool.server import PoolServer
from mooncake_sgl.store import TieredStore
from mooncake_sgl.tiers import build_tier
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.pool import PoolTier

from .conformance import TierConformance, empty_like, key, make_page, same


def _server(capacity: int, slab: int = 128 * 1024) -> PoolServer:
    return PoolServer(PoolServerConfig(port=0, capacity=max(capacity, slab), slab_size=slab,
                                       put_wait=0.2)).start()


class _PoolConformance(TierConformance):
    self_evicting = True
    transport = "auto"

    @pytest.fixture(autouse=True)
    def _servers(self) -> Iterator[None]:
        self.servers: list[PoolServer] = []
        yield
        for s in self.servers:
            s.stop()

    def make_tier(self, capacity_bytes: int) -> Tier:
        server = _server(capacity_bytes)
        self.servers.append(server)
        host, port = server.address
        return PoolTier(PoolTierConfig(endpoints=[f"{host}:{port}"], transport=self.transport,
                                       connections=2))


class TestPoolTierOverSharedMemory(_PoolConformance):
    transport = "shm"


class TestPoolTierOverTcp(_PoolConformance):
    transport = "tcp"


def test_build_tier_makes_a_pool_tier_with_declared_capabilities() -> None:
    server = _server(1 << 20)
    try:
        host, port = server.address
        t = build_tier(PoolTierConfig(endpoints=[f"{host}:{port}"]))
        assert isinstance(t, PoolTier)
        assert t.capabilities.shared and t.capabilities.self_evicting
        assert t.put_from([key(1)], [make_page(1, 4096)]).ok == (True,)
        assert t.stats().shm_endpoints == 1.0  # same host: auto picked shared memory
        t.close()
        with pytest.raises(TierClosed):
            t.get_into([key(1)], [empty_like(make_page(1, 4096))])
    finally:
        server.stop()


def test_keys_spread_over_endpoints_by_rendezvous_and_read_back() -> None:
    servers = [_server(4 << 20) for _ in range(3)]
    try:
        eps = [f"{s.address[0]}:{s.address[1]}" for s in servers]
        tier = PoolTier(PoolTierConfig(endpoints=eps, transport="tcp"))
        pages = [make_page(i, 4096) for i in range(60)]
        assert tier.put_from([key(i) for i in range(60)], pages).ok == (True,) * 60
        per_server = [int(s.stats()["pages"]) for s in servers]
        assert sum(per_server) == 60 and min(per_server) >= 8, per_server  # all three used
        # A second tier with the same endpoints in another order places keys identically.
        again = PoolTier(PoolTierConfig(endpoints=list(reversed(eps)), transport="tcp"))
        out = [empty_like(p) for p in pages]
        assert again.get_into([key(i) for i in range(60)], out) == [True] * 60
        assert all(same(a, b) for a, b in zip(pages, out))
        tier.close()
        again.close()
    finally:
        for s in servers:
            s.stop()


def test_dead_endpoint_turns_into_misses_and_is_used_again_when_it_returns() -> None:
    # Story: two pool servers in subprocesses; one is killed. Its keys become misses (never an
    # exception), the survivor keeps serving its own keys, new puts go to the survivor; the dead
    # one restarts on the same port and is used again after retry_after.
    with PoolProcess(capacity="8MiB", slab_size="1MiB") as a, PoolProcess(capacity="8MiB",
                                                                         slab_size="1MiB") as b:
        tier = PoolTier(PoolTierConfig(endpoints=[a.endpoint, b.endpoint], transport="tcp",
                                       retry_after=0.3, timeout=2.0))
        pages = [make_page(i, 4096) for i in range(40)]
        keys = [key(i) for i in range(40)]
        assert tier.put_from(keys, pages).ok == (True,) * 40
        a.kill()
        hits = tier.get_into(keys, [empty_like(p) for p in pages])
        assert 0 < sum(hits) < 40  # b's share still hits, a's share misses
        assert tier.stats().endpoints_live == 1.0 and tier.reachable()  # b still answers
        assert tier.contains(keys) == hits  # a's keys now route to b, which lacks them
        assert tier.put_from([key(100)], [make_page(100, 4096)]).ok == (True,)  # lands on b
        a.start()
        time.sleep(0.4)
        assert tier.put_from(keys, pages).ok == (True,) * 40  # a is back: its share is stored again
        assert tier.stats().endpoints_live == 2.0
        out = [empty_like(p) for p in pages]
        assert tier.get_into(keys, out) == [True] * 40
        assert all(same(x, y) for x, y in zip(pages, out))
        tier.close()


def test_unreachable_pool_is_all_misses_not_errors() -> None:
    tier = PoolTier(PoolTierConfig(endpoints=["127.0.0.1:1"], transport="tcp", timeout=0.5))
    page = make_page(1, 4096)
    assert tier.put_from([key(1)], [page]).ok == (False,)
    assert not tier.reachable()  # the store drops victims bound here instead of waiting on copies
    assert tier.get_into([key(1)], [empty_like(page)]) == [False]
    assert tier.contains([key(1)]) == [False]
    assert tier.usage().capacity_bytes == 0
    tier.close()


def test_a_stopped_server_costs_a_read_the_short_deadlines_once_not_the_full_timeout() -> None:
    # Story: the pool process is stopped (SIGSTOP: a debugger, a frozen VM), not dead. The kernel
    # still accepts its connections, so nothing fails fast by itself: a read used to wait out the
    # full request timeout (here 10 s). Now a fresh connection's handshake and an established
    # connection's reply each have a short deadline, and the endpoint is then skipped.

    with PoolProcess(capacity="4MiB", slab_size="1MiB") as pool:
        cfg = dict(endpoints=[pool.endpoint], transport="tcp", timeout=10.0, retry_after=0.5,
                   connect_timeout=0.3, first_byte_timeout=0.3)
        warm, cold = PoolTier(PoolTierConfig(**cfg)), PoolTier(PoolTierConfig(**cfg))
        page = make_page(1, 4096)
        assert warm.put_from([key(1)], [page]).ok == (True,)  # warm: connected before the stop
        pool.freeze()
        try:
            for tier in (warm, cold):
                t0 = time.monotonic()
                assert tier.get_into([key(1)], [empty_like(page)]) == [False]
                assert tier.contains([key(1)]) == [False]  # skipped: no second wait
                assert time.monotonic() - t0 < 3.0  # a tenth of the 10 s timeout, with slack
                assert tier.stats().endpoints_live == 0.0
        finally:
            pool.thaw()
        time.sleep(0.6)
        out = empty_like(page)
        assert warm.get_into([key(1)], [out]) == [True] and same(page, out)
        warm.close()
        cold.close()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_restarted_server_is_used_again_even_when_no_connection_was_in_use(transport: str) -> None:
    # Story: the server is killed while the tier is idle, and restarts on the same port with a
    # new Unix socket and segment. Opening a connection to the old generation's socket failed
    # without starting over, so every later call failed the same way, for good.
    with PoolProcess(capacity="4MiB", slab_size="1MiB") as pool:
        tier = PoolTier(PoolTierConfig(endpoints=[pool.endpoint], transport=transport,
                                       retry_after=0.1, connections=2))
        assert tier.put_from([key(1)], [make_page(1, 4096)]).ok == (True,)
        pool.kill()
        pool.start()
        # Over TCP the dead idle connection is replaced at once; over shared memory the first
        # call finds the old socket gone and fails once. Either way, after retry_after ...
        tier.put_from([key(2)], [make_page(2, 4096)])
        time.sleep(0.2)
        page = make_page(3, 4096)
        assert tier.put_from([key(3)], [page]).ok == (True,)  # ... the new server is used
        out = empty_like(page)
        assert tier.get_into([key(3)], [out]) == [True] and same(page, out)
        tier.close()


def test_a_page_as_large_as_a_slab_is_stored_over_shared_memory_in_a_one_slab_pool() -> None:
    # One process may hold half the pool, but never less than the largest page it takes.
    server = _server(256 * 1024, slab=256 * 1024)
    try:
        host, port = server.address
        tier = PoolTier(PoolTierConfig(endpoints=[f"{host}:{port}"], transport="shm"))
        page = make_page(9, 128 * 1024)  # two segments: one whole slab
        assert tier.put_from([key(9)], [page]).ok == (True,)
        out = empty_like(page)
        assert tier.get_into([key(9)], [out]) == [True] and same(page, out)
        tier.close()
    finally:
        server.stop()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_the_store_counts_only_pages_new_to_the_pool_as_written(transport: str) -> None:
    server = _server(4 << 20)
    host, port = server.address
    pool = PoolTier(PoolTierConfig(endpoints=[f"{host}:{port}"], transport=transport))
    store = TieredStore([HostTier(HostTierConfig(capacity=4 * 8192, pin_memory=False)), pool],
                        LruPolicy(2))
    try:
        pages = [make_page(i, 8192) for i in range(16)]
        keys = [key(4000 + i) for i in range(16)]
        for _ in range(3):  # SGLang hands the backend pages it has already backed up
            assert store.put_from(keys, pages) == [True] * 16
        counted = store.stats().tiers[store.names[1]].placement
        assert counted.writes == 16 and counted.bytes_written == sum(map(page_nbytes, pages))
        assert pool.stats().counts.put_already_present == 32
        assert server.stats()["put_present"] == 32
    finally:
        store.close()
        server.stop()


class Dns:
    """A resolver for ``NAME`` that answers 127.0.0.1, or hangs ``seconds`` and fails while
    ``down``, however it is reached: ``socket.getaddrinfo``, or a ``connect`` given the name (the C
    library resolves inside it)."""

    NAME = "pool.dns.test"

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds: float = 5.0) -> None:
        self.down = False
        self.seconds = seconds
        real_gai, real_connect = socket.getaddrinfo, socket.socket.connect

        def getaddrinfo(host: str, port: object, *args: object, **kwargs: object) -> list:
            if host != self.NAME:
                return real_gai(host, port, *args, **kwargs)
            if self.down:
                time.sleep(self.seconds)
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            return real_gai("127.0.0.1", port, *args, **kwargs)

        def connect(sock: socket.socket, address: object) -> None:
            if isinstance(address, tuple) and address[0] == self.NAME:
                address = getaddrinfo(*address[:2], sock.family, sock.type)[0][4]
            real_connect(sock, address)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket.socket, "connect", connect)


def concurrent_contains(tier: PoolTier, n: int) -> list[tuple[list[bool], float]]:
    out: list[tuple[list[bool], float]] = []

    def one() -> None:
        t0 = time.monotonic()
        res = tier.contains([key(1)])
        out.append((res, time.monotonic() - t0))

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_a_dns_outage_costs_each_call_at_most_the_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three concurrent contains took 10, 20 and 30 s against a 1 s connect_timeout: the name was
    # resolved inside connect, and first contact was made under the client's lock.
    dns = Dns(monkeypatch)
    dns.down = True
    tier = PoolTier(PoolTierConfig(endpoints=[f"{Dns.NAME}:7480"], transport="tcp", connect_timeout="1s"))
    try:
        results = concurrent_contains(tier, 3)
        assert [r for r, _ in results] == [[False]] * 3
        assert max(seconds for _, seconds in results) < 1.5, results
    finally:
        tier.close()


def test_a_name_that_resolved_once_is_served_through_a_later_dns_outage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dns = Dns(monkeypatch)
    server = PoolServer(PoolServerConfig(port=0, capacity="4MiB", slab_size="1MiB",
                                         shared_memory=False)).start()
    endpoint = f"{Dns.NAME}:{server.address[1]}"
    try:
        first = PoolTier(PoolTierConfig(endpoints=[endpoint], transport="tcp", connect_timeout="1s"))
        page = make_page(1, 4096)
        assert first.put_from([key(1)], [page]).ok == (True,)
        first.close()
        dns.down = True
        later = PoolTier(PoolTierConfig(endpoints=[endpoint], transport="tcp", connect_timeout="1s"))
        t0 = time.monotonic()
        assert later.contains([key(1)]) == [True] and time.monotonic() - t0 < 1.0
        later.close()
    finally:
        server.stop()
