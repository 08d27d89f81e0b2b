"""The two request shapes of the regime benchmark, and the client that drives them.

- ``chat``  SGLang's multi-turn shape (benchmark/hicache/bench_multiturn.py): each turn resends the
            conversation's whole history, the server's own answers included, plus a new user
            message.
- ``doc``   several questions over one long document each: every prompt is the document plus
            one question, and nothing of the earlier questions.

Each conversation or document is a *thread* of turns. The client keeps ``max_parallel`` requests
in flight; a thread whose answer came back queues its next turn behind every thread already
waiting, so between two turns of one thread every other thread has one: its pages have gone
cold in SGLang's device cache, which is what storage is for. Answers are greedy (temperature 0,
``ignore_eos``), so the same prompt must give the same output on every backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..client import RequestResult
from ..round_robin import digest, take_turns
from ..workloads import LongContextSpec, MultiTurnSpec, chat_parts, long_context
from .budget import stored_pages, thread_pages


@dataclass(frozen=True)
class Shape:
    """A workload's size: ``threads`` conversations (or documents) of ``turns`` turns (questions)."""
    name: str
    threads: int
    turns: int
    first_tokens: int  # chat: the first turn; doc: the document
    message_tokens: int  # chat: each later user message; doc: each question
    output_tokens: int

    def threads_for(self, seed: int) -> list[Thread]:
        if self.name == "chat":
            parts = chat_parts(MultiTurnSpec(conversations=self.threads, turns=self.turns,
                                             first_turn_tokens=self.first_tokens,
                                             user_tokens=self.message_tokens,
                                             output_tokens=self.output_tokens, seed=seed))
            return [Thread(tuple(first), tuple(tuple(m) for m in later), chat=True) for first, later in parts]
        if self.name == "doc":
            rounds = long_context(LongContextSpec(docs=self.threads, min_doc_tokens=self.first_tokens,
                                                  max_doc_tokens=self.first_tokens, questions=self.turns,
                                                  question_tokens=self.message_tokens,
                                                  output_tokens=self.output_tokens, seed=seed))
            n = self.first_tokens
            return [Thread(tuple(rounds[0][d].input_ids[:n]),
                           tuple(tuple(r[d].input_ids[n:]) for r in rounds), chat=False)
                    for d in range(self.threads)]
        raise ValueError(f"unknown shape {self.name!r}")

    def sequence_lengths(self) -> list[int]:
        """Tokens of each turn's prompt plus its answer, in turn order (the same for every thread)."""
        out, prompt = [], self.first_tokens
        for t in range(self.turns):
            if self.name == "chat":
                prompt = self.first_tokens if t == 0 else prompt + self.output_tokens + self.message_tokens
            else:
                prompt = self.first_tokens + self.message_tokens
            out.append(prompt + self.output_tokens)
        return out

    def working_set_pages(self, page: int) -> int:
        shared = None if self.name == "chat" else self.first_tokens
        return self.threads * thread_pages(self.sequence_lengths(), page, shared)

    def longest_prompt(self) -> int:
        return max(self.sequence_lengths()) - self.output_tokens


@dataclass(frozen=True)
class Thread:
    base: tuple[int, ...]  # chat: the first turn; doc: the document
    messages: tuple[tuple[int, ...], ...]  # chat: the later user messages; doc: one question a turn
    chat: bool

    @property
    def turns(self) -> int:
        return 1 + len(self.messages) if self.chat else len(self.messages)

    def prompt(self, turn: int, history: list[int]) -> list[int]:
        """Turn ``turn``'s prompt; ``history``: the previous turn's prompt and answer (chat)."""
        if not self.chat:
            return [*self.base, *self.messages[turn]]
        return list(self.base) if turn == 0 else [*history, *self.messages[turn - 1]]

    def reachable(self, turn: int, prompt: list[int], history: list[int], page: int) -> int:
        """Prompt tokens an earlier turn stored: whole pages, never the prompt's last token."""
        if turn == 0:
            return 0
        before = len(history) if self.chat else len(self.base) + 1  # +1: the document's own last token
        return min(stored_pages(before, page), (len(prompt) - 1) // page) * page


@dataclass(frozen=True)
class Sent:
    thread: int
    turn: int
    digest: str
    reachable: int
    result: RequestResult


Send = Callable[[int, int, list[int]], RequestResult]  # (thread, turn, prompt) -> its result


def drive(threads: list[Thread], turns: range, histories: dict[int, list[int]], send: Send,
          max_parallel: int, page: int, record: Callable[[Sent], None]) -> None:
    """Turns ``turns`` of every thread, round robin (``take_turns``), ``max_parallel`` in flight.
    ``histories`` carries each chat's last prompt and answer from one call to the next (a restart
    between two calls resumes the conversations); an error ends its thread."""

    def turn(c: int, t: int) -> bool:
        history = histories.get(c, [])
        prompt = threads[c].prompt(t, history)
        res = send(c, t, prompt)
        record(Sent(c, t, digest(prompt), threads[c].reachable(t, prompt, history, page), res))
        if res.error:
            histories.pop(c, None)
            return False
        histories[c] = prompt + list(res.output_ids)
        return True

    first = {c: turns.start for c in range(len(threads)) if c in histories or turns.start == 0}
    take_turns(first, lambda c: min(turns.stop, threads[c].turns), max_parallel, turn)
