"""Seeded Mooncake-format workloads shaped like a shared cluster rather than one application, large
enough that a tier at a few percent of their distinct blocks holds thousands of pages.

- ``scan_workload``: multi-turn conversations (long pasted contexts, growing by each answer and
  question, like the public Mooncake conversation trace) with one-off long documents interleaved
  (summaries, extractions: read once, never again). A document is a scan: it pushes a cache's
  recent conversations out and is worth nothing itself.
- ``mix_workload``: two tenants of one cluster, each with its own prompts: the conversations above,
  and document re-reads with Zipf popularity (long shared prefixes, a private question after them,
  like the public Mooncake synthetic trace). Short-range reuse beside long-range reuse.
- ``tenants_workload``: three tenants of different reuse side by side: chat sessions
  (``synth.chat_sessions``), agent loops (``gen_agent``) and RAG (``gen_rag``), scaled up.

Tenants never share a block (each has its own prompts and ids), as on a cluster serving several
applications: ``merge_tenants`` renumbers their ids apart and interleaves their requests by arrival.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .gen_agent import AgentShape, agent_loops
from .gen_rag import RagShape, _pick, _zipf_cdf, rag_requests
from .synth import ChainIds, chat_sessions, record


@dataclass(frozen=True)
class ConversationShape:
    """Arbitrary defaults: about 5,000 requests over ~40 minutes, prompts of ~10-80 blocks."""
    sessions: int = 1100
    rate: float = 0.45  # sessions started per second
    system_prompts: int = 24
    first_blocks: tuple[int, int] = (4, 40)  # the user's first message (a pasted context), blocks
    mean_turns: float = 4.5
    turn_blocks: tuple[int, int] = (1, 8)  # each answer and the next question, blocks
    think_s: float = 90.0  # mean time between two turns of a session


@dataclass(frozen=True)
class ScanShape:
    """Conversations with one-off documents among them: about a quarter of the requests and two
    thirds of the pages looked up are documents nobody reads twice."""
    conversation: ConversationShape = ConversationShape()
    documents: int = 1600
    document_blocks: tuple[int, int] = (40, 240)  # 20k-120k tokens
    tool_prompts: int = 3  # a short shared instruction before each document ("summarize: ...")


@dataclass(frozen=True)
class ReReadShape:
    """Long documents re-read behind a private question: a Zipf-popular pool of shared prefixes."""
    requests: int = 5000
    rate: float = 2.0  # requests per second
    documents: int = 2500
    alpha: float = 0.9  # Zipf exponent of document popularity
    document_blocks: tuple[int, int] = (10, 120)
    question_blocks: tuple[int, int] = (1, 4)


def conversations(rng: random.Random, ids: ChainIds, shape: ConversationShape,
                  tenant: str = "chat") -> list[tuple[float, list[int]]]:
    """(arrival, block ids) of every turn of ``shape.sessions`` multi-turn sessions."""
    prompts = [[(tenant, "system", p, b) for b in range(rng.randint(2, 8))]
               for p in range(shape.system_prompts)]
    weights = [1.0 / (i + 1) for i in range(shape.system_prompts)]
    out: list[tuple[float, list[int]]] = []
    t = 0.0
    for _ in range(shape.sessions):
        t += rng.expovariate(shape.rate)
        context = list(rng.choices(prompts, weights)[0]) + ids.fresh(rng.randint(*shape.first_blocks))
        turns = 1 + int(rng.expovariate(1.0 / (shape.mean_turns - 1)))
        at = t
        for _ in range(turns):
            out.append((at, ids.chain(context)))
            context = context + ids.fresh(rng.randint(*shape.turn_blocks))
            at += rng.expovariate(1.0 / shape.think_s)
    return out


def _records(requests: list[tuple[float, list[int]]]) -> list[dict]:
    requests.sort(key=lambda r: r[0])
    return [record(at, chain) for at, chain in requests]


def scan_workload(seed: int = 17, shape: ScanShape = ScanShape()) -> list[dict]:
    """Mooncake-format records, sorted by arrival (see the module docstring)."""
    rng = random.Random(seed)
    ids = ChainIds()
    requests = conversations(rng, ids, shape.conversation)
    end = max(at for at, _ in requests)
    tools = [[("tool", p, b) for b in range(rng.randint(1, 2))] for p in range(shape.tool_prompts)]
    for _ in range(shape.documents):
        labels = list(rng.choice(tools)) + ids.fresh(rng.randint(*shape.document_blocks))
        requests.append((rng.uniform(0.0, end), ids.chain(labels)))
    return _records(requests)


def rereads(rng: random.Random, ids: ChainIds, shape: ReReadShape) -> list[tuple[float, list[int]]]:
    """(arrival, block ids) of ``shape.requests`` document re-reads (``ReReadShape``)."""
    cdf = _zipf_cdf(shape.documents, shape.alpha)
    lengths = [rng.randint(*shape.document_blocks) for _ in range(shape.documents)]
    out: list[tuple[float, list[int]]] = []
    t = 0.0
    for _ in range(shape.requests):
        t += rng.expovariate(shape.rate)
        d = _pick(rng, cdf)
        labels = [("doc", d, b) for b in range(lengths[d])] + ids.fresh(rng.randint(*shape.question_blocks))
        out.append((t, ids.chain(labels)))
    return out


def mix_workload(seed: int = 19, conversation: ConversationShape = ConversationShape(),
                 reread: ReReadShape = ReReadShape()) -> list[dict]:
    """Mooncake-format records of two tenants, sorted by arrival (see the module docstring)."""
    rng = random.Random(seed)
    chat, docs = ChainIds(), ChainIds()
    return merge_tenants([_records(conversations(rng, chat, conversation)),
                          _records(rereads(rng, docs, reread))])


def tenants_workload(seed: int = 23, scale: float = 1.0) -> list[dict]:
    """Chat, agent and RAG tenants side by side, each ``2 * scale`` times its ``gen_suite`` default
    in requests (and documents, for RAG)."""
    rng = random.Random(seed)
    n = 2 * scale
    return merge_tenants([
        chat_sessions(sessions=round(1200 * n), rate=1.2 * n, seed=rng.randrange(1 << 30)),
        agent_loops(rng.randrange(1 << 30), AgentShape(agents=round(400 * n), rate=0.35 * n)),
        rag_requests(rng.randrange(1 << 30), RagShape(requests=round(4000 * n), rate=3.5 * n,
                                                      documents=round(20000 * n),
                                                      queries=round(30000 * n))),
    ])


def merge_tenants(tenants: Sequence[Sequence[dict]]) -> list[dict]:
    """One trace of several tenants' records: ids renumbered so no two tenants share a block,
    requests interleaved by arrival (ties in tenant order)."""
    renumbered: list[list[tuple[int, int, int, dict]]] = []
    ids: dict[tuple[int, int], int] = {}
    for n, records in enumerate(tenants):
        out = []
        for i, rec in enumerate(records):
            chain = [ids.setdefault((n, h), len(ids)) for h in rec["hash_ids"]]
            out.append((rec["timestamp"], n, i, {**rec, "hash_ids": chain}))
        renumbered.append(out)
    return [rec for _, _, _, rec in heapq.merge(*renumbered)]
