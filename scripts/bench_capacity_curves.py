#!/usr/bin/env python3
"""How close the online capacity curve (``policy/curve.py``) is to an exact replay, and what it costs.

For each trace and policy, one replay at ``--capacity`` keeps the curve the store would show online
(a ``CurveFeed`` observing the store, run through ``mooncake_sgl.sim.Simulator``); then one exact
replay per size the curve reports (1/8x to 8x) gives the hit ratio a tier of that size really had.
The table prints both and their difference in points of prefix hit ratio; with ``--before``, also
the estimator this one replaced (``devtools/bench/curves_before.py``), fed the same lookups.

Cost, in the same run (without ``--quick``): the curves alone fed the trace's lookups (no store),
CPU time per looked-up page of this thread for the current estimator and the one before it, then the
current one as a server runs it (``CurveProcess``: the serving side's time and the child's CPU), and
its memory (``tracemalloc``, another pass). ``--rate N`` offers a ``CurveProcess`` N looked-up pages
a second for ``--rate-seconds`` and counts what it dropped.

    python scripts/bench_capacity_curves.py --quick                    # every generated shape
    python scripts/bench_capacity_curves.py --trace gen:scan --before --policies lru --quick
    python scripts/bench_capacity_curves.py --trace gen:chat --cost-pages 20000 --rate 100000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replay_trace import build_policy, load_requests, parse_capacity  # noqa: E402

from devtools.bench.console import comma_choices, run_script, stamped  # noqa: E402
from devtools.bench.curves_before import CurvesBefore  # noqa: E402
from mooncake_sgl.config import PolicyConfig  # noqa: E402
from mooncake_sgl.policy.curve import MULTIPLIERS, TierCurves  # noqa: E402
from mooncake_sgl.policy.curve_feed import CurvesReport  # noqa: E402
from mooncake_sgl.policy.curve_process import CurveProcess  # noqa: E402
from mooncake_sgl.sim.simulator import Simulator  # noqa: E402
from mooncake_sgl.sim.trace import Request, distinct_blocks  # noqa: E402

TRACES = ("gen:chat", "gen:agent", "gen:rag", "gen:scan", "gen:mix", "gen:tenants")
POLICIES = ("lru", "adaptive", "heat")
PAGE_BYTES = 64 << 20  # only whole pages are counted; the size is arbitrary, as in replay_trace
# A curve within this many points of the exact replay at every size is what the estimator promises.
TOLERANCE_POINTS = 2.0


def replay(policy: str, requests: list[Request], blocks: int, curves: bool) -> tuple[float, list]:
    """(hit ratio, curve points of tier 0 as dicts) of one single-tier replay."""
    caps = [blocks * PAGE_BYTES]
    sim = Simulator(build_policy(policy, caps, PolicyConfig(name="heat")), caps, PAGE_BYTES, policy,
                    curves=curves)
    result = sim.run(requests)
    report = sim.store.stats().sections.get("curves")
    points = report.points.get("t0", []) if isinstance(report, CurvesReport) else []
    return result.hit_ratio, [dataclasses.asdict(p) for p in points]


def before_points(policy: str, requests: list[Request], blocks: int) -> list[dict]:
    """The old estimator's points, fed what the store feeds the curves: every lookup after the first
    page is stored (the first request's lookup comes before it)."""
    curve = CurvesBefore(blocks, policy)
    for req in requests[1:]:
        curve.on_lookup(req.keys)
    return [{"multiplier": p.multiplier, "hits": p.hits, "lookups": p.lookups} for p in curve.points()]


def cpu_per_page(feed: object, requests: list[Request]) -> float:
    """Microseconds of this thread's CPU per looked-up page, feeding ``requests`` to ``feed``."""
    pages = max(1, sum(len(req.keys) for req in requests))
    on_lookup = feed.on_lookup  # type: ignore[attr-defined]
    t0 = time.thread_time()
    for req in requests:
        on_lookup(req.keys)
    return 1e6 * (time.thread_time() - t0) / pages


def estimator_cost(policy: str, requests: list[Request], blocks: int, before: bool) -> dict[str, float]:
    """The curves alone, fed every lookup: CPU per looked-up page on this thread (the current
    estimator, and the one before it), then as a server runs them (``CurveProcess``: the serving
    side's time, the child's CPU, how long it lagged behind the last lookup); then, under
    ``tracemalloc``, the bytes and entries the current one holds."""
    caps = [blocks * PAGE_BYTES]
    pages = max(1, sum(len(req.keys) for req in requests))
    curves = TierCurves(caps, policy)
    curves.start(PAGE_BYTES)
    out: dict[str, float] = {"pages": pages, "us_per_page": cpu_per_page(curves, requests)}
    if before:
        out["before_us_per_page"] = cpu_per_page(CurvesBefore(blocks, policy), requests)
    child = CurveProcess(caps, policy)
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
        out.update(process_serving_us_per_page=1e6 * child.busy_seconds / pages,
                   process_child_us_per_page=1e6 * (child.process_seconds - started_cpu) / pages,
                   process_feed_s=fed - t0, process_lag_s=time.perf_counter() - fed,
                   process_dropped_pages=child.dropped_pages)
    finally:
        child.close()
    tracemalloc.start()
    traced = TierCurves(caps, policy)
    traced.start(PAGE_BYTES)
    for req in requests:
        traced.on_lookup(req.keys)
    out["bytes"], _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["entries"] = traced.entries()
    return out


def offered_rate(policy: str, requests: list[Request], blocks: int, rate: float, seconds: float
                 ) -> dict[str, float]:
    """A ``CurveProcess`` offered ``rate`` looked-up pages a second for ``seconds`` (the trace's
    lookups, over again as often as needed), paced as a rank's lookups come: pages offered and
    dropped, the child's CPU per page, and how long it took to catch up after the last."""
    child = CurveProcess([blocks * PAGE_BYTES], policy)
    child.start(PAGE_BYTES)
    try:
        if not child.sync(60):
            raise RuntimeError(f"the curve process did not start: {child.stopped}")
        started_cpu = child.process_seconds
        offered, i, t0 = 0, 0, time.perf_counter()
        while (now := time.perf_counter() - t0) < seconds:
            ahead = offered / rate - now
            if ahead > 0:
                time.sleep(ahead)
            keys = requests[i % len(requests)].keys
            child.on_lookup(keys)
            offered += len(keys)
            i += 1
        fed = time.perf_counter()
        caught_up = child.sync(600)
        return {"rate": rate, "seconds": fed - t0, "offered_pages": offered,
                "offered_per_s": offered / (fed - t0), "dropped_pages": child.dropped_pages,
                "child_us_per_page": 1e6 * (child.process_seconds - started_cpu) / max(1, offered),
                "lag_s": time.perf_counter() - fed if caught_up else float("inf")}
    finally:
        child.close()


def _cell(online: float, exact: float) -> str:
    return f"{100 * online:5.1f}/{100 * exact:5.1f} {100 * (online - exact):+4.1f}"


def print_accuracy(cells: list[dict], traces: list[str], policies: list[str], capacity: str,
                   key: str, title: str) -> float:
    """One table of ``key`` (``online`` or ``before``) against the exact replays; its largest
    difference in points."""
    rows = [c for c in cells if key in c]
    if not rows:
        return 0.0
    print(f"\n{title}: estimate vs exact replay at each size, prefix hit ratio in percent and the "
          f"difference in points; the tier's own size is {capacity} of each trace's distinct blocks")
    print(f"{'trace':<22} {'policy':<9} " + " ".join(f"{m:>16g}x" for m in MULTIPLIERS) + "  largest")
    worst = 0.0
    for trace in traces:
        for policy in policies:
            row = [c for c in rows if c["trace"] == trace and c["policy"] == policy]
            if not row:
                continue
            diffs = [abs(c[key] - c["exact"]) for c in row]
            worst = max(worst, *diffs)
            print(f"{Path(trace).name[:22]:<22} {policy:<9} "
                  + " ".join(_cell(c[key], c["exact"]) for c in row) + f"  {100 * max(diffs):5.2f}")
    print(f"largest difference: {100 * worst:.2f} points (promised: within {TOLERANCE_POINTS:g})")
    return 100 * worst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", action="append", default=[],
                   help="a Mooncake-format JSONL trace or gen:NAME (repeatable; default: "
                        + ", ".join(TRACES) + ")")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma list of lru, adaptive, heat")
    p.add_argument("--capacity", default="4%",
                   help="the tier's own size: blocks, or a share of the trace's distinct blocks "
                        "(default 4%%)")
    p.add_argument("--limit", type=int, help="replay only the first N requests of each trace")
    p.add_argument("--seed", type=int, help="seed of the gen: workloads (default: the documented one)")
    p.add_argument("--quick", action="store_true", help="no cost measurement (the accuracy table only)")
    p.add_argument("--cost-only", action="store_true", help="no accuracy table (no exact replays)")
    p.add_argument("--before", action="store_true",
                   help="also the estimator this one replaced: its table, and its cost beside this one's")
    p.add_argument("--cost-pages", type=int,
                   help="measure the cost over the first lookups of each trace up to this many pages")
    p.add_argument("--rate", type=float, help="offer a curve process this many looked-up pages a second")
    p.add_argument("--rate-seconds", type=float, default=10.0, help="for how long (default 10)")
    p.add_argument("--json", type=Path, help="write every cell here")
    args = p.parse_args(argv)
    policies = comma_choices(p, "--policies", args.policies, POLICIES)
    traces = args.trace or list(TRACES)

    cells: list[dict] = []
    costs: list[dict] = []
    rates: list[dict] = []
    for trace in traces:
        requests = load_requests(trace, args.seed, args.limit)
        if not requests:
            p.error(f"{trace}: no requests")
        blocks = parse_capacity(args.capacity, distinct_blocks(requests))
        for policy in policies:
            points: list[dict] = []
            exact: dict[int, float] = {}  # hit ratio of the exact replay, by size
            if not args.cost_only:
                stamped(f"{trace}, {policy}: online curve at {blocks} blocks")
                exact[blocks], points = replay(policy, requests, blocks, curves=True)
            before = before_points(policy, requests, blocks) if args.before and points else []
            for i, point in enumerate(points):
                size = point["capacity_pages"]
                if size not in exact:
                    exact[size] = replay(policy, requests, size, curves=False)[0]
                cell = {"trace": trace, "policy": policy, "multiplier": point["multiplier"],
                        "blocks": size, "exact": exact[size],
                        "online": point["hits"] / point["lookups"] if point["lookups"] else 0.0}
                if before:
                    b = before[i]
                    cell["before"] = b["hits"] / b["lookups"] if b["lookups"] else 0.0
                cell["diff_points"] = 100 * (cell["online"] - cell["exact"])
                cells.append(cell)
            if not args.quick:
                fed = requests
                if args.cost_pages:
                    total, n = 0, 0
                    while n < len(requests) and total < args.cost_pages:
                        total += len(requests[n].keys)
                        n += 1
                    fed = requests[:n]
                stamped(f"{trace}, {policy}: cost over {sum(len(r.keys) for r in fed)} looked-up pages")
                costs.append({"trace": trace, "policy": policy, "blocks": blocks,
                              **estimator_cost(policy, fed, blocks, args.before)})
            if args.rate:
                stamped(f"{trace}, {policy}: {args.rate:g} pages/s for {args.rate_seconds:g} s")
                rates.append({"trace": trace, "policy": policy, "blocks": blocks,
                              **offered_rate(policy, requests, blocks, args.rate, args.rate_seconds)})

    worst = print_accuracy(cells, traces, policies, args.capacity, "online", "this estimator")
    worst_before = print_accuracy(cells, traces, policies, args.capacity, "before", "the one before")
    if costs:
        print("\nCPU per looked-up page, microseconds: the curves on this thread (and the estimator "
              "before), then in their own process (the serving side / the child)")
        print(f"{'trace':<22} {'policy':<9} {'blocks':>7} {'inline':>8} {'before':>8} {'serving':>8} "
              f"{'child':>8} {'lag s':>6} {'dropped':>8} {'KiB held':>9} {'entries':>8}")
        for c in costs:
            before = f"{c['before_us_per_page']:>8.1f}" if "before_us_per_page" in c else f"{'':>8}"
            print(f"{Path(c['trace']).name[:22]:<22} {c['policy']:<9} {c['blocks']:>7} "
                  f"{c['us_per_page']:>8.2f} {before} {c['process_serving_us_per_page']:>8.2f} "
                  f"{c['process_child_us_per_page']:>8.2f} {c['process_lag_s']:>6.1f} "
                  f"{c['process_dropped_pages']:>8} {c['bytes'] / 1024:>9.0f} {c['entries']:>8}")
    if rates:
        print("\noffered to a curve process: looked-up pages a second, what it dropped, its CPU per page")
        print(f"{'trace':<22} {'policy':<9} {'offered/s':>10} {'pages':>9} {'dropped':>8} "
              f"{'child us':>9} {'lag s':>6}")
        for r in rates:
            print(f"{Path(r['trace']).name[:22]:<22} {r['policy']:<9} {r['offered_per_s']:>10.0f} "
                  f"{r['offered_pages']:>9} {r['dropped_pages']:>8} {r['child_us_per_page']:>9.2f} "
                  f"{r['lag_s']:>6.1f}")
    if args.json:
        args.json.write_text(json.dumps({"capacity": args.capacity, "multipliers": MULTIPLIERS,
                                         "cells": cells, "costs": costs, "rates": rates,
                                         "largest_diff_points": worst,
                                         "largest_diff_points_before": worst_before}, indent=2))
    return 0


if __name__ == "__main__":
    run_script(main)
