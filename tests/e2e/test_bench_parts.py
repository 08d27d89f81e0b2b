"""The pure parts of the live-server benchmarks: workloads, SSE parsing, aggregation, the table, the
plot, variants and the launch command. The benchmarks against live servers are in tests/live/."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from devtools.bench.client import RequestResult, SglangClient, apply_meta, parse_sse_lines
from devtools.bench.results import (
    percentile,
    plot_side_by_side,
    side_by_side_table,
    summarise_round,
    variant_result,
)
from devtools.bench.runner import variants_from_args
from devtools.bench.server import (
    CPU_FLAGS,
    Variant,
    cpu_computes_bf16,
    cpu_dtype_flags,
    has_gpu,
    launch_command,
    parse_variant,
)
from devtools.bench.workloads import (
    LongContextSpec,
    MultiTurnSpec,
    doc_lengths,
    long_context,
    multiturn,
)


def test_long_context_rounds_share_documents_and_span_8k_to_128k() -> None:
    spec = LongContextSpec(docs=4, min_doc_tokens=8192, max_doc_tokens=131072, questions=3,
                           question_tokens=32, vocab_size=1000)
    assert doc_lengths(spec) == [8192, 20643, 52016, 131072]
    rounds = long_context(spec)
    assert [len(r) for r in rounds] == [4, 4, 4]
    for d, n in enumerate(doc_lengths(spec)):
        asks = [rounds[q][d] for q in range(3)]
        assert all(a.input_ids[:n] == asks[0].input_ids[:n] for a in asks)  # shared document
        assert len({tuple(a.input_ids[n:]) for a in asks}) == 3  # distinct questions
        assert [a.reusable_tokens for a in asks] == [0, n, n]
    assert all(10 <= t < 1000 for r in rounds for a in r for t in a.input_ids)


def test_multiturn_conversations_grow_by_answer_and_user_message() -> None:
    spec = MultiTurnSpec(conversations=3, turns=4, first_turn_tokens=100, user_tokens=20, output_tokens=5)
    rounds = multiturn(spec)
    conv0 = [rounds[t][0] for t in range(4)]
    assert [len(a.input_ids) for a in conv0] == [100, 125, 150, 175]
    for prev, cur in zip(conv0, conv0[1:]):
        assert cur.input_ids[:len(prev.input_ids)] == prev.input_ids
        assert cur.reusable_tokens == len(prev.input_ids)
    assert conv0[0].reusable_tokens == 0
    assert rounds[0][0].input_ids != rounds[0][1].input_ids


def test_sse_stream_and_cached_token_details() -> None:
    lines = [b"data: " + json.dumps({"output_ids": [5], "meta_info": {"prompt_tokens": 10}}).encode() + b"\n",
             b"\n",
             b"data: " + json.dumps({"output_ids": [5, 6], "meta_info": {
                 "prompt_tokens": 10, "completion_tokens": 2, "cached_tokens": 8,
                 "cached_tokens_details": {"device": 1, "host": 3, "storage": 4,
                                           "storage_backend": "MooncakeSglStorage"},
                 "queue_time": 0.25, "forward_entry_time": 1.7e9, "storage_prefetch_wait": None}}).encode(),
             b"data: [DONE]", b"data: {\"never\": 1}"]
    chunks = list(parse_sse_lines(lines))
    assert len(chunks) == 2
    r = RequestResult(rid="a", round=1, prompt_tokens=0)
    apply_meta(r, chunks[-1]["meta_info"])
    assert (r.prompt_tokens, r.output_tokens, r.cached_tokens) == (10, 2, 8)
    assert (r.device_tokens, r.host_tokens, r.storage_tokens) == (1, 3, 4)
    assert r.storage_backend == "MooncakeSglStorage"
    assert r.steps == {"queue_time": 0.25, "forward_entry_time": 1.7e9}  # what the server sent
    plain = RequestResult(rid="b", round=0, prompt_tokens=0)
    apply_meta(plain, {"prompt_tokens": 7, "cached_tokens": 5})
    assert plain.device_tokens == 5 and plain.storage_tokens == 0


def _res(ttft: float, storage: int = 0, err: str = "") -> RequestResult:
    return RequestResult(rid="x", round=0, prompt_tokens=100, output_tokens=10, ttft_s=ttft,
                         latency_s=ttft * 2, cached_tokens=storage, storage_tokens=storage, error=err)


def test_round_summary_statistics() -> None:
    rows = [_res(t / 10) for t in range(1, 101)] + [_res(9.0, err="HTTP 500")]
    s = summarise_round(rows, wall_s=4.0)
    assert s["requests"] == 101 and s["errors"] == 1
    assert s["ttft_mean_s"] == pytest.approx(5.05)
    assert s["ttft_p50_s"] == pytest.approx(5.0, abs=0.1) and s["ttft_p99_s"] == pytest.approx(9.9, abs=0.1)
    assert s["input_tokens_per_s"] == pytest.approx(100 * 100 / 4.0)
    assert s["requests_per_s"] == pytest.approx(25.0)
    assert percentile([], 0.5) == 0.0


def test_side_by_side_table_and_plot(tmp_path: Path) -> None:
    base = variant_result("no-hicache", [([_res(2.0), _res(2.0)], 1.0), ([_res(2.0), _res(2.0)], 1.0)])
    ours = variant_result("ours:host_lmdb", [([_res(2.0), _res(2.0)], 1.0),
                                             ([_res(0.5, 900), _res(0.5, 900)], 0.5)])
    assert ours["reuse_rounds"]["storage_tokens"] == 1800
    table = side_by_side_table([base, ours])
    rows = [row.split() for row in table.splitlines()]
    line = " ".join(next(r for r in rows if r[:2] == ["ours:host_lmdb", "1"]))
    assert "0.25x" in line and "1,800" in line
    png = plot_side_by_side([base, ours], tmp_path / "p.png", "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variants_and_launch_command(tmp_path: Path) -> None:
    tiers = tmp_path / "t.yaml"
    tiers.write_text("tiers: [{kind: host, capacity: 1GiB}]\n")
    v = parse_variant(f"ours:{tiers}")
    assert v.label == "ours:t" and v.args[-1] == f"@{tiers.resolve()}"
    assert parse_variant("base=no-hicache") == Variant("base", ())
    assert parse_variant("hicache-l2").args == ("--enable-hierarchical-cache",)
    with pytest.raises(ValueError, match="does not exist"):
        parse_variant("ours:/nonexistent.yaml")
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variant("fast")
    assert parse_variant("ours").args == ("--enable-hierarchical-cache", "--hicache-storage-backend",
                                          "mooncake")  # the embedded default: no extra-config
    cmd = launch_command("/m", 31000, v.args, cpu=True, extra=("--max-total-tokens=4096",))
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert "--skip-tokenizer-init" in cmd and cmd[cmd.index("--device") + 1] == "cpu"
    assert cmd[cmd.index("--hicache-io-backend") + 1] == "direct"  # the ops the CPU adaptations supply
    assert cmd[cmd.index("--hicache-storage-backend") + 1] == "mooncake"
    assert cmd[-1] == "--max-total-tokens=4096"  # extra flags come last, so they win
    plain = launch_command("/m", 31000, parse_variant("no-hicache").args, cpu=True)
    assert "--hicache-io-backend" not in plain and all(f in plain for f in CPU_FLAGS)
    gpu = launch_command("/m", 31000, v.args, cpu=False)
    assert "--device" not in gpu and gpu[gpu.index("--hicache-mem-layout") + 1] == "page_first"

    args = argparse.Namespace(url=None, launch=True, variant=[], tiers=[str(tiers)])
    assert [x.label for x in variants_from_args(args)] == ["no-hicache", "hicache-l2", "ours:t"]
    args = argparse.Namespace(url=None, launch=True, variant=[], tiers=[])
    assert [x.label for x in variants_from_args(args)] == ["no-hicache", "hicache-l2", "ours"]


def test_a_bf16_model_on_a_cpu_without_native_bf16_computes_in_float32_over_a_bf16_kv_cache(
        tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    fast = ("--dtype", "float32", "--kv-cache-dtype", "bf16")
    assert cpu_dtype_flags(str(model), native_bf16=False) == fast
    assert cpu_dtype_flags(str(model), native_bf16=True) == ()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    assert cpu_dtype_flags(str(model), native_bf16=False) == ()  # its KV stays float32
    assert cpu_dtype_flags("org/hub-model", native_bf16=False) == ()  # nothing to read: SGLang decides
    (model / "config.json").write_text("{not json")
    assert cpu_dtype_flags(str(model), native_bf16=False) == ()

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert not cpu_computes_bf16(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_computes_bf16(info)
    assert cpu_computes_bf16(tmp_path / "absent")  # unknown: leave SGLang's dtype alone

    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    cmd = launch_command(str(model), 31000, (), cpu=True, extra=("--dtype", "bfloat16"))
    assert cmd[-2:] == ["--dtype", "bfloat16"]  # a caller's own dtype still wins


def test_no_gpu_device_node_means_no_gpu_without_asking_torch(tmp_path: Path) -> None:
    assert not has_gpu((str(tmp_path / "nvidiactl"),))


def test_client_rejects_bad_urls_and_sees_no_server() -> None:
    with pytest.raises(ValueError):
        SglangClient("https://example.com")
    assert SglangClient("127.0.0.1:9").healthy() is False  # nothing listens on the discard port


def test_tier_table_lists_each_round_and_tier_and_stays_empty_without_series() -> None:
    from devtools.bench.results import tier_table

    tiers = [{"tier": "host", "hits": 31.0, "hit_share": 0.5, "read_bytes": 31 * 65536.0,
              "written_bytes": 0.0, "evictions": 2.0},
             {"tier": "lmdb", "hits": 31.0, "hit_share": 0.5, "read_bytes": 2 * 2**30,
              "written_bytes": 4096.0, "evictions": 0.0}]
    table = tier_table([{"label": "ours", "rounds": [{"round": 1, "tiers": tiers}]}])
    lines = table.splitlines()
    assert len(lines) == 4 and "1.9 MiB" in lines[2] and "2.0 GiB" in lines[3] and "4.0 KiB" in lines[3]
    assert tier_table([{"label": "no-hicache", "rounds": [{"round": 0, "tiers": []}]}]) == ""


def _req(rid: str, rnd: int, ttft: float, storage: int = 0) -> RequestResult:
    return RequestResult(rid=rid, round=rnd, prompt_tokens=1000, output_tokens=4, ttft_s=ttft,
                         latency_s=ttft + 0.1, cached_tokens=storage, storage_tokens=storage)


def test_per_request_table_flags_every_hit_slower_than_recompute() -> None:
    from devtools.bench.results import per_request_table, per_request_vs_base

    base = variant_result("no-hicache", [([_req("a", 0, 2.0), _req("b", 0, 4.0)], 1.0),
                                         ([_req("a", 1, 2.0), _req("b", 1, 4.0)], 1.0)])
    ours = variant_result("ours", [([_req("a", 0, 2.1), _req("b", 0, 4.1)], 1.0),
                                   ([_req("a", 1, 0.5, 960), _req("b", 1, 4.4, 960)], 1.0)])
    ours["rounds"][1]["tiers"] = [{"read_bytes": 2 * 960 * 1000.0}]  # 1,000 bytes per token
    ours["requests"][2]["steps"] = {"storage_prefetch_wait": 0.002}
    rows = per_request_vs_base([base, ours])
    assert [(r["rid"], r["round"], r["slower"]) for r in rows] == [("a", 1, False), ("b", 1, True)]
    assert rows[1]["ratio"] == pytest.approx(1.1)
    assert rows[0]["prefetch_gbps"] == pytest.approx(0.48) and rows[1]["prefetch_gbps"] is None
    table = per_request_table(rows)
    slow = [line for line in table.splitlines() if "SLOWER" in line]
    assert len(slow) == 1 and " b " in slow[0] and "4,400" in slow[0] and "4,000" in slow[0]
    assert "ours: 1 of 2 reuse requests slower than recompute (no-hicache)" in table
    assert per_request_vs_base([ours]) == [] and per_request_table([]) == ""


def test_io_rates_of_a_round_from_two_readings() -> None:
    from devtools.bench.results import io_rates, io_table
    from devtools.bench.runner import sglang_io

    text = ('sglang:prefetch_bandwidth_sum{tp_rank="0"} 3.0\nsglang:prefetch_bandwidth_count{tp_rank="0"} 2\n'
            'sglang:load_back_bytes_total{tp_rank="0"} 4e9\n'
            'sglang:load_back_duration_seconds_sum{tp_rank="0"} 2.0\n')
    before = sglang_io("")
    assert before == dict.fromkeys(before, 0.0)
    io = io_rates(before, sglang_io(text))
    assert io["prefetch_calls"] == 2 and io["prefetch_gbps"] == pytest.approx(1.5)
    assert io["load_back_gbps"] == pytest.approx(2.0)
    assert io_rates(None, before) == {}
    table = io_table([{"label": "ours", "rounds": [{"round": 1, "io": io}, {"round": 0, "io": {}}]}])
    assert len(table.splitlines()) == 3 and "1.50" in table and "2.00" in table


def test_each_variant_reports_its_own_cold_round_prefill_rate() -> None:
    # Variants run one after another: a machine that got busier between them shows here.
    from devtools.bench.results import cold_prefill_rate, recompute_summary

    base = variant_result("no-hicache", [([_req("a", 0, 2.0), _req("b", 0, 4.0)], 1.0),
                                         ([_req("a", 1, 2.0), _req("b", 1, 4.0)], 1.0)])
    ours = variant_result("ours", [([_req("a", 0, 4.0), _req("b", 0, 8.0)], 1.0),
                                   ([_req("a", 1, 0.5, 960), _req("b", 1, 0.5, 960)], 1.0)])
    assert cold_prefill_rate(base) == pytest.approx(375.0)  # median of 1000/2 and 1000/4
    assert cold_prefill_rate(ours) == pytest.approx(187.5)
    lines = recompute_summary([base, ours])
    assert "375 tokens/s" in lines[0]
    assert "(0.17x)" in lines[1] and "its own cold-round prefill rate 188 tokens/s" in lines[1]


def test_throttled_mode_parses_rates_and_prints_ours_against_each_reference_per_rate() -> None:
    from devtools.bench.ssd.throttled import parse_rates, throttled_table

    assert parse_rates("0, 300") == [0, 300]
    for bad in ("", "-5", "fast"):
        with pytest.raises(ValueError):
            parse_rates(bad)

    def backend(put: list[float], get: list[float]) -> dict:
        return {"put": put[0], "put_synced": put[0], "get": get[0], "put_rounds": put,
                "put_synced_rounds": put, "get_rounds": get}

    run = {"rounds": 2, "results": {"1MiB x512": {
        "ours": backend([2.0, 3.0], [0.3, 0.3]), "HiCacheFile": backend([1.0, 1.0], [0.3, 0.2]),
        "raw O_DIRECT": backend([0.5, 0.5], [0.3, 0.3])}}}
    text = throttled_table({"loop": "/dev/loop0", "read_ahead_kb": 8192, "runs": {"300": run, "0": run}})
    assert "300 MB/s   1MiB x512    ours" in text and "none       1MiB x512" in text
    assert "2.50x [2.00-3.00]" in text  # put vs HiCacheFile: the rounds' ratios, median and range
    assert "1.25x [1.00-1.50]" in text  # cold get vs HiCacheFile


def test_disk_speed_children_put_one_batch_and_read_it_back_from_any_memory(tmp_path: Path, capsys) -> None:
    from devtools.bench.ssd import disk_speed

    for memory in ("aligned", "unaligned"):
        d = tmp_path / memory
        d.mkdir()
        disk_speed.child(["put", str(d), str(256 << 10), "8", memory])
        put = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert 0 < put["put_s"] <= put["put_synced_s"] and put["put_cpu_s"] >= 0
        disk_speed.child(["get", str(d), str(256 << 10), "8", memory])  # checks the bytes itself
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["get_s"] > 0


def test_disk_speed_table_gives_each_ratio_over_the_rounds_against_dd() -> None:
    from devtools.bench.ssd.disk_speed import disk_speed_table, summary

    def run(put: float, get: float) -> dict:
        return {"load": 1.5, "dd_write": 2.0, "dd_read": 2.0, "put": put, "put_synced": put / 2,
                "get_cold": get, "put_vs_dd": put / 2.0, "put_synced_vs_dd": put / 4.0,
                "get_cold_vs_dd": get / 2.0, "put_cpu_s": 0.1, "get_cpu_s": 0.2}

    res = {"cache_dropped_by": "drop_caches", "rounds": 3, "dd_bs": "8MiB", "memory": "aligned",
           "cpus": 2, "results": {"8MiB x96": summary([run(1.6, 1.8), run(2.0, 1.9), run(1.8, 2.2)])}}
    text = disk_speed_table(res)
    assert "dd bs=8MiB oflag=direct" in text and "load 1.5-1.5 on 2 CPUs" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("8MiB x96"))
    assert "0.90x [0.80-1.00]" in row  # put over dd: median [lowest-highest] of the rounds
    assert "0.95x [0.90-1.10]" in row  # cold get over dd
    assert row.endswith("0.10/0.20")


def test_disk_speed_options_are_checked_by_name(tmp_path: Path) -> None:
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_tiers.py"
    for flag, bad in (("--disk-speed-pages", "8MiB:0"), ("--disk-speed-pages", "big"),
                      ("--disk-speed-dd-bs", "huge"), ("--disk-speed-loop-readahead", "-1")):
        run = subprocess.run([sys.executable, str(script), "--modes", "disk-speed", flag, bad,
                              "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and flag in run.stderr, (flag, bad, run.stderr[-500:])
