"""SGLang's own controller code driving the backend: ``HiCacheController``'s backup, hit-query and
zero-copy prefetch functions (sglang 0.5.23), bound to a minimal controller state, so the page
hashes, batching and result handling are exactly what a server's storage threads do."""

from __future__ import annotations

import functools
import random
from types import SimpleNamespace

from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation, StorageOperation
from sglang.srt.mem_cache.utils import get_hash_str

from . import pools
from .pools import PAGE


def test_backup_then_hit_query_then_prefetch(make_backend) -> None:
    backend, pool = make_backend("mha", "page_first")
    ctl = SimpleNamespace(storage_backend=backend, page_size=PAGE, mem_pool_host=pool)
    ctl.page_set_func = functools.partial(HiCacheController._page_set_zero_copy, ctl)
    rnd = random.Random(21)
    tokens = [rnd.randrange(150_000) for _ in range(6 * PAGE)]
    stored = get_hash_str(tokens[:5 * PAGE], None, PAGE)  # what the radix tree hands write_storage
    src = pool.alloc(5 * PAGE)
    pools.fill_random(pool, src, seed=22)

    backup = StorageOperation(src, tokens[:5 * PAGE], hash_value=stored)
    HiCacheController._page_backup(ctl, backup)  # backup thread
    assert backup.completed_tokens == 5 * PAGE

    prefetch = PrefetchOperation("req-1", tokens)  # six pages asked, five stored
    hashes, hit_tokens = HiCacheController._storage_hit_query(ctl, prefetch)  # prefetch thread
    assert (hashes, hit_tokens) == (stored, 5 * PAGE)

    dst = pool.alloc(5 * PAGE)
    pages = HiCacheController._page_get_zero_copy(ctl, prefetch, hashes, dst)  # prefetch IO thread
    assert pages == 5
    assert pools.page_bytes(pool, dst) == pools.page_bytes(pool, src)
