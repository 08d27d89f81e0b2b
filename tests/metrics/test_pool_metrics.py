"""The pool server's ``/metrics`` (``metrics_port`` / ``--metrics-port``): its fill, traffic,
refusals, connections, authentication failures and per-op latency, read by a real scrape."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from mooncake_sgl.cli import main as cli_main
from mooncake_sgl.errors import MooncakeSglError
from mooncake_sgl.metrics.scrape import fetch, parse_pool
from mooncake_sgl.pool.config import PoolServerConfig, load_pool_config
from mooncake_sgl.pool.server import PoolServer
from mooncake_sgl.transfer.client import PoolClient
from tests.tiers.conformance import empty_like, key, make_page

SEG = 16 * 1024
SECRET = "metrics-test-secret"


@pytest.fixture
def pool() -> Iterator[PoolServer]:
    server = PoolServer(PoolServerConfig(port=0, metrics_port=0, capacity="8MiB", slab_size="1MiB",
                                         populate=False, secret=SECRET, put_wait=0.2)).start()
    yield server
    server.stop()


def scrape(server: PoolServer) -> dict[str, float]:
    return parse_pool(fetch(f"{server.config.host}:{server.metrics_http.port}"))


def client(server: PoolServer, secret: str = SECRET) -> PoolClient:
    host, port = server.address
    return PoolClient(f"{host}:{port}", transport="tcp", secret=secret, connections=1, timeout=5)


def test_a_scrape_shows_the_pools_pages_traffic_and_latency(pool: PoolServer) -> None:
    c = client(pool)
    try:
        pages = [make_page(i, SEG) for i in range(5)]
        assert c.put_batch([key(i) for i in range(5)], pages).ok == (True,) * 5
        assert c.get_batch([key(i) for i in range(7)], [empty_like(pages[0]) for _ in range(7)]) == \
            [True] * 5 + [False] * 2
        m = scrape(pool)
        assert m["connections"] == 1
    finally:
        c.close()
    assert m["pages"] == 5
    assert m["puts_total"] == 5 and m["gets_total"] == 7 and m["get_hits_total"] == 5
    assert m["received_bytes_total"] == 5 * 2 * SEG
    assert m["capacity_bytes"] == 8 << 20
    assert 0 < m["used_bytes"] <= m["capacity_bytes"]
    assert m["leased_bytes"] == 0  # no read in flight
    assert m["connections_accepted_total"] == 1
    text = fetch(f"127.0.0.1:{pool.metrics_http.port}")
    for op in ("PUT", "GET"):
        assert f'mooncake_sgl_pool_op_latency_seconds_count{{op="{op}"}} 1.0' in text


def test_pages_being_read_show_as_leased_bytes(pool: PoolServer) -> None:
    c = client(pool)
    try:
        assert c.put_batch([key(1)], [make_page(1, SEG)]).ok == (True,)
    finally:
        c.close()
    index = next(iter(pool.tenants.values())).index
    entries = index.lease([key(1)], [2 * SEG])  # what a one-sided reader holds while it copies
    try:
        m = scrape(pool)
        assert (m["leased_pages"], m["leased_bytes"]) == (1, 2 * SEG)
    finally:
        index.release(entries)
    assert scrape(pool)["leased_bytes"] == 0


def test_a_wrong_secret_counts_as_an_authentication_failure(pool: PoolServer) -> None:
    bad = client(pool, secret="not-the-secret")
    with pytest.raises(MooncakeSglError):
        bad.put_batch([key(1)], [make_page(1, SEG)])
    bad.close()
    assert scrape(pool)["auth_failures_total"] == 1


def test_refused_puts_and_evictions_are_counted(pool: PoolServer) -> None:
    # 8 MiB of 1 MiB slabs holds at most 8 pages of 1 MiB: 12 puts evict the oldest.
    c = client(pool)
    try:
        big = 512 * 1024
        for i in range(12):
            assert c.put_batch([key(100 + i)], [make_page(i, big)]).ok == (True,)
        m = scrape(pool)
    finally:
        c.close()
    assert m["evictions_total"] >= 4
    assert m["evicted_bytes_total"] == m["evictions_total"] * 2 * big
    assert m["puts_refused_total"] == 0


def test_the_command_line_serves_metrics_and_stats_reads_them(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_sgl.pool", "--port", "0",
                             "--metrics-port", "0", "--capacity", "64MiB"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline().split()
        assert ready and ready[0] == "READY", proc.stderr.read()
        fields = dict(f.split("=", 1) for f in ready[2:])
        endpoint = fields["metrics"]
        res = subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", "stats", endpoint, "--json"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)["pool"]
        assert doc["capacity_bytes"] == 64 << 20 and doc["pages"] == 0
        table = subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", "stats", endpoint],
                               capture_output=True, text=True, timeout=60)
        assert table.returncode == 0, table.stderr
        assert "pool: 0.0% full (0 B of 64.0 MiB), 0 pages, 0 connections" in table.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_metrics_port_is_validated_naming_the_key(tmp_path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text("port: 7480\nmetrics_port: 7480\n")
    with pytest.raises(MooncakeSglError, match="metrics_port"):
        load_pool_config(str(bad))
    bad.write_text("metrics_port: 70000\n")
    with pytest.raises(MooncakeSglError, match="metrics_port"):
        load_pool_config(str(bad))


def test_pool_stats_url_without_a_pool_or_our_series_is_exit_1(pool: PoolServer, capsys) -> None:
    # The pool's metrics endpoint answers; the pool's data port does not speak HTTP at all.
    host, port = pool.address
    assert cli_main(["stats", f"{host}:{port}", "--timeout", "2"]) == 1
    assert f"http://{host}:{port}/metrics" in capsys.readouterr().err
