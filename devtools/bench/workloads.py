"""Token-id workloads for live-server benchmarks, as rounds of requests.

- ``long_context``  shared long documents (8k-128k tokens), many questions each: round ``r`` asks
                    question ``r`` of every document, so from round 1 on every prompt's long prefix
                    was seen one round earlier.
- ``multiturn``     growing conversations: round ``t`` sends turn ``t`` of every conversation, whose
                    prompt is the previous prompt plus the previous answer plus a new user message.

Prompts are token ids (``/generate`` with ``input_ids``), random but seeded, below ``vocab_size``:
no tokenizer, dataset or model download. With token-id prompts the answer tokens of a turn are
synthetic (SGLang's real answer is not fed back), so the reusable prefix of a turn is the whole
previous turn's prompt (SGLang cached its own answer, not ours).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchRequest:
    rid: str
    round: int
    input_ids: list[int]
    max_new_tokens: int
    reusable_tokens: int  # prefix tokens sent in an earlier round (what a cache could serve)


@dataclass(frozen=True)
class LongContextSpec:
    docs: int = 4
    min_doc_tokens: int = 8192
    max_doc_tokens: int = 131072
    questions: int = 4  # per document = rounds
    question_tokens: int = 128
    output_tokens: int = 16
    vocab_size: int = 32000
    seed: int = 1


@dataclass(frozen=True)
class MultiTurnSpec:
    conversations: int = 16
    turns: int = 5  # = rounds
    first_turn_tokens: int = 4096  # system prompt plus first user message
    user_tokens: int = 512  # each later user message
    output_tokens: int = 64  # each answer
    vocab_size: int = 32000
    seed: int = 1


def add_chat_arguments(p: argparse.ArgumentParser, defaults: MultiTurnSpec, max_parallel: int) -> None:
    """A benchmark's conversation shape as command-line options, with its own defaults."""
    p.add_argument("--conversations", type=int, default=defaults.conversations)
    p.add_argument("--turns", type=int, default=defaults.turns)
    p.add_argument("--first-turn-tokens", type=int, default=defaults.first_turn_tokens)
    p.add_argument("--user-tokens", type=int, default=defaults.user_tokens, help="each later user message")
    p.add_argument("--output-tokens", type=int, default=defaults.output_tokens, help="each answer")
    p.add_argument("--max-parallel", type=int, default=max_parallel, help="conversations in flight at once")


def chat_spec(args: argparse.Namespace, seed: int = MultiTurnSpec.seed) -> MultiTurnSpec:
    """The conversation shape ``add_chat_arguments`` read."""
    return MultiTurnSpec(conversations=args.conversations, turns=args.turns,
                         first_turn_tokens=args.first_turn_tokens, user_tokens=args.user_tokens,
                         output_tokens=args.output_tokens, seed=seed)


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    # Ids from 10 up: low ids are special tokens (BOS/EOS/pad) in most vocabularies.
    return [rng.randrange(10, vocab) for _ in range(n)]


def doc_lengths(spec: LongContextSpec) -> list[int]:
    """Lengths spread geometrically from min to max (long contexts span orders of magnitude)."""
    if spec.docs < 1 or not 0 < spec.min_doc_tokens <= spec.max_doc_tokens:
        raise ValueError(f"bad long-context workload: {spec}")
    if spec.docs == 1:
        return [spec.max_doc_tokens]
    ratio = (spec.max_doc_tokens / spec.min_doc_tokens) ** (1 / (spec.docs - 1))
    return [round(spec.min_doc_tokens * ratio ** i) for i in range(spec.docs)]


def long_context(spec: LongContextSpec) -> list[list[BenchRequest]]:
    rng = random.Random(spec.seed)
    docs = [_tokens(rng, n, spec.vocab_size) for n in doc_lengths(spec)]
    rounds = []
    for q in range(spec.questions):
        batch = []
        for d, doc in enumerate(docs):
            ids = doc + _tokens(rng, spec.question_tokens, spec.vocab_size)
            batch.append(BenchRequest(rid=f"doc{d}-q{q}", round=q, input_ids=ids,
                                      max_new_tokens=spec.output_tokens,
                                      reusable_tokens=len(doc) if q else 0))
        rounds.append(batch)
    return rounds


def chat_parts(spec: MultiTurnSpec) -> list[tuple[list[int], list[list[int]]]]:
    """Per conversation, its first turn and each later user message, without answers: for drivers
    that append the server's own answers to the history (as a chat client does)."""
    if spec.conversations < 1 or spec.turns < 1:
        raise ValueError(f"bad multi-turn workload: {spec}")
    rng = random.Random(spec.seed)
    return [(_tokens(rng, spec.first_turn_tokens, spec.vocab_size),
             [_tokens(rng, spec.user_tokens, spec.vocab_size) for _ in range(spec.turns - 1)])
            for _ in range(spec.conversations)]


def multiturn(spec: MultiTurnSpec) -> list[list[BenchRequest]]:
    if spec.conversations < 1 or spec.turns < 1:
        raise ValueError(f"bad multi-turn workload: {spec}")
    rng = random.Random(spec.seed)
    history = [_tokens(rng, spec.first_turn_tokens, spec.vocab_size) for _ in range(spec.conversations)]
    last_prompt = [0] * spec.conversations
    rounds = []
    for t in range(spec.turns):
        batch = []
        for c in range(spec.conversations):
            if t:
                history[c] = history[c] + _tokens(rng, spec.user_tokens, spec.vocab_size)
            batch.append(BenchRequest(rid=f"conv{c}-t{t}", round=t, input_ids=list(history[c]),
                                      max_new_tokens=spec.output_tokens, reusable_tokens=last_prompt[c]))
            last_prompt[c] = len(history[c])
            # The answer joins the history for the next turn.
            history[c] = history[c] + _tokens(rng, spec.output_tokens, spec.vocab_size)
        rounds.append(batch)
    return rounds
