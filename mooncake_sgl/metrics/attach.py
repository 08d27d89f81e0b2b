"""The one call the SGLang backend makes: observe a store for as long as the backend lives.

    watch = observe_store(store, storage_config, enabled=storage_config.enable_storage_metrics)
    ...
    watch.close()   # before the store closes: final counter file, final metrics sync
"""

from __future__ import annotations

import logging
from typing import Any

from ..store import TieredStore
from ..tiers.lmdb import LmdbTier
from .exporter import StoreExporter
from .model import RANK_LABELS, rank_name
from .persist import CounterPersister

logger = logging.getLogger(__name__)


def rank_labels(storage_config: Any) -> dict[str, int]:
    """SGLang's rank labels of this process, from its ``HiCacheStorageConfig``."""
    return {k: int(getattr(storage_config, k, 0) or 0) for k in RANK_LABELS}


def policy_name(policy: object) -> str:
    """``HeatPolicy`` -> ``heat``: the name the config's ``policy.name`` uses."""
    return type(policy).__name__.removesuffix("Policy").lower()


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


def observe_store(store: TieredStore, storage_config: Any, enabled: bool) -> StoreWatch:
    """Start exporting ``store``'s counters (when ``enabled``) and persisting them (always, when the
    store has an LMDB tier). Never raises: observability must not stop a backend from attaching."""
    labels = rank_labels(storage_config)
    exporter = None
    if enabled:
        try:
            shared = frozenset(n for t, n in zip(store.tiers, store.names) if t.capabilities.shared)
            exporter = StoreExporter(store.stats, labels, shared, policy=policy_name(store.policy)).start()
            store.observe_latency = exporter.observe_tier(store)
        except Exception:
            logger.exception("mooncake_sgl: metrics export is off")
            exporter = None
    persisters = [CounterPersister(store.stats, t.path, rank_name(labels)).start()
                  for t in store.tiers if isinstance(t, LmdbTier)]
    return StoreWatch(exporter, persisters)
