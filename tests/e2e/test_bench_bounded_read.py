"""``scripts/bench_bounded_read.py``: the gate's steps over a hit, and a short run that reads every
hit back whole both ways (the timing is the benchmark's own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from devtools.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_steps_are_the_first_page_then_doubling_and_cover_the_hit_once() -> None:
    steps = load_script("bench_bounded_read").steps
    assert steps(63) == [1, 1, 2, 4, 8, 16, 31]
    assert steps(1) == [1] and steps(2) == [1, 1] and steps(5) == [1, 1, 2, 1]


def test_a_short_run_reads_each_hit_back_whole_both_ways(tmp_path: Path) -> None:
    out = tmp_path / "bounded.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bounded_read.py"), "--pages", "5",
                          "--rounds", "1", "--busy", "--dir", str(tmp_path),
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "stepped / one:" in run.stdout
    res = json.loads(out.read_text())
    assert {v: len(s) for v, s in res["seconds"].items()} == {"one": 2, "stepped": 2}
    assert res["ratio"] > 0 and res["dropped"] in ("drop_caches", "fadvise")
