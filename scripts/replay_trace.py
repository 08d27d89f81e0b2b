#!/usr/bin/env python3
"""Replay a Mooncake-format request trace through placement policies and report prefix hit ratios.

What runs: the policy objects themselves (``mooncake_sgl.policy``: ``adaptive``, ``heat`` and
``lru``, built by the same factory the store uses, from the same ``PolicyConfig``; ``default`` is
whichever of them the product's default ``policy.name`` is, so a benchmark measures what users get),
driven by ``mooncake_sgl.sim.Simulator``, which runs the real ``TieredStore`` (placement inline, on
the trace's clock) over zero-byte tiers that keep only page sizes, so a replay exercises the store's
own lookup, admission, eviction, demotion and promotion code without moving bytes. ``arc``, ``lirs``
and ``lfuda`` (per tier) are simulator-only reference policies (the experts ``adaptive`` chooses
among, each alone); ``belady`` is the offline optimum for page hits (MIN with bypass), single tier
only.

Reports, per capacity (single tier) and per policy: prefix hit ratio (the leading run of a request's
blocks found cached, as SGLang counts it) and the ratio to LRU; for ``--tiers`` runs also the hits
per tier (share of hits served by the fastest tier) and bytes written / promoted / demoted per tier.
``--timeline N`` replays the online policies side by side at each single-tier capacity and prints
their hit ratios per N requests and from the start, and the requests at which an adaptive leader
changed: when a policy gains or loses its lead, not only where it ends.

The trace is a Mooncake-format JSONL file, or ``gen:chat``, ``gen:agent``, ``gen:rag`` for a seeded
generated workload (``mooncake_sgl.sim.gen_suite``; ``--seed``).

Examples:
    python scripts/replay_trace.py synthetic_trace.jsonl \\
        --capacity-blocks 0.5%,2%,9% --policy lru,arc,lirs,lfuda,heat,default,belady --tiers 2%:36% \\
        --plot docs/replay_hit_ratio.png --json /tmp/replay.json
    python scripts/replay_trace.py gen:agent --capacity-blocks 0.5%,2%,9% --policy lru,default
    python scripts/replay_trace.py TRACE --capacity-blocks 500 --policy heat --limit 300   # smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

import mooncake_sgl.policy  # noqa: E402
import mooncake_sgl.sim.reference  # noqa: E402
from mooncake_sgl.api import PlacementPolicy  # noqa: E402
from mooncake_sgl.config import PolicyConfig, parse_size  # noqa: E402
from mooncake_sgl.config_text import load_config_file  # noqa: E402
from mooncake_sgl.policy import policy_for_capacities  # noqa: E402
from mooncake_sgl.policy.adaptive import AdaptivePolicy  # noqa: E402
from mooncake_sgl.sim.gen_suite import GENERATORS, generate_requests  # noqa: E402
from mooncake_sgl.sim.reference import ArcPolicy, LfuDaPolicy, LirsPolicy, belady_prefix_hits  # noqa: E402
from mooncake_sgl.sim.simulator import SimResult, Simulator  # noqa: E402
from mooncake_sgl.sim.trace import Request, distinct_blocks, load_trace  # noqa: E402

REFERENCES = {"arc": ArcPolicy, "lirs": LirsPolicy, "lfuda": LfuDaPolicy}  # simulator-only
POLICIES = ("lru", "arc", "lirs", "lfuda", "heat", "adaptive", "default", "belady")
# Arbitrary default page size: one 512-token block of a Llama-3-8B-like model in bf16
# (32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes x 512 tokens).
DEFAULT_PAGE_BYTES = 64 << 20


def parse_capacity(text: str, distinct: int) -> int:
    """``4000`` blocks, or ``9%`` of the trace's distinct blocks."""
    text = text.strip()
    try:
        if text.endswith("%"):
            return max(1, round(distinct * float(text[:-1]) / 100.0))
        return max(1, int(text))
    except ValueError:
        raise SystemExit(f"bad capacity {text!r}: expected a block count like 4000 or a share "
                         "like 9%") from None


def build_policy(policy: str, caps: list[int], config: PolicyConfig) -> PlacementPolicy:
    if policy in REFERENCES:
        return REFERENCES[policy](caps)
    name = PolicyConfig().name if policy == "default" else policy
    # ``config`` holds heat's knobs (and the pins every policy keeps); another policy rejects them.
    chosen = config if name == "heat" else PolicyConfig(name=name, pins=config.pins)
    return policy_for_capacities(chosen, caps)


def run_one(policy: str, requests: list[Request], blocks: list[int], page_bytes: int,
            config: PolicyConfig, quiet: bool) -> SimResult:
    caps = [b * page_bytes for b in blocks]
    if policy == "belady":
        if len(blocks) != 1:
            raise ValueError("belady is a single-tier bound")
        hits, total = belady_prefix_hits(requests, blocks[0])
        return SimResult("belady", requests=len(requests), lookup_pages=total, hit_pages=hits)
    sim = Simulator(build_policy(policy, caps, config), caps, page_bytes, policy)
    label = f"{policy:>6} {'+'.join(map(str, blocks))} blocks"
    with tqdm(total=len(requests), desc=label, unit="req", disable=quiet, leave=False,
              mininterval=0.5) as bar:
        return sim.run(requests, bar.update)


def measure_cost(policy: str, requests: list[Request], blocks: int, page_bytes: int,
                 config: PolicyConfig) -> dict[str, float]:
    """Replay speed (page lookups per second through the whole simulator loop) and the memory the
    policy holds at the end of the replay (bytes allocated by policy code and still alive, from a
    second replay under ``tracemalloc``, which slows it down)."""
    started = time.perf_counter()
    res = run_one(policy, requests, [blocks], page_bytes, config, True)
    seconds = time.perf_counter() - started
    code = [tracemalloc.Filter(True, str(Path(mooncake_sgl.policy.__file__).parent / "*")),
            tracemalloc.Filter(True, mooncake_sgl.sim.reference.__file__)]
    caps = [blocks * page_bytes]
    tracemalloc.start()
    try:
        pol = build_policy(policy, caps, config)
        Simulator(pol, caps, page_bytes, policy).run(requests)
        held = sum(s.size for s in tracemalloc.take_snapshot().filter_traces(code).statistics("filename"))
    finally:
        tracemalloc.stop()
    return {"lookups_per_s": res.lookup_pages / seconds, "seconds": seconds, "policy_bytes": held}


def timeline(policies: list[str], requests: list[Request], blocks: int, page_bytes: int,
             config: PolicyConfig, every: int) -> dict:
    """The online policies replayed side by side at one capacity: each one's prefix hit ratio over every
    ``every`` requests and from the start, and the request at which an adaptive policy's leader
    changed (what it follows, and when, is the whole story of an adaptive cell)."""
    caps = [blocks * page_bytes]
    sims = {p: Simulator(build_policy(p, caps, config), caps, page_bytes, p)
            for p in policies if p != "belady"}
    leaders = {p: s.policy.leader for p, s in sims.items() if isinstance(s.policy, AdaptivePolicy)}
    current: dict[str, str | None] = {p: None for p in leaders}
    hits = dict.fromkeys(sims, 0)
    total_hits = dict.fromkeys(sims, 0)
    pages = total_pages = 0
    rows, changes = [], []
    for i, req in enumerate(requests):
        for p, sim in sims.items():
            hits[p] += sim.request(req.keys, req.t)
        pages += len(req.keys)
        for p, leader in leaders.items():
            now = leader(0)
            if now != current[p]:
                changes.append({"request": i, "policy": p, "from": current[p], "to": now})
                current[p] = now
        if (i + 1) % every == 0 or i + 1 == len(requests):
            total_pages += pages
            for p in sims:
                total_hits[p] += hits[p]
            rows.append({"requests": i + 1,
                         "hit_ratio": {p: hits[p] / pages if pages else 0.0 for p in sims},
                         "cumulative": {p: total_hits[p] / total_pages if total_pages else 0.0
                                        for p in sims},
                         "leader": dict(current)})
            hits = dict.fromkeys(sims, 0)
            pages = 0
    return {"capacity_blocks": blocks, "every": every, "rows": rows, "leader_changes": changes}


def print_timeline(line: dict) -> None:
    rows = line["rows"]
    names = list(rows[0]["hit_ratio"]) if rows else []
    print(f"\ntimeline at {line['capacity_blocks']} blocks: prefix hit ratio (%) over each "
          f"{line['every']} requests (from the start in brackets), and adaptive leaders")
    print(f"{'requests':>9} " + " ".join(f"{p:>15}" for p in names) + "  leader")
    changes = iter(line["leader_changes"])
    change = next(changes, None)
    for row in rows:
        while change is not None and change["request"] < row["requests"]:
            if change["from"] is not None:
                print(f"  request {change['request'] + 1}: {change['policy']} now follows {change['to']}"
                      f" (was {change['from']})")
            change = next(changes, None)
        print(f"{row['requests']:>9} " + " ".join(
            f"{100 * row['hit_ratio'][p]:6.2f} ({100 * row['cumulative'][p]:5.2f})" for p in names)
            + "  " + ", ".join(f"{p}: {leader}" for p, leader in row["leader"].items()))


def load_requests(trace: str, seed: int | None, limit: int | None) -> list[Request]:
    """A trace file's requests, or a generated workload's (``gen:NAME``)."""
    if trace.startswith("gen:"):
        name = trace[len("gen:"):]
        if name not in GENERATORS:
            raise SystemExit(f"unknown generated workload {name!r}; expected one of gen:"
                             + ", gen:".join(GENERATORS))
        return generate_requests(name, seed)[:limit]
    return load_trace(trace, limit)


def _fields(config: PolicyConfig) -> dict:
    return {f: getattr(config, f) for f in config.__struct_fields__}


def plot(results: dict[str, dict[int, float]], distinct: int, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"lru": "o-", "arc": "s-", "lirs": "^-", "lfuda": "v-", "heat": "D-", "adaptive": "*-",
              "default": "*-", "belady": "k--"}
    for policy, by_cap in results.items():
        caps = sorted(by_cap)
        ax.plot([100.0 * c / distinct for c in caps], [100.0 * by_cap[c] for c in caps],
                styles.get(policy, "x-"), label=policy)
    ax.set_xscale("log")
    shares = sorted({100.0 * c / distinct for by_cap in results.values() for c in by_cap})
    ax.set_xticks(shares, [f"{s:.3g}%" for s in shares])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("capacity (% of distinct blocks, log scale)")
    ax.set_ylabel("prefix hit ratio (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Replay a Mooncake trace through placement policies.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("trace", type=Path, help="Mooncake-format JSONL file, or gen:" + "|gen:".join(GENERATORS))
    ap.add_argument("--seed", type=int, help="seed of a gen: workload (default: the documented one)")
    ap.add_argument("--capacity-blocks", default="2%,9%,36%",
                    help="single-tier capacities: block counts or shares of distinct blocks (2%%,9%%,36%%)")
    ap.add_argument("--policy", default=",".join(POLICIES), help="comma list of " + ", ".join(POLICIES))
    ap.add_argument("--tiers", action="append", default=[],
                    help="a multi-tier run, capacities fastest first separated by ':' (e.g. 2%%:36%% "
                         "for small DRAM over larger LMDB); repeatable")
    ap.add_argument("--page-bytes", default=str(DEFAULT_PAGE_BYTES), help="bytes per block (default 64MiB)")
    ap.add_argument("--config", type=Path, help="YAML/JSON store config whose policy section tunes heat")
    ap.add_argument("--sketch", choices=("count_min", "decay"), help="override the heat sketch")
    ap.add_argument("--half-life", help="override the decay sketch's half-life (e.g. 2m)")
    ap.add_argument("--half", choices=("first", "second"), help="replay only one half of the trace")
    ap.add_argument("--limit", type=int, help="replay only the first N requests (smoke runs)")
    ap.add_argument("--plot", type=Path, help="PNG of hit ratio vs capacity")
    ap.add_argument("--json", type=Path, help="write all results here")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--cost", action="store_true",
                    help="also measure each online policy's replay speed (page lookups/s) and the memory "
                         "it holds at the end (tracemalloc), per single-tier capacity")
    ap.add_argument("--timeline", type=int, metavar="N",
                    help="also replay the online policies side by side per single-tier capacity and print "
                         "each one's hit ratio over every N requests, and when an adaptive leader changed")
    args = ap.parse_args(argv)
    if args.timeline is not None and args.timeline < 1:
        ap.error(f"--timeline takes a positive number of requests, got {args.timeline}")

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        ap.error(f"unknown policy {unknown[0]!r}; expected one of {', '.join(POLICIES)}")
    config = load_config_file(args.config).policy if args.config else PolicyConfig()
    overrides = {}
    if args.sketch:
        overrides["sketch"] = args.sketch
    if args.half_life:
        overrides["half_life"] = args.half_life
    config = PolicyConfig(**{**_fields(config), "name": "heat", **overrides})
    page_bytes = parse_size(args.page_bytes)

    requests = load_requests(str(args.trace), args.seed, args.limit)
    if not requests:
        ap.error(f"{args.trace}: no requests")
    distinct = distinct_blocks(requests)  # capacities are shares of the whole trace, halves included
    if args.half == "first":  # halves split by request count
        requests = requests[: len(requests) // 2]
    elif args.half == "second":
        requests = requests[len(requests) // 2:]
    pages = sum(len(r.keys) for r in requests)
    print(f"{args.trace}: {len(requests)} requests, {pages} block lookups, {distinct} distinct blocks"
          f"{' (' + args.half + ' half)' if args.half else ''}; page {page_bytes} bytes; "
          f"heat sketch={config.sketch}; default policy={PolicyConfig().name}")

    started = time.monotonic()
    single: dict[str, dict[int, SimResult]] = {p: {} for p in policies}
    caps = [parse_capacity(c, distinct) for c in args.capacity_blocks.split(",") if c.strip()]
    for cap in caps:
        for p in policies:
            single[p][cap] = run_one(p, requests, [cap], page_bytes, config, args.quiet)

    out: dict = {"trace": str(args.trace), "requests": len(requests), "lookup_pages": pages,
                 "distinct_blocks": distinct, "page_bytes": page_bytes, "half": args.half,
                 "policy_config": _fields(config), "single_tier": [], "multi_tier": []}
    if caps:
        head = f"{'capacity':>18} " + " ".join(f"{p:>8}" for p in policies)
        if "lru" in policies:
            head += "  " + " ".join(f"{p + '/lru':>11}" for p in policies if p != "lru")
        print("\nprefix hit ratio, one tier\n" + head)
        for cap in caps:
            row = f"{cap:>7} ({100.0 * cap / distinct:5.1f}%)  "
            row += " ".join(f"{100 * single[p][cap].hit_ratio:7.2f}%" for p in policies)
            base = single["lru"][cap].hit_ratio if "lru" in policies else 0.0
            if "lru" in policies:
                row += "  " + " ".join(f"{single[p][cap].hit_ratio / base if base else 0:11.3f}"
                                       for p in policies if p != "lru")
            print(row)
            out["single_tier"].append({"capacity_blocks": cap, "share": cap / distinct,
                                       **{p: single[p][cap].as_dict() for p in policies}})

    if args.cost and caps:
        print("\ncost per single-tier capacity: page lookups/s through the simulator, KiB held by the policy")
        out["cost"] = []
        online = [p for p in policies if p != "belady"]
        for cap in caps:
            costs = {p: measure_cost(p, requests, cap, page_bytes, config) for p in online}
            print(f"{cap:>7} blocks  " + "  ".join(
                f"{p}: {c['lookups_per_s'] / 1000:6.1f}k/s {c['policy_bytes'] / 1024:8.0f} KiB"
                for p, c in costs.items()))
            out["cost"].append({"capacity_blocks": cap, **costs})

    if args.timeline and caps:
        out["timeline"] = [timeline(policies, requests, cap, page_bytes, config, args.timeline)
                           for cap in caps]
        for line in out["timeline"]:
            print_timeline(line)

    for spec in args.tiers:
        blocks = [parse_capacity(c, distinct) for c in spec.split(":")]
        print(f"\n{len(blocks)} tiers of {' : '.join(map(str, blocks))} blocks (fastest first)")
        print(f"{'policy':>8} {'hit':>7} {'tier0 share':>11}  per tier: hit% / GiB written / promoted in"
              f" / demoted in")
        entry = {"capacity_blocks": blocks, "results": {}}
        for p in policies:
            if p == "belady":
                continue
            r = run_one(p, requests, blocks, page_bytes, config, args.quiet)
            share = r.tiers[0].hit_pages / r.hit_pages if r.hit_pages else 0.0
            gib = 1 << 30
            tiers = "  ".join(f"t{i}: {100 * r.tier_hit_ratio(i):5.2f}% / {t.bytes_written / gib:7.0f} / "
                              f"{t.bytes_promoted / gib:5.0f} / {t.bytes_demoted / gib:5.0f}"
                              for i, t in enumerate(r.tiers))
            print(f"{p:>8} {100 * r.hit_ratio:6.2f}% {100 * share:10.1f}%  {tiers}")
            entry["results"][p] = {**r.as_dict(), "fastest_tier_share_of_hits": share}
        out["multi_tier"].append(entry)

    elapsed = time.monotonic() - started
    print(f"\nreplayed in {elapsed:.1f} s")
    out["elapsed_s"] = elapsed
    if args.plot and caps:
        ratios = {p: {c: single[p][c].hit_ratio for c in caps} for p in policies}
        plot(ratios, distinct, args.plot, f"{args.trace.name}: prefix hit ratio vs capacity")
        print(f"plot: {args.plot}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
