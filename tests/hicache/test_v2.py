"""The v2 contract on our backend alone: restorable-prefix rules for every ``PoolHitPolicy``, sidecar
parts, keys shared across TP ranks where SGLang replicates a pool, a failing pool failing alone,
DeepSeek V4's logical KV anchor, host slots sized to the KV page, and the refusals we log."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.memory_pool_host import LogicalHostPool
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

from devtools.testing.backend_record import store_stats
from mooncake_sgl.hicache import page_objects, sidecars
from mooncake_sgl.hicache.backend import MooncakeSglStorage
from mooncake_sgl.hicache.sglang_config import StorageRank
from mooncake_sgl.hicache.sglang_pool import HostPool

from . import hybrid, pools
from .pools import PAGE

TRAILING, ALL, BLOCKS = (PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.ALL_PAGES,
                         PoolHitPolicy.BLOCK_GROUPS)


# ---------------------------------------------------------------------------------- rules

def test_trailing_pool_keeps_every_stop_point_its_window_covers() -> None:
    # States at the ends of pages 3, 4 and 8 (1-based) with a 2-page window: 4 (pages 3-4) only.
    present = [False, False, True, True, False, False, False, True]
    one = sidecars.resolve(8, [sidecars.PoolEvidence("swa", TRAILING, present, window=2)])
    assert (one.kv_hit_pages, one.restorable_prefix_pages) == (4, [4])
    mamba = sidecars.resolve(8, [sidecars.PoolEvidence("mamba", TRAILING, present, window=1)])
    assert (mamba.kv_hit_pages, mamba.restorable_prefix_pages) == (8, [3, 4, 8])
    assert mamba.extra_pool_hit_pages == {PoolName.KV: 8, "mamba": 8}


def test_all_pages_pool_cuts_at_its_first_hole_and_pools_intersect() -> None:
    r = sidecars.resolve(6, [sidecars.PoolEvidence("indexer", ALL, [True] * 4 + [False, True]),
                             sidecars.PoolEvidence("mamba", TRAILING, [False, True] * 2 + [True] * 2)])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (4, [2, 4])
    assert r.extra_pool_hit_pages == {PoolName.KV: 6, "indexer": 4, "mamba": 6}


def test_block_groups_report_whole_leading_groups_and_never_gate() -> None:
    # Groups of 2 keys, each standing for a block of 4 FULL pages; the third group is incomplete.
    ev = sidecars.PoolEvidence("deepseek_v4_c4", BLOCKS, [True] * 4 + [True, False],
                               block_pages=4, group_pages=2)
    r = sidecars.resolve(10, [ev])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages["deepseek_v4_c4"]) == (10, 8)
    assert r.restorable_prefix_pages == list(range(1, 11))
    capped = sidecars.resolve(6, [ev])
    assert capped.extra_pool_hit_pages["deepseek_v4_c4"] == 6
    with pytest.raises(ValueError, match="block_pages"):
        sidecars.resolve(4, [sidecars.PoolEvidence("c4", BLOCKS, [True], block_pages=0, group_pages=1)])


def test_no_kv_hit_means_nothing_restorable_and_no_pool_consulted() -> None:
    r = sidecars.resolve(0, [sidecars.PoolEvidence("mamba", TRAILING, [])])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages, r.restorable_prefix_pages) == (0, {}, [])


def test_parts_cover_a_page_exactly_in_order() -> None:
    data = bytearray(range(256)) * 40  # 10240 bytes in three segments
    base = memoryview(data)
    page = [base[:3000], base[3000:3001], base[3001:]]
    parts = page_objects.chunk_page(page, 4096)
    assert [sum(s.nbytes for s in p) for p in parts] == [4096, 4096, 2048]
    assert b"".join(bytes(s) for p in parts for s in p) == bytes(data)


def test_which_sidecars_tp_ranks_share(tmp_path) -> None:
    mla = StorageRank.read(pools.storage_config("mla", "page_first", tmp_path, tp_rank=1, tp_size=2))
    mha = StorageRank.read(pools.storage_config("mha", "page_first", tmp_path, tp_rank=1, tp_size=2))
    mha_pool = HostPool.read(pools.build_pool("mha", "page_first"))
    mla_pool = HostPool.read(pools.build_pool("mla", "page_first"))
    assert sidecars.is_rank_replicated(mla, "indexer", mla_pool)
    assert sidecars.is_rank_replicated(mla, "draft", mla_pool)
    assert not sidecars.is_rank_replicated(mla, "mamba", mla_pool)  # TP-sharded (Kimi-K3)
    assert not sidecars.is_rank_replicated(mla, "draft", mha_pool)  # an MHA draft splits heads
    assert not sidecars.is_rank_replicated(mha, "swa", mha_pool)


# ---------------------------------------------------------------------------------- backend

@pytest.fixture
def attached(tmp_path) -> Any:
    """``attached(setup_name, **config) -> (backend, setup)``; closed at teardown."""
    made: list[Any] = []

    def make(name: str, setup: hybrid.Hybrid | None = None, **cfg: Any) -> tuple[Any, hybrid.Hybrid]:
        setup = setup or hybrid.build(name)
        config = hybrid.storage_config(setup, pools.extra_config(tmp_path))
        for k, v in cfg.items():
            setattr(config, k, v)
        made.append(hybrid.attach(MooncakeSglStorage(config, setup.kv), setup))
        return made[-1], setup

    yield make
    for backend in made:
        backend.close()


def test_mla_sidecars_are_written_once_and_read_by_every_tp_rank(attached) -> None:
    writer, setup = attached("mla+dsa", tp_rank=0, tp_size=2)
    keys = setup.hashes(setup.tokens(3, seed=40))
    kv_idx = setup.kv.alloc(3 * setup.page)
    hybrid.fill(setup.kv, kv_idx, seed=41)
    hybrid.fill(setup.side, kv_idx, seed=42)
    indexer = PoolTransfer(name=PoolName.INDEXER, host_indices=kv_idx, keys=keys)
    assert writer.batch_set_v2([indexer]) == {PoolName.INDEXER: [True] * 3}
    assert writer.batch_set_v1(keys, kv_idx) == [True] * 3
    writer.close()  # the ranks of one MLA group share one local LMDB; one process at a time here
    reader, _ = attached("mla+dsa", setup, tp_rank=1, tp_size=2)
    r = reader.batch_exists_v2(keys, [PoolTransfer(name=PoolName.INDEXER, indices_from_pool=PoolName.KV)])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (3, [1, 2, 3])
    dst = setup.kv.alloc(3 * setup.page)
    got = reader.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=dst, keys=keys)])
    assert got == {PoolName.INDEXER: [True] * 3}
    assert hybrid.read(setup.side, dst) == hybrid.read(setup.side, kv_idx)


def test_mamba_state_is_per_tp_rank(attached) -> None:
    rank0, setup = attached("mha+mamba", tp_rank=0, tp_size=2)
    keys = setup.hashes(setup.tokens(1, seed=43))
    state = setup.side.alloc(1)
    mamba = PoolTransfer(name=PoolName.MAMBA, host_indices=state, keys=keys, hit_policy=TRAILING)
    assert rank0.batch_set_v2([mamba]) == {PoolName.MAMBA: [True]}
    ns0 = rank0._objects(PoolName.MAMBA).namespace
    rank1, _ = attached("mha+mamba", tp_rank=1, tp_size=2)
    assert rank1._objects(PoolName.MAMBA).namespace.digest != ns0.digest


def test_a_failing_pool_fails_alone_and_bad_calls_are_misses(attached, caplog) -> None:
    backend, setup = attached("mha+mamba")
    keys = setup.hashes(setup.tokens(2, seed=44))
    kv_idx = setup.kv.alloc(2 * PAGE)
    unknown = PoolTransfer(name=PoolName.SWA, host_indices=kv_idx, keys=keys)
    kv = PoolTransfer(name=PoolName.KV, host_indices=kv_idx, keys=keys)
    with caplog.at_level(logging.WARNING, logger="mooncake_sgl.hicache.backend"):
        got = backend.batch_set_v2([unknown, kv])
    assert got == {PoolName.SWA: [False, False], PoolName.KV: [True, True]}
    assert any("'swa' was never registered" in r.getMessage() for r in caplog.records)
    assert backend.batch_exists_v2(keys, [unknown]).kv_hit_pages == 0
    mismatched = PoolTransfer(name=PoolName.KV, host_indices=kv_idx[:PAGE], keys=keys)
    assert backend.batch_get_v2([mismatched]) == {PoolName.KV: [False, False]}
    assert backend.batch_get_v2([PoolTransfer(name=PoolName.KV, keys=[])]) == {PoolName.KV: []}
    assert backend.batch_get_v2("not a list") == {}
    broken = backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.KV, hit_policy=BLOCKS)])
    assert (broken.kv_hit_pages, broken.restorable_prefix_pages) == (0, [])


def test_block_groups_through_the_backend(attached) -> None:
    backend, setup = attached("mha+swa")
    keys = setup.hashes(setup.tokens(6, seed=45))
    kv_idx, side_idx = setup.kv.alloc(6 * PAGE), setup.side.alloc(6 * PAGE)
    assert backend.batch_set_v1(keys, kv_idx) == [True] * 6
    stored = PoolTransfer(name=PoolName.SWA, host_indices=side_idx[:3 * PAGE], keys=keys[:3])
    assert backend.batch_set_v2([stored]) == {PoolName.SWA: [True] * 3}
    groups = PoolTransfer(name=PoolName.SWA, keys=keys[:4], hit_policy=BLOCKS, block_pages=2,
                          group_pages=2)
    r = backend.batch_exists_v2(keys, [groups])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages[PoolName.SWA]) == (6, 2)


def test_session_id_is_refused_with_a_log_line(attached, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="mooncake_sgl.hicache.backend"):
        backend, setup = attached("mha+mamba")
        keys = setup.hashes(setup.tokens(1, seed=46))
        mamba = PoolTransfer(name=PoolName.MAMBA, host_indices=setup.side.alloc(1), keys=keys,
                             hit_policy=TRAILING)
        for _ in range(3):
            assert backend.batch_set_v2([mamba], HiCacheStorageExtraInfo(
                extra_info={"session_id": "s-1"})) == {PoolName.MAMBA: [True]}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("refused: the session id" in m for m in messages) == 1


def test_logical_kv_anchor_lets_the_sidecars_decide(tmp_path) -> None:
    # DeepSeek V4: the KV anchor only hands out indices; the compressed pools carry the bytes.
    anchor = LogicalHostPool(size=16 * PAGE, page_size=PAGE)
    side = pools.build_pool("mla", "page_first")
    cfg = pools.storage_config("mla", "page_first", tmp_path)
    backend = MooncakeSglStorage(cfg, anchor)
    try:
        backend.register_mem_host_pool_v2(side, PoolName.DEEPSEEK_V4_C4)
        backend.on_host_pools_registered()
        keys = pools.page_hashes(3, seed=47)
        idx = side.alloc(3 * PAGE)
        assert backend.batch_set_v1(keys, idx) == [True] * 3
        assert backend.batch_get_v1(keys, idx) == [True] * 3
        c4 = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=idx[:2 * PAGE], keys=keys[:2],
                          indices_from_pool=PoolName.KV)
        assert backend.batch_set_v2([c4]) == {PoolName.DEEPSEEK_V4_C4: [True, True]}
        r = backend.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DEEPSEEK_V4_C4)])
        assert (r.kv_hit_pages, r.restorable_prefix_pages) == (2, [1, 2])
    finally:
        backend.close()


def test_kv_pages_keep_host_slots_when_a_smaller_sidecar_is_written_first(tmp_path) -> None:
    # SGLang backs sidecars up before KV; a 2 KiB state must not shrink the host tier's slots
    # below the 4 KiB KV page, or no KV page would ever fit in host memory.
    with host_memory_budget_scope(1 << 30):
        small = MambaPoolHost(MambaStateBufferInfo(temporal=torch.zeros(2, 8, 1, 16, 16),
                                                   conv=(torch.zeros(2, 8, 2, 8),)),
                              2.0, 0, device_capacity=8, pin_memory=False, layout="page_first")
    kv = pools.build_pool("mha", "page_first")
    backend = MooncakeSglStorage(pools.storage_config("mha", "page_first", tmp_path), kv)
    try:
        backend.register_mem_host_pool_v2(small, PoolName.MAMBA)
        keys = pools.page_hashes(2, seed=48)
        state, kv_idx = small.alloc(1), kv.alloc(2 * PAGE)
        assert backend.batch_set_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=state,
                                                  keys=keys[-1:], hit_policy=TRAILING)]) \
            == {PoolName.MAMBA: [True]}
        assert backend.batch_set_v1(keys, kv_idx) == [True, True]
        host = store_stats(backend)["tiers"]["host"]
        assert host["usage"]["pages"] == 3
        assert host["tier"]["put_too_large"] == 0
    finally:
        backend.close()
