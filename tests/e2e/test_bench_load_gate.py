"""The pure parts of ``scripts/bench_load_gate.py``: what a phase's summary counts and the table says
(its slow link: ``tests/cluster/test_bench_load_gate_link.py``)."""

from __future__ import annotations

from pathlib import Path

from devtools.testing.scripts import load_script


def row(recompute: float, gate: float, nogate: float, gate_storage: int,
        recompute_runs: tuple[float, float] | None = None) -> dict:
    return {"recompute": {"ttft_s": recompute, "ttft_runs_s": list(recompute_runs or (recompute, recompute)),
                          "storage_tokens": 0, "cached_tokens": 0},
            "gate": {"ttft_s": gate, "storage_tokens": gate_storage, "cached_tokens": 0},
            "nogate": {"ttft_s": nogate, "storage_tokens": 4032, "cached_tokens": 0},
            "outputs_equal": True}


def test_a_request_over_1_1x_recompute_counts_as_slower_and_the_gain_kept_is_a_share() -> None:
    bench = load_script("bench_load_gate")
    rows = [row(1.0, 1.05, 0.2, 4032), row(1.0, 1.2, 3.0, 0)]
    s = bench.summary(rows, 4096)
    assert s["gate"]["slower_than_recompute"] == 1 and s["nogate"]["slower_than_recompute"] == 1
    # gate's slow request served nothing from storage; nogate's did: only that is a hit that cost more
    assert s["gate"]["hits_slower_than_recompute"] == 0
    assert s["nogate"]["hits_slower_than_recompute"] == 1
    assert s["gate"]["storage_tokens"] == 4032 and s["outputs_equal"]
    assert s["gain_kept"] is None  # nogate gained nothing on average: no share to keep
    fast = bench.summary([row(1.0, 0.3, 0.2, 4032)], 4096)
    assert abs(fast["gain_kept"] - 0.7 / 0.8) < 1e-9


def test_the_table_names_each_phase_and_the_gates_counters() -> None:
    bench = load_script("bench_load_gate")
    phase = {"rate_mbps": 2.0, "load": 1.5, "requests": [row(1.0, 1.0, 3.0, 0)],
             "gate_counters": {"lookups": 3.0, "declined_lookups": 2.0, "declined_pages": 64.0,
                               "probe_lookups": 1.0, "abandoned_lookups": 0.0},
             **bench.summary([row(1.0, 1.0, 3.0, 0)], 4096)}
    text = bench.table([phase])
    assert "2 MB/s" in text and "declined 2 of 3 hits (64 page objects), 0 given up, 1 probes" in text
    assert "nogate" in text and "3.00x" in text


def test_recompute_reference_noise_is_the_median_spread_between_its_two_sends() -> None:
    bench = load_script("bench_load_gate")
    rows = [row(1.0, 0.5, 0.5, 64, (0.9, 1.1)), row(1.0, 0.5, 0.5, 64, (1.0, 1.0)),
            row(1.0, 0.5, 0.5, 64, (0.8, 1.2))]
    assert abs(bench.summary(rows, 4096)["recompute_spread"] - 0.2) < 1e-9


def test_the_trace_says_when_each_servers_backend_had_answered_each_request(tmp_path: Path) -> None:
    bench = load_script("bench_load_gate")
    r = row(0.1, 0.2, 0.15, 64)
    r["request"] = 0
    r["gate"]["sent_at"] = r["nogate"]["sent_at"] = 1000.0
    gate = [{"t": 1000.01, "kind": "exists", "start": 1000.001, "seconds": 0.001, "pages": 63},
            {"t": 1000.02, "kind": "get", "start": 1000.009, "seconds": 0.010, "pages": 63},
            {"t": 1001.00, "kind": "get", "start": 1000.5, "seconds": 0.010, "pages": 63}]  # not in it
    nogate = [{"t": 1000.01, "kind": "get", "start": 1000.002, "seconds": 0.005, "pages": 63}]
    for name, calls in (("gate", gate), ("nogate", nogate)):
        (tmp_path / f"{name}.jsonl.7").write_text("".join(bench.json.dumps(c) + "\n" for c in calls))
    text = bench.backend_answers([{"rate_mbps": 2.0, "requests": [r]}], tmp_path)
    assert ("2 MB/s #1 gate  : TTFT 0.200 s, answered at 0.019 s: exists 1.0 ms (63 pages), get 10.0 ms"
            in text)
    assert "2 MB/s #1 nogate: TTFT 0.150 s, answered at 0.007 s: get 5.0 ms (63 pages)" in text
    assert abs(r["gate"]["backend_answered_s"] - 0.019) < 1e-9
    assert abs(r["nogate"]["backend_answered_s"] - 0.007) < 1e-9
