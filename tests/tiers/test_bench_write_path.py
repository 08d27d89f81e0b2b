"""``scripts/bench_tiers.py --modes put-profile,backlog`` end to end at CI size: every offered page is
accounted for (stored, refused or dropped) for the tier and the raw disk alike, and the put profile
names its phases per page size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_backlog_and_put_profile_account_for_every_page(tmp_path: Path) -> None:
    out = tmp_path / "write-path.json"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_tiers.py"), "--quick", "--modes",
                          "put-profile,backlog", "--backlog-direct-io", "auto,direct", "--backlog-rate",
                          "0.2,0.1", "--dir", str(tmp_path),
                          "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "backlog:" in run.stdout and "put profile:" in run.stdout
    res = json.loads(out.read_text())
    assert [b["rate_gbps"] for b in res["backlog"]] == [0.2, 0.1]
    for backlog in res["backlog"]:
        assert set(backlog["runs"]) == {"raw O_DIRECT", "ours auto", "ours direct"}
        for consumer, runs in backlog["runs"].items():
            for r in runs:
                assert r["offered"] > 0, consumer
                assert r["stored"] + r["refused"] + r["dropped"] == r["offered"], (consumer, r)
                assert r["lag_max_s"] >= r["lag_p50_s"] >= 0
            if consumer != "raw O_DIRECT":
                assert all(0 < r["writer_busy"] <= 1 for r in runs)
        assert set(backlog["vs_raw_by_round"]) == {"ours auto", "ours direct"}
        assert all(len(ratios) == backlog["rounds"] for ratios in backlog["vs_raw_by_round"].values())
    profile = res["put_profile"]
    assert set(profile) == {"64KiB x64", "1MiB x16"}
    for row in profile.values():
        assert row["put_s"] > 0 and row["writeback_s"] >= 0
        assert {"checksum (caller)", "page bytes written (checksums, index puts included)",
                "extent allocation"} <= set(row["phases"])
        assert row["profile"], "the cProfile lines are missing"
    assert not any(p.name.startswith(("backlog", "put-profile")) for p in tmp_path.rglob("*")
                   if p.is_dir()), "benchmark files left behind"


def test_a_backlog_rate_that_is_not_a_positive_number_is_refused_by_name(tmp_path: Path) -> None:
    for bad in ("fast", "1.5,-1", ","):
        run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_tiers.py"), "--modes", "backlog",
                              "--backlog-rate", bad, "--dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "--backlog-rate" in run.stderr, (bad, run.stderr[-500:])
