"""``scripts/bench_capacity_curves.py`` end to end on a short generated trace: a cell per size with
the online estimate beside the exact replay, and the largest difference reported."""

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
                                       "--capacity", "200", "--quick", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    cells = doc["cells"]
    assert [c["multiplier"] for c in cells] == list(MULTIPLIERS)
    assert [c["blocks"] for c in cells] == [round(200 * m) for m in MULTIPLIERS]
    own = next(c for c in cells if c["multiplier"] == 1.0)
    # Every size of a 200-block tier is its own miniature (exact); at 1x the replay is the same one.
    assert abs(own["diff_points"]) < 0.5
    assert doc["largest_diff_points"] == max(abs(c["diff_points"]) for c in cells)
    assert "largest difference" in capsys.readouterr().out


def test_the_cost_table_sets_the_served_curves_beside_the_same_curves_inline(tmp_path: Path, capsys) -> None:
    out = tmp_path / "curves.json"
    assert bench_capacity_curves.main(["--trace", "gen:chat", "--policies", "lru", "--limit", "60",
                                       "--capacity", "50", "--json", str(out)]) == 0
    [cost] = json.loads(out.read_text())["costs"]
    assert cost["process_dropped_pages"] == 0
    assert cost["process_serving_us_per_page"] > 0 and cost["process_child_us_per_page"] > 0
    assert cost["us_per_page"] > 0 and cost["bytes"] > 0 and cost["entries"] > 0
    text = capsys.readouterr().out
    assert "serving/inline" in text and "gen:chat" in text
