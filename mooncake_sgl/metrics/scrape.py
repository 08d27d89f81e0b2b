"""Reading our series back from a ``/metrics`` endpoint (SGLang's or the pool's).

For benchmarks and ``mooncake-sgl stats``::

    before = scrape("127.0.0.1:30000")
    ...                                   # a round of requests
    per_tier = diff(before, scrape("127.0.0.1:30000")).by_tier()   # {"host": TierSample, ...}
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
import urllib.parse

from ..transfer.resolve import resolve
from .model import (
    COUNTERS,
    CURVE_COUNTERS,
    CURVE_GAUGES,
    GAUGES,
    POOL_PREFIX,
    STORE_COUNTERS,
    Snapshot,
    TierSample,
    rank_name,
)

_COUNTER_SAMPLES = {name + "_total": f for f, name in COUNTERS.items()}
_STORE_SAMPLES = {name + "_total": f for f, name in STORE_COUNTERS.items()}
_GAUGE_SAMPLES = {name: f for f, name in GAUGES.items()}
_CURVE_SAMPLES = {**{name + "_total": f for f, name in CURVE_COUNTERS.items()},
                  **{name: f for f, name in CURVE_GAUGES.items()}}


class ScrapeError(OSError):
    """The endpoint could not be read; the message names the URL."""


def metrics_url(target: str) -> str:
    """``host:port``, ``http://host:port`` or a full URL -> the URL of its ``/metrics``."""
    url = target if "://" in target else f"http://{target}"
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url = f"{scheme}://{rest}/metrics"
    return url


# A SGLang /metrics page is kilobytes to a few MiB (histograms per rank); far more is not ours.
MAX_BODY_BYTES = 64 << 20


def _address_within(parts: urllib.parse.SplitResult, deadline: float) -> str:
    """Where to connect for ``parts``: a plain-http host name resolved by ``deadline`` (http.client
    resolves inside ``connect``, with no bound: during a DNS outage ``stats`` waited out the
    resolver's 10-30 s whatever its timeout). HTTPS keeps the name, which its certificate check
    needs; addresses are used as they are."""
    host = parts.hostname or ""
    if parts.scheme != "http" or ":" in host:
        return host
    _, sockaddr = resolve(host, parts.port or 80, deadline)
    return sockaddr[0]


def fetch(target: str, timeout: float = 5.0, max_bytes: int = MAX_BODY_BYTES) -> str:
    """The Prometheus text of ``target``'s ``/metrics``, read within ``timeout`` seconds in all
    (connect, headers and body: a socket timeout alone restarts at every byte, so a trickling
    endpoint could hold us for ever) and at most ``max_bytes`` long. ``ScrapeError`` otherwise."""
    url = metrics_url(target)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ScrapeError(f"cannot read {url}: not an http(s) URL")
    deadline = time.monotonic() + timeout
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    expired = threading.Event()
    try:
        conn = conn_cls(_address_within(parts, deadline), parts.port, timeout=timeout)
    except TimeoutError:
        raise ScrapeError(f"cannot read {url}: {parts.hostname} did not resolve within {timeout:g} s"
                          ) from None
    except (http.client.HTTPException, ValueError, OSError) as e:
        raise ScrapeError(f"cannot read {url}: {e}") from e
    try:
        conn.connect()
        sock = conn.sock

        def cut() -> None:  # a blocked recv returns at once once its socket is shut down
            expired.set()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

        watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), cut)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("GET", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")),
                         headers={"Accept": "text/plain", "Host": parts.netloc})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ScrapeError(f"cannot read {url}: HTTP {resp.status} {resp.reason}")
            if resp.length is not None and resp.length > max_bytes:
                raise ScrapeError(f"cannot read {url}: its body is {resp.length} bytes, more than "
                                  f"the {max_bytes} a /metrics page may take")
            body = bytearray()
            while chunk := resp.read1(1 << 16):
                body += chunk
                if len(body) > max_bytes:
                    raise ScrapeError(f"cannot read {url}: its body passed {max_bytes} bytes, more "
                                      "than a /metrics page may take")
        finally:
            watchdog.cancel()
    except (http.client.HTTPException, OSError, ValueError) as e:
        if expired.is_set():
            raise ScrapeError(f"cannot read {url}: no complete answer within {timeout:g} s") from None
        if isinstance(e, ScrapeError):
            raise
        raise ScrapeError(f"cannot read {url}: {e}") from e
    finally:
        conn.close()
    if expired.is_set():  # the cut can look like the end of a body sent without a length
        raise ScrapeError(f"cannot read {url}: no complete answer within {timeout:g} s")
    return body.decode("utf-8", "replace")


def _families(text: str):  # noqa: ANN202 (prometheus_client's own iterator type)
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families(text)


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample in Prometheus text: sample name -> (labels, value) each (any series, SGLang's
    included, for readers such as ``doctor`` that look past our own)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in _families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def parse(text: str, taken_at: float | None = None) -> Snapshot:
    """Our per-tier series in Prometheus text, one sample per (rank, tier)."""
    vals: dict[tuple[str, str], dict[str, float]] = {}
    store: dict[str, dict[str, float]] = {}
    curves: dict[tuple[str, str, str], dict[str, float]] = {}
    for family in _families(text):
        for s in family.samples:
            if s.name in _STORE_SAMPLES:
                counters = store.setdefault(rank_name(s.labels), {})
                counters[_STORE_SAMPLES[s.name]] = counters.get(_STORE_SAMPLES[s.name], 0.0) + s.value
                continue
            if s.name in _CURVE_SAMPLES and "tier" in s.labels and "size" in s.labels:
                point = curves.setdefault((rank_name(s.labels), s.labels["tier"], s.labels["size"]), {})
                point[_CURVE_SAMPLES[s.name]] = point.get(_CURVE_SAMPLES[s.name], 0.0) + float(s.value)
                continue
            f = _COUNTER_SAMPLES.get(s.name) or _GAUGE_SAMPLES.get(s.name)
            if f is None or "tier" not in s.labels:
                continue
            key = (rank_name(s.labels), s.labels["tier"])
            fields = vals.setdefault(key, {})
            fields[f] = fields.get(f, 0.0) + float(s.value)
    return Snapshot({k: TierSample(**v) for k, v in vals.items()},
                    time.time() if taken_at is None else taken_at, store, curves)


def scrape(target: str, timeout: float = 5.0, max_bytes: int = MAX_BODY_BYTES) -> Snapshot:
    """Our per-tier counters as a SGLang server's ``/metrics`` shows them now."""
    return parse(fetch(target, timeout, max_bytes))


def parse_pool(text: str) -> dict[str, float]:
    """The pool server's scalar series (``mooncake_sgl_pool_*``, name without the prefix; counters
    keep their ``_total``); latency histograms are left out."""
    out: dict[str, float] = {}
    for family in _families(text):
        if family.type == "histogram":
            continue
        for s in family.samples:
            if s.name.startswith(POOL_PREFIX) and not s.name.endswith("_created"):
                out[s.name[len(POOL_PREFIX):]] = float(s.value)
    return out


def is_pool(text: str) -> bool:
    return f"\n{POOL_PREFIX}" in f"\n{text}"
