#!/usr/bin/env python3
"""A storage hit must never cost more than recomputing it: live CPU servers whose only storage tier
is an SSD tier on a disk throttled on purpose (``--medium disk``, the default) or a pool across a
link throttled on purpose (``--medium link``), per request, with the load gate on and off, against
the same request on a server without HiCache (root: a loop device, a blkio read limit, dropped page
cache; or a network namespace holding the pools, its sending shaped with ``tc tbf``).

Variants (live servers on 127.0.0.1, the tiny model, all up at once; each timed request is sent
to recompute, then gate and nogate (nogate first on every other request), then recompute again):
  gate       our backend, one LMDB tier on the loop device, ``load_gate`` on (the default);
             with ``--medium link``, one pool tier (TCP, its defaults) on a pool server in the
             namespace; with ``--medium dram``, a host tier (DRAM) over that LMDB tier, which
             holds every page: the hits are in DRAM, which the gate has no reason to judge again
             (what the gate costs such a hit);
  nogate     the same on its own directory of the same disk (its own pool server beside the
             gate's), ``load_gate: {enabled: false}``;
  recompute  the same server without HiCache: the reference each TTFT is judged against, the mean
             of its two sends around the others (its cache flushed between them).
Per request: a fresh document is sent to every server (computed, backed up to storage), every
server's caches are flushed and the page cache dropped, then it is sent again and timed: ours can
only find it in the SSD tier, whose reads the blkio limit of the phase slows (``--rates`` in MB/s,
0 = unthrottled; writes are never limited), or in the pool, whose replies the link's limit slows
(the same rates; what is sent to the pool is never limited). Phases run in the order given: with
``0,2`` the disk (the link) turns slow under a gate that has learned it fast. SGLang's flags are
the same for all (its default prefetch policy, ``timeout``, waits for a slow load up to its
deadline).

Per phase: each request's TTFT over recompute's, how many were slower than 1.1x recompute (and of
those, how many had tokens served from storage: a hit that cost more than it saved), the median
spread between recompute's two sends of a request (the noise every ratio carries), mean
TTFT, the share of nogate's TTFT gain the gate kept, tokens served from storage, the gate's own
counters, the load and prefill rate, and whether the greedy outputs agree. ``--json PATH`` writes
every request. ``--trace DIR`` also times the gate and nogate servers' calls into the backend
(``devtools/bench/prefetch_trace``): per request, when the backend had answered SGLang's lookup and
reads, against the TTFT.

    python scripts/bench_load_gate.py                          # phases 0 and 2 MB/s, 6 requests each
    python scripts/bench_load_gate.py --rates 0,1 --requests 8 --json gate.json
    python scripts/bench_load_gate.py --rates 0,2 --requests 3 --trace /tmp/gate-trace
    python scripts/bench_load_gate.py --medium link --rates 0,2,0   # a pool across a slow link
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACER = ROOT / "devtools" / "bench" / "prefetch_trace"

from devtools.bench.client import SglangClient  # noqa: E402
from devtools.bench.console import log, run_script  # noqa: E402
from devtools.bench.prefetch_timeline import load as load_trace  # noqa: E402
from devtools.bench.server import (  # noqa: E402
    LaunchedServer,
    free_port,
    has_gpu,
    launch_command,
    ours_args,
    server_env,
    stop_all,
)
from devtools.bench.ssd import throttled  # noqa: E402
from devtools.bench.workloads import BenchRequest  # noqa: E402
from devtools.testing.cluster import Cluster, unavailable_reason  # noqa: E402
from devtools.tiny_model import write_tiny_llama  # noqa: E402

VARIANTS = ("gate", "nogate", "recompute")
SLOWER = 1.1  # a request slower than this times recompute's counts as a hit that cost more than it saved
GATE_COUNTERS = ("lookups", "declined_lookups", "declined_pages", "probe_lookups", "abandoned_lookups",
                 "abandoned_pages")


def tiers_yaml(path: Path, tiers: list[str], gate: bool) -> Path:
    path.write_text(f"policy: {{name: lru}}\nload_gate: {{enabled: {'true' if gate else 'false'}}}\n"
                    "tiers:\n" + "".join(f"  - {t}\n" for t in tiers))
    return path


# Per variant with storage, its tiers file; and the read limit of a phase (MB/s, 0: none).
Medium = tuple[Callable[[str], Path], Callable[[float], None]]


@contextmanager
def slow_medium(kind: str, work: Path) -> Iterator[Medium]:
    """The storage the phases slow down: an SSD tier on a throttled loop device (``disk``), or a
    pool server per variant in a network namespace whose sending is shaped (``link``). Unlimited
    again, and torn down, on the way out."""
    if kind in ("disk", "dram"):
        with throttled.loop_disk(work, 8 << 30) as disk:
            def ssd(v: str) -> Path:
                dram = ["{kind: host, capacity: 1GiB}"] if kind == "dram" else []
                lmdb = f"{{kind: lmdb, path: {disk.mount / v}, capacity: 2GiB}}"
                return tiers_yaml(work / f"{v}.yaml", [*dram, lmdb], v == "gate")

            try:
                yield ssd, lambda mbps: limit_reads(disk, mbps)
            finally:
                limit_reads(disk, 0)
        return
    with Cluster(1, work / "cluster") as cluster:
        host = cluster.hosts[0]
        pools = {v: cluster.pool(host, capacity="2GiB", slab_size="1MiB") for v in ("gate", "nogate")}

        def pool(v: str) -> Path:
            return tiers_yaml(work / f"{v}.yaml", [f"{{kind: pool, endpoints: ['{pools[v].endpoint}'], "
                              "transport: tcp}"], v == "gate")

        try:
            yield pool, lambda mbps: cluster.limit_egress(host, mbps * 1e6)
        finally:
            cluster.limit_egress(host, None)


def unavailable(kind: str) -> str | None:
    return unavailable_reason() if kind == "link" else throttled.unavailable()


def metric_sum(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def metrics(client: SglangClient) -> str:
    status, body = client._request("GET", "/metrics", timeout=30.0)
    return body.decode() if status == 200 else ""


def wait_backed_up(client: SglangClient, quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
    """Until the tier's written bytes stop growing: SGLang backs a prefix up after its prefill."""
    last, since, deadline = -1.0, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = metric_sum(metrics(client), "mooncake_sgl_tier_written_bytes_total")
        if now != last:
            last, since = now, time.monotonic()
        elif now > 0 and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)


def limit_reads(disk: throttled.Disk, mbps: float) -> None:
    (throttled.BLKIO / "blkio.throttle.read_bps_device").write_text(f"{disk.dev} {int(mbps * 1e6)}\n")


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=False)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def phase(rate: float, n: int, clients: dict[str, SglangClient], limit: Callable[[float], None],
          args: argparse.Namespace) -> dict[str, Any]:
    limit(rate)
    rng = random.Random(f"{args.seed}-{rate}")
    before = metrics(clients["gate"])
    rows = []
    load = os.getloadavg()[0]
    for i in range(n):
        ids = [rng.randrange(32000) for _ in range(args.doc_tokens)]
        req = BenchRequest(rid=f"{rate}-{i}", round=i, input_ids=ids, max_new_tokens=8,
                           reusable_tokens=len(ids))
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        for v in order:
            first = clients[v].generate(req)
            if first.error:
                raise RuntimeError(f"{v}: {first.error}")
        for v in ("gate", "nogate"):
            wait_backed_up(clients[v])
        for c in clients.values():
            c.flush_cache()
        drop_page_cache()
        row: dict[str, Any] = {"rate_mbps": rate, "request": i, "load": os.getloadavg()[0]}
        outputs = []
        # Recompute brackets the two backends' sends, so that its reference is the mean of two
        # measurements taken before and after them: a single one moved a request's ratio by +-0.3
        # on this VM's two shared cores.
        reference = []
        for v in ("recompute", *(b for b in order if b != "recompute"), "recompute"):
            if v == "recompute" and reference:
                clients[v].flush_cache()
            sent = time.time()
            res = clients[v].generate(req)
            if res.error:
                raise RuntimeError(f"{v}: {res.error}")
            outputs.append(res.output_ids)
            if v == "recompute":
                reference.append(res.ttft_s)
                continue
            row[v] = {"ttft_s": res.ttft_s, "storage_tokens": res.storage_tokens,
                      "cached_tokens": res.cached_tokens, "sent_at": sent}
        row["recompute"] = {"ttft_s": statistics.fmean(reference), "ttft_runs_s": reference,
                            "storage_tokens": 0, "cached_tokens": 0}
        row["outputs_equal"] = len({tuple(o) for o in outputs}) == 1
        ref = row["recompute"]["ttft_s"]
        log(f"[{rate:g} MB/s] request {i + 1}/{n}: recompute {ref:.3f}s "
            f"({' / '.join(f'{t:.3f}' for t in reference)}), "
            + ", ".join(f"{v} {row[v]['ttft_s']:.3f}s ({row[v]['ttft_s'] / ref:.2f}x, "
                        f"{row[v]['storage_tokens']} from storage)" for v in ("gate", "nogate")))
        rows.append(row)
    time.sleep(2.0)  # our /metrics series are refreshed once a second
    after = metrics(clients["gate"])
    counters = {c: metric_sum(after, f"mooncake_sgl_gate_{c}_total")
                - metric_sum(before, f"mooncake_sgl_gate_{c}_total") for c in GATE_COUNTERS}
    return {"rate_mbps": rate, "load": round((load + os.getloadavg()[0]) / 2, 2), "requests": rows,
            "gate_counters": counters, **summary(rows, args.doc_tokens)}


def summary(rows: list[dict[str, Any]], doc_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ref = [r["recompute"]["ttft_s"] for r in rows]
    out["prefill_tokens_per_s"] = doc_tokens / statistics.fmean(ref)
    for v in VARIANTS:
        ttft = [r[v]["ttft_s"] for r in rows]
        slower = [t > SLOWER * x for t, x in zip(ttft, ref)]
        out[v] = {"ttft_mean_s": statistics.fmean(ttft),
                  "slower_than_recompute": sum(slower),
                  "hits_slower_than_recompute": sum(s and r[v]["storage_tokens"] > 0
                                                    for s, r in zip(slower, rows)),
                  "storage_tokens": sum(r[v]["storage_tokens"] for r in rows)}
    runs = [r["recompute"]["ttft_runs_s"] for r in rows]
    out["recompute_spread"] = statistics.median(abs(a - b) / statistics.fmean((a, b)) for a, b in runs)
    gain_nogate = out["recompute"]["ttft_mean_s"] - out["nogate"]["ttft_mean_s"]
    gain_gate = out["recompute"]["ttft_mean_s"] - out["gate"]["ttft_mean_s"]
    out["gain_kept"] = gain_gate / gain_nogate if gain_nogate > 0 else None
    out["outputs_equal"] = all(r["outputs_equal"] for r in rows)
    return out


TRACED = ("gate", "nogate")


def backend_answers(phases: list[dict[str, Any]], trace: Path) -> str:
    """Per request, on the gate and nogate servers, when the backend had answered (its last call
    within the TTFT ended), from each server's trace; the rest of the TTFT is SGLang's."""
    lines = ["per request, gate / nogate server: TTFT, and when the backend's calls within it had answered"]
    calls = {v: [e for e in load_trace(trace / f"{v}.jsonl") if e["kind"] in ("exists", "get")]
             for v in TRACED}
    for p in phases:
        for r in p["requests"]:
            for v in TRACED:
                g = r[v]
                t0, t1 = g["sent_at"], g["sent_at"] + g["ttft_s"]
                mine = [e for e in calls[v] if t0 <= e["start"] <= t1]
                answered = max((e["start"] + e["seconds"] - t0 for e in mine), default=0.0)
                g["backend_answered_s"] = answered
                spent = ", ".join(f"{e['kind']} {e['seconds'] * 1e3:.1f} ms ({e['pages']} pages)"
                                  for e in mine)
                lines.append(f"  {p['rate_mbps']:g} MB/s #{r['request'] + 1} {v:<6}: TTFT "
                             f"{g['ttft_s']:.3f} s, answered at {answered:.3f} s: {spent or 'no call'}")
    return "\n".join(lines)


def table(phases: list[dict[str, Any]]) -> str:
    lines = [f"{'read limit':>10}{'load':>6}{'prefill tok/s':>14}  {'variant':<10}{'TTFT mean':>10}"
             f"{'x recompute':>12}{'slower':>8}{'of them hits':>13}{'from storage':>13}"]
    for p in phases:
        ref = p["recompute"]["ttft_mean_s"]
        limit = f"{p['rate_mbps']:g} MB/s" if p["rate_mbps"] else "none"
        n = len(p["requests"])
        for v in VARIANTS:
            s = p[v]
            lines.append(f"{limit:>10}{p['load']:>6.2f}{p['prefill_tokens_per_s']:>14,.0f}  {v:<10}"
                         f"{s['ttft_mean_s']:>9.3f}s{s['ttft_mean_s'] / ref:>11.2f}x"
                         f"{s['slower_than_recompute']:>5}/{n}{s['hits_slower_than_recompute']:>13}"
                         f"{s['storage_tokens']:>13}")
        kept = p["gain_kept"]
        g = p["gate_counters"]
        lines.append(f"{'':>10}  gate kept {'-' if kept is None else f'{kept:.0%}'} of nogate's TTFT gain; "
                     f"declined {g['declined_lookups']:g} of {g['lookups']:g} hits ({g['declined_pages']:g} "
                     f"page objects), {g['abandoned_lookups']:g} given up, {g['probe_lookups']:g} probes; "
                     f"recompute's two sends {p['recompute_spread']:.0%} apart (median); "
                     f"outputs equal: {p['outputs_equal']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--medium", choices=("disk", "link", "dram"), default="disk",
                   help="what the phases slow down: an SSD tier's disk, or a pool's link; dram: "
                        "hits found in a host tier over that disk, which the gate has nothing to judge")
    p.add_argument("--rates", default="0,2", help="read limit per phase, MB/s (0: none), in order")
    p.add_argument("--requests", type=int, default=6, help="requests per phase")
    p.add_argument("--doc-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--health-timeout", type=float, default=600.0)
    p.add_argument("--json", type=Path, help="write every phase and request here")
    p.add_argument("--trace", type=Path, metavar="DIR",
                   help="time the gate and nogate servers' backend calls here")
    args = p.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    why = unavailable(args.medium)
    if why:
        log(f"bench_load_gate: cannot run here: {why}")
        return 2
    with tempfile.TemporaryDirectory(prefix="mooncake-sgl-gate-") as tmp:
        work = Path(tmp)
        model = write_tiny_llama(work / "model")
        cpu = not has_gpu()
        servers: dict[str, LaunchedServer] = {}
        with slow_medium(args.medium, work) as (tiers_for, limit):
            try:
                for v in VARIANTS:
                    variant = () if v == "recompute" else ours_args(tiers_for(v))
                    # An explicit host pool: SGLang's automatic size refuses a busy host.
                    extra = ("--enable-metrics", "--max-total-tokens", str(4 * args.doc_tokens),
                             *(() if v == "recompute" else ("--hicache-ratio", "2.0")))
                    env = {"XDG_CACHE_HOME": str(work / "cache")}
                    if args.trace and v in TRACED:
                        args.trace.mkdir(parents=True, exist_ok=True)
                        for stale in args.trace.glob(f"{v}.jsonl.*"):  # an earlier run's
                            stale.unlink()
                        env |= {"PYTHONPATH": os.pathsep.join((str(TRACER), str(ROOT))),
                                "MOONCAKE_SGL_PREFETCH_TRACE": str(args.trace / f"{v}.jsonl")}
                    servers[v] = LaunchedServer(lambda port, a=variant, e=extra: launch_command(
                        str(model), port, a, cpu=cpu, extra=e), free_port(), work / f"{v}.log",
                        args.health_timeout, env=server_env(cpu, env))
                    servers[v].start()
                clients = {v: SglangClient(s.url, timeout_s=600) for v, s in servers.items()}
                phases = [phase(rate, args.requests, clients, limit, args) for rate in rates]
            finally:
                stop_all(servers.values())
    only = {"disk": "the SSD tier is the only storage tier",
            "link": "a pool across the throttled link is the only storage tier",
            "dram": "a host tier over the SSD tier holds every page"}[args.medium]
    print(f"\nload gate: {args.requests} requests of {args.doc_tokens} tokens per phase, each sent, "
          f"backed up, flushed from SGLang's caches and the page cache, and sent again; {only}; "
          "'slower': requests over 1.1x recompute's TTFT; 'of them hits': those with tokens served "
          "from storage")
    print(table(phases))
    if args.trace:
        print(backend_answers(phases, args.trace))
    if args.json:
        args.json.write_text(json.dumps({"medium": args.medium, "phases": phases,
                                         "doc_tokens": args.doc_tokens}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
