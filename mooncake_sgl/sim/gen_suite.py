"""The seeded generated workloads, by name, for policy checks off the Mooncake trace.

- ``chat``  multi-turn chat sessions over shared system prompts (``synth.chat_sessions``);
- ``agent`` tool/agent loops re-sending a growing context (``gen_agent.agent_loops``);
- ``rag``   retrieval over a large document pool with Zipf popularity (``gen_rag.rag_requests``);
- ``scan``  conversations with one-off long documents among them (``gen_mixed.scan_workload``);
- ``mix``   two tenants: conversations and Zipf-popular document re-reads (``gen_mixed.mix_workload``);
- ``tenants`` chat, agent and RAG tenants side by side, scaled up (``gen_mixed.tenants_workload``).

The last three are ten times the first three's distinct blocks: a tier at a few percent of them
holds thousands of pages, where the capacity curves sample (``policy.curve``).

``mooncake-sgl trace NAME OUT.jsonl [--seed N]`` writes one in Mooncake format;
``scripts/replay_trace.py gen:NAME`` replays one without a file.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from .gen_agent import agent_loops
from .gen_mixed import mix_workload, scan_workload, tenants_workload
from .gen_rag import rag_requests
from .synth import chat_sessions, write_records
from .trace import Request, block_key

GENERATORS: dict[str, Callable[[int], list[dict]]] = {
    "chat": lambda seed: chat_sessions(seed=seed),
    "agent": lambda seed: agent_loops(seed=seed),
    "rag": lambda seed: rag_requests(seed=seed),
    "scan": lambda seed: scan_workload(seed=seed),
    "mix": lambda seed: mix_workload(seed=seed),
    "tenants": lambda seed: tenants_workload(seed=seed),
}
# The seed each workload's documented figures use.
DEFAULT_SEEDS = {"chat": 7, "agent": 11, "rag": 13, "scan": 17, "mix": 19, "tenants": 23}


def generate(name: str, seed: int | None = None) -> list[dict]:
    """Records of workload ``name`` (Mooncake format, sorted by arrival)."""
    if name not in GENERATORS:
        raise ValueError(f"unknown workload {name!r}; expected one of {', '.join(GENERATORS)}")
    return GENERATORS[name](DEFAULT_SEEDS[name] if seed is None else seed)


def generate_requests(name: str, seed: int | None = None) -> list[Request]:
    """Workload ``name`` as the simulator's requests (what ``trace.load_trace`` gives for its file)."""
    return [Request(r["timestamp"] / 1000.0, tuple(block_key(h) for h in r["hash_ids"]),
                    tuple(r["hash_ids"])) for r in generate(name, seed)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mooncake-sgl trace", description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(GENERATORS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, help="default: the seed of the documented figures")
    args = ap.parse_args(argv)
    records = generate(args.name, args.seed)
    try:
        write_records(records, args.out)
    except OSError as e:
        ap.error(f"cannot write {args.out}: {e.strerror or e}")
    print(f"wrote {len(records)} {args.name} requests to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
