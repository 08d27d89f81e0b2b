"""The parts of SGLang's built-in Mooncake backend's surface besides IO, in-process on real sglang
classes: the L3 layout reply, clear, close and re-attach, the session id. The live counterparts
(``tests/live/test_live_builtin_surface.py``) drive the same methods through SGLang's HTTP API."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import psutil
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo, merge_l3_layouts
from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

from mooncake_sgl.hicache.backend import MooncakeSglStorage
from mooncake_sgl.keys import page_key
from mooncake_sgl.tiers.mooncake_store import object_name

from . import pools
from .pools import PAGE


def _layout(backend: MooncakeSglStorage) -> dict:
    return backend.describe_l3_object_layout(sidecar_pool_specs=(), swa_trailing_pages=None,
                                             page_size=PAGE)


def _open_under(root: Path) -> list[str]:
    me = psutil.Process()
    paths = [f.path for f in me.open_files()] + [m.path for m in me.memory_maps(grouped=True)]
    return [p for p in paths if p.startswith(str(root))]


# ---------------------------------------------------------------------------------- L3 layout

def test_sglangs_scheduler_asks_us_for_the_layout(make_backend) -> None:
    # Scheduler._hicache_l3_layout calls describe_l3_object_layout only on MooncakeStore instances.
    backend, _ = make_backend("mha", "page_first")
    assert isinstance(backend, MooncakeStore)
    assert not any(c is MooncakeStore for c in type(backend).__mro__)  # none of its code is ours


def test_layout_says_disabled_and_how_an_outsider_finds_our_objects(make_backend) -> None:
    backend, pool = make_backend("mha", "page_first", tp_rank=1, tp_size=2)
    layout = _layout(backend)
    assert (layout["enabled"], layout["backend"], layout["page_size"]) == (False, "mooncake", PAGE)
    assert "{key_prefix}_{page_hash}{suffix}" in layout["reason"]
    inner = layout["hicache_object_layout"]
    assert (inner["pools"], inner["is_mla_backend"], inner["pp_rank"], inner["pp_size"]) == ([], False, 0, 1)
    ours = inner["mooncake_sgl"]
    # From the description alone: this rank's namespace, its digest, a page's key in each tier.
    namespace = ours["namespace"].format(tp_rank=1, pp_rank=0, cp_rank=0)
    digest = hashlib.blake2b(namespace.encode(), digest_size=16).digest()
    h = pools.page_hashes(1, seed=60)[0]
    key = page_key(backend._ns, h)
    assert key == digest + b"h" + bytes.fromhex(h)  # page_key as described
    assert ours["object_key"]["mooncake_store"].format(namespace_digest=digest.hex(), page_hash=h) \
        == object_name(key)
    _, sizes = pool.get_page_buffer_meta(pool.alloc(PAGE))
    assert ours["page_bytes"] == sum(sizes) and sum(ours["page_segments"]) == sum(sizes)
    assert [(t["kind"], t["shared"]) for t in ours["tiers"]] == [("host", False), ("lmdb", False)]
    assert ours["router_events"] == {"mode": "off"}


def test_layout_says_what_router_events_announce(make_backend, tmp_path) -> None:
    extra = {**pools.extra_config(tmp_path), "router_events": "local"}
    backend, _ = make_backend("mha", "page_first", extra=extra)
    said = _layout(backend)["hicache_object_layout"]["mooncake_sgl"]["router_events"]
    assert (said["mode"], said["medium"], said["tiers"]) == ("local", "DISK", ["host", "lmdb"])
    assert "cache_salt" in said["announced"] and "shared tiers" in said["not_announced"]


def test_layout_is_one_reply_for_every_rank(make_backend, tmp_path) -> None:
    # SGLang merges the schedulers' replies and answers "Inconsistent" when replicas differ.
    a, _ = make_backend("mha", "page_first", root=tmp_path / "a", tp_rank=0, tp_size=2)
    b, _ = make_backend("mha", "page_first", root=tmp_path / "b", tp_rank=1, tp_size=2)
    assert a._ns.digest != b._ns.digest
    assert _layout(a) == _layout(b)
    assert merge_l3_layouts([_layout(a), _layout(b)]) == _layout(a)
    first, second = (make_backend("mla", "page_first", root=tmp_path / f"pp{r}", pp_rank=r, pp_size=2)[0]
                     for r in (0, 1))
    merged = merge_l3_layouts([_layout(first), _layout(second)])
    assert merged["hicache_object_layout"]["mooncake_sgl"]["namespace"] \
        == _layout(first)["hicache_object_layout"]["mooncake_sgl"]["namespace"]
    assert "{pp_rank}" in merged["hicache_object_layout"]["mooncake_sgl"]["namespace"]
    assert "{tp_rank}" not in merged["hicache_object_layout"]["mooncake_sgl"]["namespace"]  # MLA


def test_layout_before_attach_and_after_close_says_why(tmp_path) -> None:
    backend = MooncakeSglStorage(pools.storage_config("mha", "page_first", tmp_path), {})
    assert "no host pool registered" in _layout(backend)["reason"]
    backend.register_mem_pool_host(pools.build_pool("mha", "page_first"))
    assert _layout(backend)["hicache_object_layout"]["mooncake_sgl"]["page_bytes"] > 0
    backend.close()
    closed = _layout(backend)
    assert closed["enabled"] is False and "closed" in closed["reason"]


# ---------------------------------------------------------------------------------- clear, close

def test_clear_empties_every_tier(make_backend) -> None:
    backend, pool = make_backend("mha", "page_first")
    keys = pools.page_hashes(4, seed=61)
    assert backend.batch_set_v1(keys, pool.alloc(4 * PAGE)) == [True] * 4
    backend.clear()
    assert backend.batch_exists(keys) == 0
    assert all(t.usage().pages == 0 for t in backend._store.tiers)
    assert backend.batch_set_v1(keys, pool.alloc(4 * PAGE)) == [True] * 4  # still attached
    assert backend.batch_exists(keys) == 4


def test_close_releases_the_files_and_a_new_backend_reattaches(tmp_path) -> None:
    # What DELETE then PUT /hicache/storage-backend does: close one backend, build another on the
    # same config in the same process.
    pool = pools.build_pool("mha", "page_first")
    cfg = pools.storage_config("mha", "page_first", tmp_path)
    keys = pools.page_hashes(3, seed=62)
    threads = psutil.Process().num_threads()
    for _ in range(2):
        backend = MooncakeSglStorage(cfg, pool)
        assert _open_under(tmp_path / "lmdb")
        assert backend.batch_set_v1(keys, pool.alloc(3 * PAGE)) == [True] * 3
        backend.close()
        assert _open_under(tmp_path / "lmdb") == []
        assert psutil.Process().num_threads() == threads
    again = MooncakeSglStorage(cfg, pool)
    try:
        assert again.batch_exists(keys) == 3  # LMDB kept them across the detach
    finally:
        again.close()


# ---------------------------------------------------------------------------------- session id

def test_a_session_id_is_refused_once_and_the_pages_still_stored(make_backend, caplog) -> None:
    backend, pool = make_backend("mha", "page_first")
    keys = pools.page_hashes(2, seed=63)
    with caplog.at_level(logging.WARNING, logger="mooncake_sgl.hicache.backend"):
        for _ in range(2):
            from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

            kv = PoolTransfer(name=PoolName.KV, host_indices=pool.alloc(2 * PAGE), keys=keys)
            assert backend.batch_set_v2([kv], HiCacheStorageExtraInfo(
                extra_info={"session_id": "s-7"})) == {PoolName.KV: [True, True]}
    refusals = [r.getMessage() for r in caplog.records if "refused: the session id" in r.getMessage()]
    assert len(refusals) == 1 and "emits no stored-KV events" in refusals[0]
    assert backend.batch_exists(keys) == 2
