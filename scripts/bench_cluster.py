#!/usr/bin/env python3
"""Three live SGLang servers on three hosts behind sglang-router: what a shared KV pool buys.

  python scripts/bench_cluster.py --json cluster.json            # all six cells
  python scripts/bench_cluster.py --kv pool --policies round_robin --conversations 8
  python scripts/bench_cluster.py --faults --json faults.json  # the fault schedule under this workload

Hosts are network namespaces on one bridge (devtools/testing/cluster.py; needs root). A
multi-turn workload of many conversations goes through the router, at most --max-parallel
conversations at once. Cells: router policy (round_robin, cache_aware) x KV:
  own       each server its own tiers (host DRAM + its own LMDB);
  pool      host DRAM + one shared `mooncake-sgl pool` on a fourth host (TCP: another host);
  mooncake  host DRAM + the Mooncake Store (its master on the fourth host, each server a segment).
Per cell: the cached share of prompt tokens against the reachable share (whole pages of the
previous turn), TTFT mean/p50/p99, throughput, and the tier each of our page hits came from (our
/metrics). Each KV setup starts its servers once; each cell starts cold (storage and caches
emptied) behind a router of its own. The question: does a shared pool let round-robin match
cache-aware routing, and by how much does it beat isolated tiers?

--faults: the CI fault test's schedule (devtools/testing/cluster_faults.py) under this
workload instead: three servers over the pool (fourth host), the Mooncake Store (etcd and the
leading master on the fourth host, the standby on host 0) and an LMDB tier (host 0's on a small
file system filled before it opened). The workload's requests go through the router in
conversation order, one at a time, each after a flush of SGLang's caches (so reuse comes from our
tiers, and batching cannot change an answer), and each answer is compared with its cold answer
(greedy ids, bit-identical logprobs). Per fault: requests, failed, differing, time until hits
resume, and what host 0's server's tiers did (its SSD tier: what it could hold, refused, evicted).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench import options  # noqa: E402
from devtools.bench.client import SglangClient  # noqa: E402
from devtools.bench.console import run_script  # noqa: E402
from devtools.bench.console import stamped as log
from devtools.bench.plot import Panel, bar_panels  # noqa: E402
from devtools.bench.results import text_table  # noqa: E402
from devtools.bench.two_instances import Sent, reachable_tokens, summarise  # noqa: E402
from devtools.bench.workloads import BenchRequest, MultiTurnSpec, add_chat_arguments, chat_spec, multiturn  # noqa: E402
from devtools.testing import cluster_faults as F  # noqa: E402
from devtools.testing.cluster import Cluster  # noqa: E402
from mooncake_sgl.metrics.model import diff  # noqa: E402
from mooncake_sgl.metrics.scrape import scrape  # noqa: E402

POLICIES = ("round_robin", "cache_aware")
KVS = ("own", "pool", "mooncake")


def tiers_yaml(kv: str, workdir: Path, i: int, host_addr: str, shared: str, host_cap: str) -> Path:
    host = f"  - {{kind: host, capacity: {host_cap}}}\n"
    if kv == "own":
        slow = f'  - {{kind: lmdb, path: "{workdir / f"lmdb{i}"}", capacity: 4GiB}}\n'
    elif kv == "pool":
        slow = f'  - {{kind: pool, endpoints: ["{shared}"]}}\n'
    else:
        slow = (f'  - {{kind: mooncake_store, master: "{shared}", local_hostname: "{host_addr}", '
                f'segment_size: 256MiB, buffer_size: 64MiB}}\n')
    path = workdir / f"tiers-{kv}-{i}.yaml"
    path.write_text("tiers:\n" + host + slow)
    return path


def drive(url: str, conversations: list[list[BenchRequest]], max_parallel: int, bar: Any) -> list[Sent]:
    """Each conversation's turns in order through the router; ``max_parallel`` conversations at once."""
    client = SglangClient(url)
    sent: list[Sent] = []
    lock = threading.Lock()

    def converse(c: int) -> None:
        for req in conversations[c]:
            res = client.generate(req)
            with lock:
                sent.append(Sent(0, reachable_tokens(req), res))
                if bar is not None:
                    bar.update(1)

    with ThreadPoolExecutor(max(1, max_parallel)) as ex:
        list(ex.map(converse, range(len(conversations))))
    return sent


def hit_sources(before: list[Any], after: list[Any]) -> dict[str, float]:
    """Our page hits per tier over all servers, between two sets of scrapes."""
    per_tier = diff(F.side_by_side(before), F.side_by_side(after)).by_tier()
    return {tier: s.hits for tier, s in per_tier.items()}


def run_kv(kv: str, args: argparse.Namespace, model: Path, conversations: list[list[BenchRequest]],
           workdir: Path) -> list[dict[str, Any]]:
    cells = []
    with Cluster(4, workdir / f"cluster-{kv}") as c:
        servers_hosts, kv_host = c.hosts[:3], c.hosts[3]
        shared = ""
        if kv == "pool":
            shared = c.pool(kv_host, capacity=args.pool_capacity).endpoint
        elif kv == "mooncake":
            shared = c.master(kv_host).rpc_address
        log(f"[{kv}] starting 3 servers (logs in {c.workdir})")
        extra = ("--max-total-tokens", str(args.max_total_tokens), "--enable-metrics", *args.server_arg)

        def start(h: Any) -> Any:
            tiers = tiers_yaml(kv, workdir, h.index, h.addr, shared, args.host_capacity)
            return c.sglang(h, model, tiers, extra=extra, health_timeout_s=args.health_timeout)

        with ThreadPoolExecutor(3) as ex:  # start-ups overlap
            servers = list(ex.map(start, servers_hosts))
        for policy in args.policies:
            for s in servers:  # cold: nothing in our tiers (a shared one empties once), nor in SGLang's
                SglangClient(s.url).clear_storage()
                SglangClient(s.url).flush_cache()
            router = c.router([s.url for s in servers], policy)
            before = [scrape(s.url) for s in servers]
            with options.progress(args, sum(map(len, conversations)), f"{policy}/{kv}") as bar:
                t0 = time.monotonic()
                sent = drive(router.url, conversations, args.max_parallel, bar)
                wall = time.monotonic() - t0
            after = [scrape(s.url) for s in servers]
            router.stop()
            summary = summarise(sent)
            summary.update({"policy": policy, "kv": kv, "wall_s": wall,
                            "throughput_req_s": len(sent) / wall if wall else 0.0,
                            "throughput_prompt_tok_s": summary["prompt_tokens"] / wall if wall else 0.0,
                            "hits_by_tier": hit_sources(before, after)})
            log(f"[{policy}/{kv}] cached {summary['cached_share']:.1%} of reachable "
                f"{summary['reachable_share']:.1%}, TTFT p50 {summary['ttft_p50_s'] * 1e3:.0f} ms, "
                f"{summary['errors']} errors")
            cells.append(summary)
    return cells


# What the filled disk of host 0's SSD tier leaves free (as in the CI test: the index opens, a few
# pages fit at most).
FAULT_DISK_LEFT = 1536 << 10


def fault_tiers(workdir: Path, i: int, pool: str, etcd: str, host_addr: str, lmdb: Path) -> Path:
    path = workdir / f"tiers-faults-{i}.yaml"
    path.write_text(f"""tiers:
  - {{kind: pool, endpoints: ["{pool}"], timeout: 2s}}
  - {{kind: mooncake_store, master: "etcd://{etcd}", local_hostname: "{host_addr}",
     segment_size: 64MiB, buffer_size: 32MiB, reconnect_after: 1s, put_retry_window: 0.5s}}
  - {{kind: lmdb, path: "{lmdb}", capacity: 256MiB}}
""")
    return path


def run_faults(args: argparse.Namespace, model: Path, conversations: list[list[BenchRequest]],
               workdir: Path) -> list[dict[str, Any]]:
    requests = [req for conv in conversations for req in conv]
    with Cluster(4, Path(tempfile.mkdtemp(prefix="cluster-faults-", dir=workdir))) as c:
        kv_host = c.hosts[3]
        pool = c.pool(kv_host, capacity=args.pool_capacity)
        etcd = c.etcd(kv_host)
        masters = [c.master(kv_host, etcd), c.master(c.hosts[0], etcd)]
        disk = c.disk("64m")
        free = F.fill(disk, FAULT_DISK_LEFT)
        log(f"[faults] host 0's SSD tier on a disk filled to {free >> 10} KiB free; starting 3 servers "
            f"(logs in {c.workdir})")
        extra = ("--max-total-tokens", str(args.max_total_tokens), "--enable-metrics", *args.server_arg)

        def start(h: Any) -> Any:
            lmdb = disk / "lmdb" if h.index == 0 else c.workdir / f"lmdb{h.index}"
            tiers = fault_tiers(workdir, h.index, pool.endpoint, etcd.endpoint, h.addr, lmdb)
            return c.sglang(h, model, tiers, extra=extra, health_timeout_s=args.health_timeout)

        with ThreadPoolExecutor(3) as ex:
            servers = list(ex.map(start, c.hosts[:3]))
        urls = [s.url for s in servers]
        log(f"[faults] cold answers of {len(requests)} requests")
        prompts = [r.input_ids for r in requests]
        with ThreadPoolExecutor(1) as ex:  # the router's start overlaps them
            starting = ex.submit(c.router, urls, args.policies[0], extra=F.ROUTER_RETRIES)
            cold = F.cold_outputs(urls[0], prompts, args.output_tokens)
            router = starting.result()
        traffic = F.Traffic(router.url, urls, prompts, cold, args.output_tokens).start()
        try:
            traffic.wait_for(len(requests), args.health_timeout)  # one warm pass first
            rig = F.Rig(c, c.hosts[0], kv_host, lambda: (pool.start(), etcd.start(), masters[0].start()),
                        masters, disk, urls)
            # Tier counts from host 0's server: its SSD tier is the one whose disk is full, its host
            # the one cut off (the others' tiers would drown both in sums).
            reports = F.schedule(rig, traffic, F.scraper(urls[:1]), lambda m: log(f"[faults] {m}"))
        finally:
            traffic.stop()
    return [r.as_dict() for r in reports]


def fault_table(reports: list[dict[str, Any]]) -> str:
    header = ("fault", "requests", "failed", "differing (ids)", "hits resume (from fault / after heal)",
              "host 0's SSD tier while held: holdable, refused, evicted")

    def secs(v: float | None) -> str:
        return "never" if v is None else f"{v:.1f} s"

    rows = []
    for r in reports:
        lmdb = r["tiers"].get("during", {}).get("lmdb")
        ssd = "-" if lmdb is None else (f"{lmdb['holdable_bytes'] / 2**20:.1f} MiB, "
                                        f"{lmdb['puts_refused']:.0f}, {lmdb['evictions']:.0f}")
        rows.append((r["fault"], str(r["requests"]), str(r["failed"]),
                     f"{r['differing']} ({r['differing_ids']})",
                     f"{secs(r['hits_resume_s'])} / {secs(r['hits_resume_after_heal_s'])}", ssd))
    return text_table(header, rows)


def table(cells: list[dict[str, Any]]) -> str:
    header = ("policy", "kv", "cached", "reachable", "TTFT mean", "p50", "p99", "req/s", "errors",
              "hits by tier")
    rows = [(c["policy"], c["kv"], f"{c['cached_share']:.1%}", f"{c['reachable_share']:.1%}",
             f"{c['ttft_mean_s'] * 1e3:.0f} ms", f"{c['ttft_p50_s'] * 1e3:.0f} ms",
             f"{c['ttft_p99_s'] * 1e3:.0f} ms", f"{c['throughput_req_s']:.2f}", str(c["errors"]),
             ", ".join(f"{t} {h:.0f}" for t, h in c["hits_by_tier"].items() if h) or "-") for c in cells]
    return text_table(header, rows)


def plot(cells: list[dict[str, Any]], path: str, title: str) -> None:
    shares = Panel("% of prompt tokens", [[("cached", [c["cached_share"] * 100 for c in cells])],
                                          [("reachable", [c["reachable_share"] * 100 for c in cells])]])
    ttft = Panel("TTFT (ms)", [[("p50", [c["ttft_p50_s"] * 1e3 for c in cells])],
                               [("p99", [c["ttft_p99_s"] * 1e3 for c in cells])]])
    bar_panels(path, title, [f"{c['policy']}\n{c['kv']}" for c in cells], [shares, ttft],
               figsize=(12, 4.5), label_size=8)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    p.add_argument("--kv", type=lambda s: s.split(","), default=list(KVS), help="own,pool,mooncake")
    add_chat_arguments(p, MultiTurnSpec(conversations=12, turns=4,
                                         first_turn_tokens=2048, user_tokens=256,
                                         output_tokens=16),
                       max_parallel=3)
    options.add_model_options(p)
    p.add_argument("--host-capacity", default="64MiB", help="our host DRAM tier on each server")
    p.add_argument("--pool-capacity", default="2GiB")
    p.add_argument("--server-arg", action="append", default=[], help="one more sglang flag (repeatable)")
    options.add_run_options(p, workdir="out/bench_cluster", json_help="write every cell's numbers here",
                            plot_default="bench_cluster.png")
    p.add_argument("--faults", action="store_true",
                   help="the fault schedule under this workload instead of the cells (router: the "
                        "first of --policies)")
    args = p.parse_args(argv)
    for k in args.kv:
        if k not in KVS:
            p.error(f"--kv: {k!r} is none of {', '.join(KVS)}")
    for pol in args.policies:
        if pol not in POLICIES:
            p.error(f"--policies: {pol!r} is none of {', '.join(POLICIES)}")
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model = options.model_path(args, workdir)
    spec = chat_spec(args)
    rounds = multiturn(spec)
    conversations = [[rounds[t][c] for t in range(spec.turns)] for c in range(spec.conversations)]
    if args.faults:
        reports = run_faults(args, model, conversations, workdir)
        print(f"faults under {spec.conversations} conversations x {spec.turns} turns through "
              f"{args.policies[0]} (one request at a time)")
        print(fault_table(reports))
        options.write_json(args, faults=reports)
        return 1 if any(r["failed"] or r["differing"] or r["hits_resume_s"] is None for r in reports) else 0
    cells: list[dict[str, Any]] = []
    for kv in args.kv:
        cells += run_kv(kv, args, model, conversations, workdir)
        # After each KV setup too: a long run interrupted keeps what it measured.
        options.write_json(args, cells=cells)
    title = (f"3 servers behind sglang-router: {spec.conversations} conversations x {spec.turns} turns, "
             f"{args.max_parallel} at once")
    print(title)
    print(table(cells))
    if args.plot:
        plot(cells, args.plot, title)
    options.write_json(args, cells=cells)
    return 1 if any(c["errors"] for c in cells) else 0


if __name__ == "__main__":
    run_script(main)
