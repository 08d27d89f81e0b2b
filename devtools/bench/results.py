"""Benchmark results: per-round aggregation, the side-by-side table, and the PNG plot; the plain
left-aligned table the benchmark scripts print their runs in."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .client import RequestResult


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 1]; 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``header`` and a rule, each column as wide as its widest cell, left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows])


def summarise_round(results: Sequence[RequestResult], wall_s: float) -> dict[str, Any]:
    """TTFT statistics, throughput and where prompt tokens came from, over one round."""
    ok = [r for r in results if not r.error]
    ttft = [r.ttft_s for r in ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    wall = max(wall_s, 1e-9)
    return {
        "requests": len(results), "errors": len(results) - len(ok),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else 0.0,
        "ttft_p50_s": percentile(ttft, 0.50), "ttft_p99_s": percentile(ttft, 0.99),
        "latency_mean_s": statistics.fmean([r.latency_s for r in ok]) if ok else 0.0,
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall,
        "input_tokens_per_s": prompt / wall,
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / wall,
        "prompt_tokens": prompt, "cached_tokens": cached,
        "device_tokens": sum(r.device_tokens for r in ok), "host_tokens": sum(r.host_tokens for r in ok),
        "storage_tokens": sum(r.storage_tokens for r in ok),
        "cache_hit_rate": cached / prompt if prompt else 0.0,
    }


def variant_result(label: str, rounds: list[tuple[list[RequestResult], float]]) -> dict[str, Any]:
    """One variant's report: per-round summaries, the reuse rounds (1+) pooled, raw requests."""
    per_round = [{"round": i, **summarise_round(res, wall)} for i, (res, wall) in enumerate(rounds)]
    later = [r for res, _ in rounds[1:] for r in res]
    reuse = summarise_round(later, sum(w for _, w in rounds[1:])) if later else None
    return {"label": label, "rounds": per_round, "reuse_rounds": reuse,
            "requests": [asdict(r) for res, _ in rounds for r in res]}


def _fmt_ms(s: float) -> str:
    return f"{s * 1e3:,.0f}"


def side_by_side_table(variants: Sequence[dict[str, Any]]) -> str:
    """One table: a row per variant and round, TTFT ratios against the first variant's round."""
    header = ["variant", "round", "TTFT mean ms", "p50", "p99", "vs base", "req/s", "in tok/s",
              "device tok", "host tok", "storage tok", "hit rate", "errors"]
    base = {r["round"]: r for r in variants[0]["rounds"]} if variants else {}
    rows = []
    for v in variants:
        for r in v["rounds"]:
            b = base.get(r["round"])
            ratio = (f"{r['ttft_mean_s'] / b['ttft_mean_s']:.2f}x"
                     if b and b["ttft_mean_s"] > 0 and r["ttft_mean_s"] > 0 else "-")
            rows.append([v["label"], str(r["round"]), _fmt_ms(r["ttft_mean_s"]), _fmt_ms(r["ttft_p50_s"]),
                         _fmt_ms(r["ttft_p99_s"]), ratio, f"{r['requests_per_s']:.2f}",
                         f"{r['input_tokens_per_s']:,.0f}", f"{r['device_tokens']:,}",
                         f"{r['host_tokens']:,}", f"{r['storage_tokens']:,}", f"{r['cache_hit_rate']:.0%}",
                         str(r["errors"])])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def plot_side_by_side(variants: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Per-round mean TTFT and input throughput, one line per variant, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ttft, ax_tput) = plt.subplots(1, 2, figsize=(12, 4.5))
    for v in variants:
        rounds = [r["round"] for r in v["rounds"]]
        ax_ttft.plot(rounds, [r["ttft_mean_s"] * 1e3 for r in v["rounds"]], marker="o", label=v["label"])
        ax_tput.plot(rounds, [r["input_tokens_per_s"] for r in v["rounds"]], marker="o", label=v["label"])
    ax_ttft.set(xlabel="round (caches flushed between rounds)", ylabel="mean TTFT (ms)", title="TTFT")
    ax_tput.set(xlabel="round", ylabel="input tokens / s", title="Throughput")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_ttft, ax_tput):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def cold_prefill_rate(variant: dict[str, Any]) -> float | None:
    """Median of prompt tokens / TTFT over a variant's cold round (round 0, nothing cached yet);
    ``None`` without such requests. Every variant computes its cold round, so each run's own rate
    shows how loaded the machine was while that variant ran."""
    cold = [r for r in variant["requests"] if r["round"] == 0 and not r["error"] and r["ttft_s"] > 0]
    return statistics.median(r["prompt_tokens"] / r["ttft_s"] for r in cold) if cold else None


def recompute_summary(variants: Sequence[dict[str, Any]], base_label: str = "no-hicache") -> list[str]:
    """The measured prefill rate and what the cache hits of each variant saved against recomputing.

    The rate is measured, not assumed: the median over the cold round of the baseline (no HiCache)
    of prompt tokens / TTFT, one request at a time. Each variant's reuse rounds then report how many
    tokens came from each cache level, how long recomputing them would take at that rate, and the
    TTFT the variant observed against the baseline's; each variant's own cold-round rate is printed
    beside it, since variants run one after another on a machine whose load may change.
    """
    base = next((v for v in variants if v["label"] == base_label), None)
    if base is None or not base["rounds"]:
        return []
    rate = cold_prefill_rate(base)
    if rate is None:
        return []
    ncold = sum(1 for r in base["requests"] if r["round"] == 0 and not r["error"] and r["ttft_s"] > 0)
    lines = [f"measured prefill rate ({base_label}, cold round, prompt tokens / TTFT per request, "
             f"median of {ncold}): {rate:,.0f} tokens/s"]
    base_reuse = base.get("reuse_rounds") or {}
    for v in variants:
        reuse = v.get("reuse_rounds")
        if v is base or not reuse or not reuse["requests"]:
            continue
        n = reuse["requests"] - reuse["errors"]
        per_req = {k: reuse[f"{k}_tokens"] / max(n, 1) for k in ("device", "host", "storage")}
        saved_s = sum(per_req.values()) / rate
        ratio = (f"{reuse['ttft_mean_s'] / base_reuse['ttft_mean_s']:.2f}x"
                 if base_reuse.get("ttft_mean_s") else "-")
        own = cold_prefill_rate(v)
        lines.append(
            f"{v['label']}: per reuse request {per_req['device']:,.0f} device + "
            f"{per_req['host']:,.0f} host + {per_req['storage']:,.0f} storage tokens cached = "
            f"{saved_s * 1e3:,.0f} ms of recompute at the measured rate; "
            f"TTFT {reuse['ttft_mean_s'] * 1e3:,.0f} ms vs {base_label} "
            f"{base_reuse.get('ttft_mean_s', 0) * 1e3:,.0f} ms ({ratio}); its own cold-round prefill "
            f"rate {'-' if own is None else f'{own:,.0f}'} tokens/s")
    return lines


def tier_table(variants: Sequence[dict[str, Any]]) -> str:
    """Per variant, round and tier of ours: pages found there (share of pages asked for), bytes read
    and written. Empty when no variant exported our series."""
    header = ["variant", "round", "tier", "pages hit", "hit share", "read", "written", "evictions"]
    out = []
    for v in variants:
        for r in v["rounds"]:
            for t in r.get("tiers", []):
                out.append([v["label"], str(r["round"]), t["tier"], f"{t['hits']:,.0f}",
                            f"{t['hit_share']:.0%}", _fmt_bytes(t["read_bytes"]),
                            _fmt_bytes(t["written_bytes"]), f"{t['evictions']:,.0f}"])
    if not out:
        return ""
    widths = [max(len(h), *(len(row[i]) for row in out)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in out])


def _fmt_bytes(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:,.1f} {unit}"
    return f"{n:,.0f} B"


def storage_bytes_per_token(variant: dict[str, Any]) -> float | None:
    """KV bytes per storage token, from the variant's own rounds: bytes our tiers read over the
    tokens SGLang reported from storage (``None`` without either)."""
    read = sum(t["read_bytes"] for r in variant["rounds"] for t in r.get("tiers", []))
    tokens = sum(r["storage_tokens"] for r in variant["rounds"])
    return read / tokens if read > 0 and tokens > 0 else None


def per_request_vs_base(variants: Sequence[dict[str, Any]], base_label: str = "no-hicache"
                        ) -> list[dict[str, Any]]:
    """Every reuse-round request of every other variant against the same request (same id, same
    round) of ``base_label``: TTFT both ways, where its cached tokens came from, ``slower`` when it
    took longer than recomputing, and (where the server sent its steps) how long it waited for the
    storage prefetch and the rate that makes. The wait is SGLang's ``storage_prefetch_wait``: from
    the request's arrival until the scheduler saw its prefetch done, which it checks only between
    forwards, so a hit that arrived during another request's forward waits for that forward too;
    the copy's own rate is the per-call one of ``io_table``. Empty without the base variant."""
    base = next((v for v in variants if v["label"] == base_label), None)
    if base is None:
        return []
    recompute = {(r["rid"], r["round"]): r for r in base["requests"] if not r["error"]}
    out = []
    for v in variants:
        if v is base:
            continue
        per_token = storage_bytes_per_token(v)
        for r in v["requests"]:
            b = recompute.get((r["rid"], r["round"]))
            if r["round"] == 0 or r["error"] or b is None or b["ttft_s"] <= 0:
                continue
            wait = (r.get("steps") or {}).get("storage_prefetch_wait")
            rate = (r["storage_tokens"] * per_token / wait / 1e9
                    if wait and per_token and r["storage_tokens"] else None)
            out.append({"variant": v["label"], "round": r["round"], "rid": r["rid"],
                        "prompt_tokens": r["prompt_tokens"], "device_tokens": r["device_tokens"],
                        "host_tokens": r["host_tokens"], "storage_tokens": r["storage_tokens"],
                        "ttft_s": r["ttft_s"], "base_ttft_s": b["ttft_s"],
                        "ratio": r["ttft_s"] / b["ttft_s"], "slower": r["ttft_s"] > b["ttft_s"],
                        "prefetch_wait_s": wait, "prefetch_gbps": rate})
    return out


def per_request_table(rows: Sequence[dict[str, Any]], base_label: str = "no-hicache") -> str:
    """``per_request_vs_base`` as a table, a row per request, each hit slower than recompute
    flagged, and a closing count; empty when there is nothing to compare."""
    if not rows:
        return ""
    header = ["variant", "round", "request", "prompt tok", "device tok", "host tok", "storage tok",
              "prefetch wait ms", "GB/s over wait", "TTFT ms", f"{base_label} ms", "ratio", ""]
    body = [[r["variant"], str(r["round"]), r["rid"], f"{r['prompt_tokens']:,}", f"{r['device_tokens']:,}",
             f"{r['host_tokens']:,}", f"{r['storage_tokens']:,}",
             "-" if r.get("prefetch_wait_s") is None else _fmt_ms(r["prefetch_wait_s"]),
             "-" if r.get("prefetch_gbps") is None else f"{r['prefetch_gbps']:.2f}",
             _fmt_ms(r["ttft_s"]), _fmt_ms(r["base_ttft_s"]), f"{r['ratio']:.2f}x",
             "SLOWER than recompute" if r["slower"] else ""] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths[:-1])]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    for label in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == label]
        slow = sum(r["slower"] for r in mine)
        lines.append(f"{label}: {slow} of {len(mine)} reuse requests slower than recompute ({base_label})")
    return "\n".join(lines)


def io_rates(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """One round's storage-hit copies from two readings of SGLang's io series (runner.SGLANG_IO):
    calls and mean GB/s of our ``batch_get_v1`` (the prefetch from our tiers into the host pool), and
    bytes and GB/s of the load-back from the host pool to the device. Empty without readings."""
    if before is None or after is None:
        return {}
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    calls = d.get("prefetch_calls", 0.0)
    load_s = d.get("load_back_s", 0.0)
    return {"prefetch_calls": calls,
            "prefetch_gbps": d.get("prefetch_gbps_sum", 0.0) / calls if calls else 0.0,
            "load_back_bytes": d.get("load_back_bytes", 0.0), "load_back_s": load_s,
            "load_back_gbps": d.get("load_back_bytes", 0.0) / load_s / 1e9 if load_s > 0 else 0.0}


def io_table(variants: Sequence[dict[str, Any]]) -> str:
    """Per variant and round with prefetch calls: their mean GB/s, and the load-back's bytes and GB/s."""
    header = ["variant", "round", "prefetch calls", "prefetch GB/s (mean per call)", "load-back",
              "load-back GB/s"]
    out = []
    for v in variants:
        for r in v["rounds"]:
            io = r.get("io") or {}
            if not io.get("prefetch_calls"):
                continue
            out.append([v["label"], str(r["round"]), f"{io['prefetch_calls']:,.0f}",
                        f"{io['prefetch_gbps']:.2f}", _fmt_bytes(io["load_back_bytes"]),
                        f"{io['load_back_gbps']:.2f}" if io["load_back_s"] > 0 else "-"])
    if not out:
        return ""
    widths = [max(len(h), *(len(row[i]) for row in out)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in out])
