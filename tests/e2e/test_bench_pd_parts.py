"""The pure parts of ``scripts/bench_pd.py``: the chat workload, and the accounting of what SGLang
cannot store (an answer's last token) or does not look up (turns under ``prefetch_threshold``)."""

from __future__ import annotations

from pathlib import Path

from devtools.bench.client import RequestResult
from devtools.bench.workloads import MultiTurnSpec, chat_parts
from devtools.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def bench_pd():
    return load_script("bench_pd")


def result(prompt: int, cached: int = 0, device: int = 0, storage: int = 0) -> RequestResult:
    return RequestResult("r", 1, prompt, output_tokens=96, ttft_s=0.5, latency_s=2.0,
                         cached_tokens=cached, device_tokens=device, storage_tokens=storage)


def test_chat_parts_are_deterministic_and_leave_answers_to_the_server() -> None:
    spec = MultiTurnSpec(conversations=3, turns=4, first_turn_tokens=100, user_tokens=7)
    parts = chat_parts(spec)
    assert parts == chat_parts(spec)
    assert [(len(first), [len(u) for u in users]) for first, users in parts] == [(100, [7, 7, 7])] * 3


def test_an_answer_ending_on_a_page_boundary_loses_its_last_page_to_the_unsampled_token() -> None:
    b = bench_pd()
    # 1,000 prompt tokens + 24 answered: history 1,024 = 16 pages; the last token's KV never exists.
    t = b.Turn(prev_prompt=1000, prev_output=24, result=result(1024 + 64))
    assert (t.reachable(), t.storable()) == (1024, 960)
    # 1,000 + 30: 1,030 tokens, 16 whole pages either way.
    t = b.Turn(prev_prompt=1000, prev_output=30, result=result(1030 + 64))
    assert (t.reachable(), t.storable()) == (1024, 1024)
    assert b.Turn(0, 0, result(1024)).reachable() == 0  # a first turn reuses nothing


def test_a_short_turn_back_on_its_own_prefill_is_counted_as_lost_to_the_threshold() -> None:
    b = bench_pd()
    # Its prefill held the 1,024-token prompt; 96 answered + 64 new = 160 uncached tokens < 256:
    # SGLang never looks in storage, so the decode's page (1,024..1,088) is recomputed.
    short = b.Turn(1024, 96, result(1024 + 96 + 64, cached=1024, device=1024))
    run = b.Run("pd-pool", [short], wall_s=1.0)
    cell = b.summarise(run, threshold=256)
    assert (cell["lost_threshold_tokens"], cell["short_other_tokens"]) == (64, 0)
    # With the threshold at one page the same shortfall is not the threshold's.
    cell = b.summarise(run, threshold=64)
    assert (cell["lost_threshold_tokens"], cell["short_other_tokens"]) == (0, 64)
    # Read from storage past the prompt's pages: the decode's output page.
    hit = b.Turn(1024, 96, result(1024 + 96 + 64, cached=1088, device=0, storage=1088))
    cell = b.summarise(b.Run("pd-pool", [hit], wall_s=1.0), threshold=256)
    assert (cell["storage_past_prompt_tokens"], cell["storage_prompt_pages_tokens"]) == (64, 1024)
