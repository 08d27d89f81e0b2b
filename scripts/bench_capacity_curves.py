#!/usr/bin/env python3
"""How close the online capacity curve (``policy/curve.py``) is to an exact replay, and what it costs.

For each trace and policy, one replay at ``--capacity`` keeps the curve the store would show online
(a ``CurveFeed`` observing the store, run through ``mooncake_sgl.sim.Simulator``); then
one exact replay per size the curve reports (1/8x to 8x) gives the hit ratio a tier of that size
really had. The table prints both and their difference in points of prefix hit ratio.

Cost, in the same run: the curves alone fed the trace's lookups (no store), per looked-up page, as a
server runs them (``CurveProcess``: the serving side's time and the child's CPU) beside the same
curves on the feeding thread (the baseline), then their memory (``tracemalloc``, another pass) and
entries, and the simulator's replay with and without them.

    python scripts/bench_capacity_curves.py                                   # gen:chat,agent,rag
    python scripts/bench_capacity_curves.py --trace TRACE.jsonl --trace gen:chat --json curves.json
    python scripts/bench_capacity_curves.py --policies lru --limit 500 --quick   # seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replay_trace import build_policy, load_requests, parse_capacity  # noqa: E402

from devtools.bench.console import comma_choices, run_script, stamped  # noqa: E402
from mooncake_sgl.config import PolicyConfig  # noqa: E402
from mooncake_sgl.policy.curve import MULTIPLIERS, TierCurves  # noqa: E402
from mooncake_sgl.policy.curve_process import CurveProcess  # noqa: E402
from mooncake_sgl.sim.simulator import Simulator  # noqa: E402
from mooncake_sgl.sim.trace import Request, distinct_blocks  # noqa: E402

TRACES = ("gen:chat", "gen:agent", "gen:rag")
POLICIES = ("lru", "adaptive", "heat")
PAGE_BYTES = 64 << 20  # only whole pages are counted; the size is arbitrary, as in replay_trace
# A curve within this many points of the exact replay at every size is what the estimator promises.
TOLERANCE_POINTS = 2.0


def replay(policy: str, requests: list[Request], blocks: int, curves: bool) -> tuple[float, list, float]:
    """(hit ratio, curve points of tier 0 as dicts, seconds) of one single-tier replay."""
    caps = [blocks * PAGE_BYTES]
    sim = Simulator(build_policy(policy, caps, PolicyConfig(name="heat")), caps, PAGE_BYTES, policy,
                    curves=curves)
    t0 = time.perf_counter()
    result = sim.run(requests)
    seconds = time.perf_counter() - t0
    points = sim.store.stats()["curves"]["points"].get("t0", []) if curves else []
    return result.hit_ratio, points, seconds


def estimator_cost(policy: str, requests: list[Request], blocks: int) -> dict[str, float]:
    """The curves alone, fed every lookup: microseconds per looked-up page as they run in a server
    (``CurveProcess``: the serving side's time handing the keys over, the child's CPU running the
    miniatures, and the seconds it lagged behind the last lookup), and on the feeding thread
    (``TierCurves``, as the simulator keeps them; no ``tracemalloc``, which slows code that
    allocates much); then, in a last pass under ``tracemalloc``, the bytes and entries they hold."""

    def feed() -> tuple[TierCurves, float]:
        curves = TierCurves([blocks * PAGE_BYTES], policy)
        curves.start(PAGE_BYTES)
        t0 = time.perf_counter()
        for req in requests:
            curves.on_lookup(req.keys)
        return curves, time.perf_counter() - t0

    pages = max(1, sum(len(req.keys) for req in requests))
    child = CurveProcess([blocks * PAGE_BYTES], policy)
    child.start(PAGE_BYTES)
    try:
        if not child.sync(60):
            raise RuntimeError(f"the curve process did not start: {child.stopped}")
        started_cpu = child.process_seconds  # its interpreter and imports
        t0 = time.perf_counter()
        for req in requests:
            child.on_lookup(req.keys)
        fed = time.perf_counter()
        if not child.sync(3600):
            raise RuntimeError(f"the curve process did not catch up: {child.stopped}")
        lag = time.perf_counter() - fed
        process = {"process_serving_us_per_page": 1e6 * child.busy_seconds / pages,
                   "process_child_us_per_page": 1e6 * (child.process_seconds - started_cpu) / pages,
                   "process_feed_s": fed - t0, "process_lag_s": lag,
                   "process_dropped_pages": child.dropped_pages}
    finally:
        child.close()
    _, seconds = feed()
    tracemalloc.start()
    curves, traced = feed()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"us_per_page": 1e6 * seconds / pages, "us_per_page_traced": 1e6 * traced / pages,
            "bytes": held, "entries": curves.entries(), **process}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", action="append", default=[],
                   help="a Mooncake-format JSONL trace or gen:chat|agent|rag (repeatable; default: "
                        + ", ".join(TRACES) + ")")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma list of lru, adaptive, heat")
    p.add_argument("--capacity", default="4%",
                   help="the tier's own size: blocks, or a share of the trace's distinct blocks "
                        "(default 4%%)")
    p.add_argument("--limit", type=int, help="replay only the first N requests of each trace")
    p.add_argument("--seed", type=int, help="seed of the gen: workloads (default: the documented one)")
    p.add_argument("--quick", action="store_true", help="no cost measurement (the accuracy table only)")
    p.add_argument("--json", type=Path, help="write every cell here")
    args = p.parse_args(argv)
    policies = comma_choices(p, "--policies", args.policies, POLICIES)
    traces = args.trace or list(TRACES)

    cells, costs, worst = [], [], 0.0
    for trace in traces:
        requests = load_requests(trace, args.seed, args.limit)
        if not requests:
            p.error(f"{trace}: no requests")
        blocks = parse_capacity(args.capacity, distinct_blocks(requests))
        for policy in policies:
            stamped(f"{trace}, {policy}: online curve at {blocks} blocks")
            ratio, points, with_s = replay(policy, requests, blocks, curves=True)
            for point in points:
                size = point["capacity_pages"]
                exact = ratio if size == blocks else replay(policy, requests, size, curves=False)[0]
                online = point["hits"] / point["lookups"] if point["lookups"] else 0.0
                diff = 100 * (online - exact)
                worst = max(worst, abs(diff))
                cells.append({"trace": trace, "policy": policy, "multiplier": point["multiplier"],
                              "blocks": size, "online": online, "exact": exact, "diff_points": diff})
            if not args.quick:
                _, _, without_s = replay(policy, requests, blocks, curves=False)
                _, _, again_s = replay(policy, requests, blocks, curves=True)
                cost = estimator_cost(policy, requests, blocks)
                costs.append({"trace": trace, "policy": policy, "blocks": blocks,
                              "replay_s_with": (with_s + again_s) / 2, "replay_s_without": without_s,
                              **cost})

    print(f"\nprefix hit ratio: online curve (kept at the tier's own size) vs exact replay at each size,"
          f" in points; the tier's own size is {args.capacity} of each trace's distinct blocks")
    print(f"{'trace':<22} {'policy':<9} " + " ".join(f"{m:>16g}x" for m in MULTIPLIERS))
    for trace in traces:
        for policy in policies:
            row = [c for c in cells if c["trace"] == trace and c["policy"] == policy]
            print(f"{Path(trace).name[:22]:<22} {policy:<9} " + " ".join(
                f"{100 * c['online']:5.1f}/{100 * c['exact']:5.1f} {c['diff_points']:+4.1f}" for c in row))
    print(f"largest difference: {worst:.2f} points (promised: within {TOLERANCE_POINTS:g})")
    if costs:
        print("\nper looked-up page: in a server (the serving side / the curve process's CPU), against the"
              " same curves on the feeding thread (the simulator's)")
        print(f"{'trace':<22} {'policy':<9} {'serving us':>10} {'process us':>10} {'inline us':>10} "
              f"{'serving/inline':>14} {'lag s':>6} {'KiB held':>9} {'entries':>8} "
              f"{'replay with/without':>20}")
        for c in costs:
            print(f"{Path(c['trace']).name[:22]:<22} {c['policy']:<9} "
                  f"{c['process_serving_us_per_page']:>10.2f} "
                  f"{c['process_child_us_per_page']:>10.1f} {c['us_per_page']:>10.1f} "
                  f"{c['process_serving_us_per_page'] / c['us_per_page']:>14.3f} {c['process_lag_s']:>6.1f} "
                  f"{c['bytes'] / 1024:>9.0f} {c['entries']:>8} "
                  f"{c['replay_s_with'] / c['replay_s_without']:>19.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"capacity": args.capacity, "multipliers": MULTIPLIERS,
                                         "cells": cells, "costs": costs, "largest_diff_points": worst},
                                        indent=2))
    return 0


if __name__ == "__main__":
    run_script(main)
