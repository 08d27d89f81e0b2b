"""Each doctor rule on evidence built by hand: it speaks when its evidence is there, with the
evidence and the fix, and says nothing when it is not."""

from __future__ import annotations

from mooncake_sgl.doctor.evidence import Look, ServerEvidence
from mooncake_sgl.doctor.findings import diagnose
from mooncake_sgl.metrics.model import NAMESPACE_INFO, Snapshot, TierSample

RANK = "tp0_pp0_dp0_cp0"


def look(at: float = 0.0, series: dict | None = None, tiers: dict | None = None,
         store: dict | None = None, curves: dict | None = None) -> Look:
    return Look(at, series or {}, Snapshot({(RANK, n): s for n, s in (tiers or {}).items()}, at,
                                            {RANK: store or {"lookup_pages": 10.0}}, curves or {}))


def server(last: Look, first: Look | None = None, **args: object) -> ServerEvidence:
    base = {"page_size": 64, "enable_metrics": True, "hicache_storage_backend": "mooncake"}
    return ServerEvidence("http://127.0.0.1:1", {**base, **args}, first or last, last)


SGLANG_ON = {"sglang:realtime_tokens_total": [({"mode": "prefill_compute"}, 100.0)]}


def codes(ev: ServerEvidence | list[ServerEvidence]) -> set[str]:
    return {f.code for f in diagnose(ev if isinstance(ev, list) else [ev])}


def test_a_healthy_server_has_no_findings() -> None:
    assert codes(server(look(series=SGLANG_ON, tiers={"host": TierSample(hits=5)}))) == set()


def test_an_unreadable_server_is_a_finding_not_an_exception() -> None:
    f = diagnose([ServerEvidence("http://127.0.0.1:9", error="cannot read ...: refused")])
    assert [x.code for x in f] == ["unreadable"] and "refused" in f[0].evidence[0]


def test_metrics_off_names_the_flag() -> None:
    f = [x for x in diagnose([server(Look(0.0, {}, Snapshot()))]) if x.code == "metrics_off"]
    assert f and "--enable-metrics" in f[0].fix


def _prefill(input_tokens: float, device_hit: float = 0.0) -> dict:
    return {"sglang:prefill_effective_tokens_total": [
        ({"mode": "input"}, input_tokens), ({"mode": "device_hit"}, device_hit),
        ({"mode": "host_hit"}, 0.0), ({"mode": "storage_hit"}, 0.0)]}


def test_uncached_tokens_never_looked_up_name_the_prefetch_threshold_with_its_configured_value() -> None:
    # 6,400 tokens past SGLang's caches, 10 pages (640 tokens) looked up: most never asked.
    ev = server(look(series=_prefill(8000, 1600)),
                hicache_storage_backend_extra_config='{"prefetch_threshold": 200}')
    [f] = [x for x in diagnose([ev]) if x.code == "below_threshold"]
    assert "only 640 of the 6400" in f.says and "prefetch_threshold (200 tokens)" in f.says
    assert "prefetch_threshold=200" in f.evidence[0] and "prefetch_threshold: 64" in f.fix
    # Looked up as it should be: nothing to say.
    asked = look(series=_prefill(8000, 1600), store={"lookup_pages": 90.0})
    assert "below_threshold" not in codes(server(asked))
    # A threshold of one page cannot be the cause: SGLang's rate limit on a full host pool is.
    one_page = server(look(series=_prefill(8000)),
                      hicache_storage_backend_extra_config='{"prefetch_threshold": 64}')
    [f] = [x for x in diagnose([one_page]) if x.code == "below_threshold"]
    assert "host pool" in f.says and "--hicache-ratio" in f.fix


def test_prefetches_ended_by_deadline_host_memory_and_failed_reads_are_each_named() -> None:
    series = {**SGLANG_ON, "sglang:storage_prefetch_unfulfilled_tokens_total": [
        ({"reason": "deadline"}, 640.0), ({"reason": "host_capacity"}, 64.0),
        ({"reason": "storage_transfer"}, 128.0), ({"reason": "device_covered"}, 9.0)]}
    found = {f.code: f for f in diagnose([server(look(series=series),
                                                 hicache_storage_prefetch_policy="timeout")])}
    assert {"prefetch_timeout", "prefetch_host_memory", "prefetch_read_failed"} <= set(found)
    assert "640 tokens" in found["prefetch_timeout"].says and "timeout" in found["prefetch_timeout"].says
    assert "wait_complete" in found["prefetch_timeout"].fix


def test_selective_write_policy_and_dropped_backups_are_named() -> None:
    series = {**SGLANG_ON, "sglang:hicache_backup_dropped_tokens_total": [({}, 256.0)]}
    found = codes(server(look(series=series), hicache_write_policy="write_through_selective"))
    assert {"write_policy", "backups_dropped"} <= found
    assert "write_policy" not in codes(server(look(series=SGLANG_ON), hicache_write_policy="write_through"))


def test_tier_refusals_corruption_fullness_and_a_saturated_writer() -> None:
    full = TierSample(puts_refused=3, corrupt_pages=1, resident_bytes=99, capacity_bytes=100,
                      holdable_bytes=100, evictions=7, write_busy_seconds=10.0)
    first = look(0.0, SGLANG_ON, {"lmdb": TierSample(write_busy_seconds=8.1)})
    last = look(2.0, SGLANG_ON, {"lmdb": full})
    assert {"tier_refused", "tier_corrupt", "tier_full", "writer_saturated"} <= codes(server(last, first))
    idle = look(2.0, SGLANG_ON, {"lmdb": TierSample(write_busy_seconds=8.2, resident_bytes=10,
                                                    capacity_bytes=100)})
    assert codes(server(idle, first)) == set()


def _curve(tier: str, points: dict[str, tuple[float, float, float]]) -> dict:
    return {(RANK, tier, size): {"capacity_bytes": c, "lookups": lk, "hits": h}
            for size, (c, lk, h) in points.items()}


def test_a_curve_that_gains_at_twice_the_size_says_too_small_and_a_flat_one_too_large() -> None:
    small = _curve("host", {"0.5x": (1 << 29, 5000, 1000), "1x": (1 << 30, 5000, 2000),
                            "2x": (1 << 31, 5000, 3000)})
    [f] = [x for x in diagnose([server(look(series=SGLANG_ON, curves=small))]) if x.code == "tier_too_small"]
    assert "2x" in f.says and "60%" in f.says and "40%" in f.says
    flat = _curve("host", {"0.5x": (1 << 29, 5000, 2000), "1x": (1 << 30, 5000, 2010),
                           "2x": (1 << 31, 5000, 2020)})
    assert "tier_too_large" in codes(server(look(series=SGLANG_ON, curves=flat)))
    few = _curve("host", {"1x": (1 << 30, 50, 10), "2x": (1 << 31, 50, 40)})
    assert codes(server(look(series=SGLANG_ON, curves=few))) == set()  # too little traffic to say


def test_curves_that_left_pages_out_say_so_with_the_count_and_a_healthy_process_says_nothing() -> None:
    curve = _curve("host", {"1x": (1 << 30, 50, 10)})
    counts = {"lookup_pages": 5000.0, "curve_dropped_pages": 1200.0, "curve_process_seconds": 9.0}
    behind = look(series=SGLANG_ON, curves=curve, store=counts)
    [f] = [x for x in diagnose([server(behind)]) if x.code == "curves_partial"]
    assert "1200 of 5000" in f.says and "curve_dropped_pages_total=1200" in f.evidence[0] and "core" in f.fix
    kept_up = look(series=SGLANG_ON, curves=curve, store={"lookup_pages": 5000.0, "curve_dropped_pages": 0.0})
    assert "curves_partial" not in codes(server(kept_up))


def _ns(page_size: int, shared: str, role: str = "colocated") -> dict:
    fields = dict(role=role, model="m", weights="w", dtype="bf16", layout="page_first",
                  page_size=str(page_size),
                  key_tp="1", pp_size="1", cp_size="1", tag="", shared=shared, tp_rank="0")
    return {**SGLANG_ON, NAMESPACE_INFO: [(fields, 1.0)]}


def test_two_instances_on_one_pool_that_cannot_meet_are_named_with_the_field_that_differs() -> None:
    a = ServerEvidence("http://a:1", {"page_size": 64}, None, look(series=_ns(64, "pool:p:1")))
    b = ServerEvidence("http://b:1", {"page_size": 32}, None, look(series=_ns(32, "pool:p:1")))
    [f] = [x for x in diagnose([a, b]) if x.code == "namespace_mismatch"]
    assert "page size 64 on a:1, 32 on b:1" in f.says and "pool:p:1" in f.says
    apart = ServerEvidence("http://b:1", {}, None, look(series=_ns(32, "pool:q:1")))
    assert "namespace_mismatch" not in codes([a, apart])  # different pools: nothing to share
    same = ServerEvidence("http://b:1", {}, None, look(series=_ns(64, "pool:p:1", role="decode")))
    assert "namespace_mismatch" not in codes([a, same])  # roles differ, pages meet


def test_an_extra_config_file_this_host_cannot_read_is_named_not_taken_for_the_default() -> None:
    ev = server(look(series=_prefill(8000, 1600)),
                hicache_storage_backend_extra_config="@/nonexistent/tiers.yaml")
    [f] = [x for x in diagnose([ev]) if x.code == "below_threshold"]
    assert "assumed SGLang's default" in f.evidence[0] and "nonexistent" in f.evidence[0]
    bad = server(look(series=_prefill(8000, 1600)),
                 hicache_storage_backend_extra_config='{"prefetch_threshold": "lots"}')
    assert [x.code for x in diagnose([bad]) if x.code == "below_threshold"]  # no exception


def test_router_events_with_no_kv_event_stream_or_mostly_unannounced_say_so() -> None:
    unpublished = look(series=SGLANG_ON, store={"lookup_pages": 10.0, "router_unannounced_pages": 40.0})
    [f] = [x for x in diagnose([server(unpublished)]) if x.code == "router_events_unpublished"]
    assert "40 pages" in f.says and "--kv-events-config" in f.fix
    config = '{"publisher": "zmq"}'
    mostly = look(series=SGLANG_ON, store={"lookup_pages": 10.0, "router_unannounced_pages": 40.0,
                                           "router_announced_pages": 10.0})
    assert "router_events_mostly_unannounced" in codes(server(mostly, kv_events_config=config))
    fine = look(series=SGLANG_ON, store={"lookup_pages": 10.0, "router_unannounced_pages": 4.0,
                                         "router_announced_pages": 96.0})
    assert not {c for c in codes(server(fine, kv_events_config=config)) if c.startswith("router")}
    assert not {c for c in codes(server(look(series=SGLANG_ON))) if c.startswith("router")}  # off


def test_hits_cut_short_by_the_load_gate_name_the_slow_tier_past_a_quarter() -> None:
    many = look(series=SGLANG_ON, store={"lookup_pages": 10.0, "gate_lookups": 100.0,
                                         "gate_declined_lookups": 40.0, "gate_declined_pages": 320.0})
    [f] = [x for x in diagnose([server(many)]) if x.code == "hits_slower_than_recompute"]
    assert "40 of 100" in f.says and "320 page objects" in f.says and "get latency" in f.fix
    few = look(series=SGLANG_ON, store={"lookup_pages": 10.0, "gate_lookups": 100.0,
                                        "gate_declined_lookups": 10.0})
    assert "hits_slower_than_recompute" not in codes(server(few))
    assert "hits_slower_than_recompute" not in codes(server(look(series=SGLANG_ON)))  # gate off
    given_up = look(series=SGLANG_ON, store={"lookup_pages": 10.0, "gate_lookups": 100.0,
                                             "gate_declined_lookups": 10.0, "gate_abandoned_lookups": 20.0,
                                             "gate_abandoned_pages": 200.0})
    [f] = [x for x in diagnose([server(given_up)]) if x.code == "hits_slower_than_recompute"]
    assert "30 of 100" in f.says and "mooncake_sgl_gate_abandoned_lookups_total=20" in f.evidence
