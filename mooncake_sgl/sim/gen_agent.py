"""Tool/agent loops re-sending a growing context: a seeded Mooncake-format workload.

Each agent starts from one of a few shared tool prompts (system prompt plus tool schemas, long, Zipf
popularity) and a fresh task, then loops: a request with the whole context, a tool call that takes a
few seconds, and the call and its result appended to the context for the next request. Along the way
an agent sometimes retries from an earlier step (the branch after it is abandoned), sometimes forks a
sub-agent that starts from its current context, and compacts its context into a short summary when it
outgrows the window (a new chain).

Reuse is short-range and very deep (every step re-reads the whole previous context within seconds),
with branches off long prefixes and a shared head (the tool prompts): unlike chat sessions, whose
turns are a minute apart, and the Mooncake trace, whose reuse is long-range re-reads.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from .synth import ChainIds, record


@dataclass(frozen=True)
class AgentShape:
    """Arbitrary defaults: about 4,000 requests over ~20 minutes, contexts of ~10-60 blocks."""
    agents: int = 400
    rate: float = 0.35  # agents started per second
    tool_prompts: int = 12
    mean_steps: float = 9.0
    tool_s: float = 4.0  # mean tool latency + decode between two steps of one agent
    retry: float = 0.06  # per step: restart from an earlier step
    fork: float = 0.04  # per step: spawn a sub-agent from the current context
    window_blocks: int = 64  # context beyond this is compacted into a summary


def agent_loops(seed: int = 11, shape: AgentShape = AgentShape()) -> list[dict]:
    """Mooncake-format records, sorted by arrival."""
    rng = random.Random(seed)
    ids = ChainIds()
    prompts = [[("tools", p, b) for b in range(rng.randint(6, 20))] for p in range(shape.tool_prompts)]
    weights = [1.0 / (i + 1) for i in range(shape.tool_prompts)]
    # (arrival, tie-break, context labels, steps left)
    queue: list[tuple[float, int, list, int]] = []
    serial = 0

    def start(at: float, context: list) -> None:
        nonlocal serial
        steps = 1 + int(rng.expovariate(1.0 / (shape.mean_steps - 1)))
        heapq.heappush(queue, (at, serial, context, steps))
        serial += 1

    t = 0.0
    for _ in range(shape.agents):
        t += rng.expovariate(shape.rate)
        start(t, list(rng.choices(prompts, weights)[0]) + ids.fresh(rng.randint(1, 4)))
    out: list[dict] = []
    history: dict[int, list[list]] = {}  # agent serial -> contexts of its steps
    while queue:
        at, agent, context, steps = heapq.heappop(queue)
        out.append(record(at, ids.chain(context)))
        past = history.setdefault(agent, [])
        past.append(context)
        if steps <= 1:
            history.pop(agent)
            continue
        if rng.random() < shape.fork:
            start(at + rng.expovariate(1.0 / shape.tool_s), context + ids.fresh(1))
        if len(past) > 1 and rng.random() < shape.retry:
            context = past[rng.randrange(len(past) - 1)]
        context = context + ids.fresh(rng.randint(1, 3))
        if len(context) > shape.window_blocks:
            head = next(i for i, label in enumerate(context) if label[0] != "tools")
            context = context[:head] + ids.fresh(rng.randint(2, 4))
        heapq.heappush(queue, (at + rng.expovariate(1.0 / shape.tool_s), agent, context, steps - 1))
    return out
