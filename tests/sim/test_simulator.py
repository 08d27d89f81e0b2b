"""The simulator (the real TieredStore over zero-byte tiers) against hand-computed replays and
against the same store over real host DRAM tiers that move bytes (hits and per-tier traffic must be
identical), plus the reference policies and the trace readers. Traces are generated, never read from
outside the repository."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mooncake_sgl.config import HostTierConfig, PolicyConfig
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.sim.reference import ArcPolicy, LfuDaPolicy, LirsPolicy, belady_prefix_hits
from mooncake_sgl.sim.simulator import Simulator
from mooncake_sgl.sim.size_tier import SizeTier
from mooncake_sgl.sim.synth import chat_sessions
from mooncake_sgl.sim.trace import Request, block_key, distinct_blocks, load_trace, read_trace
from mooncake_sgl.store import TieredStore
from mooncake_sgl.tiers.host import HostTier
from tests.store_record import holding, policy_residents, resident_keys

SEG = 512
PAGE = 2 * SEG


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory) -> Path:
    """A generated chat-session trace in Mooncake format (seeded: the same file every run)."""
    path = tmp_path_factory.mktemp("trace") / "chat.jsonl"
    with open(path, "w") as f:
        for rec in chat_sessions(300, seed=11):
            f.write(json.dumps(rec) + "\n")
    return path


def write_trace(path: Path, chains: list[list[int]]) -> Path:
    with open(path, "w") as f:
        for i, ids in enumerate(chains):
            f.write(json.dumps({"timestamp": 1000 * i, "input_length": 512 * len(ids),
                                "output_length": 1, "hash_ids": ids}) + "\n")
    return path


def reqs(*chains: list[int]) -> list[Request]:
    return [Request(float(i), tuple(block_key(h) for h in c), tuple(c)) for i, c in enumerate(chains)]


def test_trace_reader_parses_mooncake_records(tmp_path: Path):
    path = write_trace(tmp_path / "t.jsonl", [[1, 2, 3], [1, 2, 4]])
    got = load_trace(path)
    assert [r.block_ids for r in got] == [(1, 2, 3), (1, 2, 4)]
    assert got[1].t == 1.0 and got[0].keys[0] == got[1].keys[0] == block_key(1)
    assert distinct_blocks(got) == 4
    assert len(list(read_trace(path, limit=1))) == 1
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_trace(tmp_path / "bad.jsonl")


def test_lru_replay_matches_a_hand_computed_run():
    # Capacity 3 pages. Prefix hits count up to the first miss only.
    trace = reqs([1, 2], [1, 2, 3], [4], [1, 2, 3], [5, 6, 7], [1])
    sim = Simulator(LruPolicy(1), [3 * PAGE], PAGE)
    runs = [sim.request(r.keys, r.t) for r in trace]
    # [1,2] written; [1,2,3] hits 1,2 and writes 3; [4] evicts the LRU page 1; [1,2,3] misses at
    # its first page, rewrites 1 and evicts 4 (2 and 3 are protected by the write); [5,6,7]
    # evicts 2,3,1; [1] misses and evicts 5.
    assert runs == [0, 2, 0, 0, 0, 0]
    res = sim.result
    assert res.lookup_pages == 13 and res.hit_pages == 2
    assert res.tiers[0].bytes_written == PAGE * (2 + 1 + 1 + 1 + 3 + 1)
    assert res.tiers[0].evictions == 1 + 1 + 3 + 1


def _store_replay(policy, tiers: list[HostTier], requests: list[Request]) -> tuple[list[int], dict]:
    store = TieredStore(tiers, policy, mover="inline")
    runs = []
    try:
        for r in requests:
            keys = list(r.keys)
            run = store.exists_prefix(keys)
            runs.append(run)
            if run:
                dst = [[memoryview(bytearray(SEG)), memoryview(bytearray(SEG))] for _ in range(run)]
                assert all(store.get_into(keys[:run], dst))
            if run < len(keys):
                pages = [[memoryview(bytearray(SEG)), memoryview(bytearray(SEG))] for _ in keys[run:]]
                store.put_from(keys[run:], pages, keys[run - 1] if run else None)
        return runs, store.stats()
    finally:
        store.close()


@pytest.mark.parametrize("name", ["lru", "heat", "adaptive"])
def test_zero_byte_tiers_replay_as_real_tiers_do(name: str, chat_trace: Path):
    # The same request stream through the store over two real host DRAM tiers and through the
    # simulator (the same store over zero-byte tiers), each with a fresh policy from the same
    # factory: identical hits and traffic, so replays measure what the product does.
    requests = load_trace(chat_trace, limit=400)
    caps = [40, 300]
    tiers = [HostTier(HostTierConfig(capacity=c * PAGE, slot_size=PAGE, pin_memory=False)) for c in caps]
    config = PolicyConfig(name=name)
    store_runs, stats = _store_replay(policy_for_capacities(config, [c * PAGE for c in caps]),
                                      tiers, requests)
    sim = Simulator(policy_for_capacities(config, [c * PAGE for c in caps]), [c * PAGE for c in caps], PAGE)
    sim_runs = [sim.request(r.keys, r.t) for r in requests]
    assert sim_runs == store_runs
    assert sum(store_runs) > 0
    res = sim.result
    assert res.tiers[0].evictions > 0 and res.tiers[0].bytes_promoted > 0
    for t, tier_stats in enumerate(stats.tiers.values()):
        st = res.tiers[t]
        assert tier_stats.placement.bytes_written == st.bytes_written
        assert tier_stats.promotion.promotions * PAGE == st.bytes_promoted
        assert tier_stats.placement.demotions * PAGE == st.bytes_demoted
        assert tier_stats.placement.evictions == st.evictions
        assert tier_stats.reads.lookup_hits == st.hit_pages


@pytest.mark.parametrize("name", ["heat", "adaptive"])
def test_the_simulated_store_policy_and_tiers_agree(name: str, chat_trace: Path):
    caps = [30 * PAGE, 200 * PAGE]
    sim = Simulator(policy_for_capacities(PolicyConfig(name=name), caps), caps, PAGE)
    sim.run(load_trace(chat_trace, limit=300))
    for t, tier in enumerate(sim.store.tiers):
        held = {k for k, _ in tier.scan()}
        assert resident_keys(sim.store, t) == held == policy_residents(sim.policy, t)
    assert isinstance(sim.store.tiers[0], SizeTier)


def test_belady_bounds_the_online_policies(chat_trace: Path):
    requests = load_trace(chat_trace, limit=600)
    cap = 100
    hits, total = belady_prefix_hits(requests, cap)
    for policy in (LruPolicy(1), ArcPolicy([cap * PAGE]), LirsPolicy([cap * PAGE]), LfuDaPolicy([cap * PAGE]),
                   policy_for_capacities(PolicyConfig(), [cap * PAGE])):
        res = Simulator(policy, [cap * PAGE], PAGE).run(requests)
        assert res.lookup_pages == total
        assert res.hit_pages <= hits


def test_belady_keeps_the_page_needed_soonest():
    # Capacity 2: after [1],[2], request [3] must evict 2 (needed last), and bypass is allowed.
    trace = reqs([1], [2], [3], [1], [3], [2])
    hits, total = belady_prefix_hits(trace, 2)
    assert (hits, total) == (2, 6)  # 1 and 3 hit; 2 cannot also be kept


def test_arc_adapts_and_respects_protection():
    p = ArcPolicy([3 * PAGE])
    keys = [block_key(i) for i in range(4)]
    sim = Simulator(p, [3 * PAGE], PAGE)
    for ks in ([keys[0]], [keys[0]], [keys[1]], [keys[2]], [keys[3]], [keys[1]]):
        sim.request(ks, 0.0)
    assert p.victims(0, 4 * PAGE) is None
    with holding(sim.store, keys[:1]):
        assert keys[0] not in p.victims(0, PAGE)


@pytest.mark.parametrize("cls", [LirsPolicy, LfuDaPolicy])
def test_reference_policies_respect_protection_and_refuse_what_cannot_be_freed(cls):
    p = cls([3 * PAGE])
    keys = [block_key(i) for i in range(3)]
    sim = Simulator(p, [3 * PAGE], PAGE)
    for k in keys:
        sim.request([k], 0.0)
    assert p.victims(0, 4 * PAGE) is None
    with holding(sim.store, keys[:2]):
        assert p.victims(0, 2 * PAGE) is None
        assert p.victims(0, PAGE) == [keys[2]]


def test_lirs_keeps_a_loop_that_lru_thrashes():
    # A loop of 12 pages over a 10-page tier: LRU misses every time, LIRS keeps most of the loop.
    loop = [[i] for i in range(12)] * 6
    lru = Simulator(LruPolicy(1), [10 * PAGE], PAGE).run(reqs(*loop))
    lirs = Simulator(LirsPolicy([10 * PAGE]), [10 * PAGE], PAGE).run(reqs(*loop))
    assert lru.hit_pages == 0
    assert lirs.hit_pages >= 0.6 * (len(loop) - 12)


def test_lfuda_keeps_the_frequent_page_then_ages_it_out():
    sim = Simulator(LfuDaPolicy([2 * PAGE]), [2 * PAGE], PAGE)
    for _ in range(3):
        sim.request([block_key(0)], 0.0)  # page 0: priority 3
    for i in range(1, 4):  # one-off pages evict each other, raising L to 1, 2, ...
        sim.request([block_key(i)], 0.0)
    assert sim.request([block_key(0)], 0.0) == 1  # still cached: more frequent than the one-offs
    for i in range(10, 20):  # L climbs past page 0's priority: it ages out
        sim.request([block_key(i)], 0.0)
    assert sim.request([block_key(0)], 0.0) == 0


def test_synthetic_chat_trace_is_prefix_consistent_and_seeded():
    a, b = chat_sessions(200, seed=3), chat_sessions(200, seed=3)
    assert a == b and a != chat_sessions(200, seed=4)
    parent: dict[int, int | None] = {}
    for rec in a:
        prev = None
        for h in rec["hash_ids"]:
            assert parent.setdefault(h, prev) == prev  # equal id => equal prefix
            prev = h
    assert [r["timestamp"] for r in a] == sorted(r["timestamp"] for r in a)
