"""One TP rank of an MLA server through a weight update without a ``weight_version``:
``python -m tests.hicache.rank_epoch_worker RANK WORLD_PORT POOL_ENDPOINT``.

Both ranks join a real two-rank gloo world through SGLang's own ``init_distributed_environment``
(as a scheduler does), attach a backend on SGLang's real MLA host pool over one shared pool
server, and run SGLang's update through the plug-in's hook. Rank 0 then stores pages; rank 1,
which never writes on MLA, prints how many of them it finds: ``FOUND n``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

PAGES = 8


def main(rank: int, port: int, endpoint: str) -> None:
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import get_parallel

    from mooncake_sgl.hicache import weight_updates
    from mooncake_sgl.hicache.backend import MooncakeSglStorage

    from . import pools

    parallel_state.init_distributed_environment(
        world_size=2, rank=rank, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=rank,
        backend="gloo")
    world = get_parallel().world_group
    pool = pools.build_pool("mla", "page_first")
    extra = {"tiers": [{"kind": "pool", "endpoints": [endpoint], "transport": "tcp"}],
             "policy": {"name": "lru"}}
    backend = MooncakeSglStorage(pools.storage_config("mla", "page_first", Path("."), tp_rank=rank, tp_size=2,
                                                      extra=extra), pool)
    update = weight_updates._around_update("tensor")  # what the plug-in registers with SGLang
    request = SimpleNamespace(weight_version=None, flush_cache=True)
    update(lambda manager, req: SimpleNamespace(success=True), object(), request)

    hashes, idx = pools.page_hashes(PAGES, seed=11), pool.alloc(PAGES * pools.PAGE)
    if rank == 0:
        pools.fill_random(pool, idx, seed=12)
        assert backend.batch_set_v1(hashes, idx) == [True] * PAGES
    world.barrier()
    if rank == 1:
        print(f"FOUND {backend.batch_exists(hashes)}", flush=True)
    world.barrier()
    backend.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
