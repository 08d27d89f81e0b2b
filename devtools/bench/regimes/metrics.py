"""SGLang's own storage counters, read from each server's ``/metrics`` before and after a phase.

- ``found``   ``sglang:storage_prefetch_hit_tokens_total``: tokens a storage lookup found;
- ``loaded``  ``sglang:prefetched_tokens_total``: tokens copied from storage into host memory;
- ``served``  ``sglang:prefill_effective_tokens_total{mode="storage_hit"}``: prompt tokens prefill
              took from storage, what storage really spared (found and loaded count attempts: a
              refused lookup is retried and counted again).

The counters live in the server process: a restarted server starts from zero, so every phase is
read against a reading of the same process.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mooncake_sgl.metrics.scrape import ScrapeError, fetch

SERIES = {
    "sglang:storage_prefetch_hit_tokens_total": "found",
    "sglang:prefetched_tokens_total": "loaded",
    "sglang:prefill_effective_tokens_total": "served",
}
COUNTERS = ("found", "loaded", "served")


def storage_counters(text: str) -> dict[str, float]:
    """``found``, ``loaded`` and ``served`` (storage hits only) in a ``/metrics`` text, summed over
    ranks; a series SGLang has not created yet (it does at its first non-zero count) reads 0."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = SERIES.get(s.name)
            if key == "served" and s.labels.get("mode") != "storage_hit":
                continue
            if key is not None:
                out[key] += float(s.value)
    return out


def read(urls: Iterable[str], keep: Path | None = None) -> dict[str, float] | None:
    """The counters summed over the servers at ``urls``; ``None`` when one cannot be read.
    ``keep``: a path prefix under which each server's whole text is written (``PREFIX-0.txt``...),
    for what the counters here leave out (each backend's own series)."""
    total = dict.fromkeys(COUNTERS, 0.0)
    for i, url in enumerate(urls):
        try:
            text = fetch(url, timeout=30.0)
        except ScrapeError:
            return None
        if keep is not None:
            keep.with_name(f"{keep.name}-{i}.txt").write_text(text)
        for k, v in storage_counters(text).items():
            total[k] += v
    return total


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: after[k] - before.get(k, 0.0) for k in after}
