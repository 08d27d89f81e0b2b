"""Split heads (``page_head`` with ``tp_lcm_size``): servers of TP sizes 1, 2 and 4 of one model share
pages head by head, in both directions, through every shared tier (our pool server, the Mooncake
Store), exactly as SGLang's own ``MooncakeStore`` does on a real ``mooncake_master``.

One model has ``HEADS`` KV heads; a TP-``T`` server's rank ``r`` holds heads ``r*H/T .. (r+1)*H/T - 1``
in a real ``MHATokenToKVPoolHost`` of layout ``page_head``. SGLang's storage config is what its cache
controller makes: ``should_split_heads`` where ``tp_lcm_size > tp_size``. A write by one topology is
read by the others, and every head of every page must come back byte for byte.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, HiCacheStorageExtraInfo

from devtools.testing import MooncakeMaster
from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.errors import ConfigError
from mooncake_sgl.hicache import layout
from mooncake_sgl.hicache.backend import MooncakeSglStorage
from mooncake_sgl.hicache.sglang_config import StorageRank
from mooncake_sgl.hicache.sglang_pool import HostPool

from . import pools

HEADS = 4  # KV heads of the model
PAGES = 6
Heads = dict[tuple[int, int], bytes]  # (page, model head) -> that head's K bytes + V bytes


def storage_config(tp_rank: int, tp_size: int, lcm: int | None, extra: dict[str, Any]
                   ) -> HiCacheStorageConfig:
    """As SGLang's ``_generate_storage_config`` makes it for an MHA ``page_head`` pool."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
        model_name=pools.MODEL, tp_lcm_size=lcm, should_split_heads=bool(lcm) and lcm > tp_size,
        extra_config=extra)


class Server:
    """The TP ranks of one server: a host pool and a backend per rank."""

    def __init__(self, tp_size: int, lcm: int | None, make: Callable[[HiCacheStorageConfig, Any], Any]):
        self.tp_size = tp_size
        self.pools = [pools.build_pool("mha", "page_head", heads=HEADS // tp_size) for _ in range(tp_size)]
        self.backends = [make(storage_config(r, tp_size, lcm, {}), pool) for r, pool in enumerate(self.pools)]
        self.slots = [pool.alloc(PAGES * pools.PAGE) for pool in self.pools]

    def write(self, hashes: list[str], seed: int) -> Heads:
        for r, (pool, backend, idx) in enumerate(zip(self.pools, self.backends, self.slots)):
            pools.fill_random(pool, idx, seed + r)
            assert backend.batch_set_v1(hashes, idx, HiCacheStorageExtraInfo()) == [True] * PAGES
        return self.heads()

    def read(self, hashes: list[str]) -> Heads:
        for pool, backend, idx in zip(self.pools, self.backends, self.slots):
            pools.zero_pages(pool, idx)
            assert backend.batch_exists(hashes) == PAGES
            assert backend.batch_get_v1(hashes, idx) == [True] * PAGES
        return self.heads()

    def heads(self) -> Heads:
        """Every model head of every page, from the ranks' host pools."""
        out: Heads = {}
        per_rank = HEADS // self.tp_size
        for r, (pool, idx) in enumerate(zip(self.pools, self.slots)):
            ptrs, sizes = pool.get_page_buffer_meta(idx)
            for page in range(PAGES):
                k, v = (ctypes.string_at(ptrs[2 * page + j], sizes[2 * page + j]) for j in (0, 1))
                share = len(k) // per_rank
                for h in range(per_rank):
                    head = slice(h * share, (h + 1) * share)
                    out[(page, r * per_rank + h)] = k[head] + v[head]
        return out


@pytest.fixture
def master() -> Iterator[MooncakeMaster]:
    with MooncakeMaster() as m:
        yield m


@contextmanager
def ours_over(kind: str, master: MooncakeMaster) -> Iterator[Callable[..., Any]]:
    """Our backends whose only tier is the shared one: a page can reach another server only there."""
    made: list[Any] = []
    with PoolProcess(capacity="64MiB") if kind == "pool" else _nothing() as pool:
        tier = ({"kind": "pool", "endpoints": [pool.endpoint]} if kind == "pool" else
                {"kind": "mooncake_store", "master": master.rpc_address,
                 "metadata_server": master.metadata_url, "segment_size": "16MiB", "buffer_size": "4MiB"})

        def make(cfg: HiCacheStorageConfig, pool_host: Any) -> Any:
            cfg.extra_config = {"tiers": [tier], "policy": {"name": "lru"}}
            made.append(MooncakeSglStorage(cfg, pool_host))
            made[-1].register_mem_pool_host(pool_host)
            return made[-1]

        try:
            yield make
        finally:
            for backend in made:
                backend.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


@contextmanager
def builtin(master: MooncakeMaster) -> Iterator[Callable[..., Any]]:
    """SGLang's own ``MooncakeStore`` on ``master``; clients are destroyed before the master stops."""
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    made: list[Any] = []

    def make(cfg: HiCacheStorageConfig, pool_host: Any) -> Any:
        cfg.extra_config = {"master_server_address": master.rpc_address, "metadata_server": "P2PHANDSHAKE",
                            "protocol": "tcp", "local_hostname": "127.0.0.1",
                            # Split by TP size; Mooncake's smallest segment is 16 MiB.
                            "global_segment_size": cfg.tp_size * (16 << 20), "device_name": ""}
        made.append(MooncakeStore(cfg, pool_host))
        made[-1].register_mem_pool_host(pool_host)
        return made[-1]

    try:
        yield make
    finally:
        for backend in made:
            backend.close()
            del backend.store
        made.clear()
        gc.collect()


def _share_both_ways(make: Callable[..., Any], lcm: int) -> list[Heads]:
    """Each topology writes its own chain; every other topology reads it. Returns every read."""
    sizes = [t for t in (1, 2, 4) if t <= lcm]
    servers = {t: Server(t, lcm, make) for t in sizes}
    reads: list[Heads] = []
    for n, writer in enumerate(sizes):
        hashes = pools.page_hashes(PAGES, seed=100 + n)
        written = servers[writer].write(hashes, seed=10 * n)
        assert len(written) == PAGES * HEADS
        for reader in sizes:
            if reader != writer:
                got = servers[reader].read(hashes)
                assert got == written, f"TP{reader} read TP{writer}'s heads wrong"
                reads.append(got)
    return reads


@pytest.mark.parametrize("lcm", [2, 4])
def test_sglangs_own_backend_shares_heads_between_tp_sizes(master: MooncakeMaster, lcm: int) -> None:
    with builtin(master) as make:
        _share_both_ways(make, lcm)


@pytest.mark.parametrize("kind", ["mooncake_store", "pool"])
@pytest.mark.parametrize("lcm", [2, 4])
def test_tp_sizes_share_heads_both_ways_through_our_shared_tiers(master: MooncakeMaster, kind: str,
                                                                 lcm: int) -> None:
    with ours_over(kind, master) as make:
        reads = _share_both_ways(make, lcm)
    with builtin(master) as make:
        assert reads == _share_both_ways(make, lcm)  # the same seeds: the same heads restored


def test_without_a_shared_lcm_a_tp1_page_is_not_offered_to_tp2(master: MooncakeMaster) -> None:
    # A TP=1 server without tp_lcm_size stores whole pages under TP size 1: a TP=2 rank must not
    # take one for its own half-size page.
    with ours_over("mooncake_store", master) as make:
        writer, reader = Server(1, None, make), Server(2, 2, make)
        hashes = pools.page_hashes(PAGES, seed=7)
        writer.write(hashes, seed=1)
        assert [b.batch_exists(hashes) for b in reader.backends] == [0, 0]


def test_head_groups_are_the_buffers_sglang_splits() -> None:
    pool = pools.build_pool("mha", "page_head", heads=HEADS)
    idx = pool.alloc(2 * pools.PAGE)
    for split in (2, 4):
        ptrs, sizes = pool.get_split_heads_page_buffer_meta(idx, split)
        record = HostPool.read(pool)
        pages = layout.page_views(record, layout.pool_geometry(record), idx, 2)
        ours = [group for page in pages for group in layout.head_group_views(page, split)]
        flat = [(ctypes.addressof(ctypes.c_char.from_buffer(seg)), seg.nbytes) for g in ours for seg in g]
        assert flat == list(zip(ptrs, sizes, strict=True))


@pytest.mark.parametrize(("layout_name", "lcm", "heads", "match"), [
    ("page_first_direct", 2, HEADS, "page_head"),
    ("page_head", 8, HEADS, "do not divide"),
])
def test_split_heads_that_cannot_be_stored_fail_the_attach(tmp_path: Path, layout_name: str, lcm: int,
                                                           heads: int, match: str) -> None:
    pool = pools.build_pool("mha", layout_name, heads=heads)
    cfg = storage_config(0, 1, lcm, pools.extra_config(tmp_path))
    with pytest.raises(ValueError, match=match):
        MooncakeSglStorage(cfg, pool)


@pytest.mark.parametrize("layout_name", ["layer_first", "page_first", "page_first_direct"])
def test_tp_lcm_size_on_a_layout_other_than_page_head_fails_the_attach(tmp_path: Path,
                                                                       layout_name: str) -> None:
    # SGLang leaves should_split_heads off on these layouts: pages would be stored whole, under
    # this TP size only, while the operator asked for sharing across TP sizes.
    pool = pools.build_pool("mha", layout_name, heads=HEADS)
    cfg = dataclasses.replace(storage_config(0, 1, 2, pools.extra_config(tmp_path)),
                              should_split_heads=False)
    with pytest.raises(ConfigError, match=f"tp_lcm_size 2 .*layout '{layout_name}'.*at 'tp_lcm_size'"):
        MooncakeSglStorage(cfg, pool)


def test_tp_lcm_size_is_no_error_for_mla_or_without_a_split(tmp_path: Path) -> None:
    mla = storage_config(0, 1, 2, pools.extra_config(tmp_path / "mla"))
    mla = dataclasses.replace(mla, is_mla_model=True, should_split_heads=False)
    mla_pool = HostPool.read(pools.build_pool("mla", "layer_first"))
    assert layout.head_split(StorageRank.read(mla), mla_pool) == 1
    same = dataclasses.replace(storage_config(0, 2, 2, {}), should_split_heads=False)
    mha = HostPool.read(pools.build_pool("mha", "layer_first", heads=HEADS))
    assert layout.head_split(StorageRank.read(same), mha) == 1


def test_split_pages_through_the_copy_path_are_the_zero_copy_objects(tmp_path: Path) -> None:
    # SGLang's legacy copy path (flat pages) must store the same head groups under the same keys.
    pool = pools.build_pool("mha", "page_head", heads=HEADS)
    extra = pools.extra_config(tmp_path)
    zero_copy = MooncakeSglStorage(storage_config(0, 1, 2, extra), pool)
    try:
        idx = pool.alloc(PAGES * pools.PAGE)
        pools.fill_random(pool, idx, seed=3)
        hashes = pools.page_hashes(PAGES, seed=4)
        flats = [pool.get_data_page(int(i), flat=True).clone() for i in idx[::pools.PAGE]]
        assert zero_copy.batch_set(hashes, flats)
        pools.zero_pages(pool, idx)
        assert zero_copy.batch_get_v1(hashes, idx) == [True] * PAGES
        restored = [pool.get_data_page(int(i), flat=True) for i in idx[::pools.PAGE]]
        # Bitwise: random bytes make NaNs, which no float comparison calls equal.
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(restored, flats, strict=True))
    finally:
        zero_copy.close()
