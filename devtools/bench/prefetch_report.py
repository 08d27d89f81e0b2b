"""What ``scripts/bench_prefetch.py`` measures and how it reports it: SGLang's prefetch series read
from ``/metrics`` and differenced over a run, each run summarised into a cell, the cells as a
table, notes and a per-variant summary, greedy outputs compared across variants, and the plot."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mooncake_sgl.metrics.scrape import ScrapeError, fetch

from .console import stamped as log
from .plot import Panel, bar_panels
from .results import percentile, text_table
from .round_robin import Turn

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
    """``prefetch_series`` of a server; ``None`` when unreadable (logged): its run shows ``-``."""
    try:
        return prefetch_series(fetch(url, timeout=30.0))
    except ScrapeError as e:
        log(f"cannot read {url}/metrics: {e}")
        return None


# ------------------------------------------------------------------------------------ runs

@dataclass
class Run:
    variant: str
    pass_index: int
    seed: int
    load: float  # the 1-minute load average at its start
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0


def summarise(run: Run, delta: dict[str, float] | None, cleared: bool | None) -> dict[str, Any]:
    """A run as a cell of the table and the JSON: ``delta`` its prefetch series' increase (``None``:
    ``/metrics`` unreadable), ``cleared`` whether its storage was emptied first."""
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


def tok(v: float | None) -> str:
    """A token count as the table shows it; ``-``: the server does not expose that series."""
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
        served = [tok(c["served"].get(m)) for m in srv] if c["metrics_read"] else ["-"] * len(srv)
        rows.append((str(i + 1), c["variant"], f"{c['load']:.1f}", tok(c["found"]), tok(c["loaded"]),
                     "-" if ratio is None else f"{ratio:.1%}", *served,
                     *(tok(c["unfulfilled"].get(r)) for r in unf),
                     *(tok(c["deferred"].get(r)) for r in dfr),
                     ms(c["ttft_mean_s"]), ms(c["ttft_p50_s"]), ms(c["ttft_p99_s"]),
                     f"{c['prefill_rate_tok_s']:.0f}", str(c["errors"])))
    return text_table(header, rows)


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
        rows.append((n, tok(m["found"]), tok(m["loaded"]), "-" if ratio is None else f"{ratio:.1%}",
                     tok(m["storage_hit"]), f"{(m['ttft_mean_s'] or 0) * 1e3:.0f} ms",
                     f"{(m['ttft_p99_s'] or 0) * 1e3:.0f} ms", f"{m['prefill_rate_tok_s'] or 0:.0f}",
                     *(f"{(m['ttft_mean_s'] or 0) / med[b]['ttft_mean_s']:.2f}x" for b in bases)))  # type: ignore[operator]
    return text_table(header, rows), med


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
            outputs.setdefault((run.seed, t.conversation, t.turn, t.prompt_digest), {})[run.variant] = (
                list(t.result.output_ids))


def plot(cells: list[dict[str, Any]], path: str | Path, title: str) -> None:
    """Per run: tokens found, loaded, served from storage and unfulfilled by reason (stacked); TTFT
    mean and p99."""
    unfulfilled = [(f"unfulfilled: {r}", [c["unfulfilled"].get(r, 0.0) for c in cells])
                   for r in _columns(cells, "unfulfilled", nonzero=True)]
    tokens = Panel("tokens", [[("found", [c["found"] or 0 for c in cells])],
                              [("loaded", [c["loaded"] or 0 for c in cells])],
                              [("served from storage", [c["served"].get("storage_hit", 0) for c in cells])],
                              unfulfilled], legend_size=7)
    ttft = Panel("ms", [[("TTFT mean", [c["ttft_mean_s"] * 1e3 for c in cells])],
                        [("TTFT p99", [c["ttft_p99_s"] * 1e3 for c in cells])]])
    bar_panels(path, title, [f"{i + 1}\n{c['variant']}" for i, c in enumerate(cells)], [tokens, ttft],
               figsize=(14, 4.8), label_size=7, title_size=9)
