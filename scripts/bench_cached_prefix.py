#!/usr/bin/env python3
"""What a cached prefix saves the server itself: TTFT of one request beside a cached prefix of
each size, against the same request with nothing cached, on a live server without HiCache.

A backend decides how much of a storage hit to load (the load gate) on the premise that each
token loaded is a token not computed. That holds where computing beside a cached prefix costs no
more per token than computing from nothing; SGLang's CPU attention computes beside one at about
twice the cost per token, so there a short prefix costs more than it saves. This measures it.

Per round, for each prefix size in turn (0 first: the baseline): SGLang's caches are flushed, a
fresh random document of ``--doc-tokens`` is drawn, its first ``prefix`` tokens sent alone (one
output token: they are then cached on the device), and the whole document sent and timed. Prints
per size the TTFT median over the rounds, its ratio to nothing cached, and the tokens SGLang
reported cached; the load before and after.

    python scripts/bench_cached_prefix.py                      # 4,096 tokens, 8 rounds
    python scripts/bench_cached_prefix.py --prefixes 0,64,512,2048 --rounds 4 --json prefix.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.client import SglangClient  # noqa: E402
from devtools.bench.console import log, run_script  # noqa: E402
from devtools.bench.server import (  # noqa: E402
    LaunchedServer,
    free_port,
    has_gpu,
    launch_command,
    server_env,
    stop_all,
)
from devtools.bench.workloads import BenchRequest  # noqa: E402
from devtools.tiny_model import write_tiny_llama  # noqa: E402


def prefix_sizes(text: str, doc_tokens: int) -> list[int]:
    """The sizes to measure, 0 (the baseline) first; each below the document's length."""
    sizes = sorted({int(x) for x in text.split(",") if x.strip()} | {0})
    bad = [s for s in sizes if s < 0 or s >= doc_tokens]
    if bad:
        raise ValueError(f"--prefixes {bad}: each must be at least 0 and below --doc-tokens {doc_tokens}")
    return sizes


def measure(client: SglangClient, sizes: list[int], rounds: int, doc_tokens: int, seed: int
            ) -> dict[int, list[tuple[float, int]]]:
    """Per prefix size, (TTFT seconds, tokens SGLang reported cached) of each round."""
    rng = random.Random(seed)
    out: dict[int, list[tuple[float, int]]] = {s: [] for s in sizes}
    for r in range(rounds):
        for prefix in sizes:
            ids = [rng.randrange(32000) for _ in range(doc_tokens)]
            client.flush_cache()
            if prefix:
                warm = client.generate(BenchRequest(rid=f"prefix-{r}-{prefix}", round=r,
                                                    input_ids=ids[:prefix], max_new_tokens=1,
                                                    reusable_tokens=0))
                if warm.error:
                    raise RuntimeError(f"caching a {prefix}-token prefix: {warm.error}")
            res = client.generate(BenchRequest(rid=f"doc-{r}-{prefix}", round=r, input_ids=ids,
                                               max_new_tokens=2, reusable_tokens=prefix))
            if res.error:
                raise RuntimeError(f"the {doc_tokens}-token request beside {prefix}: {res.error}")
            out[prefix].append((res.ttft_s, res.cached_tokens))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{p}: {out[p][-1][0] * 1e3:.1f} ms" for p in sizes))
    return out


def table(results: dict[int, list[tuple[float, int]]], doc_tokens: int) -> tuple[str, list[dict]]:
    base = statistics.median(t for t, _ in results[0])
    rows = []
    lines = [f"{'cached':>8} {'computed':>9} {'TTFT median':>12} {'x nothing cached':>17} "
             f"{'cached (SGLang)':>16}"]
    for prefix, runs in results.items():
        ttft = statistics.median(t for t, _ in runs)
        cached = statistics.median(c for _, c in runs)
        rows.append({"prefix_tokens": prefix, "ttft_median_s": ttft, "x_nothing_cached": ttft / base,
                     "sglang_cached_tokens": cached, "ttft_s": [t for t, _ in runs]})
        lines.append(f"{prefix:>8} {doc_tokens - prefix:>9} {ttft * 1e3:>10.1f}ms {ttft / base:>16.2f}x "
                     f"{cached:>16.0f}")
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--doc-tokens", type=int, default=4096)
    p.add_argument("--prefixes", default="64,1024,2048,3968",
                   help="cached prefix sizes in tokens, comma-separated (0, the baseline, is always run)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--health-timeout", type=float, default=600.0)
    p.add_argument("--json", type=Path, help="write every round here")
    args = p.parse_args(argv)
    try:
        sizes = prefix_sizes(args.prefixes, args.doc_tokens)
    except ValueError as e:
        p.error(str(e))
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    cpu = not has_gpu()
    with tempfile.TemporaryDirectory(prefix="mooncake-sgl-prefix-") as tmp:
        work = Path(tmp)
        model = write_tiny_llama(work / "model")
        server = LaunchedServer(lambda port: launch_command(
            str(model), port, (), cpu=cpu, extra=("--max-total-tokens", str(4 * args.doc_tokens))),
            free_port(), work / "server.log", args.health_timeout,
            env=server_env(cpu, {"XDG_CACHE_HOME": str(work / "cache")}))
        try:
            server.start()
            load = os.getloadavg()[0]
            results = measure(SglangClient(server.url, timeout_s=600), sizes, args.rounds,
                              args.doc_tokens, args.seed)
            load_after = os.getloadavg()[0]
        finally:
            stop_all([server])
    text, rows = table(results, args.doc_tokens)
    print(f"\none request of {args.doc_tokens} tokens beside a cached prefix, {args.rounds} rounds, "
          f"{'CPU' if cpu else 'GPU'} server without HiCache, load {load:.2f} before, {load_after:.2f} after")
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"doc_tokens": args.doc_tokens, "rounds": args.rounds,
                                         "cpu": cpu, "load": [load, load_after], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)
