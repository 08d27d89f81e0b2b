#!/usr/bin/env python3
"""The capacity curves a live server shows (``policy.capacity_curves``), plotted from its /metrics.

Two ways to run it:

    python scripts/plot_capacity_curves.py --url 127.0.0.1:30000 --png curves.png   # a running server
    python scripts/plot_capacity_curves.py --png curves.png --json curves.json      # serves one itself

The second starts a CPU server (the tiny model, ``scripts/serve_cpu.sh``) with curves on over a
small host tier and an SSD tier, replays a trace against it (``--trace``, default the generated chat
workload; each block id becomes one 64-token page of token ids, so equal ids share a prefix as in the
trace), then reads the curve series the dashboard reads (``mooncake_sgl_tier_curve_*``) and plots,
per tier, the prefix hit ratio and the prefill tokens a tier of each size would have served, with
the tier's own size marked. A table of the same points is printed, and written with ``--json``.
The figures are the online estimates; ``scripts/bench_capacity_curves.py`` holds them against an
exact replay.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from replay_trace import load_requests  # noqa: E402

from devtools.bench.client import SglangClient  # noqa: E402
from devtools.bench.console import run_script, stamped  # noqa: E402
from devtools.bench.server import LaunchedServer, free_port, stop_all  # noqa: E402
from devtools.bench.workloads import BenchRequest  # noqa: E402
from devtools.tiny_model import write_tiny_llama  # noqa: E402
from mooncake_sgl.metrics.model import Snapshot  # noqa: E402
from mooncake_sgl.metrics.scrape import scrape  # noqa: E402
from mooncake_sgl_cpu.adaptations import HOST_RESERVE_ENV  # noqa: E402

PAGE_TOKENS = 64  # serve_cpu.sh's --page-size
VOCAB = 32000


def prompt_of(block_ids: tuple[int, ...]) -> list[int]:
    """One page of token ids per block id, a function of the id alone (equal ids, equal pages)."""
    out: list[int] = []
    for b in block_ids:
        out += [(b * 7919 + i * 104729) % (VOCAB - 10) + 5 for i in range(PAGE_TOKENS)]
    return out


def points(snap: Snapshot) -> dict[str, list[dict[str, float]]]:
    """Per tier: each size's multiplier, bytes, lookups, hits, hit ratio and tokens served."""
    out: dict[str, list[dict[str, float]]] = {}
    for tier in sorted({t for _, t, _ in snap.curves}):
        out[tier] = [{"multiplier": m, "capacity_bytes": cap, "lookups": lk, "hits": hit,
                      "hit_ratio": hit / lk if lk else 0.0, "tokens_served": hit * PAGE_TOKENS}
                     for m, cap, lk, hit in snap.curve_of(tier)]
    return out


def costs(snap: Snapshot) -> dict[str, float]:
    """What the curves cost the server, from its counters: per looked-up page, the server's side and
    the curve process's CPU (microseconds), and the pages left out while that process was behind."""
    looked = snap.store_total("lookup_pages")
    per_page = (lambda name: 1e6 * snap.store_total(name) / looked) if looked else (lambda name: 0.0)
    return {"lookup_pages": looked, "serving_us_per_page": per_page("curve_busy_seconds"),
            "process_us_per_page": per_page("curve_process_seconds"),
            "dropped_pages": snap.store_total("curve_dropped_pages")}


def table(curves: dict[str, list[dict[str, float]]]) -> str:
    head = ("tier", "size", "capacity", "lookups", "hit ratio", "tokens served")
    lines = ["{:<8} {:>6} {:>10} {:>9} {:>9} {:>14}".format(*head)]
    for tier, pts in curves.items():
        for p in pts:
            mark = " <- its size" if p["multiplier"] == 1.0 else ""
            lines.append(f"{tier:<8} {p['multiplier']:>5g}x {p['capacity_bytes'] / 2**20:>7.1f} MiB "
                         f"{p['lookups']:>9.0f} {p['hit_ratio']:>9.1%} {p['tokens_served']:>14.0f}{mark}")
    return "\n".join(lines)


def plot(curves: dict[str, list[dict[str, float]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_hit, ax_tok) = plt.subplots(1, 2, figsize=(12, 4.5))
    for tier, pts in curves.items():
        mib = [p["capacity_bytes"] / 2**20 for p in pts]
        line, = ax_hit.plot(mib, [100 * p["hit_ratio"] for p in pts], marker="o", label=tier)
        ax_tok.plot(mib, [p["tokens_served"] for p in pts], marker="o", label=tier, color=line.get_color())
        own = [p for p in pts if p["multiplier"] == 1.0]
        for ax, y in ((ax_hit, 100 * own[0]["hit_ratio"]), (ax_tok, own[0]["tokens_served"])) if own else ():
            ax.scatter([own[0]["capacity_bytes"] / 2**20], [y], s=140, facecolors="none",
                       edgecolors=line.get_color(), zorder=3)
    for ax, ylabel in ((ax_hit, "prefix hit ratio (%)"), (ax_tok, "prefill tokens served")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tier size (MiB; circled: its configured size)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def serve_and_replay(args: argparse.Namespace, workdir: Path) -> Snapshot:
    model = write_tiny_llama(workdir / "model")
    tiers = workdir / "tiers.yaml"
    tiers.write_text("policy: {capacity_curves: true}\ntiers:\n"
                     f"  - {{kind: host, capacity: {args.host_capacity}}}\n"
                     f'  - {{kind: lmdb, path: "{workdir / "ssd"}", capacity: {args.ssd_capacity}}}\n')
    flags = ["--enable-metrics", "--max-total-tokens", str(args.device_tokens)]
    server = LaunchedServer(
        lambda port: ["bash", str(ROOT / "scripts" / "serve_cpu.sh"), str(port), str(model), str(tiers),
                      *flags],
        free_port(), workdir / "server.log", 900.0,
        env={**os.environ, "PYTHONPATH": str(ROOT), HOST_RESERVE_ENV: "512MiB"})
    try:
        server.start()
        client = SglangClient(server.url)
        requests = load_requests(args.trace, None, args.requests)
        started = time.monotonic()
        for i, req in enumerate(requests):
            res = client.generate(BenchRequest(f"r{i}", 0, prompt_of(req.block_ids), 1, 0))
            if res.error:
                raise SystemExit(f"request {i} failed: {res.error}\n{server.log_tail(2000)}")
            if (i + 1) % 25 == 0 or i + 1 == len(requests):
                stamped(f"{i + 1}/{len(requests)} requests, {time.monotonic() - started:.0f} s")
        time.sleep(2.5)  # the exporter syncs every second
        return scrape(server.url)
    finally:
        stop_all([server])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a running server's host:port (no server is started)")
    p.add_argument("--trace", default="gen:chat", help="a Mooncake-format trace file or gen:NAME")
    p.add_argument("--requests", type=int, default=300, help="requests of the trace to replay")
    p.add_argument("--host-capacity", default="16MiB", help="our host tier (64 KiB pages)")
    p.add_argument("--ssd-capacity", default="48MiB", help="our SSD tier")
    p.add_argument("--device-tokens", type=int, default=8192, help="SGLang's device pool (tokens)")
    p.add_argument("--png", type=Path, help="write the plot here")
    p.add_argument("--json", type=Path, help="write the points here")
    args = p.parse_args(argv)
    if args.url:
        snap, title = scrape(args.url), f"capacity curves of {args.url}"
    else:
        with tempfile.TemporaryDirectory(prefix="mcsgl-curves-") as d:
            snap = serve_and_replay(args, Path(d))
        title = (f"capacity curves, live CPU server, {args.trace} ({args.requests} requests; "
                 f"host {args.host_capacity}, SSD {args.ssd_capacity})")
    curves = points(snap)
    if not curves:
        print("no curve series: start the server with policy.capacity_curves: true and --enable-metrics",
              file=sys.stderr)
        return 1
    print(table(curves))
    cost = costs(snap)
    print(f"cost per looked-up page ({cost['lookup_pages']:.0f} pages): {cost['serving_us_per_page']:.2f} us "
          f"in the server, {cost['process_us_per_page']:.0f} us of the curve process's CPU; "
          f"{cost['dropped_pages']:.0f} pages left out")
    if args.png:
        plot(curves, args.png, title)
        print(f"plot: {args.png}")
    if args.json:
        args.json.write_text(json.dumps({"title": title, "curves": curves, "cost": cost}, indent=2))
    return 0


if __name__ == "__main__":
    run_script(main)
