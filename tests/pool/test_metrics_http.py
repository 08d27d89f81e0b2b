"""The pool's ``/metrics`` HTTP server: prometheus_client's output, at most a few connections (a new
one pushes out the oldest), each closed at its deadline, and an accept that fails is survived."""

from __future__ import annotations

import gzip
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest, make_wsgi_app
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from mooncake_sgl.pool.metrics_http import MetricsHttp

from .peers import fail_accepts

OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("pages_total", "pages", registry=reg).inc(7)
    Counter("other_total", "other", registry=reg).inc(1)
    return reg


@pytest.fixture
def http(registry: CollectorRegistry) -> Iterator[MetricsHttp]:
    server = MetricsHttp("127.0.0.1", 0, make_wsgi_app(registry), max_connections=4, timeout=0.5)
    yield server
    server.close()


def get(http: MetricsHttp, path: str = "/metrics", **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{http.port}{path}", headers=headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, dict(r.headers), r.read()


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1 << 16) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_the_output_is_prometheus_clients_for_each_format(http: MetricsHttp,
                                                          registry: CollectorRegistry) -> None:
    status, headers, body = get(http)
    assert (status, headers["Content-Type"]) == (200, CONTENT_TYPE_PLAIN_0_0_4)
    assert body == generate_latest(registry)
    _, headers, body = get(http, Accept=OPENMETRICS_ACCEPT)
    assert headers["Content-Type"].startswith(OPENMETRICS.split(";")[0])
    assert body == openmetrics_latest(registry)
    _, headers, body = get(http, **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == generate_latest(registry)
    _, _, body = get(http, "/metrics?name[]=pages_total")
    assert b"pages_total 7.0" in body and b"other_total" not in body


def test_more_idle_connections_than_the_limit_still_let_a_scrape_through(http: MetricsHttp) -> None:
    idle = [socket.create_connection(("127.0.0.1", http.port)) for _ in range(10)]
    try:
        assert get(http)[0] == 200
        assert closed_within(idle[0], 2)  # the oldest made way
    finally:
        for s in idle:
            s.close()


def test_an_idle_or_dribbling_connection_is_closed_at_its_deadline(http: MetricsHttp) -> None:
    idle = socket.create_connection(("127.0.0.1", http.port))
    dribbling = socket.create_connection(("127.0.0.1", http.port))
    started = time.monotonic()
    for _ in range(3):
        dribbling.sendall(b"G")
        time.sleep(0.1)
    assert closed_within(idle, 2) and closed_within(dribbling, 2)
    assert time.monotonic() - started < 1.5
    idle.close()
    dribbling.close()


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (20 << 10) + b"\r\n\r\n", b"431"),
    (b"nonsense\r\n\r\n", b"400"),
    (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
])
def test_a_bad_request_gets_an_error_status(http: MetricsHttp, request_bytes: bytes, status: bytes) -> None:
    with socket.create_connection(("127.0.0.1", http.port), timeout=5) as s:
        s.sendall(request_bytes)
        assert s.recv(64).split()[1] == status


def test_the_endpoint_survives_a_failed_accept(http: MetricsHttp, monkeypatch: pytest.MonkeyPatch) -> None:
    left = fail_accepts(monkeypatch, "pool-metrics-http")
    assert get(http)[0] == 200 and left == [0]
