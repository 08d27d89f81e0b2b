"""The one call the SGLang backend makes: observe a store for as long as the backend lives.

    watch = observe_store(store, storage_config, enabled=storage_config.enable_storage_metrics,
                          reports_local_usage=layout.reports_local_usage(storage_config))
    ...
    watch.close()   # before the store closes: final counter file, final metrics sync
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..store import TieredStore
from ..store.stats import StoreReport
from .exporter import StoreExporter
from .model import RANK_LABELS, rank_name
from .persist import CounterPersister

logger = logging.getLogger(__name__)


def rank_labels(storage_config: Any) -> dict[str, int]:
    """SGLang's rank labels of this process, from its ``HiCacheStorageConfig``."""
    return {k: int(getattr(storage_config, k, 0) or 0) for k in RANK_LABELS}


class StoreWatch:
    """The exporter (``--enable-metrics`` only) and counter file (with an LMDB tier) of one store."""

    def __init__(self, exporter: StoreExporter | None, persisters: list[CounterPersister]) -> None:
        self.exporter = exporter
        self.persisters = persisters

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()
        for p in self.persisters:
            p.close()


def usage_reported_elsewhere(store: TieredStore, storage_config: Any,
                             reports_local_usage: bool) -> frozenset[str]:
    """Tiers whose usage another rank of the deployment reports, so that sums over ranks count each
    byte once: a shared tier (pool, Mooncake Store) is reported by the all-zero rank; a tier's
    local files (LMDB) by the rank ``reports_local_usage`` says (``hicache.layout`` decides which
    ranks share a directory)."""
    first = all(v == 0 for v in rank_labels(storage_config).values())
    return frozenset(n for t, n in zip(store.tiers, store.names)
                     if (t.capabilities.shared and not first)
                     or (t.capabilities.local_files and not reports_local_usage))


def _without_usage(stats: StoreReport, tiers: frozenset[str]) -> StoreReport:
    if not tiers:
        return stats
    return dataclasses.replace(stats, tiers={n: dataclasses.replace(e, usage=None) if n in tiers else e
                                             for n, e in stats.tiers.items()})


def observe_store(store: TieredStore, storage_config: Any, enabled: bool,
                  reports_local_usage: bool) -> StoreWatch:
    """Start exporting ``store``'s counters (when ``enabled``) and persisting them (always, when the
    store has an LMDB tier); ``reports_local_usage`` as ``hicache.layout.reports_local_usage``.
    Never raises: observability must not stop a backend from attaching."""
    labels = rank_labels(storage_config)
    elsewhere = usage_reported_elsewhere(store, storage_config, reports_local_usage)
    exporter = None
    if enabled:
        try:
            exporter = StoreExporter(store.stats, labels, elsewhere,
                                     policy=store.policy.name).start()
            store.time_tier_calls(exporter.observe_tier(store))
        except Exception:
            logger.exception("mooncake_sgl: metrics export is off")
            exporter = None
    persisters = [CounterPersister(lambda: _without_usage(store.stats(), elsewhere), t.path,
                                   rank_name(labels)).start()
                  for t in store.tiers if t.capabilities.local_files]
    return StoreWatch(exporter, persisters)
