"""Chat conversations taking turns on one server, each prompt its whole history with the server's
own answers, as SGLang's benchmark/hicache/bench_multiturn.py sends them (``round_robin``)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .client import RequestResult

Parts = list[tuple[list[int], list[list[int]]]]  # per conversation: first turn, later user messages
Send = Callable[[int, int, list[int]], RequestResult]  # (conversation, turn, prompt) -> its result


@dataclass
class Turn:
    conversation: int
    turn: int
    prompt_digest: str
    result: RequestResult


def digest(ids: list[int]) -> str:
    """A prompt's key: outputs of the same prompt are compared across variants."""
    return hashlib.blake2b(json.dumps(ids).encode(), digest_size=8).hexdigest()


def take_turns(first: dict[int, int], stop: Callable[[int], int], max_parallel: int,
               turn: Callable[[int, int], bool]) -> None:
    """Thread ``c``'s turns ``first[c]`` up to ``stop(c)`` in order, round robin over the threads,
    at most ``max_parallel`` turns in flight. ``turn(c, t)`` runs one turn and says whether its
    thread goes on (an error ends it: it cannot go on without its answer). A thread whose turn came
    back queues its next one behind every thread already waiting (bench_multiturn's clients do the
    same), so between two turns of one thread every other one has a turn: its history has gone cold
    in SGLang's device cache, the case storage is there for. An exception stops every worker."""
    cond = threading.Condition()
    ready: deque[int] = deque(c for c, t in first.items() if t < stop(c))
    next_turn = dict(first)
    in_flight = 0
    failed: list[BaseException] = []

    def worker() -> None:
        nonlocal in_flight
        while True:
            with cond:
                while not ready and in_flight and not failed:
                    cond.wait()
                if failed or not ready:
                    return
                c = ready.popleft()
                t = next_turn[c]
                in_flight += 1
            try:
                goes_on = turn(c, t)
            except BaseException as e:
                with cond:
                    failed.append(e)
                    in_flight -= 1
                    cond.notify_all()
                raise
            with cond:
                in_flight -= 1
                if goes_on and t + 1 < stop(c):
                    next_turn[c] = t + 1
                    ready.append(c)
                cond.notify_all()

    with ThreadPoolExecutor(max(1, max_parallel)) as ex:
        for f in [ex.submit(worker) for _ in range(max(1, max_parallel))]:
            f.result()


def round_robin(parts: Parts, send: Send, max_parallel: int, record: Callable[[Turn], None]) -> None:
    """Every conversation, turn by turn (``take_turns``), each prompt its history with the server's
    own answers."""
    history = {c: list(first) for c, (first, _) in enumerate(parts)}

    def turn(c: int, t: int) -> bool:
        if t:
            history[c] += parts[c][1][t - 1]
        prompt = list(history[c])
        res = send(c, t, prompt)
        record(Turn(c, t, digest(prompt), res))
        if not res.error and len(res.output_ids) != res.output_tokens:
            raise RuntimeError(f"{len(res.output_ids)} output ids streamed for {res.output_tokens} "
                               "completion tokens (is the server running with "
                               "--incremental-streaming-output?)")
        if res.error:
            return False
        history[c] += res.output_ids
        return True

    take_turns(dict.fromkeys(range(len(parts)), 0), lambda c: 1 + len(parts[c][1]), max_parallel, turn)
