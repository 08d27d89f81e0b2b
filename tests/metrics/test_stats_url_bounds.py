"""``mooncake-sgl stats URL`` against endpoints that never finish: a total deadline and a body cap.

Each endpoint is a real HTTP server on 127.0.0.1 (a thread per connection), and the CLI runs as
its own process, so a hang or a runaway read shows as the wall time and peak memory it had."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mooncake_sgl.metrics.scrape import ScrapeError, fetch

HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
# One of our series, so a complete page parses (the CLI's exit 0 path).
PAGE = (b'mooncake_sgl_tier_hits_total{tier="host",tp_rank="0",pp_rank="0",dp_rank="0"} 3\n'
        b'mooncake_sgl_tier_resident_pages{tier="host",tp_rank="0",pp_rank="0",dp_rank="0"} 3\n')


def _trickle_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(HEADERS + b"\r\n")  # no length: the body ends when the connection does
    for byte in PAGE * 1000:
        if stop.wait(0.3):
            return
        conn.sendall(bytes([byte]))


def _trickle_headers(conn: socket.socket, stop: threading.Event) -> None:
    for byte in HEADERS + b"X-Slow: " + b"a" * 10_000:
        if stop.wait(0.3):
            return
        conn.sendall(bytes([byte]))


def _endless(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(HEADERS + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (len(PAGE) * 512, PAGE * 512)
    while not stop.is_set():
        conn.sendall(chunk)


def _announces_too_much(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(HEADERS + b"Content-Length: 100000000000\r\n\r\n" + PAGE)
    stop.wait(30)


def _complete(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(HEADERS + b"Content-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE))


@contextlib.contextmanager
def http_server(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[str]:
    """``host:port`` of a server that reads a request and hands the socket to ``answer``."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            answer(conn, stop)

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept_loop, daemon=True)
    acceptor.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()


# Peak RSS from VmHWM, this process's own: getrusage's ru_maxrss keeps the high-water mark of the
# process that exec'd it, so a child of a large pytest reported pytest's size.
_MEASURED = ("import re, sys, time; from mooncake_sgl.metrics.cli import main; t = time.monotonic(); "
             "rc = main(sys.argv[1:]); "
             "hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); "
             "print(f'RESULT {rc} {time.monotonic() - t:.2f} {hwm // 1024}', file=sys.stderr)")


def run_stats(*args: str) -> tuple[int, float, int, str]:
    """The CLI in its own process: exit status, seconds it ran, peak RSS in MiB, stderr."""
    res = subprocess.run([sys.executable, "-c", _MEASURED, *args], capture_output=True, text=True,
                         timeout=60)
    result = [line for line in res.stderr.splitlines() if line.startswith("RESULT ")]
    assert result, res.stderr
    _, rc, seconds, rss = result[-1].split()
    return int(rc), float(seconds), int(rss), res.stderr


@pytest.mark.parametrize("answer", [_trickle_body, _trickle_headers], ids=["body", "headers"])
def test_a_trickling_endpoint_is_cut_at_the_timeout(answer: Callable) -> None:
    # A byte every 0.3 s resets any per-read socket timeout: only a total deadline ends it.
    with http_server(answer) as target:
        rc, seconds, _, err = run_stats(target, "--timeout", "2")
    assert rc == 1, err
    assert seconds < 5, f"ran {seconds} s with --timeout 2"
    assert f"http://{target}/metrics" in err and "no complete answer within 2 s" in err, err


def test_an_endless_body_is_cut_at_the_size_cap() -> None:
    with http_server(_endless) as target:
        rc, seconds, rss, err = run_stats(target, "--max-bytes", "8MiB", "--timeout", "30")
    assert rc == 1, err
    assert "more than a /metrics page may take" in err and str(8 << 20) in err, err
    assert seconds < 10 and rss < 400, (seconds, rss)


def test_the_default_cap_bounds_memory_with_no_option() -> None:
    with http_server(_endless) as target:
        rc, seconds, rss, err = run_stats(target, "--timeout", "30")
    assert rc == 1 and "more than a /metrics page may take" in err, err
    assert rss < 600, f"peak {rss} MiB reading an endless body"


def test_a_body_announced_larger_than_the_cap_is_refused_before_reading() -> None:
    with http_server(_announces_too_much) as target:
        t = time.monotonic()
        with pytest.raises(ScrapeError, match="its body is 100000000000 bytes"):
            fetch(target, timeout=20)
        assert time.monotonic() - t < 5


def test_a_complete_page_within_the_bounds_is_read() -> None:
    with http_server(_complete) as target:
        assert fetch(target, timeout=5, max_bytes=len(PAGE)) == PAGE.decode()
        rc, _, _, err = run_stats(target, "--json")
    assert rc == 0, err


def test_bad_bounds_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from mooncake_sgl.metrics.cli import main

    for args in (["--timeout", "0"], ["--max-bytes", "lots"]):
        with pytest.raises(SystemExit) as e:
            main(["127.0.0.1:1", *args])
        assert e.value.code == 2
    assert "--max-bytes" in capsys.readouterr().err


def test_a_host_name_that_hangs_in_the_resolver_costs_the_timeout_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """During a DNS outage ``getaddrinfo`` waits out the resolver (10-30 s); http.client resolved
    inside ``connect``, before any deadline of ours started to count."""
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: object) -> list:
        if host == "metrics.test":
            time.sleep(3)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    t0 = time.monotonic()
    with pytest.raises(ScrapeError, match="metrics.test did not resolve within 0.5 s"):
        fetch("metrics.test:9", timeout=0.5)
    assert time.monotonic() - t0 < 1.5


def test_a_host_name_that_resolves_is_read_as_before() -> None:
    with http_server(_complete) as target:
        assert fetch(f"localhost:{target.rsplit(':', 1)[1]}", timeout=5) == PAGE.decode()


def test_a_watch_interval_that_is_not_a_finite_number_of_seconds_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    # inf reached time.sleep as an OverflowError, nan as a ValueError, after the first read.
    from mooncake_sgl.metrics.cli import main

    for value in ("inf", "nan", "1e308"):
        with pytest.raises(SystemExit) as e:
            main(["127.0.0.1:1", "--watch", value])
        assert e.value.code == 2, value
        assert "--watch needs a number of seconds" in capsys.readouterr().err, value
