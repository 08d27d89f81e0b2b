"""The live-server benchmark driver shared by ``python -m devtools.bench long-context`` and
``multiturn``.

Per variant (one server configuration): empty our storage tiers, then per round flush SGLang's
device and host caches (``/flush_cache``) so any reuse must come from the storage tiers, send the
round's requests (``--max-parallel`` at a time) and record TTFT, throughput and
``meta_info.cached_tokens_details``. Against ``--url`` one variant runs (the server as it is); with
``--launch`` each variant gets its own ``sglang.launch_server`` and the run ends with one
side-by-side table and a PNG plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mooncake_sgl.metrics import Snapshot, diff, rows
from mooncake_sgl.metrics.scrape import ScrapeError, fetch, parse

from ..tiny_model import TinyLlama, write_tiny_llama
from .client import RequestResult, SglangClient
from .console import log as log_line
from .results import (
    io_rates,
    io_table,
    per_request_table,
    per_request_vs_base,
    plot_side_by_side,
    recompute_summary,
    side_by_side_table,
    tier_table,
    variant_result,
)
from .server import LaunchedServer, Variant, free_port, has_gpu, launch_command, parse_variant, server_env
from .workloads import BenchRequest, LongContextSpec, MultiTurnSpec, long_context, multiturn

_HOW = __doc__.split("\n\n", 1)[1]
WARMUP_PAGE_TOKENS = 64


def add_common_args(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:30000 (one variant)")
    where.add_argument("--launch", action="store_true", help="start one server per --variant")
    p.add_argument("--variant", action="append", default=[],
                   help="no-hicache | hicache-l2 | ours | ours:TIERS.yaml, optionally LABEL=...; repeat. "
                        "Default with --launch: no-hicache, hicache-l2, and ours:Y for each --tiers Y "
                        "(ours on the embedded default tiers when no --tiers is given)")
    p.add_argument("--tiers", action="append", default=[], metavar="YAML",
                   help="a tier set for our backend (adds the variant ours:YAML)")
    p.add_argument("--model-path", help="local model dir; default: a tiny Llama with seeded random "
                                        "weights written here (devtools.tiny_model)")
    p.add_argument("--model-layers", type=int, default=TinyLlama.layers, help="of the default model")
    p.add_argument("--model-hidden", type=int, default=TinyLlama.hidden, help="of the default model")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra launch_server argument(s), e.g. --server-arg=--max-total-tokens=131072")
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--max-parallel", type=int, default=8, help="concurrent requests in a round")
    p.add_argument("--request-timeout", type=float, default=1800.0, metavar="S",
                   help="seconds a request may wait for its next byte (a cold 12k-token prompt took "
                        "over 600 s on a loaded 2-core machine)")
    p.add_argument("--no-flush", action="store_true", help="keep SGLang's caches between rounds")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="PATH", help="write all results as JSON")
    p.add_argument("--plot", metavar="PATH", help="PNG of TTFT and throughput per round "
                                                  "(default with several variants: bench_<workload>.png)")
    p.add_argument("--log-dir", default=".", help="where launched servers write their logs (created)")
    p.add_argument("--no-progress", action="store_true")


def variants_from_args(args: argparse.Namespace) -> list[Variant]:
    specs = list(args.variant) + [f"ours:{t}" for t in args.tiers]
    if args.url:
        return [Variant("server", ())] if not specs else [parse_variant(specs[0])]
    if not args.variant:
        specs = ["no-hicache", "hicache-l2"] + (specs or ["ours"])
    return [parse_variant(s) for s in specs]


def default_model(directory: Path, args: argparse.Namespace) -> Path:
    """The tiny random-weight Llama the launched servers load when no ``--model-path`` is given."""
    spec = TinyLlama(layers=args.model_layers, hidden=args.model_hidden, vocab=args.vocab_size)
    args.model_description = spec.describe()
    return write_tiny_llama(directory, spec)


def run_round(client: SglangClient, batch: list[BenchRequest], max_parallel: int, progress: Any
              ) -> tuple[list[RequestResult], float]:
    start = time.perf_counter()
    results: list[RequestResult] = []
    with ThreadPoolExecutor(max_workers=max(1, max_parallel)) as pool:
        for res in pool.map(client.generate, batch):
            results.append(res)
            if progress is not None:
                progress.update(1)
    return results, time.perf_counter() - start


# SGLang's own series for the two copies of a storage hit: our batch_get_v1 calls (L3 -> host, the
# GB/s of each call as the backend measured it) and the load-back (host -> device).
SGLANG_IO = {
    "prefetch_gbps_sum": "sglang:prefetch_bandwidth_sum",
    "prefetch_calls": "sglang:prefetch_bandwidth_count",
    "load_back_bytes": "sglang:load_back_bytes_total",
    "load_back_s": "sglang:load_back_duration_seconds_sum",
}


def sglang_io(text: str) -> dict[str, float]:
    """The ``SGLANG_IO`` series in a ``/metrics`` text, summed over label sets (absent: 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name: key for key, name in SGLANG_IO.items()}
    out = dict.fromkeys(SGLANG_IO, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                out[key] += float(sample.value)
    return out


def tier_snapshot(client: SglangClient) -> tuple[Snapshot | None, dict[str, float] | None]:
    """Our per-tier counters and SGLang's io series from the server's ``/metrics`` (``None``: not
    there, e.g. a server without our backend or without ``--enable-metrics``)."""
    try:
        text = fetch(f"{client.host}:{client.port}")
    except ScrapeError:
        return None, None
    snap = parse(text)
    return (snap if snap.tiers else None), sglang_io(text)


def tier_sources(before: Snapshot | None, after: Snapshot | None) -> list[dict[str, Any]]:
    """Per tier of ours: pages found there, bytes read and written, over one round."""
    if before is None or after is None:
        return []
    return [asdict(r) for r in rows(diff(before, after))]


def run_variant(client: SglangClient, label: str, rounds: list[list[BenchRequest]], *,
                max_parallel: int, flush: bool, show_progress: bool) -> dict[str, Any]:
    # One short request first: with another storage backend (the baselines), a server's first request
    # builds or loads SGLang's page-hash extension (seconds; ours does it at attach), a one-time cost
    # of the process that must not count against either variant's round 0.
    client.generate(BenchRequest("warm-up", -1, list(range(10, 10 + 3 * WARMUP_PAGE_TOKENS)), 1, 0))
    cleared = client.clear_storage()  # a fresh start for our tiers (False: no storage backend)
    recorded = []
    sources = []
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(b) for b in rounds), desc=label, unit="req", file=sys.stderr)
    try:
        for i, batch in enumerate(rounds):
            if flush:
                client.flush_cache()
            if bar is not None:
                bar.set_postfix(round=i)
            before, io_before = tier_snapshot(client)
            recorded.append(run_round(client, batch, max_parallel, bar))
            after, io_after = tier_snapshot(client)
            sources.append((tier_sources(before, after), io_rates(io_before, io_after)))
    finally:
        if bar is not None:
            bar.close()
    out = variant_result(label, recorded)
    for r, (tiers, io) in zip(out["rounds"], sources):
        r["tiers"] = tiers
        r["io"] = io
    out["storage_cleared_at_start"] = cleared
    return out


def run(args: argparse.Namespace, workload: str, rounds: list[list[BenchRequest]]) -> int:
    variants = variants_from_args(args)
    results = []
    if args.url:
        client = SglangClient(args.url, timeout_s=args.request_timeout)
        client.wait_healthy(60.0)
        results.append(run_variant(client, variants[0].label, rounds, max_parallel=args.max_parallel,
                                   flush=not args.no_flush, show_progress=not args.no_progress))
    else:
        cpu = not has_gpu()
        with tempfile.TemporaryDirectory(prefix="mooncake-sgl-bench-") as tmp:
            model = args.model_path or str(default_model(Path(tmp) / "model", args))
            extra = tuple(args.server_arg)
            # The embedded default keeps its LMDB under $XDG_CACHE_HOME: a benchmark must not clear
            # (or read) the user's real cache, so launched servers get a cache folder of their own.
            env = server_env(cpu, {"XDG_CACHE_HOME": str(Path(tmp) / "cache")})
            for v in variants:
                port = free_port()
                metrics = ("--enable-metrics",) if "--hicache-storage-backend" in v.args else ()
                cmd = launch_command(model, port, v.args, cpu=cpu, extra=metrics + extra)
                log = Path(args.log_dir) / f"server-{workload}-{v.label.replace(':', '_')}.log"
                log_line(f"[{v.label}] starting: {' '.join(cmd)}  (log: {log})")
                with LaunchedServer(cmd, port, log, args.health_timeout, env=env) as server:
                    results.append(run_variant(SglangClient(server.url, timeout_s=args.request_timeout),
                                               v.label, rounds,
                                               max_parallel=args.max_parallel, flush=not args.no_flush,
                                               show_progress=not args.no_progress))
    title = f"{workload}: {sum(len(b) for b in rounds)} requests in {len(rounds)} rounds"
    print(title)
    print(f"model: {getattr(args, 'model_description', None) or args.model_path or 'the server as it runs'}")
    print(side_by_side_table(results))
    for line in recompute_summary(results):
        print(line)
    per_request = per_request_vs_base(results)
    if per_request:
        print("each reuse request against recomputing it (same request, same round, no HiCache):")
        print(per_request_table(per_request))
    io = io_table(results)
    if io:
        print("storage hits' copies, per round (SGLang's /metrics: our batch_get_v1 calls, its load-back):")
        print(io)
    tiers = tier_table(results)
    if tiers:
        print("where our pages came from, per round (the backend's own series on /metrics):")
        print(tiers)
    plot = args.plot or (f"bench_{workload}.png" if len(results) > 1 else None)
    if plot:
        plot_side_by_side(results, Path(plot), title)
        print(f"plot written to {plot}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps({"workload": workload, "args": vars(args),
                                               "summary": recompute_summary(results),
                                               "per_request": per_request,
                                               "variants": results}, indent=2, default=str))
    return 1 if any(r["errors"] for v in results for r in v["rounds"]) else 0


def long_context_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Long-context benchmark against a live SGLang server: "
                                            "shared long documents, many questions each.\n\n" + _HOW,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    d = LongContextSpec()
    p.add_argument("--docs", type=int, default=d.docs)
    p.add_argument("--min-doc-tokens", type=int, default=d.min_doc_tokens)
    p.add_argument("--max-doc-tokens", type=int, default=d.max_doc_tokens)
    p.add_argument("--questions", type=int, default=d.questions, help="per document (= rounds)")
    p.add_argument("--question-tokens", type=int, default=d.question_tokens)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    args = p.parse_args(argv)
    spec = LongContextSpec(docs=args.docs, min_doc_tokens=args.min_doc_tokens,
                           max_doc_tokens=args.max_doc_tokens, questions=args.questions,
                           question_tokens=args.question_tokens, output_tokens=args.output_tokens,
                           vocab_size=args.vocab_size, seed=args.seed)
    return run(args, "long_context", long_context(spec))


def multiturn_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Multi-turn benchmark against a live SGLang server: "
                                            "growing conversations.\n\n" + _HOW,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    d = MultiTurnSpec()
    p.add_argument("--conversations", type=int, default=d.conversations)
    p.add_argument("--turns", type=int, default=d.turns, help="= rounds")
    p.add_argument("--first-turn-tokens", type=int, default=d.first_turn_tokens)
    p.add_argument("--user-tokens", type=int, default=d.user_tokens)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    args = p.parse_args(argv)
    spec = MultiTurnSpec(conversations=args.conversations, turns=args.turns,
                         first_turn_tokens=args.first_turn_tokens, user_tokens=args.user_tokens,
                         output_tokens=args.output_tokens, vocab_size=args.vocab_size, seed=args.seed)
    return run(args, "multiturn", multiturn(spec))
