"""Both sides of the warm-restart test.

``write`` runs in a child forked from the test process (sglang is already imported there, which
saves a 10-20 s import): it stands in for a server without the real ``mooncake`` package (the
import is blocked), stores pages through the backend, records their bytes, reports READY and waits
to be SIGKILLed.

``python -m tests.hicache.restart_worker read ROOT`` is a fresh interpreter doing what a spawned
SGLang scheduler does: ``load_plugins()``, then ``StorageBackendFactory.create_backend("mooncake",
config, host_pool)``, with nothing of mooncake_sgl imported by hand, so the backend reaching it
proves the entry point works in a spawned process. It reads every page back (MLA as TP rank 1, a
rank that never writes) and compares bytes.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from devtools.testing.backend_record import store_stats

PLAN = [("mha", "page_first"), ("mha", "layer_first"), ("mla", "page_first_direct")]
PAGES = 20


def _backends(role: str, root: Path):
    """Per planned pool: (backend, pool, page hashes, host indices, directory)."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from . import pools

    for seed, (kind, layout) in enumerate(PLAN):
        where = root / f"{kind}-{layout}"
        pool = pools.build_pool(kind, layout, allocator_type="mooncake")
        cfg = pools.storage_config(kind, layout, where, tp_rank=1 if role == "read" and kind == "mla" else 0,
                                   tp_size=2 if kind == "mla" else 1)
        backend = StorageBackendFactory.create_backend("mooncake", cfg, pool)
        backend.register_mem_pool_host(pool)
        assert type(backend).__name__ == "MooncakeSglStorage", type(backend)
        yield backend, pool, pools.page_hashes(PAGES, seed=100 + seed), pool.alloc(PAGES * pools.PAGE), where


def write(root: Path, conn) -> None:
    """Fork child: store pages, send READY on ``conn`` (or the error), then wait to be killed."""
    try:
        sys.modules["mooncake"] = None  # type: ignore[assignment]
        sys.modules["mooncake.store"] = None  # type: ignore[assignment]
        from . import pools

        keep = []
        for seed, (backend, pool, keys, idx, where) in enumerate(_backends("write", root)):
            assert type(pool.allocator).__name__ == "HostTensorAllocator", type(pool.allocator)
            pools.fill_random(pool, idx, seed=200 + seed)
            res = backend.batch_set_v1(keys, idx)
            assert res == [True] * PAGES, (res, store_stats(backend))
            (where / "expected.bin").write_bytes(b"".join(pools.page_bytes(pool, idx)))
            keep.append((backend, pool))
        conn.send("READY")
    except BaseException:
        conn.send(traceback.format_exc())
        raise
    time.sleep(600)  # killed by the test long before


def read(root: Path) -> None:
    from sglang.srt.plugins import load_plugins

    from . import pools

    load_plugins()
    for backend, pool, keys, idx, where in _backends("read", root):
        assert backend.batch_exists(keys) == PAGES, backend.batch_exists(keys)
        assert backend.batch_get_v1(keys, idx) == [True] * PAGES
        assert b"".join(pools.page_bytes(pool, idx)) == (where / "expected.bin").read_bytes()
        print(f"OK {where.name} {type(pool.allocator).__name__}", flush=True)


if __name__ == "__main__":
    assert sys.argv[1] == "read", "only the reader runs as a script; the writer is forked"
    read(Path(sys.argv[2]))
