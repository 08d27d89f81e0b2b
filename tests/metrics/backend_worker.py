"""A scheduler process in miniature: our backend built by SGLang's own factory, as SGLang builds it
under ``--enable-metrics``, in prometheus_client's multiprocess mode.

    PROMETHEUS_MULTIPROC_DIR=DIR python -m tests.metrics.backend_worker ROOT TP_RANK METRICS(0|1)

Backs up 4 pages and reads them back, then 2 unknown ones; closes the backend (final sync and
counter file) and prints the backend's store counters as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.plugins import load_plugins

from devtools.testing.backend_record import store_stats
from mooncake_sgl.metrics.source import snapshot_of
from mooncake_sgl.store.stats import StoreReport
from tests.hicache import pools


def main() -> None:
    root, tp_rank, metrics = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    load_plugins()  # what every SGLang process does first: `mooncake` becomes our backend
    pool = pools.build_pool("mha", "page_first")
    cfg = pools.storage_config("mha", "page_first", root, tp_rank=tp_rank, tp_size=2, metrics=metrics)
    backend = StorageBackendFactory.create_backend("mooncake", cfg, pool)
    backend.register_mem_pool_host(pool)
    keys = pools.page_hashes(4, seed=tp_rank)
    src, dst = pool.alloc(4 * pools.PAGE), pool.alloc(4 * pools.PAGE)
    pools.fill_random(pool, src, seed=1)
    assert backend.batch_set_v1(keys, src) == [True] * 4
    assert backend.batch_exists(keys) == 4
    assert backend.batch_get_v1(keys, dst) == [True] * 4
    assert backend.batch_get_v1(pools.page_hashes(2, seed=99), dst[:2 * pools.PAGE]) == [False] * 2
    stats = store_stats(backend)
    backend.close()
    print(json.dumps({t: {"hits": s.hits, "misses": s.misses, "written_bytes": s.written_bytes}
                      for t, s in snapshot_of(StoreReport.from_plain(stats)).by_tier().items()}))


if __name__ == "__main__":
    main()
