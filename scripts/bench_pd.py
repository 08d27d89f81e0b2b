#!/usr/bin/env python3
"""Prefill/decode disaggregation around our pool: what the pooled KV buys a PD deployment.

  python scripts/bench_pd.py --json pd.json                 # every variant, A B C D D C B A
  python scripts/bench_pd.py --variants pd-pool,pd-none --prefills 2   # turns land on either prefill

Live SGLang servers on 127.0.0.1 (no root needed; devtools/testing/pd.py), every variant up at
once (idle servers sleep), run in interleaved order so that the machine's load falls on each
variant alike. Variants, each with --prefills + --decodes servers:
  pd-pool         PD (mooncake_tcp, SGLang's mini load balancer, which picks a prefill and a
                  decode at random per request); prefills over our pool, decodes offloading
                  their output pages to it;
  pd-pool-t64     the same with SGLang's prefetch_threshold at one page (64), so a turn with
                  fewer than 256 new tokens still reads the decode's pages (item 5 below);
  pd-none         the same PD deployment without HiCache storage;
  colocated-pool  as many plain servers over the pool behind sglang-router (round robin).
A chat workload: each conversation's next turn is its whole history, the server's own answer
included, plus a new user message. Per run: TTFT mean/p50/p99, ITL, throughput, each run's own
prefill rate (computed prompt tokens per second of TTFT: the machine's speed in that run), the
cached share of prompt tokens against the reachable share, and where cached tokens came from
(the serving prefill's own device/host cache; storage pages of earlier prompts; storage pages
past the previous prompt, which in PD only a decode with offload writes).

What SGLang does not store, counted per run: the last sampled token of each answer (never run
through the model: a page lost whenever the history ends on a page boundary), and turns whose
new tokens are fewer than prefetch_threshold, which never look in storage at all.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench import options  # noqa: E402
from devtools.bench.client import RequestResult, SglangClient  # noqa: E402
from devtools.bench.console import run_script  # noqa: E402
from devtools.bench.console import stamped as log
from devtools.bench.plot import Panel, bar_panels  # noqa: E402
from devtools.bench.results import percentile, text_table  # noqa: E402
from devtools.bench.server import LaunchedServer  # noqa: E402
from devtools.bench.workloads import BenchRequest, MultiTurnSpec, add_chat_arguments, chat_parts, chat_spec  # noqa: E402
from devtools.testing.pd import PdServers  # noqa: E402
from devtools.testing.pool_process import PoolProcess  # noqa: E402
from mooncake_sgl_cpu.adaptations import HOST_RESERVE_ENV  # noqa: E402

PAGE = 64
SGLANG_THRESHOLD = 256  # SGLang's default prefetch_threshold
VARIANTS = ("pd-pool", "pd-pool-t64", "pd-none", "colocated-pool")


@dataclass
class Variant:
    name: str
    front: LaunchedServer  # where requests go
    servers: list[LaunchedServer]
    threshold: int | None  # SGLang's prefetch_threshold for its storage reads; None: no storage


@dataclass
class Turn:
    """One request of a conversation and what the previous turn left for it."""
    prev_prompt: int  # tokens of the previous turn's prompt (0 on a first turn)
    prev_output: int
    result: RequestResult

    @property
    def prompt(self) -> int:
        return self.result.prompt_tokens

    def reachable(self) -> int:
        """Whole pages of the history before this turn's user message (never the prompt's last token)."""
        if not self.prev_prompt:
            return 0
        return min(self.prev_prompt + self.prev_output, self.prompt - 1) // PAGE * PAGE

    def storable(self) -> int:
        """What SGLang can have stored of that history: every whole page but the one the
        answer's last sampled token would end (its KV is never computed)."""
        if not self.prev_prompt:
            return 0
        return min(self.prev_prompt + self.prev_output - 1, self.prompt - 1) // PAGE * PAGE


@dataclass
class Run:
    variant: str
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0


def tiers_file(workdir: Path, pool: str, threshold: int | None) -> Path:
    name = f"tiers-t{threshold}.yaml" if threshold else "tiers.yaml"
    path = workdir / name
    text = f'tiers:\n  - {{kind: host, capacity: 64MiB}}\n  - {{kind: pool, endpoints: ["{pool}"]}}\n'
    if threshold:
        text += f"prefetch_threshold: {threshold}  # read by SGLang, not by us\n"
    path.write_text(text)
    return path


def start_variant(made: PdServers, name: str, workdir: Path, pool: str, prefills: int,
                  decodes: int) -> Variant:
    threshold = {"pd-pool-t64": PAGE, "pd-none": None}.get(name, SGLANG_THRESHOLD)
    tiers = tiers_file(workdir, pool, threshold if threshold != SGLANG_THRESHOLD else None)
    with ThreadPoolExecutor(prefills + decodes) as ex:
        if name == "colocated-pool":
            servers = list(ex.map(lambda i: made.colocated(f"{name}-{i}", tiers), range(prefills + decodes)))
            return Variant(name, made.router(f"{name}-router", servers), servers, threshold)
        storage = None if name == "pd-none" else tiers
        ps = [ex.submit(made.server, f"{name}-prefill{i}", "prefill", storage) for i in range(prefills)]
        ds = [ex.submit(made.server, f"{name}-decode{i}", "decode-offload", storage) for i in range(decodes)]
        p, d = [f.result() for f in ps], [f.result() for f in ds]
    return Variant(name, made.balancer(f"{name}-lb", p, d), p + d, threshold)


def cold_start(v: Variant) -> None:
    """Nothing cached anywhere: SGLang's caches flushed on every server, our pool emptied."""
    for s in v.servers:
        SglangClient(s.url).flush_cache()
        if v.threshold is not None:  # each server's own host tier, and the pool they share
            SglangClient(s.url).clear_storage()


def drive(v: Variant, parts: list[tuple[list[int], list[list[int]]]], output_tokens: int,
          max_parallel: int, bar: Any) -> Run:
    client = SglangClient(v.front.url)
    run = Run(v.name)
    lock = threading.Lock()

    def converse(c: int) -> None:
        history, users = parts[c]
        prev_prompt = prev_output = 0
        for t in range(len(users) + 1):
            if t:
                history = history + users[t - 1]
            res = client.generate(BenchRequest(f"conv{c}-t{t}", t, list(history), output_tokens, 0))
            with lock:
                run.turns.append(Turn(prev_prompt, prev_output, res))
                if bar is not None:
                    bar.update(1)
            if res.error:
                return  # the conversation cannot go on without its answer
            if len(res.output_ids) != res.output_tokens:
                raise RuntimeError(f"{v.name}: {len(res.output_ids)} output ids streamed for "
                                   f"{res.output_tokens} completion tokens (is the server running "
                                   "with --incremental-streaming-output?)")
            prev_prompt, prev_output = len(history), len(res.output_ids)
            history = history + list(res.output_ids)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, max_parallel)) as ex:
        list(ex.map(converse, range(len(parts))))
    run.wall_s = time.monotonic() - t0
    return run


def summarise(run: Run, threshold: int | None) -> dict[str, Any]:
    ok = [t for t in run.turns if not t.result.error]
    rs = [t.result for t in ok]
    prompt = sum(r.prompt_tokens for r in rs)
    cached = sum(r.cached_tokens for r in rs)
    ttft = [r.ttft_s for r in rs]
    itl = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in rs if r.output_tokens > 1]
    computed = prompt - cached
    past_prompt = lost_threshold = short = 0
    for t in ok:
        r = t.result
        own = r.device_tokens + r.host_tokens
        boundary = t.prev_prompt // PAGE * PAGE
        if r.storage_tokens:  # storage served [own, cached): the part past the last prompt's pages
            past_prompt += max(0, r.cached_tokens - max(own, boundary))
        if r.cached_tokens < t.storable():
            gap = t.storable() - r.cached_tokens
            if (threshold is not None and not r.storage_tokens
                    and t.prompt - r.cached_tokens < max(threshold, PAGE)):
                lost_threshold += gap
            else:
                short += gap
    reachable = sum(t.reachable() for t in ok)
    last_token = sum(t.reachable() - t.storable() for t in ok)
    storage = sum(r.storage_tokens for r in rs)
    return {
        "variant": run.variant, "requests": len(run.turns), "errors": len(run.turns) - len(ok),
        "wall_s": run.wall_s, "prompt_tokens": prompt, "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "reachable_share": reachable / prompt if prompt else 0.0,
        "own_cache_tokens": sum(r.device_tokens + r.host_tokens for r in rs),
        "storage_prompt_pages_tokens": storage - past_prompt, "storage_past_prompt_tokens": past_prompt,
        "lost_last_token_tokens": last_token, "lost_threshold_tokens": lost_threshold,
        "short_other_tokens": short,
        "ttft_mean_s": statistics.fmean(ttft) if ttft else 0.0,
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
        "itl_mean_s": statistics.fmean(itl) if itl else 0.0,
        "throughput_req_s": len(ok) / run.wall_s if run.wall_s else 0.0,
        "throughput_out_tok_s": sum(r.output_tokens for r in rs) / run.wall_s if run.wall_s else 0.0,
        "prefill_rate_tok_s": computed / sum(ttft) if ttft and sum(ttft) else 0.0,
    }


def table(cells: list[dict[str, Any]]) -> str:
    header = ("run", "variant", "cached", "reachable", "own cache", "pool: prompts", "pool: past prompt",
              "TTFT mean", "p50", "p99", "ITL", "out tok/s", "prefill tok/s", "lost: last tok",
              "lost: threshold", "short: other", "errors")

    def ms(s: float) -> str:
        return f"{s * 1e3:.0f} ms"

    rows = [(str(i + 1), c["variant"], f"{c['cached_share']:.1%}", f"{c['reachable_share']:.1%}",
             str(c["own_cache_tokens"]), str(c["storage_prompt_pages_tokens"]),
             str(c["storage_past_prompt_tokens"]), ms(c["ttft_mean_s"]), ms(c["ttft_p50_s"]),
             ms(c["ttft_p99_s"]), ms(c["itl_mean_s"]), f"{c['throughput_out_tok_s']:.1f}",
             f"{c['prefill_rate_tok_s']:.0f}", str(c["lost_last_token_tokens"]),
             str(c["lost_threshold_tokens"]), str(c["short_other_tokens"]), str(c["errors"]))
            for i, c in enumerate(cells)]
    return text_table(header, rows)


def by_variant(cells: list[dict[str, Any]]) -> str:
    """Per variant, the median over its runs, and TTFT as a ratio to the PD baseline's."""
    names = list(dict.fromkeys(c["variant"] for c in cells))
    med = {n: {k: statistics.median(c[k] for c in cells if c["variant"] == n)
               for k in ("cached_share", "ttft_mean_s", "ttft_p99_s", "throughput_out_tok_s")}
           for n in names}
    base = med.get("pd-none", {}).get("ttft_mean_s")
    lines = ["variant          cached   TTFT mean  TTFT p99  out tok/s  TTFT vs pd-none"]
    for n in names:
        m = med[n]
        ratio = f"{m['ttft_mean_s'] / base:.2f}x" if base else "-"
        lines.append(f"{n:<16} {m['cached_share']:>6.1%}  {m['ttft_mean_s'] * 1e3:>7.0f} ms "
                     f"{m['ttft_p99_s'] * 1e3:>6.0f} ms  {m['throughput_out_tok_s']:>9.1f}  {ratio}")
    return "\n".join(lines)


def plot(cells: list[dict[str, Any]], path: str, title: str) -> None:
    shares = Panel("% of prompt tokens", [[("cached", [c["cached_share"] * 100 for c in cells])],
                                          [("reachable", [c["reachable_share"] * 100 for c in cells])]])
    ttft = Panel("ms", [[("TTFT mean", [c["ttft_mean_s"] * 1e3 for c in cells])],
                        [("TTFT p99", [c["ttft_p99_s"] * 1e3 for c in cells])]])
    bar_panels(path, title, [f"{i + 1}\n{c['variant']}" for i, c in enumerate(cells)], [shares, ttft],
               figsize=(13, 4.5), label_size=7)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    # Every variant's servers are up at once (about 1.5-2 GiB of host memory each on a CPU host):
    # four variants of 1 + 1 fit a 24 GiB machine; --variants pd-pool,pd-none --prefills 2 too.
    p.add_argument("--prefills", type=int, default=1)
    p.add_argument("--decodes", type=int, default=1)
    add_chat_arguments(p, MultiTurnSpec(conversations=4, turns=4,
                                         first_turn_tokens=1024, user_tokens=64,
                                         output_tokens=96),
                       max_parallel=2)
    options.add_passes(p, "A B C D D C B A")
    options.add_model_options(p)
    p.add_argument("--pool-capacity", default="1GiB")
    options.add_host_reserve(p)
    options.add_run_options(p, workdir="out/bench_pd", json_help="write every run's numbers here",
                            plot_default="bench_pd.png")
    args = p.parse_args(argv)
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"--variants: {v!r} is none of {', '.join(VARIANTS)}")
    if args.prefills < 1 or args.decodes < 1 or args.turns < 2:
        p.error("--prefills and --decodes at least 1, --turns at least 2")
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model = options.model_path(args, workdir)
    spec = chat_spec(args)
    parts = chat_parts(spec)
    order = [v for _, v, _ in options.schedule(args.variants, args.passes)]
    # SGLang sizes each host pool from what memory is left after a 10 GiB reserve; a dozen servers
    # on one host leave none, so the reserve is the live tests' (the tiny model's pools are small).
    made = PdServers(model, workdir / "logs", ("--max-total-tokens", str(args.max_total_tokens),
                                               "--enable-metrics"), env={HOST_RESERVE_ENV: args.host_reserve},
                     health_timeout_s=args.health_timeout)
    cells: list[dict[str, Any]] = []
    with PoolProcess(capacity=args.pool_capacity) as pool:
        try:
            log(f"starting {len(args.variants)} deployments of {args.prefills}+{args.decodes} servers "
                f"(logs in {made.logs})")
            with ThreadPoolExecutor(len(args.variants)) as ex:
                started = list(ex.map(lambda n: start_variant(made, n, workdir, pool.endpoint, args.prefills,
                                                              args.decodes), args.variants))
            variants = {v.name: v for v in started}
            for i, name in enumerate(order):
                v = variants[name]
                cold_start(v)
                desc = f"{i + 1}/{len(order)} {name}"
                with options.progress(args, spec.conversations * spec.turns, desc) as bar:
                    run = drive(v, parts, args.output_tokens, args.max_parallel, bar)
                cell = summarise(run, v.threshold)
                cells.append(cell)
                log(f"[{name}] cached {cell['cached_share']:.1%} of reachable {cell['reachable_share']:.1%}, "
                    f"TTFT mean {cell['ttft_mean_s'] * 1e3:.0f} ms, prefill {cell['prefill_rate_tok_s']:.0f} "
                    f"tok/s, {cell['errors']} errors")
                # After every run: a long run interrupted keeps what it measured.
                options.write_json(args, runs=cells)
        finally:
            made.close()
    title = (f"PD: {args.prefills} prefill + {args.decodes} decode: {spec.conversations} conversations x "
             f"{spec.turns} turns, {args.max_parallel} at once, {args.output_tokens}-token answers, "
             f"{args.user_tokens}-token user turns")
    print(title)
    print(table(cells))
    print()
    print(by_variant(cells))
    if args.plot:
        plot(cells, args.plot, title)
    return 1 if any(c["errors"] for c in cells) else 0


if __name__ == "__main__":
    run_script(main)
