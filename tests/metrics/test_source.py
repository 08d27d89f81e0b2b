"""``metrics.source``: every exported series reads a declared field of the store's report, so a
renamed field fails here instead of exporting 0."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any, TypeVar

from mooncake_sgl.api import STATS_SHAPE
from mooncake_sgl.config import HostTierConfig
from mooncake_sgl.hicache.router_events import AnnouncerStats
from mooncake_sgl.metrics.model import (
    COUNTERS,
    CURVE_FIELDS,
    GAUGES,
    POLICY_GAUGES,
    STORE_COUNTERS,
    TierSample,
)
from mooncake_sgl.metrics.persist import _plain, read_counter_file, write_counter_file
from mooncake_sgl.metrics.router_report import AnnouncerReport
from mooncake_sgl.metrics.source import (
    CURVE_COST_FIELDS,
    CURVE_POINT_FIELDS,
    LOOKUP_FIELDS,
    ROUTER_FIELDS,
    TIER_FIELDS,
    USAGE_FIELDS,
    curve_points,
    policy_series,
    snapshot_of,
    tier_sample,
)
from mooncake_sgl.policy.curve import CurvePoint
from mooncake_sgl.policy.curve_feed import CurveCosts, CurveFeed, CurvesReport
from mooncake_sgl.policy.lru import LruPolicy, LruReport, LruTierReport
from mooncake_sgl.store.stats import (
    ExpertReport,
    LookupStats,
    MoverReport,
    MoverStats,
    PlainTierReport,
    ResidencyStats,
    StoreReport,
    StoreTierReport,
    TierExpertsReport,
    TierPlacementStats,
    TierPromotionStats,
    TierReadStats,
    UsageReport,
)
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.ssd.tier import SsdTierReport, SsdTierStats

T = TypeVar("T")
_numbers = itertools.count(1)


def distinct(shape: type[T], **given: Any) -> T:
    """``shape`` with every numeric field a different positive number (a field read in the wrong
    place, or not at all, shows)."""
    return shape(**{f.name: given[f.name] if f.name in given else next(_numbers)
                    for f in dataclasses.fields(shape)})  # type: ignore[arg-type]


def tier_report() -> StoreTierReport:
    own = distinct(SsdTierReport, counts=distinct(SsdTierStats))
    return StoreTierReport(distinct(UsageReport), distinct(TierReadStats), distinct(TierPlacementStats),
                           distinct(TierPromotionStats), own)


def store_report(tiers: dict[str, StoreTierReport]) -> StoreReport:
    mover = MoverReport(True, distinct(MoverStats))
    experts = {"host": TierExpertsReport(3, {"lru": ExpertReport(1, 0.25)})}
    points = [distinct(CurvePoint, multiplier=1.0), distinct(CurvePoint, multiplier=2.0)]
    curves = CurvesReport({"host": points}, distinct(CurveCosts))
    policy = LruReport((distinct(LruTierReport), distinct(LruTierReport)))
    return StoreReport(distinct(LookupStats), distinct(ResidencyStats), mover, policy, experts, tiers,
                       {"curves": curves, "router_events": distinct(AnnouncerReport)})


def test_every_series_of_a_tier_reads_a_field_of_the_report() -> None:
    assert TIER_FIELDS.keys() | USAGE_FIELDS.keys() | {"position"} == COUNTERS.keys() | GAUGES.keys()
    assert COUNTERS.keys() | GAUGES.keys() == {f.name for f in dataclasses.fields(TierSample)}
    entry = tier_report()
    sample = tier_sample(entry, 2)
    assert all(getattr(sample, f) > 0 for f in TIER_FIELDS.keys() | USAGE_FIELDS.keys())
    assert sample.position == 2.0
    assert (sample.hits, sample.read_bytes, sample.written_bytes, sample.promotions_in) == (
        entry.reads.hits, entry.reads.bytes_read, entry.placement.bytes_written, entry.promotion.promotions)
    assert isinstance(entry.tier, SsdTierReport)
    assert sample.corrupt_pages == entry.tier.counts.corrupt_pages
    assert sample.write_busy_seconds == entry.tier.write_busy_s


def test_every_series_of_a_rank_reads_a_field_of_the_report() -> None:
    assert set(LOOKUP_FIELDS) <= {f.name for f in dataclasses.fields(LookupStats)}
    report = store_report({"host": tier_report()})
    counters = snapshot_of(report).store[""]
    assert counters.keys() == STORE_COUNTERS.keys()
    assert all(counters[name] > 0 for name in STORE_COUNTERS if not name.startswith("gate_"))
    # Every value comes from its own field (``distinct`` numbers them all differently).
    curves, router = report.sections["curves"], report.sections["router_events"]
    assert isinstance(curves, CurvesReport) and isinstance(router, AnnouncerReport)
    assert all(counters[name] == value(curves.costs) for name, value in CURVE_COST_FIELDS.items())
    assert all(counters[name] == value(router) for name, value in ROUTER_FIELDS.items())
    assert (counters["curve_busy_seconds"], counters["router_announced_pages"]) == (
        curves.costs.busy_seconds, router.stored)
    assert len(set(counters.values()) - {0.0}) == len(counters) - 6  # all but the gate's, distinct


def test_the_router_report_carries_every_count_of_the_announcer() -> None:
    # The report's counts are the announcer's ``AnnouncerStats``, under the same names (the JSON's).
    counts = [f.name for f in dataclasses.fields(AnnouncerStats)]
    assert [f.name for f in dataclasses.fields(AnnouncerReport)][:len(counts)] == counts


def test_the_curve_series_read_the_fields_of_a_curve_point() -> None:
    assert tuple(CURVE_POINT_FIELDS) == CURVE_FIELDS
    report = store_report({})
    curves = report.sections["curves"]
    assert isinstance(curves, CurvesReport)
    one, two = curves.points["host"]
    assert curve_points(report, "tp0") == {
        ("tp0", "host", "1x"): dict(lookups=one.lookups, hits=one.hits, capacity_bytes=one.capacity_bytes),
        ("tp0", "host", "2x"): dict(lookups=two.lookups, hits=two.hits, capacity_bytes=two.capacity_bytes),
    }


def test_a_curve_feed_reports_a_curves_report() -> None:
    host = HostTier(HostTierConfig(capacity=1 << 20, pin_memory=False))
    try:
        feed = CurveFeed([host], ["host"], LruPolicy(1), "inline")
        report = feed.stats()
    finally:
        host.close()
    assert isinstance(report, CurvesReport) and report.points == {}
    assert report.costs.process_seconds == report.costs.dropped_pages == 0.0


def test_policy_series_read_the_experts_fields() -> None:
    assert POLICY_GAUGES.keys() <= {f.name for f in dataclasses.fields(ExpertReport)}
    gauges, switches = policy_series(store_report({}))
    assert gauges == {("lead", "host", "lru"): 1.0, ("shadow_hit_ratio", "host", "lru"): 0.25}
    assert switches == {"host": 3.0}


def test_a_report_read_back_from_its_json_gives_the_same_series(tmp_path: Path) -> None:
    report = store_report({"host": tier_report(), "lmdb": tier_report()})
    assert tuple(report.as_dict())[:len(STATS_SHAPE)] == STATS_SHAPE
    assert StoreReport.from_plain(report.as_dict()).as_dict() == report.as_dict()
    path = write_counter_file(str(tmp_path), report, "tp0")
    back, live = read_counter_file(path), snapshot_of(report, "tp0")
    assert (back.tiers, back.store, back.curves) == (live.tiers, live.store, live.curves)
    # The typed sections' JSON is their fields in order, and reads back to the same report.
    plain = json.loads(json.dumps(report.as_dict(), default=_plain))
    assert CurvesReport.from_plain(plain["curves"]) == report.sections["curves"]
    assert AnnouncerReport.from_plain(plain["router_events"]) == report.sections["router_events"]
    assert list(plain["router_events"]) == [f.name for f in dataclasses.fields(AnnouncerReport)]


def test_a_tier_report_read_back_keeps_the_ssd_tiers_exported_fields() -> None:
    # ``PlainTierReport`` reads the SSD tier's flattened names: a rename of those fields fails here.
    own = distinct(SsdTierReport, counts=distinct(SsdTierStats))
    plain = PlainTierReport(own.as_dict())
    assert own.corrupt_pages() > 0 and own.write_busy_seconds() > 0
    assert plain.corrupt_pages() == own.corrupt_pages()
    assert plain.write_busy_seconds() == own.write_busy_seconds()
