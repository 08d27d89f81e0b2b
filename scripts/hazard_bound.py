#!/usr/bin/env python3
"""How far can a policy that ranks pages by (access count, age) go on a trace, and does what it needs
carry over from the past to the future?

An offline experiment, not a policy: it fits, from a stretch of the trace, the distribution of the gap
(in requests) to a block's next access given how many times the block has been accessed so far (1..8,
capped). A one-tier cache then evicts, before each write, the pages with the lowest probability of
being accessed within ``--horizon`` requests given their count class and age (tails of a chain before
its head), and counts prefix hits as SGLang does. Fitted on the whole trace, the table knows the
future's statistics (an upper bound for this family of features); fitted on the first half only, it
is what the best possible online learner of this family could have known by the middle of the trace.

    python scripts/hazard_bound.py synthetic_trace.jsonl --capacity-blocks 2%,9%   # Mooncake's FAST'25 trace
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

CLASSES = 8
NEVER = 1 << 40


def load(path: Path) -> list[list[int]]:
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def fit(requests: Sequence[Sequence[int]], horizon: int) -> Callable[[int, int], float]:
    """P(next access within ``horizon`` requests | count class, no access for ``age`` requests)."""
    seen: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        for b in r:
            seen[b].append(i)
    gaps: dict[int, list[int]] = defaultdict(list)
    for uses in seen.values():
        for n, i in enumerate(uses):
            gaps[min(n + 1, CLASSES)].append(uses[n + 1] - i if n + 1 < len(uses) else NEVER)
    for g in gaps.values():
        g.sort()
    memo: dict[tuple[int, int], float] = {}

    def score(cls: int, age: int) -> float:
        if (cls, age) not in memo:
            g = gaps.get(cls, [])
            lo = bisect.bisect_right(g, age)
            alive = len(g) - lo
            memo[cls, age] = (bisect.bisect_right(g, age + horizon) - lo) / alive if alive else 0.0
        return memo[cls, age]
    return score


def replay(requests: Sequence[Sequence[int]], capacity: int, score: Callable[[int, int], float]) -> float:
    """Prefix hit ratio of the (count class, age)-ranked cache of ``capacity`` blocks."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)  # (count, last use) -> blocks, head first
    where: dict[int, tuple[int, int]] = {}
    count: dict[int, int] = defaultdict(int)
    hits = total = 0

    def drop(b: int) -> None:
        g = where.pop(b)
        groups[g].remove(b)
        if not groups[g]:
            del groups[g]

    for i, r in enumerate(requests):
        run = 0
        while run < len(r) and r[run] in where:
            run += 1
        hits += run
        total += len(r)
        for b in r:
            count[b] += 1
            if b in where:
                drop(b)
        need = len(where) + len(r) - capacity
        protected = set(r)
        for g in sorted(groups, key=lambda g: (score(min(g[0], CLASSES), i - g[1]), g[1])):
            if need <= 0:
                break
            for b in reversed(list(groups.get(g, ()))):
                if need <= 0:
                    break
                if b not in protected:
                    drop(b)
                    need -= 1
        for b in r:
            where[b] = (count[b], i)
            groups[where[b]].append(b)
    return hits / total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--capacity-blocks", default="2%,9%", help="blocks or shares of the distinct blocks")
    ap.add_argument("--horizon", type=int, default=0,
                    help="requests ahead a page's reuse is scored over (default: the capacity's turnover, "
                         "capacity / mean blocks per request)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    requests = load(args.trace)
    distinct = len({b for r in requests for b in r})
    per_request = sum(map(len, requests)) / len(requests)
    half = len(requests) // 2
    rows = []
    print(f"{'capacity':>14} {'horizon':>8} {'fit: whole trace':>17} {'fit: first half':>16}")
    for text in args.capacity_blocks.split(","):
        cap = round(distinct * float(text[:-1]) / 100) if text.endswith("%") else int(text)
        horizon = args.horizon or max(1, round(cap / per_request))
        whole = replay(requests, cap, fit(requests, horizon))
        past = replay(requests, cap, fit(requests[:half], horizon))
        rows.append({"capacity_blocks": cap, "horizon": horizon, "fit_whole": whole, "fit_first_half": past})
        print(f"{cap:>8} ({text:>4}) {horizon:>8} {100 * whole:>16.2f}% {100 * past:>15.2f}%", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"trace": str(args.trace), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
