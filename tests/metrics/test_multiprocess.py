"""SGLang's multiprocess mode: two scheduler-rank processes write their values into
``PROMETHEUS_MULTIPROC_DIR`` and one ``MultiProcessCollector`` (what SGLang's HTTP process serves at
``/metrics``) shows each rank once, its counters exactly, and the shared pool's fill once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from mooncake_sgl.metrics.scrape import parse
from mooncake_sgl.pool.config import PoolServerConfig
from mooncake_sgl.pool.server import PoolServer

ROOT = Path(__file__).resolve().parents[2]


def run_rank(tp_rank: int, endpoint: str, pages: int, prom_dir: Path) -> dict:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-m", "tests.metrics.rank_worker", str(tp_rank), endpoint,
                          str(pages)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_two_ranks_are_each_counted_once_and_the_shared_pool_once(tmp_path: Path) -> None:
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    pool = PoolServer(PoolServerConfig(port=0, capacity="16MiB", slab_size="1MiB",
                                       populate=False)).start()
    try:
        host, port = pool.address
        endpoint = f"{host}:{port}"
        own = {0: run_rank(0, endpoint, 6, prom_dir), 1: run_rank(1, endpoint, 9, prom_dir)}
    finally:
        pool.stop()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(prom_dir))
    text = generate_latest(registry).decode()
    snap = parse(text)
    for rank, tiers in own.items():
        for tier, counts in tiers.items():
            sample = snap.tiers[(f"tp{rank}_pp0_dp0_cp0", tier)]
            assert (sample.hits, sample.misses, sample.written_bytes) == (
                counts["hits"], counts["misses"], counts["written_bytes"]), (rank, tier)
    total = snap.by_tier()
    assert total["host"].hits + total["pool"].hits == 6 + 9
    assert snap.store_total("read_pages") == 6 + 9
    # The pool's capacity is one pool seen by both ranks: one series, from rank 0.
    capacity = [s for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "mooncake_sgl_tier_capacity_bytes" and s.labels["tier"] == "pool"]
    assert [s.labels["tp_rank"] for s in capacity] == ["0"]
    # Latency histograms from both ranks, one series per rank.
    counts = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "mooncake_sgl_tier_put_latency_seconds_count" and s.labels["tier"] == "host"]
    assert sorted(s.labels["tp_rank"] for s in counts) == ["0", "1"]
