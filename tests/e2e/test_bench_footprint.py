"""``scripts/bench_store_footprint.py`` end to end on a small tier: every variant opens every page,
and the per-page figures it reports are the measured totals divided by the pages."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_store_footprint  # noqa: E402


def test_each_variant_opens_every_page_and_reports_per_page_costs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "footprint.json"
    assert bench_store_footprint.main(["--pages", "1000", "--quick", "--policies", "lru",
                                       "--dir", str(tmp_path), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["results"]) == {"tier-only", "lru"}
    for variant, runs in doc["runs"].items():
        assert [r["pages"] for r in runs] == [1000], variant
    lru = doc["results"]["lru"]
    assert lru["index_locked_bytes"] > 0 and lru["attach_s"] > 0
    assert lru["index_locked_bytes_per_page"] == lru["index_locked_bytes"] / 1000
    assert lru["attach_s_per_100k_pages"] == lru["attach_s"] * 100
    assert "x tier" in capsys.readouterr().out
