"""SGLang's host pool read once at attach (``hicache/sglang_pool.py``): real sglang 0.5.23 pools on
CPU give the right records, and a pool lacking a field its class declares fails the attach with a
``ConfigError`` naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.memory_pool_host import LogicalHostPool

from mooncake_sgl.errors import ConfigError
from mooncake_sgl.hicache import layout
from mooncake_sgl.hicache.backend import MooncakeSglStorage
from mooncake_sgl.hicache.sglang_pool import HostPool

from . import pools
from .pools import DEVICE_TOKENS, HEADS, LAYERS, PAGE


@pytest.mark.parametrize("layout_name", pools.LAYOUTS)
def test_an_mha_pool_reads_as_its_heads_layers_and_one_buffer(layout_name: str) -> None:
    pool = pools.build_pool("mha", layout_name)
    record = HostPool.read(pool)
    assert (record.kind, record.class_name, record.layout, record.dtype) == (
        "mha", "MHATokenToKVPoolHost", layout_name, "bfloat16")
    assert (record.page_size, record.layer_num, record.head_num) == (PAGE, LAYERS, HEADS)
    assert record.slots == record.host_tokens == pool.size and record.device_tokens == DEVICE_TOKENS
    assert len(record.buffers) == 1 and record.buffers[0] is pool.kv_buffer
    assert not record.logical
    assert record.dummy_flat_page().numel() == pool.get_dummy_flat_data_page().numel()


@pytest.mark.parametrize("layout_name", pools.LAYOUTS)
def test_an_mla_pool_reads_as_layers_without_heads(layout_name: str) -> None:
    pool = pools.build_pool("mla", layout_name)
    record = HostPool.read(pool)
    assert (record.kind, record.class_name, record.layout, record.dtype) == (
        "mla", "MLATokenToKVPoolHost", layout_name, "bfloat16")
    assert (record.page_size, record.layer_num, record.head_num) == (PAGE, LAYERS, 0)
    assert record.slots == record.host_tokens == pool.size and record.device_tokens == DEVICE_TOKENS
    assert len(record.buffers) == 1 and record.buffers[0] is pool.kv_buffer
    latent_row = (pools.KV_LORA_RANK + pools.ROPE_DIM) * pools.DTYPE.itemsize
    assert layout.pool_geometry(record).page_nbytes == LAYERS * PAGE * latent_row


def test_the_geometry_of_a_record_is_the_pools_own_page() -> None:
    pool = pools.build_pool("mha", "layer_first")
    geometry = layout.pool_geometry(HostPool.read(pool))
    _, sizes = pool.get_page_buffer_meta(torch.arange(PAGE, dtype=torch.int64))
    assert geometry.segment_sizes == tuple(sizes) and len(sizes) == 2 * LAYERS
    # layer_first: zero-copy K0 V0 K1 V1 ..., the flat page K0 K1 ... V0 V1 ...
    assert geometry.flat_order[:4] == (0, LAYERS, 1, LAYERS + 1)


def test_deepseek_v4s_anchor_reads_as_logical_with_no_bytes() -> None:
    pool = LogicalHostPool(size=8 * PAGE, page_size=PAGE, layout="page_first")
    record = HostPool.read(pool)
    assert record.logical and record.kind == "logical" and record.buffers == ()
    assert (record.page_size, record.slots, record.layout) == (PAGE, 8 * PAGE, "page_first")
    geometry = layout.pool_geometry(record)
    assert geometry.segment_sizes == () and geometry.dtype == "none"  # the namespace names no bytes


@pytest.mark.parametrize(("kind", "field"), [
    ("mha", "head_num"), ("mha", "layer_num"), ("mha", "layout"), ("mla", "layer_num"), ("mla", "dtype"),
])
def test_a_pool_lacking_a_declared_field_fails_the_attach_naming_it(tmp_path: Path, kind: str,
                                                                    field: str) -> None:
    pool = pools.build_pool(kind, "page_first")
    delattr(pool, field)  # as if a later SGLang renamed it
    cfg = pools.storage_config(kind, "page_first", tmp_path)
    with pytest.raises(ConfigError, match=f"no field '{field}'.*at '{field}'") as err:
        MooncakeSglStorage(cfg, pool)
    assert type(pool).__name__ in str(err.value)
    assert not (tmp_path / "lmdb").exists()  # refused before any tier started


def test_an_object_that_is_no_sglang_host_pool_is_refused_by_class(tmp_path: Path) -> None:
    class LooksLikeAPool:  # every field a pool has, but not SGLang's class
        page_size, layout, dtype, size = PAGE, "page_first", torch.bfloat16, 64 * PAGE

    with pytest.raises(ConfigError, match="LooksLikeAPool, no host pool class of sglang 0.5.23"):
        MooncakeSglStorage(pools.storage_config("mha", "page_first", tmp_path), LooksLikeAPool())


def test_a_sidecar_pool_is_read_when_registered(make_backend) -> None:
    backend, _ = make_backend("mla", "page_first")
    sidecar = pools.build_pool("mla", "page_first")
    del sidecar.dtype
    with pytest.raises(ConfigError, match="no field 'dtype'"):
        backend.register_mem_host_pool_v2(sidecar, PoolName.INDEXER)
