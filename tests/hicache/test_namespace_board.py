"""The namespace board on a real pool server: what each instance posts, what a prefill and a
decode that cannot share pages are told, and that a torn slot, a full board or a dead pool never
fails anything (``mooncake_sgl.hicache.namespace_board``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.config import PoolTierConfig
from mooncake_sgl.hicache import namespace_board as nb
from mooncake_sgl.keys import KeyNamespace, board_key
from mooncake_sgl.tiers.pool import PoolTier
from mooncake_sgl.transfer.client import PoolClient

from . import pools

NS = KeyNamespace(model="/models/llama", dtype="torch.bfloat16", layout="page_first", page_size=64,
                  tp_size=2, weights="f" * 32)


@pytest.fixture(scope="module")
def pool() -> Iterator[PoolProcess]:
    with PoolProcess(capacity="32MiB") as p:
        yield p


@pytest.fixture
def tier(pool: PoolProcess) -> Iterator[PoolTier]:
    t = PoolTier(PoolTierConfig(endpoints=[pool.endpoint], transport="tcp", timeout=2.0))
    t.remove([board_key(s) for s in range(nb.SLOTS)])  # each test starts from an empty board
    yield t
    t.close()


def records(tier: PoolTier) -> list[nb.NamespaceRecord]:
    return [r for _, r in nb.read_board(tier) if r is not None]


def test_a_prefill_and_a_decode_that_differ_are_told_each_field_that_differs(tier: PoolTier) -> None:
    decode = nb.record_for(replace(NS, page_size=32, layout="layer_first"), 1, "decode")
    prefill = nb.record_for(NS, 1, "prefill")
    assert nb.announce([tier], decode) == []
    level, line = nb.peer_report(prefill, nb.announce([tier], prefill))
    assert level == logging.WARNING
    assert "cannot share pages with the decode" in line
    assert "page size 64 here, 32 there" in line and "host layout page_first here, layer_first there" in line
    assert "model" not in line.split(":", 2)[2]  # only what differs is named


def test_a_tp2_prefill_and_a_tp1_decode_meet_on_the_head_grid_of_split_heads(tier: PoolTier) -> None:
    prefill = nb.record_for(NS, 1, "prefill")  # TP 2, whole pages per rank
    decode = nb.record_for(replace(NS, tp_size=1), 2, "decode")  # TP 1, each page as 2 head groups
    nb.announce([tier], prefill)
    level, line = nb.peer_report(decode, nb.announce([tier], decode))
    assert level == logging.INFO and "this decode shares pages with the prefill" in line
    plain = nb.record_for(replace(NS, tp_size=1), 1, "decode")  # TP 1 without split heads
    assert "TP key grid 1 here, 2 there" in nb.peer_report(plain, nb.announce([tier], plain))[1]


def test_colocated_instances_and_lone_roles_report_nothing(tier: PoolTier) -> None:
    colocated = nb.record_for(NS, 1, "colocated")
    nb.announce([tier], nb.record_for(NS, 1, "decode"))
    assert nb.peer_report(colocated, nb.announce([tier], colocated)) is None
    other = nb.record_for(replace(NS, model="other"), 1, "decode")
    assert nb.peer_report(other, nb.announce([tier], other)) is None  # no prefill posted


def test_one_slot_per_configuration_refreshed_when_old(tier: PoolTier) -> None:
    rec = nb.record_for(NS, 1, "prefill")
    for _ in range(3):
        nb.announce([tier], rec)
    assert records(tier) == [rec]
    later = replace(rec, host="elsewhere", seen=rec.seen + nb.REFRESH_AFTER_S + 1)
    nb.announce([tier], later)
    assert records(tier) == [later]


def test_a_full_board_replaces_its_oldest_record(tier: PoolTier) -> None:
    now = time.time()
    for i in range(nb.SLOTS):
        nb.announce([tier], replace(nb.record_for(replace(NS, model=f"m{i}"), 1, "colocated"), seen=now + i))
    newcomer = nb.record_for(replace(NS, model="new"), 1, "colocated")
    others = nb.announce([tier], newcomer)
    assert len(others) == nb.SLOTS
    models = {r.model for r in records(tier)}
    assert "new" in models and "m0" not in models and len(models) == nb.SLOTS


def test_a_torn_or_foreign_slot_is_skipped(tier: PoolTier) -> None:
    garbage = b"\xff" * nb.RECORD_BYTES
    foreign = b'{"format": 99}'.ljust(nb.RECORD_BYTES)
    short = b"x" * 100
    wrong_types = nb.NamespaceRecord("prefill", "m", "", "d", "l", 64, "1", 1, 1, "").encode().replace(
        b'"page_size":64', b'"page_size":"64"')
    for slot, raw in enumerate((garbage, foreign, short, wrong_types)):
        tier.put_from([board_key(slot)], [[memoryview(raw)]])
    assert [r for _, r in nb.read_board(tier)[:4]] == [None] * 4
    rec = nb.record_for(NS, 1, "prefill")
    assert nb.announce([tier], rec) == [] and records(tier) == [rec]


def test_a_record_with_a_very_long_model_path_keeps_the_paths_tail() -> None:
    rec = nb.record_for(replace(NS, model="/x" * 2000 + "/Llama-3-8B"), 1, "prefill")
    raw = rec.encode()
    assert len(raw) == nb.RECORD_BYTES
    back = nb.NamespaceRecord.decode(raw)
    assert back is not None and back.model.startswith("...") and back.model.endswith("/Llama-3-8B")


def test_a_dead_pool_or_a_closed_tier_never_fails_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    with PoolProcess(capacity="32MiB") as p:
        t = PoolTier(PoolTierConfig(endpoints=[p.endpoint], transport="tcp", timeout=1.0,
                                    connect_timeout=0.5))
    try:  # the pool is gone: every read is a miss, and the post is dropped
        assert nb.announce([t], nb.record_for(NS, 1, "prefill")) == []
    finally:
        t.close()
    with caplog.at_level(logging.WARNING):  # a tier broken as a whole raises: one warning
        assert nb.announce([t], nb.record_for(NS, 1, "prefill")) == []
    assert "namespace board on tier pool not reachable (TierClosed" in caplog.text


def test_an_attaching_backend_posts_its_namespace_on_the_shared_tier(make_backend, pool: PoolProcess,
                                                                      tier: PoolTier, tmp_path) -> None:
    extra = {"tiers": [{"kind": "host", "capacity": "64KiB", "pin_memory": False},
                       {"kind": "pool", "endpoints": [pool.endpoint]}], "policy": {"name": "lru"}}
    backend, _ = make_backend("mha", "page_first", extra=extra)
    deadline = time.monotonic() + 20
    while not records(tier) and time.monotonic() < deadline:
        time.sleep(0.1)
    (rec,) = records(tier)
    assert (rec.role, rec.model, rec.layout, rec.page_size, rec.key_tp) == (
        "colocated", pools.MODEL, "page_first", pools.PAGE, "1")
    assert rec.weights == backend._ns.weights


def test_a_nested_or_out_of_range_record_is_skipped_and_the_board_still_works(tier: PoolTier) -> None:
    deep = (b"[" * (nb.RECORD_BYTES // 2)).ljust(nb.RECORD_BYTES)  # RecursionError in json.loads
    good = nb.record_for(replace(NS, model="other"), 1, "decode")
    nan = good.encode().replace(b'"seen":%s' % str(good.seen).encode(), b'"seen":NaN')
    future = replace(good, model="future", seen=time.time() + 10 * 365 * 86400)
    for slot, raw in enumerate((deep, nan, future.encode())):
        tier.put_from([board_key(slot)], [[memoryview(raw)]])
    assert [r for _, r in nb.read_board(tier)[:3]] == [None] * 3
    rec = nb.record_for(NS, 1, "prefill")
    assert nb.announce([tier], rec) == []  # the board is readable, and this instance posts
    assert rec in records(tier)


def test_a_far_future_record_does_not_outlive_a_full_board(tier: PoolTier) -> None:
    now = time.time()
    stuck = replace(nb.record_for(replace(NS, model="stuck"), 1, "colocated"), seen=now + 1e9)
    tier.put_from([board_key(0)], [[memoryview(stuck.encode())]])
    for i in range(1, nb.SLOTS):
        nb.announce([tier], replace(nb.record_for(replace(NS, model=f"m{i}"), 1, "colocated"), seen=now + i))
    nb.announce([tier], nb.record_for(replace(NS, model="new"), 1, "colocated"))
    # The stuck slot was free for the taking; the oldest real record was not pushed out instead.
    assert {r.model for r in records(tier)} == {f"m{i}" for i in range(1, nb.SLOTS)} | {"new"}


def test_a_peers_host_name_cannot_forge_a_log_line(tier: PoolTier) -> None:
    nb.announce([tier], replace(nb.record_for(NS, 1, "decode"), host="evil\nmooncake_sgl: all is well"))
    prefill = nb.record_for(NS, 1, "prefill")
    _, line = nb.peer_report(prefill, nb.announce([tier], prefill))
    assert "\n" not in line and "evil\\nmooncake_sgl" in line


def test_posting_on_a_full_pool_evicts_no_page(tmp_path) -> None:
    """An attach posts its record into a pool full of KV pages whose reads have reordered the LRU
    (the oldest pages sit in every slab): before the fix it freed a whole slab of pages scattered
    over all slabs, 97% of the pool."""
    page = 1 << 20
    # No background eviction: the pool stays full, as one under steady load is between passes.
    with PoolProcess(capacity="64MiB", slab_size="4MiB", high_watermark=1.0, low_watermark=1.0) as p:
        t = PoolTier(PoolTierConfig(endpoints=[p.endpoint], transport="tcp", timeout=5.0))
        try:
            keys = [b"kv-page-%04d" % i for i in range(64)]
            data = memoryview(bytearray(page))
            for i in range(0, len(keys), 8):
                assert all(t.put_from(keys[i:i + 8], [[data]] * 8).ok)
            bufs = [[memoryview(bytearray(page))] for _ in keys[::2]]
            assert all(t.get_into(keys[::2], bufs))  # every other page read: LRU order spans slabs
            server = PoolClient(p.endpoint, transport="tcp", connections=1)
            assert server.stats()["evictions"] == 0 and sum(t.contains(keys)) == 64
            nb.announce([t], nb.record_for(NS, 1, "prefill"))
            assert server.stats()["evictions"] == 0
            assert sum(t.contains(keys)) == 64
            server.close()
        finally:
            t.close()
