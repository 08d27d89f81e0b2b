"""The pure parts of ``scripts/bench_prefetch.py``, in ``devtools.bench``: SGLang's prefetch series
read from /metrics and differenced over a run, the table and its notes (``prefetch_report``), the
seed of each run (``options.schedule``), the comparison of outputs, the conversations taking turns
(``round_robin``)."""

from __future__ import annotations

from devtools.bench import prefetch_report as report
from devtools.bench.client import RequestResult
from devtools.bench.options import schedule
from devtools.bench.round_robin import Turn, digest, round_robin


def metrics(found: float, loaded: float, host_capacity: float, deadline: float, storage_hit: float) -> str:
    """A /metrics text as SGLang writes it: two ranks, reasons and modes as labels, zeros pre-seeded."""
    lab = 'model_name="m",tp_rank="{}"'
    unf = "sglang:storage_prefetch_unfulfilled_tokens_total"
    return "\n".join([
        "# HELP sglang:storage_prefetch_hit_tokens_total Storage-hit tokens returned by an L3 query.",
        "# TYPE sglang:storage_prefetch_hit_tokens_total counter",
        f"sglang:storage_prefetch_hit_tokens_total{{{lab.format(0)}}} {found / 2}",
        f"sglang:storage_prefetch_hit_tokens_total{{{lab.format(1)}}} {found / 2}",
        "# TYPE sglang:prefetched_tokens_total counter",
        f"sglang:prefetched_tokens_total{{{lab.format(0)}}} {loaded}",
        "# TYPE sglang:storage_prefetch_unfulfilled_tokens_total counter",
        f'{unf}{{{lab.format(0)},reason="host_capacity"}} {host_capacity}',
        f'{unf}{{{lab.format(1)},reason="deadline"}} {deadline}',
        f'{unf}{{{lab.format(0)},reason="dropped"}} 0.0',
        f'{unf}{{{lab.format(1)},reason="dropped"}} 0.0',
        "# TYPE sglang:prefill_effective_tokens_total counter",
        f'sglang:prefill_effective_tokens_total{{{lab.format(0)},mode="input"}} 1000.0',
        f'sglang:prefill_effective_tokens_total{{{lab.format(0)},mode="storage_hit"}} {storage_hit}',
        "# TYPE sglang:num_running_reqs gauge",
        f"sglang:num_running_reqs{{{lab.format(0)}}} 2.0",
        "",
    ])


def result(prompt: int, cached: int, ttft: float) -> RequestResult:
    return RequestResult("r", 1, prompt, output_tokens=64, ttft_s=ttft, latency_s=1.0, cached_tokens=cached)


def test_series_are_summed_over_ranks_kept_apart_by_reason_and_mode_and_differenced() -> None:
    before = report.prefetch_series(metrics(1000, 500, 100, 0, 448))
    assert before == {"found": 1000, "loaded": 500, "unfulfilled:host_capacity": 100,
                      "unfulfilled:deadline": 0, "unfulfilled:dropped": 0, "served:input": 1000,
                      "served:storage_hit": 448}
    after = report.prefetch_series(metrics(4000, 2000, 700, 64, 1472))
    delta = report.series_delta(before, after)
    assert delta["found"] == 3000 and delta["loaded"] == 1500
    assert report.split(delta, "unfulfilled") == {"host_capacity": 600, "deadline": 64, "dropped": 0}
    assert report.split(delta, "served") == {"input": 0, "storage_hit": 1024}
    # A server without a storage backend has none of the storage series: absent, not zero.
    assert report.prefetch_series("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1.0\n") == {}


def cell(variant: str, delta: dict[str, float] | None, ttft: float = 0.5) -> dict:
    run = report.Run(variant, 0, 1, load=1.5, turns=[Turn(0, 0, "d", result(2048, 1024, ttft))], wall_s=2.0)
    return report.summarise(run, delta, cleared=True if delta else None)


def test_the_table_shows_found_loaded_and_each_nonzero_reason_and_notes_the_rest() -> None:
    delta = report.series_delta(report.prefetch_series(metrics(0, 0, 0, 0, 0)),
                           report.prefetch_series(metrics(4000, 1000, 600, 64, 960)))
    ours = cell("ours", delta)
    assert ours["loaded_over_found"] == 0.25
    assert ours["prefill_rate_tok_s"] == 1024 / 0.5  # computed tokens per second of TTFT
    plain = cell("no-storage", {"served:input": 2048, "served:storage_hit": 0}, ttft=1.0)
    text = report.table([ours, plain])
    header, rule, row1, row2 = text.splitlines()
    for col in ("found", "loaded", "ld/found", "srv: input", "srv: storage_hit", "unf: deadline",
                "unf: host_capacity", "TTFT mean", "prefill tok/s"):
        assert col in header
    assert "dropped" not in header  # zero in every run: a note, not a column
    assert row1.split()[:7] == ["1", "ours", "1.5", "4000", "1000", "25.0%", "0"]
    assert "960" in row1 and "600" in row1 and "500 ms" in row1
    assert row2.split()[:6] == ["2", "no-storage", "1.5", "-", "-", "-"]
    said = report.notes([ours, plain])
    assert "unfulfilled reasons on /metrics, 0 in every run: dropped" in said
    missing = "no-storage: never on /metrics: sglang:storage_prefetch_hit_tokens_total"
    assert any(n.startswith(missing) for n in said)
    # A storage server that found nothing yet: no found/loaded series, but the reasons are there.
    idle = cell("builtin", {"unfulfilled:deadline": 0.0, "served:storage_hit": 0.0})
    assert (idle["found"], idle["loaded"], idle["loaded_over_found"]) == (0.0, 0.0, None)
    text, med = report.by_variant([ours, plain])
    assert med["ours"]["storage_hit"] == 960
    assert "TTFT vs no-storage" in text and "0.50x" in text


def test_each_half_pass_has_its_own_seed_shared_by_every_variant() -> None:
    order = schedule(["a", "b", "c"], passes=2, base_seed=10)
    assert [v for _, v, _ in order] == ["a", "b", "c", "c", "b", "a"] * 2
    assert [s for _, _, s in order] == [10, 10, 10, 11, 11, 11, 12, 12, 12, 13, 13, 13]
    for v in "abc":  # no variant meets the same prompts twice...
        seeds = [s for _, w, s in order if w == v]
        assert len(seeds) == len(set(seeds)) == 4
    for s in range(10, 14):  # ...and every seed's prompts go to every variant
        assert sorted(v for _, v, t in order if t == s) == ["a", "b", "c"]


def test_outputs_of_one_prompt_are_compared_across_variants() -> None:
    outputs = {(1, 0, 0, "p"): {"no-storage": [5, 6], "ours": [5, 6], "builtin": [5, 7]},
               (1, 0, 1, "q"): {"no-storage": [8], "ours": [8]},
               (1, 0, 1, "r"): {"builtin": [9]}}  # another history: nothing to compare it with
    out = report.compare_outputs(outputs, "no-storage")
    assert (out["compared"], out["mismatched"]) == (2, 1)
    assert out["mismatched_vs_reference"] == {"ours": 0, "builtin": 1}
    assert out["examples"] == [{"seed": 1, "conversation": 0, "turn": 0,
                                "variants": ["builtin", "no-storage", "ours"]}]


def test_conversations_take_turns_round_robin_each_prompt_its_whole_history() -> None:
    parts = [([c * 100], [[c * 100 + 1], [c * 100 + 2]]) for c in range(3)]
    sent: list[tuple[int, int, list[int]]] = []

    def send(c: int, t: int, prompt: list[int]) -> RequestResult:
        sent.append((c, t, prompt))
        res = RequestResult("r", t, len(prompt), output_tokens=1, output_ids=[-(c * 10 + t)])
        if (c, t) == (2, 1):
            res.error = "HTTP 500"  # ends conversation 2: it has no answer to go on with
        return res

    turns: list = []
    round_robin(parts, send, max_parallel=1, record=turns.append)
    assert [(c, t) for c, t, _ in sent] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (1, 2)]
    assert sent[3][2] == [0, 0, 1]  # first turn, its answer, the next user message
    assert sent[6][2] == [0, 0, 1, -1, 2]
    assert len(turns) == 8 and turns[6].prompt_digest == digest([0, 0, 1, -1, 2])
    turns.clear()
    round_robin(parts, send, max_parallel=3, record=turns.append)  # several in flight: all turns, once each
    assert sorted((t.conversation, t.turn) for t in turns) == sorted((c, t) for c, t, _ in sent[:8])
