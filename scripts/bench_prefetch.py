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
import hashlib
import json
import os
import shlex
import shutil
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.client import RequestResult, SglangClient  # noqa: E402
from devtools.bench.console import run_script  # noqa: E402
from devtools.bench.console import stamped as log
from devtools.bench.results import percentile  # noqa: E402
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
from devtools.tiny_model import TinyLlama, write_tiny_llama  # noqa: E402
from mooncake_sgl.metrics.scrape import ScrapeError, fetch  # noqa: E402
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

# SGLang's series (sample names) -> (our key, the label kept apart; None: summed over every label).
FOUND = "sglang:storage_prefetch_hit_tokens_total"
LOADED = "sglang:prefetched_tokens_total"
UNFULFILLED = "sglang:storage_prefetch_unfulfilled_tokens_total"
DEFERRED = "sglang:storage_prefetch_deferred_tokens_total"
EFFECTIVE = "sglang:prefill_effective_tokens_total"
SERIES: dict[str, tuple[str, str | None]] = {
    FOUND: ("found", None), LOADED: ("loaded", None), UNFULFILLED: ("unfulfilled", "reason"),
    DEFERRED: ("deferred", "reason"), EFFECTIVE: ("served", "mode"),
}


# ------------------------------------------------------------------------------------ metrics

def prefetch_series(text: str) -> dict[str, float]:
    """SGLang's prefetch series (``SERIES``) in a ``/metrics`` text: ``found``, ``loaded``,
    ``unfulfilled:REASON``, ``deferred:REASON``, ``served:MODE``, each summed over the other labels
    (ranks...). Only the series the text has: an absent key is a metric the server never exposes."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            kind = SERIES.get(s.name)
            if kind is None:
                continue
            key, label = kind
            if label is not None:
                key = f"{key}:{s.labels.get(label, '')}"
            out[key] = out.get(key, 0.0) + float(s.value)
    return out


def series_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counter increases over a run (a series first seen after it started from 0)."""
    return {k: after[k] - before.get(k, 0.0) for k in after}


def split(delta: dict[str, float], kind: str) -> dict[str, float]:
    """``{"unfulfilled:deadline": 5, ...}``, ``"unfulfilled"`` -> ``{"deadline": 5}``."""
    return {k.split(":", 1)[1]: v for k, v in delta.items() if k.startswith(kind + ":")}


def scrape(url: str) -> dict[str, float] | None:
    try:
        return prefetch_series(fetch(url, timeout=30.0))
    except ScrapeError as e:
        log(f"cannot read {url}/metrics: {e}")
        return None


# ------------------------------------------------------------------------------------ schedule

def schedule(variants: list[str], passes: int, base_seed: int) -> list[tuple[int, str, int]]:
    """(pass, variant, seed) of every run: A B C C B A per pass; the forward half of pass p runs on
    seed base+2p, the backward half on base+2p+1, so variants of one half share their prompts and no
    variant ever meets the same prompts twice."""
    out = []
    for p in range(passes):
        out += [(p, v, base_seed + 2 * p) for v in variants]
        out += [(p, v, base_seed + 2 * p + 1) for v in reversed(variants)]
    return out


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

@dataclass
class Turn:
    conversation: int
    turn: int
    prompt_digest: str
    result: RequestResult


@dataclass
class Run:
    variant: str
    pass_index: int
    seed: int
    load: float  # the 1-minute load average at its start
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0


def digest(ids: list[int]) -> str:
    return hashlib.blake2b(json.dumps(ids).encode(), digest_size=8).hexdigest()


Parts = list[tuple[list[int], list[list[int]]]]  # per conversation: first turn, later user messages
Send = Callable[[int, int, list[int]], RequestResult]  # (conversation, turn, prompt) -> its result


def round_robin(parts: Parts, send: Send, max_parallel: int, record: Callable[[Turn], None]) -> None:
    """Every conversation, turn by turn, each prompt its history with the server's own answers, and
    at most ``max_parallel`` requests in flight. A conversation whose answer came back queues its
    next turn behind every conversation already waiting (bench_multiturn's clients do the same), so
    between two turns of one conversation every other one has a turn: its history has gone cold
    in SGLang's device cache, the case storage is there for."""
    cond = threading.Condition()
    ready: deque[int] = deque(range(len(parts)))
    history = {c: list(first) for c, (first, _) in enumerate(parts)}
    next_turn = dict.fromkeys(range(len(parts)), 0)
    in_flight = 0
    failed: list[BaseException] = []

    def worker() -> None:
        nonlocal in_flight
        while True:
            with cond:
                while not ready and in_flight and not failed:
                    cond.wait()
                if failed or not ready:
                    return
                c = ready.popleft()
                t = next_turn[c]
                if t:
                    history[c] += parts[c][1][t - 1]
                prompt = list(history[c])
                in_flight += 1
            try:
                res = send(c, t, prompt)
                record(Turn(c, t, digest(prompt), res))
                if not res.error and len(res.output_ids) != res.output_tokens:
                    raise RuntimeError(f"{len(res.output_ids)} output ids streamed for {res.output_tokens} "
                                       "completion tokens (is the server running with "
                                       "--incremental-streaming-output?)")
            except BaseException as e:
                with cond:
                    failed.append(e)
                    in_flight -= 1
                    cond.notify_all()
                raise
            with cond:
                in_flight -= 1
                # An error ends its conversation: it cannot go on without its answer.
                if not res.error and t < len(parts[c][1]):
                    history[c] += res.output_ids
                    next_turn[c] = t + 1
                    ready.append(c)
                cond.notify_all()

    with ThreadPoolExecutor(max(1, max_parallel)) as ex:
        for f in [ex.submit(worker) for _ in range(max(1, max_parallel))]:
            f.result()


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


# ------------------------------------------------------------------------------------ results

def summarise(run: Run, delta: dict[str, float] | None, cleared: bool | None) -> dict[str, Any]:
    ok = [t.result for t in run.turns if not t.result.error]
    ttft = [r.ttft_s for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    d = delta or {}
    # SGLang creates a found/loaded series at its first non-zero count, but the unfulfilled reasons
    # up front: where those exist, the server has a storage backend and a missing series is a zero.
    zero = 0.0 if any(k.startswith("unfulfilled:") for k in d) else None
    found, loaded = d.get("found", zero), d.get("loaded", zero)
    return {
        "variant": run.variant, "pass": run.pass_index, "seed": run.seed, "load": run.load,
        "requests": len(run.turns), "errors": len(run.turns) - len(ok), "wall_s": run.wall_s,
        "storage_cleared": cleared, "metrics_read": delta is not None,
        "found": found, "loaded": loaded,
        "loaded_over_found": loaded / found if found and loaded is not None else None,
        "unfulfilled": split(d, "unfulfilled"), "deferred": split(d, "deferred"),
        "served": split(d, "served"),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "meta_storage_tokens": sum(r.storage_tokens for r in ok),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else 0.0,
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
        "prefill_rate_tok_s": (prompt - cached) / sum(ttft) if ttft and sum(ttft) else 0.0,
    }


def _columns(cells: list[dict[str, Any]], kind: str, nonzero: bool) -> list[str]:
    names = dict.fromkeys(k for c in cells for k, v in c[kind].items() if v or not nonzero)
    return sorted(names)


def _tok(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def table(cells: list[dict[str, Any]]) -> str:
    """One row per run; an unfulfilled or deferred reason gets a column when some run has it non-zero,
    a served mode whenever it appears; ``-``: the server does not expose that series."""
    unf = _columns(cells, "unfulfilled", nonzero=True)
    dfr = _columns(cells, "deferred", nonzero=True)
    srv = _columns(cells, "served", nonzero=False)
    header = ("run", "variant", "load", "found", "loaded", "ld/found", *(f"srv: {m}" for m in srv),
              *(f"unf: {r}" for r in unf), *(f"def: {r}" for r in dfr),
              "TTFT mean", "p50", "p99", "prefill tok/s", "errors")

    def ms(s: float) -> str:
        return f"{s * 1e3:.0f} ms"

    rows = []
    for i, c in enumerate(cells):
        ratio = c["loaded_over_found"]
        served = [_tok(c["served"].get(m)) for m in srv] if c["metrics_read"] else ["-"] * len(srv)
        rows.append((str(i + 1), c["variant"], f"{c['load']:.1f}", _tok(c["found"]), _tok(c["loaded"]),
                     "-" if ratio is None else f"{ratio:.1%}", *served,
                     *(_tok(c["unfulfilled"].get(r)) for r in unf),
                     *(_tok(c["deferred"].get(r)) for r in dfr),
                     ms(c["ttft_mean_s"]), ms(c["ttft_p50_s"]), ms(c["ttft_p99_s"]),
                     f"{c['prefill_rate_tok_s']:.0f}", str(c["errors"])))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows])


def notes(cells: list[dict[str, Any]]) -> list[str]:
    """What the table leaves out: reasons on /metrics but zero in every run, series never seen."""
    out = []
    for kind in ("unfulfilled", "deferred"):
        zero = sorted(set(_columns(cells, kind, nonzero=False)) - set(_columns(cells, kind, nonzero=True)))
        if zero:
            out.append(f"{kind} reasons on /metrics, 0 in every run: {', '.join(zero)}")
    for v in dict.fromkeys(c["variant"] for c in cells):
        mine = [c for c in cells if c["variant"] == v and c["metrics_read"]]
        missing = [name for name, key in ((FOUND, "found"), (LOADED, "loaded"))
                   if all(c[key] is None for c in mine)]
        missing += [name for name, key in ((UNFULFILLED, "unfulfilled"), (DEFERRED, "deferred"),
                                           (EFFECTIVE, "served")) if all(not c[key] for c in mine)]
        if mine and missing:
            out.append(f"{v}: never on /metrics: {', '.join(missing)}")
        if len(mine) < sum(c["variant"] == v for c in cells):
            out.append(f"{v}: /metrics unreadable in some runs (their counters show as -)")
    not_cleared = sorted({c["variant"] for c in cells if c["storage_cleared"] is False})
    if not_cleared:
        out.append(f"storage not cleared through the server for: {', '.join(not_cleared)} "
                   "(every run has its own prompts, so no run found another's pages)")
    return out


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def by_variant(cells: list[dict[str, Any]]) -> tuple[str, dict[str, dict[str, float | None]]]:
    """Per variant, the median over its runs; mean TTFT as a ratio to builtin's and no-storage's."""
    names = list(dict.fromkeys(c["variant"] for c in cells))
    med: dict[str, dict[str, float | None]] = {}
    for n in names:
        mine = [c for c in cells if c["variant"] == n]
        med[n] = {k: _median([c[k] for c in mine]) for k in
                  ("found", "loaded", "loaded_over_found", "ttft_mean_s", "ttft_p99_s", "prefill_rate_tok_s")}
        med[n]["storage_hit"] = _median([c["served"].get("storage_hit") for c in mine])
    bases = [b for b in ("builtin", "no-storage") if b in med and med[b]["ttft_mean_s"]]
    header = ("variant", "found", "loaded", "ld/found", "srv: storage_hit", "TTFT mean", "TTFT p99",
              "prefill tok/s", *(f"TTFT vs {b}" for b in bases))
    rows = []
    for n in names:
        m = med[n]
        ratio = m["loaded_over_found"]
        rows.append((n, _tok(m["found"]), _tok(m["loaded"]), "-" if ratio is None else f"{ratio:.1%}",
                     _tok(m["storage_hit"]), f"{(m['ttft_mean_s'] or 0) * 1e3:.0f} ms",
                     f"{(m['ttft_p99_s'] or 0) * 1e3:.0f} ms", f"{m['prefill_rate_tok_s'] or 0:.0f}",
                     *(f"{(m['ttft_mean_s'] or 0) / med[b]['ttft_mean_s']:.2f}x" for b in bases)))  # type: ignore[operator]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]), med


# (seed, conversation, turn, digest of the prompt): after one variant's answer differs, its later
# turns have other prompts, which are not compared (the first difference is the one counted).
Key = tuple[int, int, int, str]


def compare_outputs(outputs: dict[Key, dict[str, list[int]]], reference: str | None) -> dict[str, Any]:
    """Greedy outputs of one prompt (seed, conversation, turn) across the variants that served it:
    how many prompts more than one variant served, on how many they disagree, and per variant its
    disagreements with ``reference``."""
    compared = mismatched = 0
    against: dict[str, int] = {}
    examples = []
    for key, by in sorted(outputs.items()):
        if len(by) < 2:
            continue
        compared += 1
        if any(ids != next(iter(by.values())) for ids in by.values()):
            mismatched += 1
            if len(examples) < 10:
                examples.append({"seed": key[0], "conversation": key[1], "turn": key[2],
                                 "variants": sorted(by)})
        ref = by.get(reference) if reference else None
        for v, ids in by.items():
            if ref is not None and v != reference:
                against[v] = against.get(v, 0) + (ids != ref)
    return {"compared": compared, "mismatched": mismatched, "reference": reference,
            "mismatched_vs_reference": against, "examples": examples}


def record_outputs(outputs: dict[Key, dict[str, list[int]]], run: Run) -> None:
    """Keep each turn's greedy output ids, keyed by its prompt."""
    for t in run.turns:
        if not t.result.error:
            outputs.setdefault((run.seed, t.conversation, t.turn, t.prompt_digest), {})[run.variant] = \
                list(t.result.output_ids)


def plot(cells: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{i + 1}\n{c['variant']}" for i, c in enumerate(cells)]
    x = list(range(len(cells)))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.8))
    w = 0.2
    ax1.bar([i - 1.5 * w for i in x], [c["found"] or 0 for c in cells], w, label="found")
    ax1.bar([i - 0.5 * w for i in x], [c["loaded"] or 0 for c in cells], w, label="loaded")
    ax1.bar([i + 0.5 * w for i in x], [c["served"].get("storage_hit", 0) for c in cells], w,
            label="served from storage")
    bottom = [0.0] * len(cells)
    for r in _columns(cells, "unfulfilled", nonzero=True):
        vals = [c["unfulfilled"].get(r, 0.0) for c in cells]
        ax1.bar([i + 1.5 * w for i in x], vals, w, bottom=bottom, label=f"unfulfilled: {r}")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax1.set_ylabel("tokens")
    ax1.set_xticks(x, labels, fontsize=7)
    ax1.legend(fontsize=7)
    ax2.bar([i - 0.2 for i in x], [c["ttft_mean_s"] * 1e3 for c in cells], 0.4, label="TTFT mean")
    ax2.bar([i + 0.2 for i in x], [c["ttft_p99_s"] * 1e3 for c in cells], 0.4, label="TTFT p99")
    ax2.set_ylabel("ms")
    ax2.set_xticks(x, labels, fontsize=7)
    ax2.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
    p.add_argument("--passes", type=int, default=1,
                   help="each pass runs every variant forward then backward (A B C C B A)")
    p.add_argument("--seed", type=int, default=1, help="base seed of the prompts (see schedule)")
    p.add_argument("--model-path", help="default: a tiny random Llama written for the run")
    p.add_argument("--hicache-ratio", type=float, default=1.0)
    p.add_argument("--max-total-tokens", type=int, default=16384)
    p.add_argument("--sglang-args", default="", help="more SGLang flags for every variant, one string")
    p.add_argument("--builtin-segment", default="4GiB",
                   help="global_segment_size of the builtin's Mooncake client (the store's capacity)")
    p.add_argument("--host-reserve", default="512MiB",
                   help="host memory SGLang leaves aside when it sizes each HiCache host pool (CPU hosts)")
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--workdir", default="out/bench_prefetch")
    p.add_argument("--json", help="write every run's numbers here (after every run)")
    p.add_argument("--plot", help="PNG of found/loaded/unfulfilled and TTFT per run")
    p.add_argument("--no-progress", action="store_true")
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
    model = Path(args.model_path) if args.model_path else write_tiny_llama(workdir / "model", TinyLlama())
    order = schedule(args.variants, args.passes, args.seed)
    cells: list[dict[str, Any]] = []
    outputs: dict[Key, dict[str, list[int]]] = {}
    reference = "no-storage" if "no-storage" in args.variants else args.variants[0]

    def spec(seed: int) -> MultiTurnSpec:
        return chat_spec(args, seed)

    def dump() -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(
                {"args": vars(args), "runs": cells, "outputs": compare_outputs(outputs, reference),
                 "notes": notes(cells) if cells else [], "wall_s": time.monotonic() - t_start},
                indent=2))

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
            bar = None
            if not args.no_progress:
                from tqdm import tqdm

                bar = tqdm(total=args.conversations * args.turns, desc=f"{i + 1}/{len(order)} {name} s{seed}",
                           unit="req", file=sys.stderr)
            drive(v, run, chat_parts(spec(seed)), args.output_tokens, args.max_parallel, bar)
            if bar is not None:
                bar.close()
            after = scrape(v.server.url)
            delta = series_delta(before, after) if before is not None and after is not None else None
            cell = summarise(run, delta, cleared)
            cells.append(cell)
            record_outputs(outputs, run)
            ratio = cell["loaded_over_found"]
            log(f"[{name}] found {_tok(cell['found'])}, loaded {_tok(cell['loaded'])}"
                f"{'' if ratio is None else f' ({ratio:.1%})'}, served from storage "
                f"{_tok(cell['served'].get('storage_hit'))}, TTFT mean {cell['ttft_mean_s'] * 1e3:.0f} ms, "
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
        plot(cells, Path(args.plot), title)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 1 if any(c["errors"] for c in cells) or cmp["mismatched"] else 0


if __name__ == "__main__":
    run_script(main)
