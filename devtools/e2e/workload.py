"""The long-context workload of the CPU end-to-end run, and the page contents it checks.

- ``KvShape``       the KV geometry of the simulated model (Llama-3-8B by default) and its page bytes.
- ``Request``       one prompt: a shared document followed by a question, as token ids.
- ``make_requests`` several long documents, many questions each, visited round-robin so that a
                    document comes back only after the others have pushed it out of the host pool.
- ``PagePattern``   deterministic page bytes derived from SGLang's page hash: what "prefill" writes
                    into the host pool, and what a page loaded back from storage must equal.

Token ids are random (seeded), never a tokenizer: no model or data is downloaded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

LLAMA3_VOCAB = 128_256


@dataclass(frozen=True)
class KvShape:
    """MHA KV cache geometry. Defaults: Llama-3-8B (GQA, 8 KV heads), bf16, 64-token pages."""
    layers: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 64
    dtype: torch.dtype = torch.bfloat16

    @property
    def token_bytes(self) -> int:
        """K plus V bytes of one token over all layers."""
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize

    @property
    def page_bytes(self) -> int:
        return self.token_bytes * self.page_size


@dataclass(frozen=True)
class Request:
    rid: str
    doc: int
    question: int
    tokens: list[int]
    doc_tokens: int  # length of the shared document prefix


@dataclass(frozen=True)
class WorkloadSpec:
    docs: int = 3
    min_doc_tokens: int = 4096
    max_doc_tokens: int = 8192
    questions: int = 4  # per document
    question_tokens: int = 96
    seed: int = 1


def doc_lengths(spec: WorkloadSpec, page_size: int) -> list[int]:
    """Document lengths spread evenly from min to max, whole pages (so documents share no page
    with their questions and the expected hit counts are exact)."""
    if spec.docs < 1 or spec.min_doc_tokens > spec.max_doc_tokens or spec.min_doc_tokens < page_size:
        raise ValueError(f"bad workload: {spec}")
    if spec.docs == 1:
        raw = [spec.max_doc_tokens]
    else:
        step = (spec.max_doc_tokens - spec.min_doc_tokens) / (spec.docs - 1)
        raw = [spec.min_doc_tokens + round(i * step) for i in range(spec.docs)]
    return [max(page_size, n // page_size * page_size) for n in raw]


def make_requests(spec: WorkloadSpec, page_size: int) -> list[Request]:
    """Round ``q`` asks question ``q`` of every document, documents in order."""
    rng = random.Random(spec.seed)
    docs = [[rng.randrange(LLAMA3_VOCAB) for _ in range(n)] for n in doc_lengths(spec, page_size)]
    out = []
    for q in range(spec.questions):
        for d, doc in enumerate(docs):
            question = [rng.randrange(LLAMA3_VOCAB) for _ in range(spec.question_tokens)]
            out.append(Request(rid=f"doc{d}-q{q}", doc=d, question=q, tokens=doc + question,
                               doc_tokens=len(doc)))
    return out


class PagePattern:
    """Page bytes as a function of the page hash: ``base XOR tag(hash)`` over int16 words.

    ``base`` is one random page (fixed seed); the tag differs per page and between K and V, so a
    page written to the wrong slot, a K/V swap, or a torn page all fail ``matches``.
    """

    def __init__(self, shape: KvShape, seed: int = 7):
        gen = torch.Generator().manual_seed(seed)
        words = shape.page_size * shape.layers * shape.kv_heads * shape.head_dim
        itemsize = torch.empty(0, dtype=shape.dtype).element_size()
        if itemsize != 2:
            raise ValueError("PagePattern works on 16-bit KV dtypes")
        self._base = torch.randint(-(2 ** 15), 2 ** 15, (words,), dtype=torch.int16, generator=gen)

    @staticmethod
    def _tags(page_hash: str) -> tuple[int, int]:
        k = int(page_hash[:4], 16) - 2 ** 15
        v = int(page_hash[4:8], 16) - 2 ** 15
        return k, v if v != k else k ^ 0x5A5A

    def fill(self, k_region: torch.Tensor, v_region: torch.Tensor, page_hash: str) -> None:
        """Write the page of ``page_hash`` into its K and V regions (any shape, 16-bit dtype)."""
        k, v = self._tags(page_hash)
        torch.bitwise_xor(self._base, k, out=_words(k_region))
        torch.bitwise_xor(self._base, v, out=_words(v_region))

    def matches(self, k_region: torch.Tensor, v_region: torch.Tensor, page_hash: str) -> bool:
        k, v = self._tags(page_hash)
        return (torch.equal(_words(k_region), torch.bitwise_xor(self._base, k))
                and torch.equal(_words(v_region), torch.bitwise_xor(self._base, v)))


def _words(region: torch.Tensor) -> torch.Tensor:
    # A host-pool page region is contiguous in page_first layout; view its bytes as int16 words.
    if not region.is_contiguous():
        raise ValueError("page region must be contiguous (host layout page_first)")
    return region.view(torch.int16).reshape(-1)
