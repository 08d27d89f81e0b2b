"""A second synthetic workload with a different reuse pattern, for validating policies off the
Mooncake trace: multi-turn chat sessions over a few shared system prompts, and the helpers every
generator here shares (``ChainIds``, ``write_records``).

Each session picks a system prompt (Zipf popularity), then runs a geometric number of turns; every
turn's prompt is the previous turn's prompt plus new blocks, after an exponential think time. Reuse
is therefore mostly short-range and recency-driven (the next turn of a live session), with a small
frequency-driven core (popular system prompts): the opposite balance of the Mooncake synthetic trace,
whose reuse is long-range document re-reads.

Run ``python -m mooncake_sgl.sim.synth OUT.jsonl`` to write it in Mooncake format; ``gen_suite`` names
every generator (chat, agent loops, RAG).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path

from .trace import BLOCK_TOKENS


class ChainIds:
    """Mooncake-style block ids: one id per distinct (prefix, block content), so two prompts share an
    id exactly when they share that block and everything before it."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, Hashable], int] = {}
        self._fresh = 0

    def chain(self, blocks: Iterable[Hashable]) -> list[int]:
        """Ids of a prompt made of ``blocks`` (content labels), in order."""
        out: list[int] = []
        parent = -1
        for label in blocks:
            parent = self._ids.setdefault((parent, label), len(self._ids))
            out.append(parent)
        return out

    def fresh(self, n: int) -> list[Hashable]:
        """``n`` block labels never used before (new text: a question, a tool result)."""
        self._fresh += n
        return [("fresh", self._fresh - n + i) for i in range(n)]


def record(at: float, chain: Sequence[int], output_blocks: float = 0.2) -> dict:
    """One Mooncake-format request arriving at ``at`` seconds."""
    return {"timestamp": int(at * 1000), "input_length": len(chain) * BLOCK_TOKENS,
            "output_length": max(1, int(output_blocks * BLOCK_TOKENS)), "hash_ids": list(chain)}


def write_records(records: Sequence[dict], path: Path) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def chat_sessions(sessions: int = 1200, prompts: int = 40, seed: int = 7, rate: float = 1.2,
                  mean_turns: float = 4.0, think_s: float = 60.0) -> list[dict]:
    """Mooncake-format records, sorted by arrival. Arbitrary defaults sized like the Mooncake trace
    (about 4,000 requests over ~20 minutes)."""
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    system = [fresh(rng.randint(2, 8)) for _ in range(prompts)]
    weights = [1.0 / (i + 1) for i in range(prompts)]  # Zipf(1) popularity of system prompts
    events: list[tuple[float, int, list[int], int]] = []
    t = 0.0
    for s in range(sessions):
        t += rng.expovariate(rate)
        chain = list(rng.choices(system, weights)[0]) + fresh(rng.randint(1, 12))
        turns = 1 + int(rng.expovariate(1.0 / (mean_turns - 1)))
        at = t
        for _ in range(turns):
            heapq.heappush(events, (at, s, list(chain), 0))
            chain = chain + fresh(rng.randint(1, 6))
            at += rng.expovariate(1.0 / think_s)
    out = []
    while events:
        at, _, chain, _ = heapq.heappop(events)
        out.append({"timestamp": int(at * 1000), "input_length": len(chain) * BLOCK_TOKENS,
                    "output_length": 100, "hash_ids": chain})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sessions", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    recs = chat_sessions(args.sessions, seed=args.seed)
    write_records(recs, args.out)
    print(f"wrote {len(recs)} requests to {args.out}")


if __name__ == "__main__":
    main()
