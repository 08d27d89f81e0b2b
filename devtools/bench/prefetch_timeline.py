"""Reads what ``prefetch_trace/sitecustomize.py`` wrote in a live server: every storage hit SGLang
tried to stage in its host pool, and the storage calls around it.

    python -m devtools.bench.prefetch_timeline DIR/ours.jsonl     # the files ours.jsonl.<pid>

Prints how many allocations were refused (``host_capacity``) or cut short, what the host pool held
when they were (free tokens, what ``evict_host`` could free, the device's used tokens, whose host
copies ``write_through`` pins), the storage calls' durations, and the timeline of one refused
allocation: the calls into the backend in the seconds before it.
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path
from typing import Any

WINDOW_S = 2.0  # the storage calls shown before the refusal


def load(prefix: str | Path) -> list[dict[str, Any]]:
    events = []
    for name in sorted(glob.glob(f"{prefix}.*")):
        for line in Path(name).read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    return sorted(events, key=lambda e: e.get("start", e["t"]))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    allocs = [e for e in events if e["kind"] == "alloc"]
    refused = [e for e in allocs if not e["allocated"]]
    short = [e for e in allocs if 0 < e["allocated"] < e["hit"]]
    calls = {k: [e for e in events if e["kind"] == k] for k in ("set", "get", "exists")}
    return {
        "allocations": len(allocs), "refused": len(refused), "cut_short": len(short),
        "hit_tokens": sum(e["hit"] for e in allocs), "allocated_tokens": sum(e["allocated"] for e in allocs),
        "refused_with_nothing_evictable": sum(1 for e in refused if e["evicted"] <= 0),
        "refused_host_free_median": _median([e["host_free_before"] for e in refused]),
        "refused_device_used_median": _median([e["device_used"] for e in refused]),
        "refused_backups_queued_max": max((e["backups_queued"] for e in refused), default=0),
        "host_size": allocs[0]["host_size"] if allocs else 0,
        **{f"{k}_calls": len(v) for k, v in calls.items()},
        **{f"{k}_ms_median": _median([e["seconds"] * 1e3 for e in v]) for k, v in calls.items()},
        **{f"{k}_ms_max": max((e["seconds"] * 1e3 for e in v), default=0.0) for k, v in calls.items()},
    }


def timeline(events: list[dict[str, Any]], refusal: dict[str, Any]) -> list[str]:
    t = refusal["t"]
    lines = []
    for e in events:
        start = e.get("start", e["t"])
        if e is refusal or (t - WINDOW_S <= start <= t and e["kind"] != "alloc") or (
                e["kind"] == "alloc" and t - WINDOW_S <= e["t"] < t):
            at = f"{(start - t) * 1e3:+8.1f} ms"
            if e["kind"] == "alloc":
                lines.append(f"{at}  stage {e['hit']} hit tokens: host free {e['host_free_before']} of "
                             f"{e['host_size']}, evict_host freed {e['evicted']}, allocated "
                             f"{e['allocated']} (min {e['min_tokens']}); device used {e['device_used']}, "
                             f"backups queued {e['backups_queued']}, prefetches in flight {e['prefetching']}")
            else:
                lines.append(f"{at}  batch_{e['kind']} {e['pages']} pages, {e['seconds'] * 1e3:.1f} ms")
    return lines


def report(prefix: str | Path) -> str:
    events = load(prefix)
    s = summary(events)
    out = [f"{prefix}: {s['allocations']} storage hits staged, {s['refused']} refused (host_capacity), "
           f"{s['cut_short']} cut short; {s['allocated_tokens']} of {s['hit_tokens']} hit tokens allocated",
           f"  refused: {s['refused_with_nothing_evictable']} with nothing evictable in the host pool; "
           f"median host free {s['refused_host_free_median']:.0f} of {s['host_size']} tokens, median "
           f"device used {s['refused_device_used_median']:.0f} tokens; at most "
           f"{s['refused_backups_queued_max']} backups queued",
           "  storage calls: " + ", ".join(
               f"batch_{k} {s[f'{k}_calls']} (median {s[f'{k}_ms_median']:.1f} ms, max "
               f"{s[f'{k}_ms_max']:.1f} ms)" for k in ("set", "get", "exists"))]
    refused = [e for e in events if e["kind"] == "alloc" and not e["allocated"]]
    if refused:
        first = refused[len(refused) // 2]  # one from the middle of the run, past the warm-up
        out.append(f"  one refusal and the {WINDOW_S:.0f} s before it:")
        out += ["    " + line for line in timeline(events, first)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__)
        return 2
    for prefix in args:
        print(report(prefix))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
