"""MooncakeSglStorage against real sglang 0.5.23 classes: registration, IO on real host pools in
every layout, prefix semantics, keys, metrics, and failures that must read as misses."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import threading
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from sglang.srt.environ import envs
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
from sglang.srt.mem_cache.pool_host import HostTensorAllocator
from sglang.srt.mem_cache.pool_host.common import get_allocator_from_storage
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.observability.metrics_collector import StorageMetrics

from devtools.testing import hybrid_pools
from mooncake_sgl.hicache import layout, plugin
from mooncake_sgl.hicache.backend import MooncakeSglStorage
from mooncake_sgl.hicache.sglang_config import StorageRank
from mooncake_sgl.hicache.sglang_pool import HostPool

from . import pools
from .pools import KINDS, LAYOUTS, PAGE

ROOT = Path(__file__).resolve().parents[2]
ALL_POOLS = [(k, lay) for k in KINDS for lay in LAYOUTS]


def _flat_bytes(pool, index) -> bytes:
    # What SGLang's own copy path reads out of the pool for one page (bytes: bf16 NaNs compare unequal).
    return pool.get_data_page(int(index), flat=True).contiguous().view(torch.uint8).numpy().tobytes()


# ---------------------------------------------------------------------------------- registration

def test_entry_point_makes_mooncake_our_class(tmp_path) -> None:
    ours = [ep for ep in entry_points(group="sglang.srt.plugins")
            if ep.value == "mooncake_sgl.hicache.plugin:register"]
    assert ours, "mooncake_sgl is not installed with its sglang.srt.plugins entry point (pip install -e .)"
    # The session fixture ran sglang's load_plugins(); the factory now resolves the name to us.
    pool = pools.build_pool("mha", "page_first")
    cfg = pools.storage_config("mha", "page_first", tmp_path)
    backend = StorageBackendFactory.create_backend("mooncake", cfg, pool)
    try:
        assert isinstance(backend, MooncakeSglStorage)
    finally:
        backend.close()


def test_attach_loads_sglangs_page_hash_before_the_first_request(tmp_path) -> None:
    # In a fresh process, as a scheduler is: constructing the backend must leave SGLang's page-hash
    # extension loaded, or the first request's storage lookup pays its build and is abandoned.
    code = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module as load
from tests.hicache import pools
from mooncake_sgl.hicache.backend import MooncakeSglStorage
pool = pools.build_pool("mha", "page_first")
assert load.cache_info().currsize == 0
backend = MooncakeSglStorage(pools.storage_config("mha", "page_first", Path({str(tmp_path)!r})), pool)
print("loaded", load.cache_info().currsize)
backend.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loaded 1" in out.stdout, out.stdout


def test_register_turns_off_the_shared_transfer_engine_unless_asked(monkeypatch) -> None:
    monkeypatch.delenv(plugin.REUSE_TE_ENV, raising=False)
    plugin.register()
    # The exact clause of maybe_init_shared_mooncake_transfer_engine that would import mooncake.
    assert envs.SGLANG_HICACHE_MOONCAKE_REUSE_TE.get() is False
    monkeypatch.setenv(plugin.REUSE_TE_ENV, "1")
    plugin.register()
    assert os.environ[plugin.REUSE_TE_ENV] == "1"


def test_dynamic_backend_with_interface_v1(tmp_path) -> None:
    extra = {**pools.extra_config(tmp_path), "backend_name": "mooncake_sgl", "interface_v1": 1,
             "module_path": "mooncake_sgl.hicache.backend", "class_name": "MooncakeSglStorage"}
    pool = pools.build_pool("mha", "page_first")
    cfg = pools.storage_config("mha", "page_first", tmp_path, extra=extra)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pool)  # constructed as (cfg, {})
    try:
        assert isinstance(backend, MooncakeSglStorage)
        keys, src = pools.page_hashes(2, seed=5), pool.alloc(2 * PAGE)
        # No pool yet: misses, not exceptions.
        assert backend.batch_set_v1(keys, src) == [False, False]
        assert backend.batch_exists(keys) == 0
        backend.register_mem_pool_host(pool)
        assert backend.batch_set_v1(keys, src) == [True, True]
        assert backend.batch_exists(keys) == 2
    finally:
        backend.close()


def test_mooncake_allocator_falls_back_without_mooncake(monkeypatch, make_backend) -> None:
    # As if the real mooncake package were not installed.
    monkeypatch.setitem(sys.modules, "mooncake", None)
    monkeypatch.setitem(sys.modules, "mooncake.store", None)
    assert type(get_allocator_from_storage("mooncake")) is HostTensorAllocator
    pool = pools.build_pool("mha", "page_first", allocator_type="mooncake")
    assert type(pool.allocator) is HostTensorAllocator
    backend, _ = make_backend("mha", "page_first", pool=pool)
    keys, src, dst = pools.page_hashes(3, seed=6), pool.alloc(3 * PAGE), pool.alloc(3 * PAGE)
    pools.fill_random(pool, src, seed=7)
    assert backend.batch_set_v1(keys, src) == [True] * 3
    assert backend.batch_get_v1(keys, dst) == [True] * 3
    assert pools.page_bytes(pool, dst) == pools.page_bytes(pool, src)


def test_real_mooncake_allocator_pool_round_trips(make_backend) -> None:
    pool = pools.build_pool("mla", "page_first", allocator_type="mooncake")
    assert type(pool.allocator).__name__ == "MooncakeHostTensorAllocator"
    backend, _ = make_backend("mla", "page_first", pool=pool)
    keys, src, dst = pools.page_hashes(2, seed=8), pool.alloc(2 * PAGE), pool.alloc(2 * PAGE)
    pools.fill_random(pool, src, seed=9)
    assert backend.batch_set_v1(keys, src) == [True, True]
    assert backend.batch_get_v1(keys, dst) == [True, True]
    assert pools.page_bytes(pool, dst) == pools.page_bytes(pool, src)


# ---------------------------------------------------------------------------------- IO

@pytest.mark.parametrize(("kind", "pool_layout"), ALL_POOLS)
def test_pages_round_trip_byte_exact(make_backend, kind: str, pool_layout: str) -> None:
    backend, pool = make_backend(kind, pool_layout)
    n = 24  # more than the host tier's 16 slots: part of the batch comes back from LMDB
    src, dst = pool.alloc(n * PAGE), pool.alloc(n * PAGE)
    pools.fill_random(pool, src, seed=1)
    pools.zero_pages(pool, dst)
    keys = pools.page_hashes(n, seed=2)
    expected = pools.page_bytes(pool, src)
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, src) == [True] * n
    assert backend.batch_exists(keys) == n
    assert pools.page_bytes(pool, dst) != expected
    assert backend.batch_get_v1(keys, dst) == [True] * n
    assert pools.page_bytes(pool, dst) == expected
    assert all(_flat_bytes(pool, src[i * PAGE]) == _flat_bytes(pool, dst[i * PAGE]) for i in range(n))


def test_batch_exists_stops_at_first_missing_page(make_backend) -> None:
    backend, pool = make_backend("mha", "page_first")
    keys = pools.page_hashes(6, seed=3)
    src = pool.alloc(6 * PAGE)
    pools.fill_random(pool, src, seed=4)
    present = [0, 1, 2, 4]  # page 3 is missing; page 5 too
    assert backend.batch_set_v1([keys[i] for i in present],
                                torch.cat([src[i * PAGE:(i + 1) * PAGE] for i in present])) == [True] * 4
    assert backend.batch_exists(keys) == 3
    assert backend.batch_exists(keys[4:]) == 1
    assert backend.batch_exists(keys[3:]) == 0
    # With SGLang's prefix keys (hicache_storage_pass_prefix_keys) the answer is the same.
    assert backend.batch_exists(keys[1:], HiCacheStorageExtraInfo(prefix_keys=keys[:1])) == 2
    assert [backend.exists(k) for k in keys] == [True, True, True, False, True, False]
    dst = pool.alloc(6 * PAGE)
    assert backend.batch_get_v1(keys, dst, HiCacheStorageExtraInfo(prefix_keys=[])) == \
        [True, True, True, False, True, False]


@pytest.mark.parametrize(("kind", "pool_layout"), ALL_POOLS)
def test_copy_path_shares_keys_and_bytes_with_zero_copy_path(make_backend, kind: str,
                                                             pool_layout: str) -> None:
    backend, pool = make_backend(kind, pool_layout)
    keys = pools.page_hashes(4, seed=10)
    src, dst = pool.alloc(4 * PAGE), pool.alloc(4 * PAGE)
    pools.fill_random(pool, src, seed=11)
    # Legacy set (what SGLang's _generic_page_set sends) -> exists and zero-copy get.
    assert backend.set(keys[0], pool.get_data_page(int(src[0]), flat=True))
    assert backend.exists(keys[0])
    assert backend.batch_get_v1(keys[:1], dst[:PAGE]) == [True]
    assert pools.page_bytes(pool, dst[:PAGE]) == pools.page_bytes(pool, src[:PAGE])
    # Zero-copy set -> legacy get into SGLang's dummy flat page.
    assert backend.batch_set_v1(keys[1:2], src[PAGE:2 * PAGE]) == [True]
    got = backend.get(keys[1], pool.get_dummy_flat_data_page())
    assert got is not None and got.view(torch.uint8).numpy().tobytes() == _flat_bytes(pool, src[PAGE])
    assert backend.batch_get(keys[2:4]) == [None, None]
    assert backend.batch_set(keys[2:4], [pool.get_data_page(int(src[i * PAGE])) for i in (2, 3)])
    assert backend.batch_exists(keys) == 4


# ---------------------------------------------------------------------------------- keys, ranks

def test_key_namespace_covers_model_ranks_and_layout(tmp_path) -> None:
    mha_geo = layout.pool_geometry(HostPool.read(pools.build_pool("mha", "page_first")))
    mla_geo = layout.pool_geometry(HostPool.read(pools.build_pool("mla", "page_first")))

    def ns(kind, geo, **kw):
        cfg = StorageRank.read(pools.storage_config(kind, "page_first", tmp_path, **kw))
        return layout.key_namespace(cfg, geo)

    assert ns("mha", mha_geo, tp_rank=0, tp_size=2) != ns("mha", mha_geo, tp_rank=1, tp_size=2)
    assert ns("mha", mha_geo) != ns("mha", mha_geo, model="other/model")
    assert ns("mha", mha_geo) != ns("mha", mha_geo, pp_rank=1, pp_size=2)
    assert ns("mha", mha_geo).page_size == PAGE and ns("mha", mha_geo).dtype == "bfloat16"
    # MLA pages are identical on every TP rank: one namespace and one local file for all of them.
    assert ns("mla", mla_geo, tp_rank=0, tp_size=2).digest == ns("mla", mla_geo, tp_rank=1, tp_size=2).digest
    def suffix(kind: str, tp_rank: int) -> str:
        return layout.rank_suffix(StorageRank.read(pools.storage_config(kind, "page_first", tmp_path,
                                                                        tp_rank=tp_rank, tp_size=2)))

    assert suffix("mla", 1) == suffix("mla", 0)
    assert suffix("mha", 1) != suffix("mha", 0)


@pytest.mark.parametrize("mla", [False, True])
def test_each_local_directory_has_exactly_one_rank_reporting_its_usage(mla: bool) -> None:
    # Whatever ranks share a directory (``rank_suffix``), one of them reports it: the fact that
    # metrics/attach.py used to restate on its own.
    from collections import Counter

    reporters: Counter[str] = Counter()
    for tp, pp, dp in itertools.product(range(4), range(2), range(2)):
        cfg = StorageRank(tp_rank=tp, tp_size=4, pp_rank=pp, pp_size=2, attn_cp_rank=0, attn_cp_size=1,
                          dcp_rank=0, dcp_size=1, dp_rank=dp, is_mla_model=mla, is_storage_writer=True,
                          tp_lcm_size=0, should_split_heads=False, model_name="m",
                          enable_storage_metrics=False, extra_config=None)
        reporters[layout.rank_suffix(cfg)] += layout.reports_local_usage(cfg)
    assert set(reporters.values()) == {1}
    assert len(reporters) == (4 if mla else 16)


def test_model_name_separates_pages_in_one_store(make_backend, tmp_path) -> None:
    keys = pools.page_hashes(3, seed=12)
    a, pool = make_backend("mha", "page_first")
    src = pool.alloc(3 * PAGE)
    assert a.batch_set_v1(keys, src) == [True] * 3
    a.close()  # same local files next: one LMDB environment per process at a time
    b, _ = make_backend("mha", "page_first", pool=pool, model="someone-else/model")
    assert b.batch_exists(keys) == 0
    b.close()
    again, _ = make_backend("mha", "page_first", pool=pool)
    assert again.batch_exists(keys) == 3


@pytest.mark.parametrize("pool_layout", LAYOUTS)
def test_mla_only_the_writer_writes_and_every_rank_reads(make_backend, pool_layout: str) -> None:
    keys = pools.page_hashes(4, seed=13)
    reader, pool = make_backend("mla", pool_layout, tp_rank=1, tp_size=2)
    src = pool.alloc(4 * PAGE)
    pools.fill_random(pool, src, seed=14)
    assert reader.batch_set_v1(keys, src) == [True] * 4  # nothing to do on a non-writer rank
    assert reader.batch_exists(keys) == 0
    reader.close()
    writer, _ = make_backend("mla", pool_layout, pool=pool, tp_rank=0, tp_size=2)
    assert writer.batch_set_v1(keys, src) == [True] * 4
    writer.close()
    reader, _ = make_backend("mla", pool_layout, pool=pool, tp_rank=1, tp_size=2)
    dst = pool.alloc(4 * PAGE)
    assert reader.batch_get_v1(keys, dst) == [True] * 4
    assert pools.page_bytes(pool, dst) == pools.page_bytes(pool, src)


# ---------------------------------------------------------------------------------- metrics

def test_get_stats_reports_pages_and_bandwidth_then_resets(make_backend) -> None:
    backend, pool = make_backend("mha", "page_first", metrics=True)
    keys, src, dst = pools.page_hashes(5, seed=15), pool.alloc(5 * PAGE), pool.alloc(5 * PAGE)
    assert backend.batch_set_v1(keys, src) == [True] * 5
    assert backend.batch_get_v1(keys[:3], dst[:3 * PAGE]) == [True] * 3
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert (stats.backup_pgs, stats.prefetch_pgs) == ([5], [3])
    assert len(stats.backup_bandwidth) == len(stats.prefetch_bandwidth) == 1
    assert stats.backup_bandwidth[0] > 0 and stats.prefetch_bandwidth[0] > 0
    again = backend.get_stats()
    assert (again.backup_pgs, again.prefetch_pgs, again.backup_bandwidth) == ([], [], [])


# ---------------------------------------------------------------------------------- failure = miss

def _assert_every_call_is_a_miss(backend, pool, keys) -> None:
    idx = pool.alloc(len(keys) * PAGE)
    n = len(keys)
    assert backend.batch_exists(keys) == 0
    assert backend.exists(keys[0]) is False
    assert backend.batch_get_v1(keys, idx) == [False] * n
    assert backend.batch_set_v1(keys, idx) == [False] * n
    assert backend.get(keys[0], pool.get_dummy_flat_data_page()) is None
    assert backend.batch_get(keys) == [None] * n
    assert backend.set(keys[0], pool.get_data_page(int(idx[0]))) is False
    assert backend.batch_set(keys, [pool.get_data_page(int(idx[i * PAGE])) for i in range(n)]) is False
    backend.clear()
    assert isinstance(backend.get_stats(), StorageMetrics)


@pytest.mark.parametrize("tiers", ["lmdb", "host+lmdb"])
def test_closed_tiers_answer_misses(make_backend, tmp_path, tiers: str) -> None:
    extra = pools.extra_config(tmp_path)
    if tiers == "lmdb":
        extra["tiers"] = extra["tiers"][1:]
    backend, pool = make_backend("mha", "page_first", extra=extra)
    keys = pools.page_hashes(3, seed=16)
    assert backend.batch_set_v1(keys, pool.alloc(3 * PAGE)) == [True] * 3
    for tier in backend._store.tiers:  # every tier dies under the adapter
        tier.close()
    _assert_every_call_is_a_miss(backend, pool, keys)


def test_closed_backend_answers_misses(make_backend) -> None:
    backend, pool = make_backend("mla", "page_first")
    keys = pools.page_hashes(2, seed=17)
    assert backend.batch_set_v1(keys, pool.alloc(2 * PAGE)) == [True] * 2
    backend.close()
    backend.close()  # idempotent
    _assert_every_call_is_a_miss(backend, pool, keys)


def test_a_detach_keeps_the_pages_queued_for_demotion_to_disk(make_backend, tmp_path) -> None:
    # Pages reach LMDB only by demotion here (the door to the slow tier is shut), and the store's
    # mover is busy when SGLang detaches the backend: the demotions queued behind it still land.
    extra = {**pools.extra_config(tmp_path),
             "policy": {"name": "heat", "admission_min_hits": 15, "admission_min_reuse": 1.0,
                        "demotion_min_hits": 1}}
    backend, pool = make_backend("mha", "page_first", extra=extra)
    keys = pools.page_hashes(16, seed=18)  # what the host tier holds
    go, running = threading.Event(), threading.Event()

    def park() -> None:
        running.set()
        go.wait(10)

    store = backend._store
    assert store._mover.submit(park) and running.wait(10)
    try:
        for b in range(0, len(keys), 4):  # a full host tier: the mover is to demote the coldest
            backend.batch_exists(keys[b:b + 4])  # a lookup before the write, as SGLang's prefetch
            assert backend.batch_set_v1(keys[b:b + 4], pool.alloc(4 * PAGE)) == [True] * 4
        assert not list(store.tiers[1].scan())  # nothing on disk yet
        threading.Timer(0.3, go.set).start()  # the mover frees up while the detach drains
        backend.close()
    finally:
        go.set()
    again, _ = make_backend("mha", "page_first", pool=pool, extra=extra)
    assert sum(again.exists(k) for k in keys) > 0


def test_wrong_index_count_is_a_miss_logged_once(make_backend, caplog) -> None:
    backend, pool = make_backend("mha", "page_first")
    keys = pools.page_hashes(3, seed=18)
    short = pool.alloc(2 * PAGE)  # SGLang #27033: fewer host pages than keys
    with caplog.at_level(logging.WARNING, logger="mooncake_sgl.hicache.backend"):
        for _ in range(5):
            assert backend.batch_set_v1(keys, short) == [False] * 3
    assert sum("batch_set_v1 failed" in r.getMessage() for r in caplog.records) == 1


# ---------------------------------------------------------------------------------- DCP

def _dcp_pool(rank: int):
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    dim = pools.KV_LORA_RANK + pools.ROPE_DIM
    rows = tuple(torch.zeros(pools.DEVICE_TOKENS, 1, dim, dtype=pools.DTYPE) for _ in range(pools.LAYERS))
    ptrs = torch.tensor([t.data_ptr() for t in rows], dtype=torch.uint64)
    info = MLABufferInfo(buffers=rows, data_ptrs=ptrs,
                         layer_indices=tuple(range(pools.LAYERS)), device_layer_num=pools.LAYERS,
                         page_size=PAGE, kv_lora_rank=pools.KV_LORA_RANK, qk_rope_head_dim=pools.ROPE_DIM,
                         kv_cache_dim=dim, dtype=pools.DTYPE, device=torch.device("cpu"))
    with host_memory_budget_scope(1 << 30):
        return MLATokenToKVPoolHost(info, 2.0, 0, PAGE, "page_first", pin_memory=False, device="cpu",
                                    device_capacity_tokens=pools.DEVICE_TOKENS, start_layer=0,
                                    end_layer=pools.LAYERS, target_layer_num=pools.LAYERS, dcp_size=2,
                                    dcp_rank=rank)


def test_dcp_ranks_each_store_their_shard_of_a_logical_page(tmp_path) -> None:
    # Decode context parallel: each DCP rank holds every other token of a logical page; SGLang
    # counts host indices in logical slots (twice the physical pool) and keys whole logical pages.
    keys = pools.page_hashes(3, seed=19)
    namespaces = set()
    for rank in (0, 1):
        pool = _dcp_pool(rank)
        cfg = pools.storage_config("mla", "page_first", tmp_path / f"dcp{rank}", tp_rank=rank, tp_size=2)
        cfg.dcp_size, cfg.dcp_rank, cfg.logical_page_size = 2, rank, pool.logical_page_size
        backend = MooncakeSglStorage(cfg, pool)
        try:
            src = pool.alloc(3 * pool.logical_page_size)
            assert int(src.max()) < pool.logical_size
            hybrid_pools.fill(pool, src, seed=20 + rank)
            assert backend.batch_set_v1(keys, src) == [True] * 3
            dst = pool.alloc(3 * pool.logical_page_size)
            assert backend.batch_get_v1(keys, dst) == [True] * 3
            assert hybrid_pools.read(pool, dst) == hybrid_pools.read(pool, src)
            beyond = torch.arange(pool.logical_size, pool.logical_size + pool.logical_page_size)
            assert backend.batch_get_v1(keys[:1], beyond) == [False]
            namespaces.add(backend._ns.digest)
        finally:
            backend.close()
    assert len(namespaces) == 2  # one shard per DCP rank, shared by the TP ranks of that shard


def test_a_storage_config_missing_a_field_sglang_declares_fails_the_attach_naming_it(tmp_path) -> None:
    """SGLang's config is read once, field by field: a renamed field is an error at attach, never a
    silent default (a missing should_split_heads would have stored split pages whole)."""
    import dataclasses

    from mooncake_sgl.errors import ConfigError

    cfg = pools.storage_config("mha", "page_first", tmp_path)
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "should_split_heads"}
    renamed = type("OlderStorageConfig", (), {**fields, "is_storage_writer": True})()
    with pytest.raises(ConfigError, match="no field 'should_split_heads'.*at 'should_split_heads'"):
        MooncakeSglStorage(renamed, pools.build_pool("mha", "page_first"))
