"""The store's counters as Prometheus series: what a scrape shows equals what the store counted."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mooncake_sgl.metrics.attach import observe_store
from mooncake_sgl.metrics.exporter import StoreExporter
from mooncake_sgl.metrics.scrape import parse
from mooncake_sgl.metrics.source import snapshot_of
from mooncake_sgl.store.stats import StoreReport

from .stores import PAGE, host_lmdb_store, key, read, write

RANK = {"tp_rank": 1, "pp_rank": 0, "dp_rank": 0}


@pytest.fixture
def store(tmp_path: Path):
    s = host_lmdb_store(tmp_path / "db")
    yield s
    s.close()


def scrape_registry(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_a_scrape_shows_what_the_store_counted(store) -> None:
    # 6 pages through a 4-page host tier over LMDB: host evicts 2 (demoted to LMDB), then reading
    # all 6 plus 2 unknown pages finds 4 in host, 2 in LMDB and 2 nowhere.
    registry = CollectorRegistry()
    exporter = StoreExporter(store.stats, RANK, registry=registry)
    write(store, range(6))
    read(store, range(6))
    read(store, range(100, 102))
    exporter.sync()
    tiers = parse(scrape_registry(registry)).by_tier()
    expected = snapshot_of(store.stats()).by_tier()
    assert list(tiers) == ["host", "lmdb"]
    for name in ("host", "lmdb"):
        assert tiers[name].hits == expected[name].hits
        assert tiers[name].misses == expected[name].misses
        assert tiers[name].written_bytes == expected[name].written_bytes
        assert tiers[name].resident_pages == expected[name].resident_pages
    assert tiers["host"].hits + tiers["lmdb"].hits == 6
    assert tiers["lmdb"].misses == 2  # in no tier
    assert tiers["host"].evictions >= 2
    assert tiers["host"].capacity_bytes == tiers["host"].holdable_bytes == 4 * PAGE
    assert 0 < tiers["lmdb"].holdable_bytes <= tiers["lmdb"].capacity_bytes


def test_counters_only_grow_by_what_happened_since_the_last_sync(store) -> None:
    registry = CollectorRegistry()
    exporter = StoreExporter(store.stats, RANK, registry=registry)
    write(store, range(2))
    read(store, range(2))
    exporter.sync()
    exporter.sync()  # nothing new: no double counting
    assert parse(scrape_registry(registry)).by_tier()["host"].hits == 2
    read(store, range(2))
    exporter.sync()
    assert parse(scrape_registry(registry)).by_tier()["host"].hits == 4


def test_series_carry_sglangs_rank_labels_and_the_tier(store) -> None:
    registry = CollectorRegistry()
    StoreExporter(store.stats, RANK, registry=registry).sync()
    hits = next(f for f in text_string_to_metric_families(scrape_registry(registry))
                if f.name == "mooncake_sgl_tier_hits")
    labels = {tuple(sorted(s.labels.items())) for s in hits.samples if s.name.endswith("_total")}
    ranks = {"tp_rank": "1", "pp_rank": "0", "dp_rank": "0", "attn_cp_rank": "0"}
    assert labels == {tuple(sorted({"tier": t, **ranks}.items())) for t in ("host", "lmdb")}


def test_a_tier_another_rank_reports_has_no_gauges_here(store) -> None:
    # Every rank sees the same pool: its fill reported by each would be summed N times.
    registry = CollectorRegistry()
    StoreExporter(store.stats, RANK, skip_gauges=frozenset({"lmdb"}), registry=registry).sync()
    text = scrape_registry(registry)
    ranks = 'attn_cp_rank="0",dp_rank="0",pp_rank="0"'
    assert f'mooncake_sgl_tier_capacity_bytes{{{ranks},tier="host",tp_rank="1"}}' in text
    assert 'tier="lmdb"' in text  # its counters are per rank and still exported
    assert f'mooncake_sgl_tier_capacity_bytes{{{ranks},tier="lmdb"' not in text


def test_tier_calls_are_timed_only_with_metrics_on(tmp_path: Path) -> None:
    off = host_lmdb_store(tmp_path / "off")
    watch = observe_store(off, storage_config=None, enabled=False, reports_local_usage=True)
    try:
        assert watch.exporter is None and off.latency_hook is None
    finally:
        watch.close()
        off.close()
    on = host_lmdb_store(tmp_path / "on")
    registry = CollectorRegistry()
    exporter = StoreExporter(on.stats, RANK, registry=registry)
    on.time_tier_calls(exporter.observe_tier(on))
    try:
        write(on, range(2))
        read(on, range(2))
        exporter.sync()  # timings reach the histograms on the sync thread, not SGLang's
        families = {f.name: f for f in text_string_to_metric_families(scrape_registry(registry))}
        count = {(s.labels["tier"], f): s.value for f in ("mooncake_sgl_tier_get_latency_seconds",
                                                         "mooncake_sgl_tier_put_latency_seconds")
                 for s in families[f].samples if s.name.endswith("_count")}
        assert count[("host", "mooncake_sgl_tier_get_latency_seconds")] == 1  # one batch
        assert count[("host", "mooncake_sgl_tier_put_latency_seconds")] == 2
        assert count[("lmdb", "mooncake_sgl_tier_put_latency_seconds")] >= 2
    finally:
        on.close()


def test_admission_refusals_are_counted_per_policy_and_tier(tmp_path: Path) -> None:
    # A heat policy that admits nothing cold to the slower tier: 5 fresh pages, 5 refusals there.
    from mooncake_sgl.config import HostTierConfig, LmdbTierConfig, PolicyConfig, StoreConfig
    from mooncake_sgl.store import build_store

    cfg = StoreConfig(tiers=[HostTierConfig(capacity=8 * PAGE, slot_size=PAGE, pin_memory=False),
                             LmdbTierConfig(path=str(tmp_path / "db"), capacity="64MiB")],
                      policy=PolicyConfig(name="heat", admission_min_hits=3, admission_min_reuse=1.0))
    store = build_store(cfg)
    try:
        registry = CollectorRegistry()
        exporter = StoreExporter(store.stats, RANK, registry=registry, policy=store.policy.name)
        write(store, range(5))
        exporter.sync()
        text = scrape_registry(registry)
    finally:
        store.close()
    refusals = {s.labels["tier"]: (s.labels["policy"], s.value)
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "mooncake_sgl_policy_admission_refusals_total"}
    assert refusals == {"host": ("heat", 0.0), "lmdb": ("heat", 5.0)}
    assert parse(text).by_tier()["lmdb"].admission_refusals == 5


@pytest.mark.parametrize(("ranks", "mla", "elsewhere"), [
    ({"tp_rank": 0}, False, set()),
    ({"tp_rank": 1}, False, set()),  # its own LMDB directory
    ({"tp_rank": 0}, True, set()),  # the MLA storage writer reports the shared directory
    ({"tp_rank": 1}, True, {"lmdb"}),
    ({"tp_rank": 0, "dp_rank": 1}, True, set()),  # another DP group: its own directory
])
def test_each_byte_of_usage_is_reported_by_one_rank(store, ranks, mla, elsewhere) -> None:
    from types import SimpleNamespace

    from mooncake_sgl.hicache.layout import reports_local_usage
    from mooncake_sgl.metrics.attach import usage_reported_elsewhere

    cfg = SimpleNamespace(**{"tp_rank": 0, "pp_rank": 0, "dp_rank": 0, "attn_cp_rank": 0, **ranks},
                          is_mla_model=mla)
    assert usage_reported_elsewhere(store, cfg, reports_local_usage(cfg)) == elsewhere


def test_a_reattached_backend_keeps_counting_in_the_same_process(tmp_path: Path) -> None:
    # SGLang can detach and attach the storage backend at runtime (PUT /hicache/storage-backend):
    # the new store counts from zero, the process's series must keep growing, not fail or reset.
    registry = CollectorRegistry()
    for i, pages in enumerate((3, 2)):
        s = host_lmdb_store(tmp_path / f"db{i}")
        exporter = StoreExporter(s.stats, RANK, registry=registry)
        write(s, range(pages))
        read(s, range(pages))
        exporter.close()
        s.close()
    assert parse(scrape_registry(registry)).by_tier()["host"].hits == 5


def test_a_page_failing_its_checksum_shows_in_the_corrupt_page_series(tmp_path: Path) -> None:
    # A flipped bit in the LMDB tier's page file: the read is a miss and the series counts it.
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.policy.lru import LruPolicy
    from mooncake_sgl.store import TieredStore
    from mooncake_sgl.tiers.ssd import LmdbTier

    db = tmp_path / "db"
    s = TieredStore([LmdbTier(LmdbTierConfig(path=str(db), capacity="64MiB"))], LruPolicy(1),
                    mover="inline")
    write(s, range(1))
    s.close()
    raw = bytearray((db / "pages.bin").read_bytes())
    at = next(i for i, b in enumerate(raw) if b)  # the file is preallocated: the page is what is set
    raw[at + PAGE // 2] ^= 0x01
    (db / "pages.bin").write_bytes(bytes(raw))
    s = TieredStore([LmdbTier(LmdbTierConfig(path=str(db), capacity="64MiB"))], LruPolicy(1),
                    mover="inline")
    try:
        registry = CollectorRegistry()
        exporter = StoreExporter(s.stats, RANK, registry=registry)
        assert read(s, range(1)) == [False]
        exporter.sync()
        lmdb = parse(scrape_registry(registry)).by_tier()["lmdb"]
        assert (lmdb.corrupt_pages, lmdb.hits, lmdb.misses) == (1, 0, 1)
    finally:
        s.close()


def _samples(text: str, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels[k] for k in ("tier", "expert") if k in s.labels): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


def test_the_adaptive_policy_shows_its_leader_and_shadows_per_tier(tmp_path: Path) -> None:
    # The default policy: before any evidence LRU leads every bounded tier; each expert's shadow
    # hit ratio is a series, so an operator sees which expert the workload favours.
    from mooncake_sgl.config import PolicyConfig
    from mooncake_sgl.policy import policy_for_capacities

    store = host_lmdb_store(tmp_path / "db", policy=policy_for_capacities(PolicyConfig(),
                                                                          [4 * PAGE, 64 << 20]))
    try:
        registry = CollectorRegistry()
        exporter = StoreExporter(store.stats, RANK, registry=registry)
        write(store, range(6))
        read(store, range(6))
        exporter.sync()
        text = scrape_registry(registry)
    finally:
        store.close()
    leaders = _samples(text, "mooncake_sgl_policy_leader")
    assert {e for (t, e), v in leaders.items() if t == "host" and v == 1.0} == {"lru"}
    assert {e for (t, e) in leaders if t == "host"} == {"lru", "arc", "lirs", "lfuda"}
    ratios = _samples(text, "mooncake_sgl_policy_shadow_hit_ratio")
    assert set(ratios) == set(leaders) and all(0.0 <= v <= 1.0 for v in ratios.values())
    assert _samples(text, "mooncake_sgl_policy_leader_changes_total")[("host",)] == 0.0


def test_changes_of_leader_count_once_each(tmp_path: Path) -> None:
    stats = {"tiers": {"host": {}, "lmdb": {}},
             "experts": {"host": {"leader_switches": 2, "experts": {
                 "arc": {"lead": 1, "shadow_hit_ratio": 0.5}, "lru": {"lead": 0, "shadow_hit_ratio": 0.4}}}}}
    registry = CollectorRegistry()
    exporter = StoreExporter(lambda: StoreReport.from_plain(stats), RANK, registry=registry)
    exporter.sync()
    exporter.sync()  # nothing new
    stats["experts"]["host"]["leader_switches"] = 5
    exporter.sync()
    text = scrape_registry(registry)
    assert _samples(text, "mooncake_sgl_policy_leader_changes_total") == {("host",): 5.0}
    assert _samples(text, "mooncake_sgl_policy_leader") == {("host", "arc"): 1.0, ("host", "lru"): 0.0}


def test_capacity_curves_reach_metrics_and_the_stats_table(tmp_path: Path) -> None:
    """Each bounded tier's curve: seven sizes, their bytes, the estimated lookups and hits, as a
    scrape reads them back, and ``mooncake-sgl stats``'s table of them."""
    from mooncake_sgl.config import HostTierConfig
    from mooncake_sgl.metrics.cli import curve_table
    from mooncake_sgl.metrics.model import as_json
    from mooncake_sgl.policy.curve_feed import CurveFeed
    from mooncake_sgl.policy.lru import LruPolicy
    from mooncake_sgl.store.tiered_store import TieredStore
    from mooncake_sgl.tiers.host import HostTier

    host = HostTier(HostTierConfig(capacity=8 * PAGE, slot_size=PAGE, pin_memory=False))
    store = TieredStore([host], LruPolicy(1), mover="inline")
    curves = CurveFeed(store.tiers, store.names, store.policy, "process")
    store.observe(curves)
    try:
        registry = CollectorRegistry()
        exporter = StoreExporter(store.stats, RANK, registry=registry)
        write(store, range(4))
        for _ in range(3):
            assert store.exists_prefix([key(i) for i in range(4)]) == 4
        store.exists_prefix([key(i) for i in range(100, 104)])  # 4 pages no size ever held
        assert curves.sync(30)
        exporter.sync()
        text = scrape_registry(registry)
        snap = parse(text)
    finally:
        store.close()
        curves.close()
    assert 'mooncake_sgl_tier_curve_hit_pages_total{' in text and 'size="8x"' in text
    points = snap.curve_of("host")
    assert [(m, cap) for m, cap, _, _ in points] == [(m, round(8 * m) * PAGE) for m in
                                                      (0.125, 0.25, 0.5, 1, 2, 4, 8)]
    # Every size saw the 16 pages looked up. A miniature learns a page from its first lookup's miss
    # (SGLang writes back what it just computed), so from half the tier up the 4 pages hit twice.
    assert all(looked == 16 for _, _, looked, _ in points)
    assert [hits for _, _, _, hits in points][2:] == [8] * 5
    assert as_json(snap)["curves"]["host"][3]["hit_ratio"] == 8 / 16
    table = curve_table(snap)
    assert "capacity curves" in table and "50.0%" in table and "8x" in table
    # What the curves cost is counted on both sides of the process boundary, and shown beside them.
    busy, own = snap.store_total("curve_busy_seconds"), snap.store_total("curve_process_seconds")
    assert 0 < busy < own < 60 and snap.store_total("curve_dropped_pages") == 0
    for name in ("busy_seconds", "process_seconds", "dropped_pages"):
        assert f"mooncake_sgl_curve_{name}_total{{" in text
    assert (f"cost: {busy:.1f} s in the server ({1e6 * busy / 16:.1f} us per looked-up page) and "
            f"{own:.1f} s of the curve process's ({1e6 * own / 16:.0f} us) for 16 looked-up pages") in table


def test_without_curves_their_cost_is_zero(store) -> None:
    registry = CollectorRegistry()
    exporter = StoreExporter(store.stats, RANK, registry=registry)
    write(store, range(4))
    store.exists_prefix([key(i) for i in range(4)])
    exporter.sync()
    assert parse(scrape_registry(registry)).store_total("curve_busy_seconds") == 0


def test_the_namespace_series_shows_the_current_namespace_at_1_and_the_one_before_at_0(store) -> None:
    from mooncake_sgl.doctor.evidence import Look, ServerEvidence
    from mooncake_sgl.metrics.scrape import parse, series

    registry = CollectorRegistry()
    exporter = StoreExporter(store.stats, RANK, registry=registry)
    old = dict(role="colocated", model="m", weights="aaaa", dtype="bf16", layout="page_first", page_size=64,
               key_tp="1", pp_size=1, cp_size=1, tag="", shared="pool:127.0.0.1:7480")
    exporter.namespace(old)
    exporter.namespace({**old, "weights": "bbbb"})  # a weight update
    text = scrape_registry(registry)
    ev = ServerEvidence("http://x:1", {}, None, Look(0.0, series(text), parse(text)))
    [now] = ev.namespaces()
    assert now["weights"] == "bbbb" and now["page_size"] == "64" and now["shared"] == "pool:127.0.0.1:7480"
    assert 'weights="aaaa"' in text  # kept at 0: multiprocess files cannot drop a series
