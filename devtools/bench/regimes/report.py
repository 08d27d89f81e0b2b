"""The regime benchmark's numbers: one record per run, the greedy outputs compared across runs,
the tables, the plot.

A run's record describes its measured phase (``after`` in ``restart``, the turns sent to the
restarted server; ``run`` otherwise): SGLang's found / loaded / served counters, the prompt
tokens a perfect cache could have served (``reachable``), those any level served (``cached``:
SGLang's device and host pools too; behind a router it depends on where each turn landed), TTFT
mean and p90, and prefill's rate
(computed prompt tokens over the summed TTFTs, which is what the machine's load moves). In
``restart`` also the first turn after it: its mean TTFT and the share of its reachable tokens
that storage served (``survived``). In ``instances`` with the client alternating the servers (no
router: each turn's server is known), the cross-instance tokens (``cross_instance``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..results import percentile, text_table
from .rig import Phase, server_of
from .workload import Sent

# Greedy outputs are compared per prompt: (shape, seed, digest of the prompt ids).
OutputKey = tuple[str, int, str]


def measured(phases: Sequence[Phase]) -> Phase:
    return next((p for p in phases if p.name == "after"), phases[-1])


def cross_instance(sent: Sequence[Sent], servers: int, page: int) -> tuple[int, int]:
    """Of the turns ``sent`` to ``servers`` alternating (``rig.server_of``): the reachable prompt
    tokens that only another server had computed (past what the receiving server's own latest turn
    of the thread left it, page-aligned), and how many of those some level served (``cached``
    past that). Its own pools cannot hold them: only a store shared by the servers can serve them."""
    done = {(s.thread, s.turn): s for s in sent if not s.result.error}
    reach = hit = 0
    for (c, t), s in done.items():
        mine = server_of(c, t, servers)
        own_turn = next((u for u in range(t - 1, -1, -1) if server_of(c, u, servers) == mine), None)
        own = 0
        if own_turn is not None and (c, own_turn) in done:
            r = done[(c, own_turn)].result
            own = (r.prompt_tokens + r.output_tokens) // page * page
        cross = max(0, s.reachable - own)
        reach += cross
        hit += min(cross, max(0, s.result.cached_tokens - own))
    return reach, hit


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    """A run's JSON record from ``rig.run_cell``'s result."""
    cell, phases = raw["cell"], raw["phases"]
    p = measured(phases)
    ok = [s for s in p.sent if not s.result.error]
    ttft = [s.result.ttft_s for s in ok]
    prompt = sum(s.result.prompt_tokens for s in ok)
    cached = sum(s.result.cached_tokens for s in ok)
    c = p.counters or {}
    rec: dict[str, Any] = {
        **asdict(cell), "load": p.load, "load_end": raw.get("load_end"), "phase": p.name,
        "requests": len(p.sent), "errors": len(p.sent) - len(ok), "wall_s": p.wall_s,
        "metrics_read": p.counters is not None,
        "found": c.get("found"), "loaded": c.get("loaded"), "served": c.get("served"),
        "reachable": sum(s.reachable for s in ok), "storage_tokens": sum(s.result.storage_tokens for s in ok),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "ttft_p90_s": percentile(ttft, 0.9) if ttft else None,
        "prefill_rate_tok_s": (prompt - cached) / sum(ttft) if ttft and sum(ttft) else None,
        "disk_used": raw.get("disk_used"), "router": raw.get("router"), "restart_s": raw.get("restart_s"),
        "master_alive": raw.get("master_alive"), "backend_failures": raw.get("backend_failures", 0),
        "phases": [{"name": q.name, "load": q.load, "wall_s": q.wall_s, "counters": q.counters,
                    "requests": [{"thread": s.thread, "turn": s.turn, "digest": s.digest,
                                  "reachable": s.reachable, **asdict(s.result)} for s in q.sent]}
                   for q in phases],
    }
    alternating = raw.get("servers", 1) > 1 and not raw.get("router")
    rec["cross_reachable"], rec["cross_hit"] = (cross_instance(p.sent, raw["servers"], raw["page"])
                                                if alternating else (None, None))
    if p.name == "after":
        first = [s for s in ok if s.turn == min(x.turn for x in ok)] if ok else []
        reach = sum(s.reachable for s in first)
        rec["first_ttft_mean_s"] = statistics.fmean([s.result.ttft_s for s in first]) if first else None
        rec["survived"] = sum(s.result.storage_tokens for s in first) / reach if reach else None
    return rec


def outputs_of(rec: dict[str, Any]) -> dict[OutputKey, tuple[int, ...]]:
    """Every prompt the run answered (all phases), keyed for comparison."""
    return {(rec["shape"], rec["seed"], r["digest"]): tuple(r["output_ids"])
            for ph in rec["phases"] for r in ph["requests"] if not r["error"]}


def compare_outputs(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Per run, (prompts some other run answered too, of those: answered like the majority of the
    runs that answered it). Without a strict majority (two runs that disagree) neither counts."""
    per_run = [outputs_of(r) for r in records]
    by_key: dict[OutputKey, list[tuple[int, ...]]] = {}
    for outs in per_run:
        for k, ids in outs.items():
            by_key.setdefault(k, []).append(ids)
    result = []
    for outs in per_run:
        compared = equal = 0
        for k, ids in outs.items():
            all_ids = by_key[k]
            if len(all_ids) < 2:
                continue
            compared += 1
            top, n = Counter(all_ids).most_common(1)[0]
            equal += n * 2 > len(all_ids) and ids == top
        result.append((compared, equal))
    return result


def _tok(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:,.0f} ms"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _cross(hit: float | None, reach: float | None) -> str:
    return "-" if hit is None or reach is None else f"{_tok(hit)} of {_tok(reach)}"


def runs_table(records: list[dict[str, Any]]) -> str:
    header = ("#", "regime", "shape", "backend", "seed", "load", "found", "loaded", "served", "cached",
              "reachable", "cross-instance", "TTFT mean", "p90", "1st after", "survived", "prefill tok/s",
              "outputs equal", "disk MiB", "errors", "failed calls")
    rows = []
    for i, r in enumerate(records):
        eq = r.get("outputs_equal")
        rows.append((str(i + 1), r["regime"], r["shape"], r["backend"], str(r["seed"]),
                     f"{r['load']:.1f}-{r['load_end'] or 0:.1f}", _tok(r["found"]), _tok(r["loaded"]),
                     _tok(r["served"]), _tok(r["cached_tokens"]), _tok(r["reachable"]),
                     _cross(r.get("cross_hit"), r.get("cross_reachable")), _ms(r["ttft_mean_s"]),
                     _ms(r["ttft_p90_s"]),
                     _ms(r.get("first_ttft_mean_s")), _share(r.get("survived")),
                     _tok(r["prefill_rate_tok_s"]), "-" if not eq else f"{eq[1]}/{eq[0]}",
                     "-" if r["disk_used"] is None else f"{r['disk_used'] / (1 << 20):.1f}",
                     str(r["errors"]), str(r["backend_failures"])))
    return text_table(header, rows)


def _median(vals: list[float | None]) -> float | None:
    present = [v for v in vals if v is not None]
    return statistics.median(present) if present else None


def by_backend(records: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Per regime, shape and backend: the median over its runs, and its mean TTFT and served
    tokens as ratios to the built-in's of the same regime and shape."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["regime"], r["shape"], r["backend"]), []).append(r)
    rows_out = []
    for (regime, shape, backend), rs in groups.items():
        eq = [r.get("outputs_equal") or (0, 0) for r in rs]
        rows_out.append({"regime": regime, "shape": shape, "backend": backend, "runs": len(rs),
                         **{k: _median([r.get(k) for r in rs]) for k in
                            ("found", "loaded", "served", "cached_tokens", "reachable", "cross_hit",
                             "cross_reachable", "ttft_mean_s", "ttft_p90_s", "first_ttft_mean_s", "survived",
                             "load")},
                         "outputs_compared": sum(e[0] for e in eq), "outputs_equal": sum(e[1] for e in eq)})
    base = {(g["regime"], g["shape"]): g for g in rows_out if g["backend"] == "builtin"}
    header = ("regime", "shape", "backend", "runs", "load", "found", "loaded", "served", "cached",
              "cross-instance", "TTFT mean", "p90", "1st after", "survived", "served / builtin",
              "TTFT / builtin", "outputs equal")
    rows = []
    for g in rows_out:
        b = base.get((g["regime"], g["shape"]))
        g["served_vs_builtin"] = (g["served"] / b["served"] if b and b["served"] and g["served"] is not None
                                  else None)
        g["ttft_vs_builtin"] = (g["ttft_mean_s"] / b["ttft_mean_s"] if b and b["ttft_mean_s"]
                                and g["ttft_mean_s"] is not None else None)
        rows.append((g["regime"], g["shape"], g["backend"], str(g["runs"]), f"{g['load'] or 0:.1f}",
                     _tok(g["found"]), _tok(g["loaded"]), _tok(g["served"]), _tok(g["cached_tokens"]),
                     _cross(g["cross_hit"], g["cross_reachable"]), _ms(g["ttft_mean_s"]),
                     _ms(g["ttft_p90_s"]), _ms(g["first_ttft_mean_s"]), _share(g["survived"]),
                     "-" if g["served_vs_builtin"] is None else f"{g['served_vs_builtin']:.2f}x",
                     "-" if g["ttft_vs_builtin"] is None else f"{g['ttft_vs_builtin']:.2f}x",
                     f"{g['outputs_equal']}/{g['outputs_compared']}"))
    return text_table(header, rows), rows_out


def plot(summary: list[dict[str, Any]], path: Path, title: str) -> None:
    """Served tokens and mean TTFT per backend, one pair of panels per regime and shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((g["regime"], g["shape"]) for g in summary))
    fig, axes = plt.subplots(2, len(panels), figsize=(3.6 * len(panels), 6.4), squeeze=False)
    for j, (regime, shape) in enumerate(panels):
        mine = [g for g in summary if (g["regime"], g["shape"]) == (regime, shape)]
        names = [g["backend"] for g in mine]
        axes[0][j].bar(names, [g["served"] or 0 for g in mine])
        axes[0][j].set_title(f"{regime}, {shape}", fontsize=9)
        axes[1][j].bar(names, [(g["ttft_mean_s"] or 0) * 1e3 for g in mine])
        for ax in (axes[0][j], axes[1][j]):
            ax.tick_params(axis="x", labelsize=7, rotation=30)
    axes[0][0].set_ylabel("tokens served from storage")
    axes[1][0].set_ylabel("TTFT mean, ms")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
