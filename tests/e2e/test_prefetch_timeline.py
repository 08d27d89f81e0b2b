"""The prefetch tracer (``devtools/bench/prefetch_trace``) wraps SGLang's host-pool staging of a
storage hit in a real sglang import, and ``devtools.bench.prefetch_timeline`` reads its lines back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devtools.bench.prefetch_timeline import load, report, summary

ROOT = Path(__file__).resolve().parents[2]


def test_the_tracer_wraps_sglangs_staging_and_every_backends_calls_only_when_asked(tmp_path: Path) -> None:
    probe = ("import sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller as h, "
             "sglang.srt.managers.cache_controller as c, sglang.srt.mem_cache.unified_radix_cache as u, "
             "sglang.srt.managers.scheduler as s, mooncake_sgl.hicache.backend as b; "
             "traced = lambda f: f.__code__.co_filename.endswith('sitecustomize.py'); "
             "print(traced(h.HybridCacheController.allocate_storage_hit), "
             "traced(b.MooncakeSglStorage.batch_set_v1), traced(c.HiCacheController._page_transfer), "
             "traced(u.UnifiedRadixCache.check_prefetch_progress), "
             "traced(u.UnifiedRadixCache.prefetch_from_storage), traced(s.Scheduler.run_batch))")
    tracer = str(ROOT / "devtools" / "bench" / "prefetch_trace")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tracer, str(ROOT)])}
    on = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                        env={**env, "MOONCAKE_SGL_PREFETCH_TRACE": str(tmp_path / "t.jsonl")})
    assert on.stdout.split() == ["True"] * 6, on.stderr[-2000:]
    off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert off.stdout.split() == ["False"] * 6, off.stderr[-2000:]


def _write(path: Path, events: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_a_refusal_is_read_against_the_host_pool_and_the_calls_before_it(tmp_path: Path) -> None:
    base = {"host_size": 16384, "min_tokens": 256, "backups_queued": 0, "prefetching": 1}
    _write(tmp_path / "ours.jsonl.11", [
        {"t": 100.0, "kind": "alloc", "rid": "a", "hit": 3072, "host_free_before": 4096, "evicted": 0,
         "host_free_after": 4096, "allocated": 3072, "device_used": 9000, **base},
        {"t": 101.5, "kind": "alloc", "rid": "b", "hit": 4608, "host_free_before": 128, "evicted": 0,
         "host_free_after": 128, "allocated": 0, "device_used": 15000, **base},
    ])
    _write(tmp_path / "ours.jsonl.12", [
        {"t": 101.1, "start": 101.0, "kind": "set", "seconds": 0.004, "pages": 24},
        {"t": 90.0, "start": 90.0, "kind": "get", "seconds": 0.001, "pages": 48},
    ])
    s = summary(load(tmp_path / "ours.jsonl"))
    assert (s["allocations"], s["refused"], s["refused_with_nothing_evictable"]) == (2, 1, 1)
    assert (s["hit_tokens"], s["allocated_tokens"], s["set_calls"]) == (7680, 3072, 1)
    text = report(tmp_path / "ours.jsonl")
    assert "1 refused (host_capacity)" in text
    assert "-500.0 ms  batch_set 24 pages, 4.0 ms" in text  # inside the window before the refusal
    assert "-1500.0 ms  stage 3072" in text and "+0.0 ms  stage 4608" in text
    assert "batch_get 48" not in text.split("one refusal")[1]  # 11.5 s earlier: outside the window
