"""One "scheduler rank" for the multiprocess test: a real store (host DRAM over a shared pool)
exporting into ``$PROMETHEUS_MULTIPROC_DIR`` as SGLang's scheduler processes do.

    python -m tests.metrics.rank_worker TP_RANK POOL_ENDPOINT PAGES

Prints its store's own counters (JSON: tier -> {hits, misses, written_bytes}) after a final sync.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from mooncake_sgl.config import HostTierConfig, PoolTierConfig
from mooncake_sgl.metrics.attach import usage_reported_elsewhere
from mooncake_sgl.metrics.exporter import StoreExporter
from mooncake_sgl.metrics.source import snapshot_of
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.pool import PoolTier

from .stores import PAGE, read, write


def main() -> None:
    tp_rank, endpoint, pages = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    tiers = [HostTier(HostTierConfig(capacity=4 * PAGE, slot_size=PAGE, pin_memory=False)),
             PoolTier(PoolTierConfig(endpoints=[endpoint], transport="tcp"))]
    store = TieredStore(tiers, LruPolicy(2), mover="inline")
    ranks = {"tp_rank": tp_rank, "pp_rank": 0, "dp_rank": 0, "attn_cp_rank": 0}
    elsewhere = usage_reported_elsewhere(store, SimpleNamespace(**ranks), reports_local_usage=True)
    exporter = StoreExporter(store.stats, ranks, skip_gauges=elsewhere)
    store.time_tier_calls(exporter.observe_tier(store))
    # Each rank writes its own pages (TP ranks hold different heads of the same tokens).
    ids = range(tp_rank * 1000, tp_rank * 1000 + pages)
    write(store, ids)
    read(store, ids)
    exporter.close()
    mine = snapshot_of(store.stats()).by_tier()
    print(json.dumps({t: {"hits": s.hits, "misses": s.misses, "written_bytes": s.written_bytes}
                      for t, s in mine.items()}))
    store.close()


if __name__ == "__main__":
    main()
