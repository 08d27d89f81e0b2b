"""Observability: our counters as Prometheus series, on disk, and in ``mooncake-sgl stats``.

- ``model``     series names, ``TierSample`` / ``Snapshot``, ``diff``, hit shares (``rows``).
- ``source``    ``TieredStore.stats()`` -> ``Snapshot`` (the one place knowing the store's names).
- ``exporter``  ``StoreExporter``: the store's counters in SGLang's ``/metrics`` (multiprocess mode).
- ``persist``   the counter file in the LMDB tier's directory, written every few seconds.
- ``attach``    ``observe_store``: what the SGLang backend starts and closes.
- ``scrape``    ``scrape(url) -> Snapshot``: reading our series back (benchmarks, the CLI).
- ``cli``       ``mooncake-sgl stats``.

Benchmarks: ``diff(scrape(url), scrape(url)).by_tier()`` gives per-tier pages and bytes of a round.
"""

from .model import Snapshot, TierSample, diff, rows
from .scrape import scrape

__all__ = ["Snapshot", "TierSample", "diff", "rows", "scrape"]
