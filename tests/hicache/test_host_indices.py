"""Host indices from SGLang are trusted nowhere (issue 10, defect 7): an index outside the host pool
used to reach ``get_page_buffer_meta``'s pointer arithmetic and crash the process in memmove (1e9)
or read and write another object's memory (negative). Every index path must answer a miss and leave
the pool's memory alone: v1, v2 (KV-derived and own-slot sidecars) and the legacy copy path."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

from mooncake_sgl.hicache.backend import MooncakeSglStorage

from . import hybrid, pools
from .pools import PAGE


def _bad_indices(pool, page: int) -> dict[str, torch.Tensor]:
    limit = pool.size
    return {
        "huge": torch.full((page,), 10**9, dtype=torch.int64),
        "negative": torch.arange(-page, 0, dtype=torch.int64),
        "one_negative": torch.cat([torch.tensor([-1]), torch.arange(1, page)]).to(torch.int64),
        "straddles_the_end": torch.arange(limit - page + 1, limit + 1, dtype=torch.int64),
        "float": torch.arange(page, dtype=torch.float32),
    }


@pytest.mark.parametrize("bad", ["huge", "negative", "one_negative", "straddles_the_end", "float"])
def test_out_of_range_v1_indices_are_misses_and_touch_nothing(make_backend, bad: str) -> None:
    backend, pool = make_backend("mha", "page_first")
    keys = pools.page_hashes(1, seed=30)
    good = pool.alloc(PAGE)
    pools.fill_random(pool, good, seed=31)
    before = pools.page_bytes(pool, good)
    idx = _bad_indices(pool, PAGE)[bad]
    assert backend.batch_set_v1(keys, idx) == [False]
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, good) == [True]
    assert backend.batch_get_v1(keys, idx) == [False]
    assert pools.page_bytes(pool, good) == before
    assert backend.batch_get_v1(keys, good) == [True]  # the backend is still healthy


@pytest.fixture
def mamba_backend(tmp_path):
    setup = hybrid.build("mha+mamba")
    cfg = hybrid.storage_config(setup, pools.extra_config(tmp_path))
    backend = hybrid.attach(MooncakeSglStorage(cfg, setup.kv), setup)
    yield backend, setup
    backend.close()


@pytest.mark.parametrize("bad", ["huge", "negative", "float"])
def test_out_of_range_v2_indices_fail_only_their_pool(mamba_backend, bad: str) -> None:
    backend, setup = mamba_backend
    keys = pools.page_hashes(2, seed=32)
    state = setup.side.alloc(1)
    hybrid.fill(setup.side, state, seed=33)
    mamba_bad = _bad_indices(setup.side, 1)[bad]
    kv_idx = setup.kv.alloc(2 * PAGE)
    # The KV pool through v2 with good indices, the Mamba state with bad ones: only Mamba fails.
    set_result = backend.batch_set_v2([
        PoolTransfer(name=PoolName.KV, host_indices=kv_idx, keys=keys),
        PoolTransfer(name=PoolName.MAMBA, host_indices=mamba_bad, keys=keys[-1:],
                     hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert set_result == {PoolName.KV: [True, True], PoolName.MAMBA: [False]}
    assert backend.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=mamba_bad,
                                              keys=keys[-1:])]) == {PoolName.MAMBA: [False]}


def test_kv_derived_sidecar_with_out_of_range_kv_indices_is_a_miss(tmp_path) -> None:
    setup = hybrid.build("mla+dsa")
    cfg = hybrid.storage_config(setup, pools.extra_config(tmp_path))
    backend = hybrid.attach(MooncakeSglStorage(cfg, setup.kv), setup)
    try:
        keys = pools.page_hashes(1, seed=34)
        for idx in _bad_indices(setup.kv, setup.page).values():
            transfer = PoolTransfer(name=PoolName.INDEXER, host_indices=idx, keys=keys)
            assert backend.batch_set_v2([transfer]) == {PoolName.INDEXER: [False]}
            assert backend.batch_get_v2([transfer]) == {PoolName.INDEXER: [False]}
            assert backend.batch_get_v1(keys, idx) == [False]
    finally:
        backend.close()


def test_legacy_copy_path_refuses_pages_of_the_wrong_size(make_backend) -> None:
    backend, pool = make_backend("mha", "page_first")
    keys = pools.page_hashes(2, seed=35)
    small = torch.zeros(8, dtype=pools.DTYPE)
    assert backend.batch_set(keys[:1], [small]) is False
    assert backend.set(keys[0], small) is False
    assert backend.batch_get(keys[:1], [small]) == [None]
    assert backend.get(keys[0], small) is None
