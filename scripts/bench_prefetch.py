#!/usr/bin/env python3
"""Storage prefetch under a multi-turn chat load: what storage lookups find, what SGLang loads, and why
the rest is not loaded, per SGLang's own /metrics, beside TTFT, for several server variants.

  python scripts/bench_prefetch.py --json prefetch.json             # ours, builtin, no-storage
  python scripts/bench_prefetch.py --ours-config tiers.yaml --passes 2 --plot prefetch.png
  python scripts/bench_prefetch.py --sglang-args "--hicache-write-policy write_back"

The load is shaped like SGLang's benchmark/hicache/bench_multiturn.py: many conversations, a few
requests in flight at once, each turn resending the whole history (the server's own answers
included) plus a new user message, and a conversation's next turn queued behind every other
conversation waiting (round robin: by its next turn, its history has gone cold in the device cache);
greedy answers (temperature 0, ignore_eos). Live SGLang servers on 127.0.0.1, one
per variant, every one up at once (idle servers sleep: --sleep-on-idle on CPU hosts), run in the
order A B C .. C B A per pass, so that the machine's load falls on each variant alike. Variants:
  ours          our backend on its embedded default (--hicache-storage-backend mooncake);
  ours-config   the same over --ours-config FILE (extra-config @FILE; added by that flag);
  builtin       SGLang's own Mooncake Store backend (MooncakeStore, reached through the
                `dynamic` backend: our package holds the name `mooncake`) on a real
                mooncake_master on 127.0.0.1, protocol tcp;
  no-storage    HiCache without a storage backend (device + host only): the recompute reference.
Every server gets the same SGLang flags (--hicache-ratio, direct io, page_first_direct, 64-token
pages, --max-total-tokens, --enable-metrics, then --sglang-args).

Each run starts cold (SGLang's caches flushed, the storage backend cleared through the server) and
sends prompts of its own seed: in pass p the forward half uses seed+2p and the backward half seed+2p+1,
so all variants of a half see identical prompts and no run can find another run's pages even where a
clear did not work. The counters are differences of /metrics before and after the run, summed over
label sets but `reason` and `mode`:
  found           sglang:storage_prefetch_hit_tokens_total: tokens a storage lookup found;
  loaded          sglang:prefetched_tokens_total: tokens copied from storage into host memory;
  unf: REASON     sglang:storage_prefetch_unfulfilled_tokens_total{reason}: found but not loaded
                  (or loaded but not usable), by reason; every reason non-zero in some run;
  def: REASON     sglang:storage_prefetch_deferred_tokens_total{reason}, where non-zero;
  srv: MODE       sglang:prefill_effective_tokens_total{mode}: prompt tokens by where prefill got
                  them (input = computed, device_hit, host_hit, storage_hit).
How to read it: found and unfulfilled count ATTEMPTS (a lookup refused for host_capacity is retried
and counted again), so found can exceed the prompt tokens and loaded/found understates the share of
pages loaded; loaded can exceed what was used (a span loaded but no longer usable at admission is
counted again under cache_admission_shortfall); `srv: storage_hit` is what was truly served from
storage. The rest of a turn's history was recomputed (`srv: input`) or came from the server's own
caches. found 0 everywhere means the live histories fit in device + host memory (storage never
asked): more conversations, longer turns or a smaller --max-total-tokens make storage matter.
TTFT against no-storage's says what storage hits bought. Greedy outputs of the same prompts are
compared across variants: a storage hit must give the tokens recomputing gives.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench import options  # noqa: E402
from devtools.bench.client import RequestResult, SglangClient  # noqa: E402
from devtools.bench.console import run_script  # noqa: E402
from devtools.bench.console import stamped as log
from devtools.bench.prefetch_report import (  # noqa: E402
    Key,
    Run,
    by_variant,
    compare_outputs,
    notes,
    plot,
    record_outputs,
    scrape,
    series_delta,
    summarise,
    table,
    tok,
)
from devtools.bench.round_robin import Parts, Turn, round_robin  # noqa: E402
from devtools.bench.server import (  # noqa: E402
    HICACHE,
    LaunchedServer,
    free_port,
    has_gpu,
    launch_command,
    ours_args,
    server_env,
    stop_all,
)
from devtools.bench.workloads import BenchRequest, MultiTurnSpec, add_chat_arguments, chat_parts, chat_spec  # noqa: E402
from mooncake_sgl.units import parse_size  # noqa: E402
from mooncake_sgl_cpu.adaptations import HOST_RESERVE_ENV  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRACER = ROOT / "devtools" / "bench" / "prefetch_trace"
VARIANTS = ("ours", "ours-config", "builtin", "no-storage")
DEFAULT_VARIANTS = ("ours", "builtin", "no-storage")
# One request per server before the first run, past SGLang's prefetch_threshold (256) so that it runs the
# storage lookup too: a server's first lookup has one-time costs (the built-in backend builds SGLang's
# page-hash extension then) that must not fall on a measured run.
WARMUP_TOKENS = 512

# ------------------------------------------------------------------------------------ servers

@dataclass
class Variant:
    name: str
    server: LaunchedServer
    storage: bool  # has a storage backend (cleared at each cold start)


def builtin_extra(master_rpc: str, segment_bytes: int) -> dict[str, Any]:
    """Extra-config of SGLang's MooncakeStore through the dynamic loader. ``interface_v1`` makes the
    cache controller use the zero-copy page get/set, as it does for the registered ``mooncake``."""
    return {"backend_name": "mooncake_builtin",
            "module_path": "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store",
            "class_name": "MooncakeStore", "interface_v1": 1, "master_server_address": master_rpc,
            "metadata_server": "P2PHANDSHAKE", "protocol": "tcp", "local_hostname": "127.0.0.1",
            "global_segment_size": segment_bytes, "device_name": ""}


def variant_args(name: str, ours_config: Path | None, builtin: dict[str, Any] | None) -> tuple[str, ...]:
    if name == "ours":
        return ours_args(None)
    if name == "ours-config":
        assert ours_config is not None
        return ours_args(ours_config)
    if name == "builtin":
        assert builtin is not None
        return (HICACHE, "--hicache-storage-backend", "dynamic",
                "--hicache-storage-backend-extra-config", json.dumps(builtin))
    if name == "no-storage":
        return (HICACHE,)
    raise ValueError(f"unknown variant {name!r}")


def common_flags(ratio: float, max_total_tokens: int, sglang_args: str) -> tuple[str, ...]:
    """What every variant's server gets, after the platform's flags (the last of a flag wins)."""
    return ("--hicache-ratio", str(ratio), "--hicache-io-backend", "direct", "--hicache-mem-layout",
            "page_first_direct", "--page-size", "64", "--max-total-tokens", str(max_total_tokens),
            "--enable-metrics", *shlex.split(sglang_args))


def start_server(name: str, model: Path, args: tuple[str, ...], extra: tuple[str, ...], workdir: Path,
                 host_reserve: str, health_timeout_s: float, started: list[LaunchedServer],
                 trace: Path | None = None) -> Variant:
    """One variant's server, healthy and warmed up; listed in ``started`` before it starts, so that
    whoever stops ``started`` stops it too. ``trace``: a folder for the server's prefetch timeline
    (``devtools/bench/prefetch_trace``)."""
    cpu = not has_gpu()
    first = [str(TRACER)] if trace else []
    path = os.pathsep.join(p for p in (*first, str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    # Our embedded default keeps its LMDB under $XDG_CACHE_HOME: each server its own, in the workdir.
    env = server_env(cpu, {"PYTHONPATH": path, "SGLANG_HOST_IP": "127.0.0.1",
                           HOST_RESERVE_ENV: host_reserve, "XDG_CACHE_HOME": str(workdir / "cache" / name)})
    if trace:
        trace.mkdir(parents=True, exist_ok=True)
        for stale in trace.glob(f"{name}.jsonl.*"):  # an earlier run's processes: not this one's
            stale.unlink()
        env["MOONCAKE_SGL_PREFETCH_TRACE"] = str(trace / f"{name}.jsonl")

    def cmd(port: int) -> list[str]:
        return launch_command(str(model), port, args, cpu=cpu, extra=extra)

    server = LaunchedServer(cmd, free_port(), workdir / "logs" / f"{name}.log", health_timeout_s, env=env)
    started.append(server)
    server.start()
    client = SglangClient(server.url)
    client.generate(BenchRequest("warm-up", -1, list(range(10, 10 + WARMUP_TOKENS)), 1, 0))
    return Variant(name, server, "--hicache-storage-backend" in args)


def cold_start(v: Variant) -> bool | None:
    """SGLang's device and host caches flushed, the storage backend cleared; whether it cleared
    (``None``: no storage)."""
    client = SglangClient(v.server.url)
    client.flush_cache()
    return client.clear_storage() if v.storage else None


# ------------------------------------------------------------------------------------ driving

def drive(v: Variant, run: Run, parts: Parts, output_tokens: int, max_parallel: int, bar: Any) -> Run:
    client = SglangClient(v.server.url)
    lock = threading.Lock()

    def send(c: int, t: int, prompt: list[int]) -> RequestResult:
        return client.generate(BenchRequest(f"s{run.seed}-conv{c}-t{t}", t, prompt, output_tokens, 0))

    def record(turn: Turn) -> None:
        with lock:
            run.turns.append(turn)
            if bar is not None:
                bar.update(1)

    t0 = time.monotonic()
    try:
        round_robin(parts, send, max_parallel, record)
    except RuntimeError as e:
        raise RuntimeError(f"{v.name}: {e}") from e
    run.wall_s = time.monotonic() - t0
    return run


# ------------------------------------------------------------------------------------ main

@dataclass
class Rig:
    """Everything started for a benchmark: stopped on exit."""
    variants: dict[str, Variant] = field(default_factory=dict)
    stack: ExitStack = field(default_factory=ExitStack)


def start_all(args: argparse.Namespace, model: Path, workdir: Path, rig: Rig) -> Iterator[str]:
    """Start the master (for builtin) and every variant's server, in parallel; yields log lines."""
    builtin = None
    if "builtin" in args.variants:
        from devtools.testing.mooncake_master import MooncakeMaster

        master = rig.stack.enter_context(MooncakeMaster())
        # The master's log lives in a temporary folder removed at its stop: keep a copy.
        rig.stack.callback(lambda: shutil.copy(master.log_path, workdir / "logs" / "mooncake_master.log"))
        builtin = builtin_extra(master.rpc_address, parse_size(args.builtin_segment))
        yield f"mooncake_master up: rpc {master.rpc_address}"
    extra = common_flags(args.hicache_ratio, args.max_total_tokens, args.sglang_args)
    ours_config = Path(args.ours_config).resolve() if args.ours_config else None
    started: list[LaunchedServer] = []
    rig.stack.callback(lambda: stop_all(started))

    def one(name: str) -> Variant:
        return start_server(name, model, variant_args(name, ours_config, builtin), extra, workdir,
                            args.host_reserve, args.health_timeout, started,
                            Path(args.trace) if args.trace else None)

    with ThreadPoolExecutor(len(args.variants)) as ex:
        futures = {n: ex.submit(one, n) for n in args.variants}
        errors = []
        for n, f in futures.items():
            try:
                rig.variants[n] = f.result()
            except Exception as e:  # noqa: BLE001 (each failure is reported, then all stop)
                errors.append(f"{n}: {e}")
        if errors:
            raise RuntimeError("servers failed to start:\n" + "\n".join(errors))
    yield f"servers up: {', '.join(f'{n} {v.server.url}' for n, v in rig.variants.items())}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(DEFAULT_VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)} (default: {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--ours-config", metavar="FILE",
                   help="adds the variant ours-config: our backend over FILE (extra-config @FILE)")
    add_chat_arguments(p, MultiTurnSpec(conversations=8, turns=5,
                                         first_turn_tokens=1536, user_tokens=1536,
                                         output_tokens=64),
                       max_parallel=2)
    options.add_passes(p, "A B C C B A")
    p.add_argument("--seed", type=int, default=1, help="base seed of the prompts (see schedule)")
    options.add_model_options(p)
    p.add_argument("--hicache-ratio", type=float, default=1.0)
    p.add_argument("--sglang-args", default="", help="more SGLang flags for every variant, one string")
    p.add_argument("--builtin-segment", default="4GiB",
                   help="global_segment_size of the builtin's Mooncake client (the store's capacity)")
    options.add_host_reserve(p)
    options.add_run_options(p, workdir="out/bench_prefetch",
                            json_help="write every run's numbers here (after every run)",
                            plot_help="PNG of found/loaded/unfulfilled and TTFT per run")
    p.add_argument("--trace", metavar="DIR",
                   help="record every server's storage-hit allocations and storage calls in DIR and "
                        "print each one's timeline at the end (devtools/bench/prefetch_trace)")
    args = p.parse_args(argv)
    if args.ours_config:
        if not Path(args.ours_config).is_file():
            p.error(f"--ours-config: {args.ours_config} is not a file")
        if "ours-config" not in args.variants:
            args.variants.append("ours-config")
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"--variants: {v!r} is none of {', '.join(VARIANTS)}")
    if "ours-config" in args.variants and not args.ours_config:
        p.error("the variant ours-config needs --ours-config FILE")
    if len(set(args.variants)) != len(args.variants):
        p.error("--variants: each variant once")
    if args.turns < 2 or args.conversations < 1 or args.passes < 1:
        p.error("--turns at least 2, --conversations and --passes at least 1")
    parse_size(args.builtin_segment)
    t_start = time.monotonic()
    workdir = Path(args.workdir).resolve()
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    for name in args.variants:  # each run of ours starts from an empty LMDB folder too
        shutil.rmtree(workdir / "cache" / name, ignore_errors=True)
    model = options.model_path(args, workdir)
    order = options.schedule(args.variants, args.passes, args.seed)
    cells: list[dict[str, Any]] = []
    outputs: dict[Key, dict[str, list[int]]] = {}
    reference = "no-storage" if "no-storage" in args.variants else args.variants[0]

    def spec(seed: int) -> MultiTurnSpec:
        return chat_spec(args, seed)

    def dump() -> None:
        options.write_json(args, runs=cells, outputs=compare_outputs(outputs, reference),
                   notes=notes(cells) if cells else [], wall_s=time.monotonic() - t_start)

    rig = Rig()
    with rig.stack:
        log(f"starting {', '.join(args.variants)} (logs in {workdir / 'logs'})")
        for line in start_all(args, model, workdir, rig):
            log(line)
        for i, (pass_index, name, seed) in enumerate(order):
            v = rig.variants[name]
            cleared = cold_start(v)
            before = scrape(v.server.url)
            run = Run(name, pass_index, seed, os.getloadavg()[0])
            desc = f"{i + 1}/{len(order)} {name} s{seed}"
            with options.progress(args, args.conversations * args.turns, desc) as bar:
                drive(v, run, chat_parts(spec(seed)), args.output_tokens, args.max_parallel, bar)
            after = scrape(v.server.url)
            delta = series_delta(before, after) if before is not None and after is not None else None
            cell = summarise(run, delta, cleared)
            cells.append(cell)
            record_outputs(outputs, run)
            ratio = cell["loaded_over_found"]
            log(f"[{name}] found {tok(cell['found'])}, loaded {tok(cell['loaded'])}"
                f"{'' if ratio is None else f' ({ratio:.1%})'}, served from storage "
                f"{tok(cell['served'].get('storage_hit'))}, TTFT mean {cell['ttft_mean_s'] * 1e3:.0f} ms, "
                f"{cell['errors']} errors, load {cell['load']:.1f}")
            dump()  # after every run: a long run interrupted keeps what it measured
    title = (f"prefetch: {args.conversations} conversations x {args.turns} turns, "
             f"{args.max_parallel} at once, "
             f"{args.first_turn_tokens}-token first turns, {args.user_tokens}-token user turns, "
             f"{args.output_tokens}-token answers; ratio {args.hicache_ratio}, {args.max_total_tokens} tokens"
             + (f"; {args.sglang_args}" if args.sglang_args else ""))
    print(title)
    print(table(cells))
    for line in notes(cells):
        print(f"  note: {line}")
    print()
    text, _ = by_variant(cells)
    print(text)
    cmp = compare_outputs(outputs, reference)
    print()
    print(f"outputs: {cmp['compared']} prompts served by more than one variant, {cmp['mismatched']} with "
          f"differing greedy outputs; vs {reference}: "
          + (", ".join(f"{v} {n}" for v, n in cmp["mismatched_vs_reference"].items()) or "-"))
    if args.trace:
        from devtools.bench.prefetch_timeline import report

        for name in args.variants:
            print()
            print(report(Path(args.trace) / f"{name}.jsonl"))
    wall = time.monotonic() - t_start
    print(f"wall time {wall:.0f} s")
    dump()
    if args.plot:
        plot(cells, args.plot, title)
    return 1 if any(c["errors"] for c in cells) or cmp["mismatched"] else 0


if __name__ == "__main__":
    run_script(main)
