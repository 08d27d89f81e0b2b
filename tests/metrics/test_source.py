"""``metrics.source``: every exported series reads a declared field of the store's report, so a
renamed field fails here instead of exporting 0."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, TypeVar

from mooncake_sgl.api import STATS_SHAPE
from mooncake_sgl.config import HostTierConfig
from mooncake_sgl.hicache.router_events import AnnouncerStats
from mooncake_sgl.metrics.model import COUNTERS, GAUGES, POLICY_GAUGES, STORE_COUNTERS, TierSample
from mooncake_sgl.metrics.persist import read_counter_file, write_counter_file
from mooncake_sgl.metrics.source import (
    CURVE_COST_FIELDS,
    LOOKUP_FIELDS,
    ROUTER_FIELDS,
    TIER_FIELDS,
    USAGE_FIELDS,
    policy_series,
    snapshot_of,
    tier_sample,
)
from mooncake_sgl.policy.curve_feed import CurveFeed
from mooncake_sgl.policy.lru import LruPolicy
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
    costs = {field: float(next(_numbers)) for field in CURVE_COST_FIELDS.values()}
    mover = MoverReport(True, distinct(MoverStats))
    experts = {"host": TierExpertsReport(3, {"lru": ExpertReport(1, 0.25)})}
    return StoreReport(distinct(LookupStats), distinct(ResidencyStats), mover, {"decay": 0.5}, experts,
                       tiers, {"curves": {"points": {}, "costs": costs},
                               "router_events": dataclasses.asdict(distinct(AnnouncerStats))})


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
    # The curves' and router announcer's sections are their owners' dicts: their names are checked
    # against what those owners write.
    assert set(ROUTER_FIELDS.values()) <= {f.name for f in dataclasses.fields(AnnouncerStats)}
    host = HostTier(HostTierConfig(capacity=1 << 20, pin_memory=False))
    try:
        feed = CurveFeed([host], ["host"], LruPolicy(1), "inline")
        assert set(CURVE_COST_FIELDS.values()) <= feed.stats()["costs"].keys()
    finally:
        host.close()
    assert set(LOOKUP_FIELDS) <= {f.name for f in dataclasses.fields(LookupStats)}
    counters = snapshot_of(store_report({"host": tier_report()})).store[""]
    assert counters.keys() == STORE_COUNTERS.keys()
    assert all(counters[name] > 0 for name in STORE_COUNTERS if not name.startswith("gate_"))


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
    assert read_counter_file(path).tiers == snapshot_of(report, "tp0").tiers


def test_a_tier_report_read_back_keeps_the_ssd_tiers_exported_fields() -> None:
    # ``PlainTierReport`` reads the SSD tier's flattened names: a rename of those fields fails here.
    own = distinct(SsdTierReport, counts=distinct(SsdTierStats))
    plain = PlainTierReport(own.as_dict())
    assert own.corrupt_pages() > 0 and own.write_busy_seconds() > 0
    assert plain.corrupt_pages() == own.corrupt_pages()
    assert plain.write_busy_seconds() == own.write_busy_seconds()
