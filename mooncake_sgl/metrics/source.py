"""From ``TieredStore.stats()`` (a ``store.stats.StoreReport``) to per-tier samples: the one place
that maps the store's report onto our series.

The store reports, per tier, its own counters (what it moved through the tier), the tier's usage,
and the tier's own report; ``tier_sample`` picks the fields our series need from those and nothing
else. Every mapping reads a declared field, so a renamed field is an ``AttributeError`` (which
``test_source`` calls every mapping to catch), never a series that silently stays 0. A counter file
is read back through ``StoreReport.from_plain`` into the same types.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ..policy.curve import CurvePoint
from ..policy.curve_feed import CurveCosts, CurvesReport
from ..policy.load_gate import LoadGateStats
from ..store.stats import LookupStats, StoreReport, StoreTierReport, UsageReport
from .model import CurveKey, Snapshot, TierSample, size_label
from .router_report import AnnouncerReport

# Sample field -> its value in the store's report of one tier (what the store moved through it, and
# the tier's own report for what only some tiers count).
TIER_FIELDS: dict[str, Callable[[StoreTierReport], float]] = {
    "hits": lambda t: t.reads.hits,
    "misses": lambda t: t.reads.misses,
    "read_bytes": lambda t: t.reads.bytes_read,
    "written_bytes": lambda t: t.placement.bytes_written,
    "puts_refused": lambda t: t.placement.write_failures,
    "evictions": lambda t: t.placement.evictions,
    "promotions_in": lambda t: t.promotion.promotions,
    "demotions_in": lambda t: t.placement.demotions,
    "admission_refusals": lambda t: t.reads.admission_refused,
    "corrupt_pages": lambda t: t.tier.corrupt_pages(),
    "write_busy_seconds": lambda t: t.tier.write_busy_seconds(),
}
# Sample field -> its value in the tier's usage (all 0 where the tier's usage is not reported here:
# it failed, or another rank reports it).
USAGE_FIELDS: dict[str, Callable[[UsageReport], float]] = {
    "resident_pages": lambda u: u.pages,
    "resident_bytes": lambda u: u.used_bytes,
    "capacity_bytes": lambda u: u.capacity_bytes,
    "holdable_bytes": lambda u: u.holdable_bytes,
}
# Per-rank counter -> its value in the store's own lookup counts.
LOOKUP_FIELDS: dict[str, Callable[[LookupStats], float]] = {
    "lookup_pages": lambda s: s.lookup_pages,
    "lookup_hit_pages": lambda s: s.lookup_hit_pages,
}
# Per-rank counter -> its value in the curves' costs (``policy.curve_feed``) and in the router
# announcer's report (``hicache.router_events``); 0 where that observer is off.
CURVE_COST_FIELDS: dict[str, Callable[[CurveCosts], float]] = {
    "curve_busy_seconds": lambda c: c.busy_seconds,
    "curve_process_seconds": lambda c: c.process_seconds,
    "curve_dropped_pages": lambda c: c.dropped_pages,
}
ROUTER_FIELDS: dict[str, Callable[[AnnouncerReport], float]] = {
    "router_announced_pages": lambda r: r.stored,
    "router_removed_pages": lambda r: r.removed,
    "router_unannounced_pages": lambda r: r.unannounced,
    "router_skipped_other_namespace": lambda r: r.skipped_other_namespace,
    "router_skipped_not_sglang_hash": lambda r: r.skipped_not_sglang_hash,
}
# Curve series (``model.CURVE_FIELDS``) -> its value in one point of a tier's curve.
CURVE_POINT_FIELDS: dict[str, Callable[[CurvePoint], float]] = {
    "lookups": lambda p: p.lookups,
    "hits": lambda p: p.hits,
    "capacity_bytes": lambda p: p.capacity_bytes,
}


def tier_sample(entry: StoreTierReport, position: int) -> TierSample:
    """A sample from one tier's entry of ``store.stats().tiers``."""
    vals: dict[str, float] = {"position": float(position)}
    for f, value in TIER_FIELDS.items():
        vals[f] = float(value(entry))
    usage = entry.usage
    for f, of_usage in USAGE_FIELDS.items():
        vals[f] = float(of_usage(usage)) if isinstance(usage, UsageReport) else 0.0
    return TierSample(**vals)


def snapshot_of(stats: StoreReport, rank: str = "", taken_at: float | None = None) -> Snapshot:
    """Every tier of one store's ``stats()`` under ``rank``."""
    samples = {(rank, name): tier_sample(entry, i) for i, (name, entry) in enumerate(stats.tiers.items())}
    first = next(iter(samples.values()), TierSample())
    curves = curves_of(stats.sections.get("curves"))
    router = router_events_of(stats.sections.get("router_events"))
    counters = {"read_pages": first.hits + first.misses,
                **{name: float(value(stats.lookups)) for name, value in LOOKUP_FIELDS.items()},
                **{name: float(value(curves.costs)) if curves else 0.0
                   for name, value in CURVE_COST_FIELDS.items()},
                **{name: float(value(router)) if router else 0.0 for name, value in ROUTER_FIELDS.items()},
                **gate_counters(stats.sections.get("load_gate"))}
    return Snapshot(samples, time.time() if taken_at is None else taken_at, {rank: counters},
                    curve_points(stats, rank))


def curves_of(section: object) -> CurvesReport | None:
    """The curves' section (``policy/curve_feed.py``), typed; None with the curves off."""
    if isinstance(section, Mapping):  # read back from a counter file
        section = CurvesReport.from_plain(section)
    return section if isinstance(section, CurvesReport) else None


def router_events_of(section: object) -> AnnouncerReport | None:
    """The router announcer's section (``hicache/router_events.py``), typed; None with it off."""
    if isinstance(section, Mapping):  # read back from a counter file
        section = AnnouncerReport.from_plain(section)
    return section if isinstance(section, AnnouncerReport) else None


def gate_counters(gate: object) -> dict[str, float]:
    """The load gate's counters (``policy/load_gate.py``), field by field; zeros with it off."""
    if isinstance(gate, Mapping):  # read back from a counter file
        gate = LoadGateStats.from_plain(gate)
    if not isinstance(gate, LoadGateStats):
        return {"gate_lookups": 0.0, "gate_declined_lookups": 0.0, "gate_declined_pages": 0.0,
                "gate_probe_lookups": 0.0, "gate_abandoned_lookups": 0.0, "gate_abandoned_pages": 0.0}
    return {"gate_lookups": float(gate.lookups), "gate_declined_lookups": float(gate.declined_lookups),
            "gate_declined_pages": float(gate.declined_pages),
            "gate_probe_lookups": float(gate.probe_lookups),
            "gate_abandoned_lookups": float(gate.abandoned_lookups),
            "gate_abandoned_pages": float(gate.abandoned_pages)}


def curve_points(stats: StoreReport, rank: str = "") -> dict[CurveKey, dict[str, float]]:
    """From a store's ``stats()`` section ``curves`` (``policy/curve_feed.py``): per (rank, tier,
    size label), the point's ``CURVE_POINT_FIELDS``."""
    out: dict[CurveKey, dict[str, float]] = {}
    curves = curves_of(stats.sections.get("curves"))
    for tier, points in curves.points.items() if curves else ():
        for point in points:
            out[(rank, tier, size_label(point.multiplier))] = {
                f: float(value(point)) for f, value in CURVE_POINT_FIELDS.items()}
    return out


def policy_series(stats: StoreReport) -> tuple[dict[tuple[str, str, str], float], dict[str, float]]:
    """From a store's ``stats().experts`` (the policy's ``standings()``, by tier name):
    ``{(field, tier, expert): value}`` for ``POLICY_GAUGES`` fields and ``{tier: leader switches}``;
    empty for a policy without experts. No name is parsed: a renamed expert is a renamed label."""
    gauges: dict[tuple[str, str, str], float] = {}
    switches: dict[str, float] = {}
    for tier, entry in stats.experts.items():
        switches[tier] = float(entry.leader_switches)
        for expert, standing in entry.experts.items():
            gauges[("lead", tier, expert)] = float(standing.lead)
            gauges[("shadow_hit_ratio", tier, expert)] = float(standing.shadow_hit_ratio)
    return gauges, switches
