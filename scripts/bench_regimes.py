#!/usr/bin/env python3
"""Where the choice of HiCache storage backend decides: memory pressure, restarts, several instances
and a slow tier, ours against SGLang's built-in Mooncake Store backend and Lifeboat, on live servers.

  python scripts/bench_regimes.py --json regimes.json --plot regimes.png        # everything
  python scripts/bench_regimes.py --regimes pressure,restart --shapes chat \\
      --backends ours,builtin --conversations 4 --turns 4                      # a few minutes

Regimes (each run: fresh servers on an empty disk folder, see devtools/bench/regimes/rig.py):
  pressure   L3 DRAM of --dram-fraction (a quarter) of the working set, the same disk for all;
  restart    the same storage; the first --restart-after turns, then every server SIGKILLed and
             started again on the same storage, then the remaining turns of the same threads;
             reported: the turns after the restart, and the first of them (TTFT, survived);
  instances  two servers behind sglang-router round_robin (the client alternates servers when it
             is not installed, or with --no-router) sharing one store: our pool, one
             mooncake_master, or Lifeboat's shared directory; DRAM for the whole working set; with
             the client alternating, each turn's server is known, and the cross-instance column
             counts the reachable tokens only the other server had computed, and how many of them
             were served;
  slow       pressure's set-up with every disk folder on a loop device throttled to
             --throttle-mbps (cgroup v1 blkio, root; skipped with the reason where unavailable).
Backends (devtools/bench/regimes/backends.py says what each is given): ours, builtin (SGLang's
MooncakeStore through `dynamic` on a real mooncake_master, with Mooncake's SSD offload where the
wheel has it), lifeboat (lifeboatcache through `dynamic`; installed on demand, --no-install to
refuse), ours-dram (ours with a host tier for the whole working set: what pressure costs ours),
builtin-dram (the built-in without its SSD offload), recompute (no HiCache: the baseline a hit must
beat).
Shapes: chat (SGLang's multi-turn shape: every turn resends the history with the server's own
answers) and doc (several questions over one long document each).

Every server gets the same SGLang flags (--hicache-ratio, 64-token pages, --max-total-tokens,
--enable-metrics, then --sglang-args) and OMP_WAIT_POLICY=PASSIVE (unless set: see rig.py). Per
regime and shape the backends run A B C C B A per pass; each run prints its load (1-minute average
at its start and end) and prefill rate. found / loaded / served: SGLang's
storage_prefetch_hit_tokens_total, prefetched_tokens_total and
prefill_effective_tokens_total{mode="storage_hit"} over the measured phase (found and loaded count
attempts; served is what storage spared). reachable: prompt tokens an earlier turn had stored.
Greedy outputs of a prompt are compared across every run that answered it: "outputs equal" is k/n,
n prompts some other run answered too, k answered as the majority did.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.console import comma_choices, run_script  # noqa: E402
from devtools.bench.console import stamped as log
from devtools.bench.regimes import backends as be  # noqa: E402
from devtools.bench.regimes import report  # noqa: E402
from devtools.bench.regimes.budget import Budget, budget, kv_bytes_per_token  # noqa: E402
from devtools.bench.regimes.rig import RigConfig, router_available, run_cell  # noqa: E402
from devtools.bench.regimes.schedule import BACKENDS, REGIMES, SHAPES, schedule  # noqa: E402
from devtools.bench.regimes.workload import Shape  # noqa: E402
from devtools.tiny_model import TinyLlama, write_tiny_llama  # noqa: E402
from mooncake_sgl.units import parse_size  # noqa: E402

PAGE = 64


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regimes", default=",".join(REGIMES), help=f"comma list of {', '.join(REGIMES)}")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--backends", default="ours,builtin,lifeboat", help=f"comma list of {', '.join(BACKENDS)}")
    p.add_argument("--passes", type=int, default=1, help="each pass runs the backends A B C C B A")
    p.add_argument("--seed", type=int, default=1)
    g = p.add_argument_group("chat shape")
    g.add_argument("--conversations", type=int, default=8)
    g.add_argument("--turns", type=int, default=4)
    g.add_argument("--first-turn-tokens", type=int, default=1024)
    g.add_argument("--user-tokens", type=int, default=512, help="each later user message")
    g = p.add_argument_group("doc shape")
    g.add_argument("--docs", type=int, default=6)
    g.add_argument("--doc-tokens", type=int, default=3072)
    g.add_argument("--questions", type=int, default=3, help="per document, one a turn")
    g.add_argument("--question-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=32, help="each answer (both shapes)")
    p.add_argument("--max-parallel", type=int, default=2, help="requests in flight")
    p.add_argument("--model-path", help="default: a tiny random-weight Llama written for the run")
    # Many thin layers: 8 KiB of KV per token (512 KiB pages) for little compute, so that a quarter
    # of a working set a 2-core machine prefills in seconds still fills Mooncake's smallest segment.
    p.add_argument("--model-layers", type=int, default=8, help="of the default model")
    p.add_argument("--model-hidden", type=int, default=TinyLlama.hidden, help="of the default model")
    p.add_argument("--model-kv-heads", type=int, default=4, help="of the default model (of 4 heads)")
    p.add_argument("--max-total-tokens", type=int, default=4096, help="SGLang's device KV pool")
    p.add_argument("--hicache-ratio", type=float, default=2.0, help="SGLang's host pool over the device's")
    p.add_argument("--sglang-args", default="", help="more SGLang flags for every server, one string")
    p.add_argument("--dram-fraction", type=float, default=0.25, help="L3 DRAM over the working set")
    p.add_argument("--disk-budget", help="disk of every backend (default: twice the working set)")
    p.add_argument("--restart-after", type=int, help="turns before the restart (default: half of them)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds between the last answer and the kill")
    p.add_argument("--throttle-mbps", type=int, default=50, help="the slow regime's disk, MB/s each way")
    p.add_argument("--no-offload", action="store_true", help="the built-in without Mooncake's SSD offload")
    p.add_argument("--no-install", action="store_true", help="never install lifeboatcache: fail saying how")
    p.add_argument("--no-router", action="store_true",
                   help="instances: the client alternates the servers itself, so each turn's server is "
                        "known and the tokens only the other server had computed are counted "
                        "(cross-instance)")
    p.add_argument("--host-reserve", default="512MiB",
                   help="host memory SGLang leaves aside when it sizes its host pool (CPU hosts)")
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--workdir", default="out/bench_regimes")
    p.add_argument("--json", metavar="PATH", help="every run's numbers, rewritten after each run")
    p.add_argument("--plot", metavar="PNG", help="served tokens and TTFT per backend (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.regimes = comma_choices(p, "--regimes", args.regimes, REGIMES)
    args.shapes = comma_choices(p, "--shapes", args.shapes, SHAPES)
    args.backends = comma_choices(p, "--backends", args.backends, BACKENDS)
    if len(set(args.backends)) != len(args.backends):
        p.error("--backends: each backend once")
    if min(args.conversations, args.turns, args.docs, args.questions, args.passes) < 1:
        p.error("--conversations, --turns, --docs, --questions and --passes: at least 1")
    if "restart" in args.regimes and min(args.turns if "chat" in args.shapes else 2,
                                         args.questions if "doc" in args.shapes else 2) < 2:
        p.error("the restart regime needs 2 turns (questions) at least: some before, some after")
    if not 0 < args.dram_fraction:
        p.error("--dram-fraction must be positive")
    if args.disk_budget:
        parse_size(args.disk_budget)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib (pip install matplotlib)")
    return args


def shapes_of(args: argparse.Namespace) -> dict[str, Shape]:
    every = {"chat": Shape("chat", args.conversations, args.turns, args.first_turn_tokens, args.user_tokens,
                           args.output_tokens),
             "doc": Shape("doc", args.docs, args.questions, args.doc_tokens, args.question_tokens,
                          args.output_tokens)}
    return {n: every[n] for n in args.shapes}


def sglang_flags(args: argparse.Namespace) -> tuple[str, ...]:
    import shlex

    return ("--hicache-ratio", str(args.hicache_ratio), "--page-size", str(PAGE),
            "--max-total-tokens", str(args.max_total_tokens), "--enable-metrics",
            *shlex.split(args.sglang_args))


def slow_disk(stack: ExitStack, args: argparse.Namespace, workdir: Path, budgets: dict[str, Budget]
              ) -> Path | str:
    """The throttled loop device's mount for the slow regime, or why this machine has none."""
    from devtools.bench.ssd import throttled

    why = throttled.unavailable()
    if why:
        log(f"skipping the slow regime: {why}")
        return why
    # One run's disk at a time (each run's folder is removed after it), with room to spare.
    size = 2 * max(b.disk for b in budgets.values()) + (1 << 30)
    disk = stack.enter_context(throttled.loop_disk(workdir, size))
    disk.limit(args.throttle_mbps)
    log(f"slow regime: {disk.loop} mounted at {disk.mount}, {args.throttle_mbps} MB/s each way")
    return disk.mount


def product_state() -> str:
    """Uncommitted changes to the product: a run measures the working tree, not a commit."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", "mooncake_sgl"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent.parent, timeout=30).stdout
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent.parent, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    changed = len(out.splitlines())
    return f"{head}" + (f" with {changed} product files changed in the working tree" if changed else "")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_start = time.monotonic()
    workdir = Path(args.workdir).resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    model = Path(args.model_path) if args.model_path else write_tiny_llama(
        workdir / "model", TinyLlama(layers=args.model_layers, hidden=args.model_hidden,
                                     kv_heads=args.model_kv_heads))
    page_bytes = PAGE * kv_bytes_per_token(model / "config.json")
    shapes = shapes_of(args)
    for s in shapes.values():
        if s.longest_prompt() + s.output_tokens > args.max_total_tokens:
            raise SystemExit(f"bench_regimes: the {s.name} shape's longest prompt ({s.longest_prompt()} "
                             f"tokens) and answer do not fit --max-total-tokens {args.max_total_tokens}")
    budgets = {n: budget(s.working_set_pages(PAGE), page_bytes, args.dram_fraction, args.disk_budget)
               for n, s in shapes.items()}
    segments = {n: [b.dram] * bool(set(args.regimes) - {"instances"})
                + [be.full_dram(b) // 2] * ("instances" in args.regimes) for n, b in budgets.items()}
    small = [n for n, sizes in segments.items() if min(sizes) < be.MOONCAKE_MIN_SEGMENT]
    if {"builtin", "builtin-dram"} & set(args.backends) and small:
        raise SystemExit(f"bench_regimes: Mooncake refuses a segment under {be.MOONCAKE_MIN_SEGMENT >> 20} "
                         f"MiB and the {', '.join(small)} shape's L3 DRAM is smaller: a larger workload, "
                         "--dram-fraction or model (--model-layers, --model-kv-heads)")
    lifeboat = be.ensure_lifeboat(not args.no_install) if "lifeboat" in args.backends else None
    offload = "builtin" in args.backends and not args.no_offload and be.builtin_offload_available()
    if "builtin" in args.backends and not args.no_offload and not offload:
        log("the built-in runs without SSD offload: this Mooncake wheel's setup() has no enable_ssd_offload")
    features = {n: be.features(b, offload, lifeboat, 2) for n, b in budgets.items()}
    state = product_state()
    router = ("sglang-router round_robin" if router_available() and not args.no_router
              else "none, the client alternates servers")
    log(f"product: {state}; router for instances: {router}")
    for n, b in budgets.items():
        log(f"[{n}] {b.describe()}")
        for backend in args.backends:
            log(f"[{n}]   {backend}: {features[n][backend]}")
    if lifeboat:  # a key this version does not know fails here, not in a server
        probe = workdir / "lifeboat-check"
        probe.mkdir(exist_ok=True)
        (probe / "lifeboat.yaml").write_text(be.lifeboat_yaml(next(iter(budgets.values())), probe, False))
        be.check_lifeboat_config(probe / "lifeboat.yaml")
    flags = sglang_flags(args)
    order = schedule(args.regimes, args.shapes, args.backends, args.passes, args.seed)
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    failed: list[str] = []

    def dump() -> None:
        if not args.json:
            return
        _, summary = report.by_backend(records) if records else ("", [])
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"args": vars(args), "flags": flags, "product": state, "page_bytes": page_bytes,
             "budgets": {n: dataclasses.asdict(b) for n, b in budgets.items()}, "features": features,
             "skipped": skipped, "failed": failed, "summary": summary, "runs": records,
             "wall_s": time.monotonic() - t_start}, indent=1, default=str))

    def cfg_for(shape: Shape) -> RigConfig:
        return RigConfig(model=model, flags=flags, workdir=workdir, host_reserve=args.host_reserve,
                         health_timeout_s=args.health_timeout, request_timeout_s=args.request_timeout,
                         max_parallel=args.max_parallel, page=PAGE,
                         restart_after=min(args.restart_after or shape.turns // 2, shape.turns - 1),
                         settle_s=args.settle, offload=offload, progress=not args.no_progress,
                         router=not args.no_router)

    for regime in args.regimes:
        cells = [c for c in order if c.regime == regime]
        with ExitStack() as stack:
            disk_root = slow_disk(stack, args, workdir, budgets) if regime == "slow" else workdir / "disk"
            if isinstance(disk_root, str):
                skipped.append(f"slow: {disk_root}")
                continue
            for cell in cells:
                i = order.index(cell) + 1
                shape = shapes[cell.shape]
                log(f"run {i}/{len(order)}: {cell.regime} {cell.shape} {cell.backend} (seed {cell.seed}), "
                    f"load {os.getloadavg()[0]:.1f}")
                try:
                    raw = run_cell(cell, i, len(order), shape, budgets[cell.shape], cfg_for(shape), disk_root)
                except Exception as e:  # noqa: BLE001 (one run's failure is reported; the others go on)
                    failed.append(f"run {i} ({cell.regime} {cell.shape} {cell.backend}): {str(e)[:2000]}")
                    log(f"run {i} failed: {str(e)[:4000]}")
                    dump()
                    continue
                records.append(report.summarise(raw))
                for rec, eq in zip(records, report.compare_outputs(records)):
                    rec["outputs_equal"] = eq
                r = records[-1]
                log(f"[{cell.regime} {cell.shape} {cell.backend}] found {r['found']}, loaded {r['loaded']}, "
                    f"served {r['served']} of {r['reachable']} reachable, TTFT mean "
                    f"{(r['ttft_mean_s'] or 0) * 1e3:.0f} ms, p90 {(r['ttft_p90_s'] or 0) * 1e3:.0f} ms, "
                    f"prefill {r['prefill_rate_tok_s'] or 0:.0f} tok/s, "
                    f"load {r['load']:.1f}-{r['load_end']:.1f}, "
                    f"{r['errors']} errors, {r['backend_failures']} failed storage calls"
                    + (", its mooncake_master had died" if r["master_alive"] is False else ""))
                dump()
    title = (f"regimes: chat {args.conversations}x{args.turns} ({args.first_turn_tokens}+"
             f"{args.user_tokens}), doc {args.docs}x{args.questions} ({args.doc_tokens}+"
             f"{args.question_tokens}), {args.output_tokens}-token answers, {args.max_parallel} in flight; "
             f"ratio {args.hicache_ratio}, {args.max_total_tokens} device tokens, L3 DRAM "
             f"{args.dram_fraction:.0%} of the working set")
    print(title)
    print(f"product: {state}")
    for n, b in budgets.items():
        print(f"{n}: {b.describe()}")
    for line in skipped:
        print(f"skipped: {line}")
    for line in failed:
        print(f"failed: {line.splitlines()[0]}")
    if not records:
        return 1
    print(report.runs_table(records))
    print()
    text, summary = report.by_backend(records)
    print(text)
    print(f"wall time {time.monotonic() - t_start:.0f} s")
    dump()
    if args.plot:
        report.plot(summary, Path(args.plot), title)
        log(f"plot written to {args.plot}")
    return 1 if failed or any(r["errors"] or r["backend_failures"] for r in records) else 0


if __name__ == "__main__":
    run_script(main)
