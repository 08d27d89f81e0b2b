"""The pure parts of ``scripts/bench_regimes.py`` (``devtools/bench/regimes``): the run order and
seeds, the budgets, the workload shapes and their client, SGLang's counters, each backend's
config, and the records, comparisons and tables of the report. No live server."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from devtools.bench.client import RequestResult
from devtools.bench.regimes import backends as be
from devtools.bench.regimes import report
from devtools.bench.regimes.budget import budget, kv_bytes_per_token, stored_pages, thread_pages
from devtools.bench.regimes.metrics import delta, storage_counters
from devtools.bench.regimes.rig import Phase
from devtools.bench.regimes.schedule import Cell, interleave, schedule
from devtools.bench.regimes.workload import Sent, Shape, digest, drive
from devtools.tiny_model import TinyLlama
from mooncake_sgl.config_sources import our_file

PAGE = 64


def test_each_regime_and_shape_runs_the_backends_forward_then_backward_on_two_seeds() -> None:
    assert interleave(["A", "B", "C"]) == ["A", "B", "C", "C", "B", "A"]
    cells = schedule(["pressure", "instances"], ["chat"], ["ours", "builtin", "ours-dram"], passes=2,
                     base_seed=5)
    pressure = [(c.backend, c.pass_index, c.seed) for c in cells if c.regime == "pressure"]
    assert pressure == [("ours", 0, 5), ("builtin", 0, 5), ("ours-dram", 0, 5),
                        ("ours-dram", 0, 6), ("builtin", 0, 6), ("ours", 0, 6),
                        ("ours", 1, 7), ("builtin", 1, 7), ("ours-dram", 1, 7),
                        ("ours-dram", 1, 8), ("builtin", 1, 8), ("ours", 1, 8)]
    # With several instances every backend has DRAM for the whole working set: ours-dram is ours.
    assert [c.backend for c in cells if c.regime == "instances"][:4] == ["ours", "builtin", "builtin", "ours"]


def test_a_chat_keeps_the_pages_of_its_last_turn_a_document_its_own_and_each_questions_tail() -> None:
    assert stored_pages(64, PAGE) == 0 and stored_pages(65, PAGE) == 1  # never the last token
    assert thread_pages([1000, 1600, 2200], PAGE, shared=None) == 2199 // 64
    # A 3072-token document (48 pages) and three questions each ending 4 pages further on.
    assert thread_pages([3360, 3360, 3360], PAGE, shared=3072) == 48 + 3 * 4
    chat = Shape("chat", threads=8, turns=4, first_tokens=1024, message_tokens=512, output_tokens=32)
    assert chat.sequence_lengths() == [1056, 1600, 2144, 2688]
    assert chat.working_set_pages(PAGE) == 8 * (2687 // 64)
    assert chat.longest_prompt() == 2656


def test_the_dram_budget_is_a_fraction_of_the_working_set_in_whole_pages_and_the_disk_twice_it() -> None:
    b = budget(working_set_pages=330, page_bytes=64 << 10, dram_fraction=0.25, disk=None)
    assert (b.working_set, b.dram) == (330 * (64 << 10), 82 * (64 << 10))
    assert b.disk == 42 << 20  # 2 x 20.6 MiB, rounded up to a MiB
    assert budget(3, 1024, 0.1, "1GiB").dram == 1024 and budget(3, 1024, 0.1, "1GiB").disk == 1 << 30
    assert "L3 DRAM 5.1 MiB (25%)" in b.describe()
    with pytest.raises(ValueError):
        budget(0, 1024, 0.25, None)


def test_kv_bytes_per_token_read_from_config_json_matches_the_tiny_models_own(tmp_path: Path) -> None:
    spec = TinyLlama(layers=3, hidden=512, heads=8, kv_heads=2)
    (tmp_path / "config.json").write_text(json.dumps(spec.hf_config()))
    assert kv_bytes_per_token(tmp_path / "config.json") == spec.kv_bytes_per_token() == 3 * 2 * 2 * 64 * 2


def test_a_chat_resends_its_history_with_answers_and_a_document_only_itself_and_the_question() -> None:
    chat = Shape("chat", 1, 3, first_tokens=100, message_tokens=20, output_tokens=4).threads_for(1)[0]
    doc = Shape("doc", 2, 2, first_tokens=130, message_tokens=10, output_tokens=4).threads_for(1)[1]
    assert chat.turns == 3 and doc.turns == 2
    history = chat.prompt(0, []) + [7, 7, 7, 7]
    second = chat.prompt(1, history)
    assert second[:104] == history and len(second) == 124
    assert chat.reachable(1, second, history, PAGE) == 64 and chat.reachable(0, history, [], PAGE) == 0
    q1 = doc.prompt(1, [])
    assert q1[:130] == list(doc.base) and len(q1) == 140
    assert doc.reachable(1, q1, [], PAGE) == 128  # the document's two whole pages


def _fake_send(log: list[tuple[int, int]], lock: threading.Lock):
    def send(c: int, t: int, prompt: list[int]) -> RequestResult:
        with lock:
            log.append((c, t))
        return RequestResult(rid=f"{c}-{t}", round=t, prompt_tokens=len(prompt), ttft_s=0.01,
                             output_ids=[c + 10] * 4)
    return send


def test_the_client_takes_threads_round_robin_and_resumes_them_after_a_restart() -> None:
    threads = Shape("chat", 3, 4, 100, 20, 4).threads_for(3)
    lock = threading.Lock()
    whole: list[tuple[int, int]] = []
    sent_whole: list[Sent] = []
    drive(threads, range(4), {}, _fake_send(whole, lock), 1, PAGE, sent_whole.append)
    assert whole == [(c, t) for t in range(4) for c in range(3)]  # every thread waits its turn
    split: list[tuple[int, int]] = []
    sent_split: list[Sent] = []
    histories: dict[int, list[int]] = {}
    drive(threads, range(2), histories, _fake_send(split, lock), 2, PAGE, sent_split.append)
    drive(threads, range(2, 4), histories, _fake_send(split, lock), 2, PAGE, sent_split.append)
    # Resumed from the histories, the same turns carry the same prompts.
    assert sorted((s.thread, s.turn, s.digest) for s in sent_split) == \
        sorted((s.thread, s.turn, s.digest) for s in sent_whole)


def test_an_error_ends_its_thread_and_not_the_others() -> None:
    threads = Shape("doc", 2, 3, 100, 20, 4).threads_for(1)
    got: list[Sent] = []

    def send(c: int, t: int, prompt: list[int]) -> RequestResult:
        return RequestResult(rid="", round=t, prompt_tokens=len(prompt), error="HTTP 500" if c == 0 else "",
                             output_ids=[1])
    drive(threads, range(3), {}, send, 2, PAGE, got.append)
    assert sorted((s.thread, s.turn) for s in got) == [(0, 0), (1, 0), (1, 1), (1, 2)]


METRICS = "\n".join([
    "# TYPE sglang:storage_prefetch_hit_tokens_total counter",
    'sglang:storage_prefetch_hit_tokens_total{tp_rank="0"} 300.0',
    'sglang:storage_prefetch_hit_tokens_total{tp_rank="1"} 300.0',
    "# TYPE sglang:prefill_effective_tokens_total counter",
    'sglang:prefill_effective_tokens_total{mode="storage_hit",tp_rank="0"} 256.0',
    'sglang:prefill_effective_tokens_total{mode="input",tp_rank="0"} 999.0',
    ""])


def test_storage_counters_sum_ranks_keep_only_storage_hits_and_read_absent_series_as_zero() -> None:
    c = storage_counters(METRICS)
    assert c == {"found": 600.0, "loaded": 0.0, "served": 256.0}
    assert delta({"found": 100.0, "loaded": 0.0, "served": 6.0}, c) == {"found": 500.0, "loaded": 0.0,
                                                                        "served": 250.0}
    assert delta(None, c) is None


def test_each_backends_config_is_its_own_format_and_holds_the_budget(tmp_path: Path) -> None:
    b = budget(100, 64 << 10, 0.25, "64MiB")
    tiers = tmp_path / "tiers.yaml"
    tiers.write_text(be.ours_tiers("pressure", "ours", b, tmp_path / "disk", None))
    config, _ = our_file(tiers)  # what our backend reads from SGLang's @FILE form
    assert [t.capacity for t in config.tiers] == [25 * (64 << 10), 64 << 20]
    full = yaml.safe_load(be.ours_tiers("pressure", "ours-dram", b, tmp_path, None))
    assert full["tiers"][0]["capacity"] >= b.working_set
    assert yaml.safe_load(be.ours_tiers("instances", "ours", b, tmp_path, "127.0.0.1:7480")) == \
        {"tiers": [{"kind": "pool", "endpoints": ["127.0.0.1:7480"]}]}
    lb = yaml.safe_load(be.lifeboat_yaml(b, tmp_path / "lb", shared=True))
    assert lb["storage"]["tiers"][0]["capacity_gb"] * (1 << 30) == b.disk
    assert lb["storage"]["shared_lookup"] is True and lb["dashboard"] == {"enabled": False}
    launch = be.launch("builtin", "pressure", b, tmp_path, tmp_path / "disk", be.Services("127.0.0.1:1"), 1,
                       offload=True)
    extra = json.loads(launch.args[launch.args.index("--hicache-storage-backend-extra-config") + 1])
    assert extra["global_segment_size"] == b.dram and extra["enable_ssd_offload"] is True
    assert launch.env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"] == str(b.disk)
    shared = be.launch("builtin", "instances", b, tmp_path, tmp_path, be.Services("127.0.0.1:1"), 2, True)
    extra = json.loads(shared.args[-1])
    assert "enable_ssd_offload" not in extra and extra["global_segment_size"] * 2 <= be.full_dram(b)
    assert be.launch("recompute", "pressure", b, tmp_path, tmp_path, be.Services(), 1, True) == be.Launch(())


def _record(backend: str, outputs: list[int], ttft: float, served: float, after: bool = False) -> dict:
    phases = []
    for name in (("before", "after") if after else ("run",)):
        ph = Phase(name, load=1.5, counters={"found": served * 2, "loaded": served, "served": served})
        for c in range(2):
            ph.sent.append(Sent(c, 1 if name == "after" else 0, f"d{c}{name}", 128,
                                RequestResult(rid="", round=0, prompt_tokens=512, cached_tokens=128,
                                              storage_tokens=64 if name == "after" else 0, ttft_s=ttft,
                                              output_ids=outputs)))
        phases.append(ph)
    cell = Cell("restart" if after else "pressure", "chat", backend, 0, 1)
    return report.summarise({"cell": cell, "phases": phases, "load_end": 2.0, "disk_used": 1 << 20})


def test_records_compare_outputs_by_majority_and_the_tables_and_json_hold_every_run() -> None:
    recs = [_record("ours", [1, 2], 0.2, 200), _record("builtin", [1, 2], 0.4, 100),
            _record("lifeboat", [1, 3], 0.3, 150), _record("ours", [5], 0.1, 80, after=True)]
    assert recs[0]["ttft_mean_s"] == pytest.approx(0.2)
    assert recs[0]["prefill_rate_tok_s"] == pytest.approx(1920)
    assert recs[3]["phase"] == "after" and recs[3]["survived"] == pytest.approx(0.5)
    assert recs[3]["first_ttft_mean_s"] == pytest.approx(0.1) and recs[3]["requests"] == 2
    eq = report.compare_outputs(recs)
    assert eq[:3] == [(2, 2), (2, 2), (2, 0)]  # lifeboat's differ from the majority's
    assert eq[3] == (0, 0)  # prompts no other run answered
    for r, e in zip(recs, eq):
        r["outputs_equal"] = e
    table = report.runs_table(recs)
    assert table.count("\n") == len(recs) + 1 and "2/2" in table and "0/2" in table
    text, summary = report.by_backend(recs)
    ours = next(g for g in summary if g["backend"] == "ours" and g["regime"] == "pressure")
    assert ours["served_vs_builtin"] == pytest.approx(2.0) and ours["ttft_vs_builtin"] == pytest.approx(0.5)
    assert "2.00x" in text and "0.50x" in text
    json.dumps({"runs": recs, "summary": summary}, default=str)


def test_cross_instance_tokens_are_those_only_the_other_server_computed_and_served_past_its_own() -> None:
    # One chat alternating two servers: turn t's server last saw the thread at turn t - 2.
    # (prompt, reachable, cached) per turn
    turns = [(1024, 0, 0), (1568, 1024, 1024), (2112, 1536, 1536), (2656, 2112, 1600)]
    sent = [Sent(0, t, f"d{t}", reach, RequestResult(rid="", round=t, prompt_tokens=prompt,
                                                     cached_tokens=cached, output_tokens=32, ttft_s=0.1))
            for t, (prompt, reach, cached) in enumerate(turns)]
    # Turn 1: all 1,024 served came from the other server. Turn 2: its own turn 0 left 1,024 of the
    # 1,536, the other 512 were served. Turn 3: its own turn 1 left 1,600 of 2,112; none past it.
    assert report.cross_instance(sent, 2, PAGE) == (1024 + 512 + 512, 1024 + 512 + 0)
    phase = Phase("run", load=1.0, sent=sent)
    cell = Cell("instances", "chat", "ours", 0, 1)
    alternating = report.summarise({"cell": cell, "phases": [phase], "servers": 2, "page": PAGE,
                                    "router": False})
    assert (alternating["cross_reachable"], alternating["cross_hit"]) == (2048, 1536)
    routed = report.summarise({"cell": cell, "phases": [phase], "servers": 2, "page": PAGE, "router": True})
    assert routed["cross_hit"] is None  # behind a router each turn's server is not known
    assert "1,536 of 2,048" in report.runs_table([alternating])


def test_digest_tells_prompts_apart() -> None:
    assert digest([1, 2, 3]) == digest([1, 2, 3]) != digest([1, 2, 4])


def test_failed_storage_calls_in_a_runs_server_logs_are_counted_and_no_other_runs(tmp_path: Path) -> None:
    from devtools.bench.regimes.rig import FAILED_CALL, backend_failures

    (tmp_path / "09-restart-chat-ours-server0.log").write_text(f"ok\nbatch_set_v1 {FAILED_CALL}: X\n")
    (tmp_path / "09-restart-chat-ours-restarted0.log").write_text(f"a {FAILED_CALL}\nb {FAILED_CALL}\n")
    (tmp_path / "10-restart-chat-ours-server0.log").write_text(f"{FAILED_CALL}\n")
    assert backend_failures(tmp_path, "09-restart-chat-ours") == 3
    assert backend_failures(tmp_path, "11-restart-chat-ours") == 0
