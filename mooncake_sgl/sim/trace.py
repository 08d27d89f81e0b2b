"""Mooncake-format request traces: one JSON object a line with ``timestamp`` (ms), ``input_length``,
``output_length`` and ``hash_ids`` (one id per 512-token block; equal ids mean an equal block *and*
an equal prefix before it, so each request's ids form a prefix chain).

``read_trace`` yields ``Request``s lazily; ``block_key`` turns a block id into a real ``PageKey`` (the
store's key layout, in a fixed simulation namespace) so policies see the keys they see in production.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..api import PageKey
from ..keys import KeyNamespace, page_key

# Tokens per block in the published Mooncake traces.
BLOCK_TOKENS = 512

_SIM_NAMESPACE = KeyNamespace(model="trace-replay", dtype="bf16", layout="page_first",
                              page_size=BLOCK_TOKENS)


@dataclass(frozen=True)
class Request:
    t: float  # arrival, seconds from the start of the trace
    keys: tuple[PageKey, ...]  # the prompt's blocks, in prefix order
    block_ids: tuple[int, ...]


def block_key(block_id: int) -> PageKey:
    return page_key(_SIM_NAMESPACE, str(block_id))


def read_trace(path: str | Path, limit: int | None = None) -> Iterator[Request]:
    """Requests of a Mooncake-format JSONL trace in file order (arrival order)."""
    with open(path) as f:
        for n, line in enumerate(f):
            if limit is not None and n >= limit:
                return
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
                ids = tuple(int(h) for h in rec["hash_ids"])
                t = float(rec["timestamp"]) / 1000.0
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n + 1}: not a Mooncake trace record ({e})") from None
            yield Request(t, tuple(block_key(h) for h in ids), ids)


def load_trace(path: str | Path, limit: int | None = None) -> list[Request]:
    return list(read_trace(path, limit))


def distinct_blocks(requests: list[Request]) -> int:
    return len({k for r in requests for k in r.keys})
