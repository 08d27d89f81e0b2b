"""scripts/replay_trace.py end to end on a generated trace (CI-sized), and scripts/hazard_bound.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from devtools.testing.scripts import load_script
from mooncake_sgl.config import PolicyConfig

ROOT = Path(__file__).resolve().parents[2]
ONLINE = ("lru", "arc", "lirs", "lfuda", "heat", "adaptive", "default")


@pytest.fixture(scope="module")
def TRACE(tmp_path_factory) -> Path:
    """Mooncake-format requests shaped like the Mooncake trace's reuse: a few popular documents
    (Zipf), each request followed by blocks of its own that never come back (one-hit wonders)."""
    rng = random.Random(5)
    docs = [list(range(d * 100, d * 100 + rng.randint(2, 10))) for d in range(40)]
    weights = [1.0 / (i + 1) for i in range(len(docs))]
    fresh = 10_000
    path = tmp_path_factory.mktemp("trace") / "docs.jsonl"
    with open(path, "w") as f:
        for i in range(600):
            doc = rng.choices(docs, weights)[0]
            tail = list(range(fresh, fresh + rng.randint(1, 6)))
            fresh += len(tail)
            f.write(json.dumps({"timestamp": 500 * i, "hash_ids": doc + tail}) + "\n")
    return path


def test_replay_reports_table_tiers_json_and_plot(tmp_path: Path, capsys, TRACE: Path):
    replay = load_script("replay_trace")
    out, png = tmp_path / "r.json", tmp_path / "p.png"
    assert replay.main([str(TRACE), "--limit", "400", "--capacity-blocks", "2%,9%", "--tiers", "2%:20%",
                        "--json", str(out), "--plot", str(png), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "belady/lru" in printed and "tier0 share" in printed
    data = json.loads(out.read_text())
    assert data["requests"] == 400 and len(data["single_tier"]) == 2
    for row in data["single_tier"]:
        bound = row["belady"]["hit_ratio"]
        assert all(row[p]["hit_ratio"] <= bound for p in ONLINE)
    tiers = data["multi_tier"][0]["results"]
    assert set(tiers) == set(ONLINE)
    # Heat keeps one-hit wonders off the slow tier: fewer bytes written there than write-through LRU.
    assert tiers["heat"]["tiers"][1]["bytes_written"] < tiers["lru"]["tiers"][1]["bytes_written"]
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_default_is_the_product_default_policy(tmp_path: Path):
    # ``default`` must measure what users get: the same replay as the policy ``policy.name``
    # defaults to, whatever that is.
    replay = load_script("replay_trace")
    out = tmp_path / "d.json"
    assert replay.main(["gen:chat", "--limit", "300", "--capacity-blocks", "3%", "--policy",
                        f"default,{PolicyConfig().name}", "--json", str(out), "--quiet"]) == 0
    row = json.loads(out.read_text())["single_tier"][0]
    assert row["default"]["hit_pages"] == row[PolicyConfig().name]["hit_pages"] > 0


@pytest.mark.parametrize("name", ["chat", "agent", "rag"])
def test_generated_workloads_replay_without_a_file(name: str, tmp_path: Path):
    replay = load_script("replay_trace")
    out = tmp_path / "g.json"
    assert replay.main([f"gen:{name}", "--seed", "3", "--limit", "200", "--capacity-blocks", "5%",
                        "--policy", "lru,adaptive,belady", "--cost", "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    row = data["single_tier"][0]
    assert data["requests"] == 200
    cost = data["cost"][0]
    assert set(cost) == {"capacity_blocks", "lru", "adaptive"}
    assert all(cost[p]["lookups_per_s"] > 0 and cost[p]["policy_bytes"] > 0 for p in ("lru", "adaptive"))
    assert 0 < row["lru"]["hit_ratio"] <= row["belady"]["hit_ratio"]
    assert row["adaptive"]["hit_ratio"] <= row["belady"]["hit_ratio"]


def test_replay_rejects_bad_arguments(TRACE: Path):
    replay = load_script("replay_trace")
    with pytest.raises(SystemExit):
        replay.main([str(TRACE), "--policy", "fifo"])
    with pytest.raises(SystemExit, match="bad capacity"):
        replay.main([str(TRACE), "--limit", "10", "--capacity-blocks", "lots", "--quiet"])
    with pytest.raises(SystemExit, match="gen:chat"):
        replay.main(["gen:nope", "--quiet"])


def test_hazard_bound_without_evictions_equals_the_unbounded_cache(tmp_path: Path):
    mod = load_script("hazard_bound")
    chains = [[1, 2, 3], [4], [1, 2, 5], [6, 7], [1, 2, 3], [4, 8]]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "hash_ids": c}) + "\n"
                             for i, c in enumerate(chains)))
    out = tmp_path / "h.json"
    assert mod.main([str(trace), "--capacity-blocks", "8,2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["fit_whole"] == rows[0]["fit_first_half"] == 6 / 14  # leading hits 2 + 3 + 1 of 14 blocks
    assert 0.0 <= rows[1]["fit_whole"] < 6 / 14


def test_timeline_shows_each_policy_per_interval_and_when_the_leader_changed(tmp_path: Path, capsys,
                                                                            TRACE: Path):
    replay = load_script("replay_trace")
    out = tmp_path / "t.json"
    assert replay.main([str(TRACE), "--limit", "400", "--capacity-blocks", "20", "--policy",
                        "lru,lirs,adaptive,belady", "--timeline", "150", "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    line = data["timeline"][0]
    assert [row["requests"] for row in line["rows"]] == [150, 300, 400]  # the last interval is short
    final = line["rows"][-1]["cumulative"]
    # The side-by-side replay is the same replay as the table's: same policies, same hits.
    table = data["single_tier"][0]
    assert set(final) == {"lru", "lirs", "adaptive"}
    assert all(final[p] == table[p]["hit_ratio"] for p in final)
    changes = line["leader_changes"]
    assert changes[0] == {"request": 0, "policy": "adaptive", "from": None, "to": "lru"}
    assert all(row["leader"]["adaptive"] in ("lru", "arc", "lirs", "lfuda") for row in line["rows"])
    assert "timeline at 20 blocks" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        replay.main([str(TRACE), "--timeline", "0", "--quiet"])
