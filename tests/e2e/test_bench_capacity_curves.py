"""``scripts/bench_capacity_curves.py`` end to end on a short generated trace: a cell per size with
the online estimate beside the exact replay (and the estimator before it), the largest difference
reported, and the cost of both, per looked-up page, in the same run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_capacity_curves  # noqa: E402

from mooncake_sgl.policy.curve import MULTIPLIERS  # noqa: E402


def test_every_size_has_its_online_estimate_beside_its_exact_replay(tmp_path: Path, capsys) -> None:
    out = tmp_path / "curves.json"
    assert bench_capacity_curves.main(["--trace", "gen:chat", "--policies", "lru", "--limit", "150",
                                       "--capacity", "200", "--quick", "--before",
                                       "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    cells = doc["cells"]
    assert [c["multiplier"] for c in cells] == list(MULTIPLIERS)
    assert [c["blocks"] for c in cells] == [round(200 * m) for m in MULTIPLIERS]
    own = next(c for c in cells if c["multiplier"] == 1.0)
    # Every size of a 200-block tier is tracked by the stack: exact for LRU touching every page of a
    # lookup, which ``LruPolicy`` does not for pages past a miss (150 requests: a point or so).
    assert abs(own["diff_points"]) < 1.5 and all("before" in c for c in cells)
    assert doc["largest_diff_points"] == max(abs(c["diff_points"]) for c in cells)
    text = capsys.readouterr().out
    assert "largest difference" in text and "the one before" in text


def test_the_cost_table_sets_both_estimators_and_the_served_curves_side_by_side(tmp_path: Path,
                                                                                capsys) -> None:
    out = tmp_path / "curves.json"
    assert bench_capacity_curves.main(["--trace", "gen:scan", "--policies", "lru", "--limit", "60",
                                       "--capacity", "50", "--quick", "--before", "--cost-pages", "2000",
                                       "--rate", "20000", "--rate-seconds", "0.5",
                                       "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["costs"] == []  # --quick: no cost table, but the offered rate still runs
    [rate] = doc["rates"]
    assert rate["dropped_pages"] == 0 and rate["offered_pages"] > 0 and rate["child_us_per_page"] > 0
    assert bench_capacity_curves.main(["--trace", "gen:chat", "--policies", "lru", "--limit", "60",
                                       "--capacity", "50", "--before", "--json", str(out)]) == 0
    [cost] = json.loads(out.read_text())["costs"]
    assert cost["process_dropped_pages"] == 0
    assert cost["process_serving_us_per_page"] > 0 and cost["process_child_us_per_page"] > 0
    assert cost["us_per_page"] > 0 and cost["before_us_per_page"] > 0 and cost["bytes"] > 0
    text = capsys.readouterr().out
    assert "before" in text and "offered" in text and "gen:chat" in text
