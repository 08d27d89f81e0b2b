"""What ``--enable-metrics`` costs the store: put/get through ``TieredStore`` with metrics off and on.

Two setups: host DRAM alone (the fastest calls, so the largest relative cost of the per-call hook)
and host over LMDB (write-through); placement inline so both stores of a pair do the same work.
"on" runs what the backend runs under ``--enable-metrics``: the exporter's sync thread at its
production interval and the per-tier-call latency hook. Rounds alternate off/on so other load on
the machine hits both alike. It runs in a child process with ``PROMETHEUS_MULTIPROC_DIR`` set, as
SGLang's schedulers do, because prometheus_client picks its value storage (mmap'd files) at import.

    python -m devtools.metrics_overhead --sizes 64KiB,1MiB --batch 128 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

GB = 1e9
_HOOK_CALLS = 20000  # arbitrary: enough for a stable per-call mean


SETUPS = ("host", "host+lmdb")


def _store(setup: str, path: Path, page: int, batch: int):  # noqa: ANN202 (TieredStore, imported late)
    from mooncake_sgl.config import HostTierConfig, LmdbTierConfig
    from mooncake_sgl.policy.lru import LruPolicy
    from mooncake_sgl.store import TieredStore
    from mooncake_sgl.tiers.host import HostTier
    from mooncake_sgl.tiers.ssd import LmdbTier

    tiers = [HostTier(HostTierConfig(capacity=2 * batch * page, slot_size=page, pin_memory=False))]
    if setup == "host+lmdb":
        tiers.append(LmdbTier(LmdbTierConfig(path=str(path), capacity=max(64 << 20, 8 * batch * page))))
    return TieredStore(tiers, LruPolicy(len(tiers)), mover="inline")


def _pages(batch: int, page: int, fill: int) -> list[list[memoryview]]:
    buf = np.full(batch * page, fill, dtype=np.uint8)
    half = page // 2  # two segments per page, like SGLang's K and V
    return [[memoryview(buf[i * page:i * page + half]), memoryview(buf[i * page + half:(i + 1) * page])]
            for i in range(batch)]


def _timed(fn: Callable[[], list[bool]]) -> float:
    t0 = time.perf_counter()
    ok = fn()
    elapsed = time.perf_counter() - t0
    if not all(ok):
        raise RuntimeError("a page was not stored or not read back")
    return elapsed


def measure(setup: str, page: int, batch: int, rounds: int, workdir: Path) -> dict[str, dict[str, float]]:
    """GB/s of put and get, metrics off vs on, best and median of ``rounds`` interleaved rounds."""
    from mooncake_sgl.metrics.exporter import StoreExporter

    stores = {m: _store(setup, workdir / m, page, batch) for m in ("off", "on")}
    on = stores["on"]
    exporter = StoreExporter(on.stats, {"tp_rank": 0, "pp_rank": 0, "dp_rank": 0}).start()
    on.time_tier_calls(exporter.observe_tier(on))
    src, dst = _pages(batch, page, 7), _pages(batch, page, 0)
    times: dict[str, dict[str, list[float]]] = {m: {"put": [], "get": []} for m in stores}
    try:
        for r in range(rounds + 1):  # round 0 warms both up (first touch of memory), untimed
            for mode in ("off", "on") if r % 2 else ("on", "off"):  # neither always goes first
                store = stores[mode]
                keys = [f"{mode}-{r}-{i}".encode() for i in range(batch)]
                put = _timed(lambda: store.put_from(keys, src))  # noqa: B023 (called at once)
                get = _timed(lambda: store.get_into(keys, dst))  # noqa: B023
                if r:
                    times[mode]["put"].append(put)
                    times[mode]["get"].append(get)
        t0 = time.perf_counter()
        exporter.sync()
        sync_s = time.perf_counter() - t0
        hook = on.latency_hook
        t0 = time.perf_counter()
        for _ in range(_HOOK_CALLS):
            hook(on.tiers[0], "get", 1e-4)
        hook_s = (time.perf_counter() - t0) / _HOOK_CALLS
    finally:
        exporter.close()
        for store in stores.values():
            store.close()
    nbytes = batch * page
    out: dict[str, dict[str, float]] = {}
    for mode, ops in times.items():
        for op, ts in ops.items():
            out.setdefault(mode, {})[f"{op}_best_gbps"] = nbytes / min(ts) / GB
            out[mode][f"{op}_median_gbps"] = nbytes / statistics.median(ts) / GB
    # Each round's off and on ran back to back: their ratio cancels slow drifts in machine load,
    # so the median of per-round ratios is steadier than a ratio of medians.
    out["on/off"] = {f"{op}_paired_median": statistics.median(
        off / on for off, on in zip(times["off"][op], times["on"][op])) for op in ("put", "get")}
    out["on"]["sync_ms"] = sync_s * 1e3
    out["on"]["hook_us_per_tier_call"] = hook_s * 1e6
    return out


def run_in_child(sizes: list[int], batch: int, rounds: int, workdir: str | None = None
                 ) -> dict[str, dict[str, dict[str, float]]]:
    """``measure`` for each page size in a fresh process in prometheus_client's multiprocess mode.

    Returns ``{"<setup> <page size>": {"off"|"on"|"on/off": {metric: value}}}``.
    """
    with tempfile.TemporaryDirectory(prefix="mooncake_sgl_overhead_", dir=workdir) as tmp:
        prom = os.path.join(tmp, "prom")
        os.mkdir(prom)
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": prom,
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        res = subprocess.run([sys.executable, "-m", "devtools.metrics_overhead", "--child",
                              "--sizes", ",".join(map(str, sizes)), "--batch", str(batch),
                              "--rounds", str(rounds), "--dir", tmp],
                             capture_output=True, text=True, env=env, check=False)
        if res.returncode:
            raise RuntimeError(f"metrics overhead run failed:\n{res.stderr[-4000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    from .bench.console import human

    lines = [f"{'tiers':>10} {'page':>6} {'op':>4} {'metrics off':>12} {'metrics on':>11} {'on/off':>7}"
             "   (GB/s, median of interleaved rounds; on/off: median of per-round ratios)"]
    for name, r in results.items():
        setup, size = name.split()
        for op in ("put", "get"):
            k = f"{op}_median_gbps"
            lines.append(f"{setup:>10} {human(int(size)):>6} {op:>4} {r['off'][k]:>12.2f} "
                         f"{r['on'][k]:>11.2f} {r['on/off'][f'{op}_paired_median']:>7.3f}")
    hook = statistics.median(r["on"]["hook_us_per_tier_call"] for r in results.values())
    sync = statistics.median(r["on"]["sync_ms"] for r in results.values())
    lines.append(f"metrics on: the latency hook costs {hook:.1f} us per tier call (in multiprocess mode); "
                 f"one sync of the counters {sync:.2f} ms, once a second, off SGLang's threads")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from mooncake_sgl.config import parse_size

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64KiB,1MiB", help="page sizes, comma separated")
    ap.add_argument("--batch", type=int, default=128, help="pages per put/get call")
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds per mode")
    ap.add_argument("--dir", default=None, help="scratch directory (LMDB files)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = [int(parse_size(s)) for s in args.sizes.split(",")]
    if args.child:
        out = {}
        for setup in SETUPS:
            for size in sizes:
                with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                    out[f"{setup} {size}"] = measure(setup, size, args.batch, args.rounds, Path(tmp))
        print(json.dumps(out))
        return 0
    results = run_in_child(sizes, args.batch, args.rounds, args.dir)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
