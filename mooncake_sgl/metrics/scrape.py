"""Reading our series back from a ``/metrics`` endpoint (SGLang's or the pool's).

For benchmarks and ``mooncake-sgl stats``::

    before = scrape("127.0.0.1:30000")
    ...                                   # a round of requests
    per_tier = diff(before, scrape("127.0.0.1:30000")).by_tier()   # {"host": TierSample, ...}
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request

from .model import COUNTERS, GAUGES, POOL_PREFIX, STORE_COUNTERS, Snapshot, TierSample, rank_name

_COUNTER_SAMPLES = {name + "_total": f for f, name in COUNTERS.items()}
_STORE_SAMPLES = {name + "_total": f for f, name in STORE_COUNTERS.items()}
_GAUGE_SAMPLES = {name: f for f, name in GAUGES.items()}


class ScrapeError(OSError):
    """The endpoint could not be read; the message names the URL."""


def metrics_url(target: str) -> str:
    """``host:port``, ``http://host:port`` or a full URL -> the URL of its ``/metrics``."""
    url = target if "://" in target else f"http://{target}"
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url = f"{scheme}://{rest}/metrics"
    return url


def fetch(target: str, timeout: float = 5.0) -> str:
    """The Prometheus text of ``target``'s ``/metrics``."""
    url = metrics_url(target)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        raise ScrapeError(f"cannot read {url}: {e}") from e


def _families(text: str):  # noqa: ANN202 (prometheus_client's own iterator type)
    from prometheus_client.parser import text_string_to_metric_families

    return text_string_to_metric_families(text)


def parse(text: str, taken_at: float | None = None) -> Snapshot:
    """Our per-tier series in Prometheus text, one sample per (rank, tier)."""
    vals: dict[tuple[str, str], dict[str, float]] = {}
    store: dict[str, dict[str, float]] = {}
    for family in _families(text):
        for s in family.samples:
            if s.name in _STORE_SAMPLES:
                counters = store.setdefault(rank_name(s.labels), {})
                counters[_STORE_SAMPLES[s.name]] = counters.get(_STORE_SAMPLES[s.name], 0.0) + s.value
                continue
            f = _COUNTER_SAMPLES.get(s.name) or _GAUGE_SAMPLES.get(s.name)
            if f is None or "tier" not in s.labels:
                continue
            key = (rank_name(s.labels), s.labels["tier"])
            fields = vals.setdefault(key, {})
            fields[f] = fields.get(f, 0.0) + float(s.value)
    return Snapshot({k: TierSample(**v) for k, v in vals.items()},
                    time.time() if taken_at is None else taken_at, store)


def scrape(target: str, timeout: float = 5.0) -> Snapshot:
    """Our per-tier counters as a SGLang server's ``/metrics`` shows them now."""
    return parse(fetch(target, timeout))


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
