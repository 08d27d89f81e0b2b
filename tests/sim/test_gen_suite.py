"""The generated workloads: seeded, valid Mooncake prefix chains, and each with the reuse structure
it is meant to exercise (agent loops: deep short-range re-reads; RAG: a Zipf-popular document core)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mooncake_sgl.sim import gen_suite
from mooncake_sgl.sim.gen_agent import AgentShape, agent_loops
from mooncake_sgl.sim.gen_mixed import (
    ConversationShape,
    ReReadShape,
    ScanShape,
    merge_tenants,
    mix_workload,
    scan_workload,
    tenants_workload,
)
from mooncake_sgl.sim.gen_rag import RagShape, rag_requests
from mooncake_sgl.sim.synth import ChainIds
from mooncake_sgl.sim.trace import load_trace


def small(name: str, seed: int) -> list[dict]:
    if name == "agent":
        return agent_loops(seed, AgentShape(agents=60))
    if name == "rag":
        return rag_requests(seed, RagShape(requests=600, documents=3000, queries=4000))
    if name == "scan":
        return scan_workload(seed, ScanShape(ConversationShape(sessions=100), documents=150))
    if name == "mix":
        return mix_workload(seed, ConversationShape(sessions=100), ReReadShape(requests=300))
    if name == "tenants":
        return tenants_workload(seed, scale=0.1)
    return gen_suite.GENERATORS[name](seed)[:600]


@pytest.mark.parametrize("name", sorted(gen_suite.GENERATORS))
def test_workloads_are_seeded_and_prefix_consistent(name: str):
    a, b = small(name, 3), small(name, 3)
    assert a == b and a != small(name, 4)
    parent: dict[int, int | None] = {}
    last = -1
    for rec in a:
        assert rec["timestamp"] >= last and rec["hash_ids"]
        assert rec["input_length"] == 512 * len(rec["hash_ids"])
        last = rec["timestamp"]
        prev = None
        for h in rec["hash_ids"]:
            # An id names a block *and* its whole prefix: it always follows the same id.
            assert parent.setdefault(h, prev) == prev
            prev = h


def test_chain_ids_share_an_id_only_for_an_equal_prefix():
    ids = ChainIds()
    a = ids.chain(["s", "d1", "q"])
    b = ids.chain(["s", "d1", "r"])
    c = ids.chain(["x", "d1", "q"])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not set(c) & set(a)
    f1, f2 = ids.fresh(2), ids.fresh(2)
    assert len(set(f1 + f2)) == 4


def test_agent_steps_reread_their_whole_previous_context():
    recs = agent_loops(5, AgentShape(agents=40, retry=0.0, fork=0.0))
    by_prefix = {tuple(r["hash_ids"]) for r in recs}
    extended = 0
    for r in recs:
        ids = r["hash_ids"]
        # Some earlier step of the same agent is a proper prefix of this one (grown by 1-3 blocks).
        if any(tuple(ids[:n]) in by_prefix for n in range(len(ids) - 3, len(ids))):
            extended += 1
    assert extended >= 0.6 * len(recs)
    # Shared tool prompts: the first block of most requests is one of a dozen.
    heads = Counter(r["hash_ids"][0] for r in recs)
    assert len(heads) <= AgentShape().tool_prompts


def test_rag_documents_follow_zipf_popularity():
    recs = rag_requests(5, RagShape(requests=2000, private_share=0.0, system_prompts=1))
    # One system prompt of two blocks: the third block is the first retrieved document's first.
    firsts = Counter(r["hash_ids"][2] for r in recs)
    top = [c for _, c in firsts.most_common()]
    assert top[0] >= 10 * top[len(top) // 2]  # a popular core and a long tail
    assert len(firsts) > 0.3 * len(recs)  # a large pool: most first documents are rare


def test_scan_documents_are_long_and_read_once_among_conversations():
    recs = scan_workload(5, ScanShape(ConversationShape(sessions=200), documents=200))
    seen = Counter(h for r in recs for h in r["hash_ids"])
    documents = [r for r in recs if len(r["hash_ids"]) >= 42 and seen[r["hash_ids"][-1]] == 1
                 and all(seen[h] == 1 for h in r["hash_ids"][2:])]
    assert len(documents) >= 190  # every document: one-off past its short instruction
    turns = [r for r in recs if r not in documents]
    # Conversations come back: most turns extend an earlier turn of their session.
    prefixes = {tuple(r["hash_ids"]) for r in turns}
    grown = sum(any(tuple(r["hash_ids"][:n]) in prefixes for n in range(len(r["hash_ids"]) - 8,
                                                                          len(r["hash_ids"])))
                for r in turns)
    assert grown >= 0.5 * len(turns)


def test_tenants_share_no_block_and_keep_their_order():
    a = [{"timestamp": t, "hash_ids": [0, 1]} for t in (0, 5, 9)]
    b = [{"timestamp": t, "hash_ids": [0, 2]} for t in (1, 5)]
    merged = merge_tenants([a, b])
    assert [r["timestamp"] for r in merged] == [0, 1, 5, 5, 9]
    assert merged[2]["hash_ids"] == [0, 1] and merged[3]["hash_ids"] == [2, 3]  # ties: tenant order
    recs = mix_workload(3, ConversationShape(sessions=50), ReReadShape(requests=100))
    assert len(recs) > 150 and all(r["hash_ids"] for r in recs)


def test_mooncake_sgl_trace_writes_a_replayable_trace(tmp_path: Path):
    from mooncake_sgl.cli import main as cli_main

    out = tmp_path / "agent.jsonl"
    assert cli_main(["trace", "agent", str(out), "--seed", "2"]) == 0
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["hash_ids"]
    assert len(load_trace(out)) == len(lines) == len(gen_suite.generate("agent", 2))
    with pytest.raises(ValueError, match="unknown workload"):
        gen_suite.generate("video")
    with pytest.raises(SystemExit) as exit_:
        cli_main(["trace", "agent", str(tmp_path / "missing" / "agent.jsonl")])
    assert exit_.value.code == 2
