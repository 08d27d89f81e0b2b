"""Retrieval-augmented generation over a large document pool with Zipf popularity: a seeded
Mooncake-format workload.

A request is a system prompt (a few, Zipf popularity), the documents retrieved for its query in
relevance order, the question, and sometimes the user's own context (never reused). Queries come
from a large pool with Zipf popularity (popular questions are asked again, retrieving the same
documents); each query retrieves ``k`` documents drawn by their own Zipf popularity. Since KV pages
chain over the prefix, a document's pages are reused only behind the same system prompt and the same
documents before it: the first document of popular queries is the reusable core.

Reuse is frequency-driven and long-range (a popular document comes back at any distance, a tail
document rarely): LFU's ground rather than LRU's, unlike chat sessions and agent loops.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass

from .synth import ChainIds, record


@dataclass(frozen=True)
class RagShape:
    """Arbitrary defaults: about 4,000 requests over ~20 minutes, prompts of ~5-40 blocks."""
    requests: int = 4000
    rate: float = 3.5  # requests per second
    system_prompts: int = 4
    documents: int = 20000
    doc_alpha: float = 0.9  # Zipf exponent of document popularity
    queries: int = 30000
    query_alpha: float = 0.8  # Zipf exponent of query popularity
    top_k: int = 4
    private_share: float = 0.4  # requests that end with the user's own, never reused, context


def _zipf_cdf(n: int, alpha: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (i + 1) ** alpha for i in range(n)))


def rag_requests(seed: int = 13, shape: RagShape = RagShape()) -> list[dict]:
    """Mooncake-format records, sorted by arrival."""
    rng = random.Random(seed)
    ids = ChainIds()
    doc_cdf = _zipf_cdf(shape.documents, shape.doc_alpha)
    query_cdf = _zipf_cdf(shape.queries, shape.query_alpha)
    doc_blocks = [rng.randint(1, 6) for _ in range(shape.documents)]
    # Popularity rank is not id order: a random permutation maps ranks to documents and queries.
    doc_of_rank = rng.sample(range(shape.documents), shape.documents)
    sys_weights = [1.0 / (i + 1) for i in range(shape.system_prompts)]
    queries: dict[int, list] = {}

    def query(q: int) -> list:
        """Labels of query ``q``'s prompt after the system prompt, fixed once drawn."""
        if q not in queries:
            docs: list[int] = []
            while len(docs) < shape.top_k:
                d = doc_of_rank[_pick(rng, doc_cdf)]
                if d not in docs:
                    docs.append(d)
            labels: list = [("doc", d, b) for d in docs for b in range(doc_blocks[d])]
            queries[q] = labels + [("question", q, b) for b in range(rng.randint(1, 2))]
        return queries[q]

    out: list[dict] = []
    t = 0.0
    for _ in range(shape.requests):
        t += rng.expovariate(shape.rate)
        system = rng.choices(range(shape.system_prompts), sys_weights)[0]
        labels = [("system", system, b) for b in range(2 + system % 3)]
        labels += query(_pick(rng, query_cdf))
        if rng.random() < shape.private_share:
            labels += ids.fresh(rng.randint(1, 3))
        out.append(record(t, ids.chain(labels)))
    return out


def _pick(rng: random.Random, cdf: list[float]) -> int:
    """Index drawn with probability proportional to its weight, from the weights' running sums."""
    return bisect.bisect_left(cdf, rng.random() * cdf[-1])
