"""One SGLang rank configured only the way SGLang's built-in Mooncake backend is: a fresh interpreter
whose environment and extra-config are all the test gives it.

    python -m tests.hicache.builtin_worker write N SEED EXTRA_JSON   # prints READY {...}, serves
                                                                     # until stdin closes
    python -m tests.hicache.builtin_worker read N SEED EXTRA_JSON    # prints IMPORTED, waits for a
                                                                     # line, prints RESULT {...}

It does what a spawned SGLang scheduler does: ``load_plugins()``, then
``StorageBackendFactory.create_backend("mooncake", config, host_pool)`` on a real sglang host pool,
so nothing of our config is set up by hand. The writer stores N pages of seeded random bytes; the
reader looks them up and reads them into zeroed host slots. Both report SHA-256 digests of every
page's bytes, the tiers their config became, and per tier how many pages it served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys


def main(role: str, n: int, seed: int, extra: dict) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.plugins import load_plugins

    from mooncake_sgl.config import tier_kind

    from . import pools

    load_plugins()
    pool = pools.build_pool("mha", "page_first")
    if role == "read":  # started early to import in parallel with the writer; go once it wrote
        print("IMPORTED", flush=True)
        sys.stdin.readline()
    cfg = pools.storage_config("mha", "page_first", root=None, extra=extra)
    backend = StorageBackendFactory.create_backend("mooncake", cfg, pool)
    backend.register_mem_pool_host(pool)
    assert type(backend).__name__ == "MooncakeSglStorage", type(backend)
    store = backend._store
    hashes, idx = pools.page_hashes(n, seed=seed), pool.alloc(n * pools.PAGE)
    report: dict = {"tiers": [tier_kind(t) for t in backend._store_config.tiers],
                    "lmdb_paths": [getattr(t, "path", "") for t in backend._store_config.tiers
                                   if tier_kind(t) == "lmdb"]}
    if role == "write":
        pools.fill_random(pool, idx, seed=seed)
        report["stored"] = sum(backend.batch_set_v1(hashes, idx))
    else:
        pools.zero_pages(pool, idx)
        report["exists"] = backend.batch_exists(hashes)
        report["read"] = sum(backend.batch_get_v1(hashes, idx))
    report["digests"] = [hashlib.sha256(p).hexdigest() for p in pools.page_bytes(pool, idx)]
    stats = store.stats().tiers
    report["hits"] = {tier_kind(t): stats[name].reads.hits
                      for name, t in zip(store.names, backend._store_config.tiers)}
    print(("READY " if role == "write" else "RESULT ") + json.dumps(report), flush=True)
    if role == "write":
        sys.stdin.read()  # the pages live in this process's Mooncake segment until the test is done
    backend.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
