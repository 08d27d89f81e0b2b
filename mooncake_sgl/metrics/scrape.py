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
    size_multiplier,
)

_COUNTER_SAMPLES = {name + "_total": f for f, name in COUNTERS.items()}
_STORE_SAMPLES = {name + "_total": f for f, name in STORE_COUNTERS.items()}
_GAUGE_SAMPLES = {name: f for f, name in GAUGES.items()}
_CURVE_SAMPLES = {**{name + "_total": f for f, name in CURVE_COUNTERS.items()},
                  **{name: f for f, name in CURVE_GAUGES.items()}}


# One sample of Prometheus text: (name, labels, value).
Sample = tuple[str, dict[str, str], float]


class ScrapeError(OSError):
    """The endpoint could not be read; the message names the URL."""


def metrics_url(target: str) -> str:
    """``host:port``, ``http://host:port`` or a full URL -> the URL of its ``/metrics``. A URL
    with no path or only ``/`` gets ``/metrics``: a server's root (a trailing slash) serves none."""
    url = target if "://" in target else f"http://{target}"
    scheme, _, rest = url.partition("://")
    host, _, path = rest.partition("/")
    if not path.strip("/"):
        url = f"{scheme}://{host}/metrics"
    return url


def server_url(target: str) -> str:
    """``host:port`` or a URL, with or without ``/metrics`` and trailing slashes -> the base the
    server's paths join to (``http://host:port``, and any path prefix a proxy adds). SGLang answers
    ``//metrics`` with 404, so ``http://host:port/`` must not become that. ``ValueError`` for what is
    not an http(s) URL with a host and a valid port."""
    url = target.strip() if "://" in target else f"http://{target.strip()}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host")
    _ = parts.port  # raises ValueError for a port that is not a number from 0 to 65535
    path = parts.path.rstrip("/").removesuffix("/metrics").rstrip("/")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


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


def fetch(target: str, timeout: float = 5.0, max_bytes: int = MAX_BODY_BYTES, *,
          deadline: float | None = None) -> str:
    """The Prometheus text of ``target``'s ``/metrics``, read within ``timeout`` seconds in all
    (connect, headers and body: a socket timeout alone restarts at every byte, so a trickling
    endpoint could hold us for ever) and at most ``max_bytes`` long. ``ScrapeError`` otherwise.

    ``deadline`` (a ``time.monotonic()`` time) replaces ``now + timeout`` for a caller that bounds
    several reads by one ``timeout`` in all (``doctor``); the message still names ``timeout``."""
    url = metrics_url(target)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as e:  # a bracketed host that is not an IPv6 address
        raise ScrapeError(f"cannot read {url}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ScrapeError(f"cannot read {url}: not an http(s) URL")
    deadline = time.monotonic() + timeout if deadline is None else deadline
    left = deadline - time.monotonic()
    if left <= 0:
        raise ScrapeError(f"cannot read {url}: no complete answer within {timeout:g} s")
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    expired = threading.Event()
    try:
        conn = conn_cls(_address_within(parts, deadline), parts.port, timeout=left)
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


def samples(text: str, max_samples: int | None = None) -> list[Sample]:
    """Every sample in Prometheus text. ``ValueError`` when the text is not Prometheus text (an
    HTML page, say), or has more than ``max_samples`` lines other than comments: counted before
    parsing, since prometheus_client holds a whole family's samples before it yields any."""
    # Lines that are not comments (blank ones too): a bound on the samples, counted in C.
    if max_samples is not None and text.count("\n") - text.count("\n#") > max_samples:
        raise ValueError(f"more than {max_samples} samples (lines other than comments), more than "
                         "a /metrics page may have: not parsed")
    try:
        return [(s.name, dict(s.labels), float(s.value)) for family in _families(text)
                for s in family.samples]
    except ValueError as e:  # the only error prometheus_client's parser raises on bad text
        raise ValueError(f"not Prometheus text ({str(e)[:200]})") from None


def by_name(found: list[Sample]) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by sample name -> (labels, value) each (any series, SGLang's included, for readers
    such as ``doctor`` that look past our own)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in found:
        out.setdefault(name, []).append((labels, value))
    return out


def series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample in Prometheus text by sample name (``by_name``)."""
    return by_name(samples(text))


def curve_size(label: str) -> float | None:
    """A curve point's ``size`` label as its multiplier, ``None`` for a label no exporter of ours
    writes (the page is whatever the endpoint served: ``size="big"`` once crashed ``stats``)."""
    try:
        return size_multiplier(label)
    except ValueError:
        return None


def snapshot(found: list[Sample], taken_at: float | None = None) -> Snapshot:
    """Our series among ``found``, one sample per (rank, tier); curve samples whose size is not a
    curve size are left out."""
    vals: dict[tuple[str, str], dict[str, float]] = {}
    store: dict[str, dict[str, float]] = {}
    curves: dict[tuple[str, str, str], dict[str, float]] = {}
    for name, labels, value in found:
        if name in _STORE_SAMPLES:
            counters = store.setdefault(rank_name(labels), {})
            counters[_STORE_SAMPLES[name]] = counters.get(_STORE_SAMPLES[name], 0.0) + value
            continue
        if name in _CURVE_SAMPLES and "tier" in labels and "size" in labels:
            if curve_size(labels["size"]) is not None:
                point = curves.setdefault((rank_name(labels), labels["tier"], labels["size"]), {})
                point[_CURVE_SAMPLES[name]] = point.get(_CURVE_SAMPLES[name], 0.0) + value
            continue
        f = _COUNTER_SAMPLES.get(name) or _GAUGE_SAMPLES.get(name)
        if f is None or "tier" not in labels:
            continue
        key = (rank_name(labels), labels["tier"])
        fields = vals.setdefault(key, {})
        fields[f] = fields.get(f, 0.0) + value
    return Snapshot({k: TierSample(**v) for k, v in vals.items()},
                    time.time() if taken_at is None else taken_at, store, curves)


def parse(text: str, taken_at: float | None = None) -> Snapshot:
    """Our per-tier series in Prometheus text, one sample per (rank, tier)."""
    return snapshot(samples(text), taken_at)


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
