"""Our series through SGLang's own backend factory and ``enable_storage_metrics`` (its
``--enable-metrics``), in its multiprocess mode; and nothing at all without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from mooncake_sgl.metrics.persist import counter_file_name, read_counter_file
from mooncake_sgl.metrics.scrape import parse

ROOT = Path(__file__).resolve().parents[2]


def run_worker(root: Path, tp_rank: int, metrics: bool, prom_dir: Path) -> dict:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-m", "tests.metrics.backend_worker", str(root), str(tp_rank),
                          "1" if metrics else "0"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def collect(prom_dir: Path) -> str:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(prom_dir))
    return generate_latest(registry).decode()


def test_enable_metrics_puts_each_ranks_tiers_into_sglangs_metrics(tmp_path: Path) -> None:
    prom = tmp_path / "prom"
    prom.mkdir()
    own = {rank: run_worker(tmp_path / "cache", rank, True, prom) for rank in (0, 1)}
    snap = parse(collect(prom))
    for rank, tiers in own.items():
        for tier, counts in tiers.items():
            s = snap.tiers[(f"tp{rank}_pp0_dp0_cp0", tier)]
            assert (s.hits, s.misses, s.written_bytes) == (
                counts["hits"], counts["misses"], counts["written_bytes"]), (rank, tier)
    total = snap.by_tier()
    assert list(total) == ["host", "lmdb"]
    assert total["host"].hits + total["lmdb"].hits == 8  # 4 pages per rank
    assert total["lmdb"].misses == 4  # 2 unknown pages per rank, found in no tier
    assert snap.store_total("lookup_hit_pages") == 8
    # Each rank keeps its counters in its own LMDB directory as well.
    for rank in (0, 1):
        f = tmp_path / "cache" / "lmdb" / f"tp{rank}_pp0" / counter_file_name(f"tp{rank}_pp0_dp0_cp0")
        assert read_counter_file(str(f)).by_tier()["host"].hits == own[rank]["host"]["hits"]


def test_without_enable_metrics_no_series_exist(tmp_path: Path) -> None:
    prom = tmp_path / "prom"
    prom.mkdir()
    own = run_worker(tmp_path / "cache", 0, False, prom)
    assert own["host"]["hits"] == 4
    assert "mooncake_sgl" not in collect(prom)
    # The counter file does not depend on --enable-metrics.
    f = tmp_path / "cache" / "lmdb" / "tp0_pp0" / counter_file_name("tp0_pp0_dp0_cp0")
    assert read_counter_file(str(f)).by_tier()["host"].hits == 4
