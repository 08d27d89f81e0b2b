"""From ``TieredStore.stats()`` to per-tier samples: the one place that knows the store's names.

The store reports, per tier, its own counters (what it moved through the tier), the tier's usage,
and the tier's own counters under the tier's own names; ``tier_sample`` picks the fields our
series need from those and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..policy.load_gate import LoadGateStats
from .model import CURVE_FIELDS, CurveKey, Snapshot, TierSample, size_label

# Store-level counter name -> sample field. The store counts what it moved through a tier.
_STORE_FIELDS = {
    "hits": "hits",
    "misses": "misses",
    "bytes_read": "read_bytes",
    "bytes_written": "written_bytes",
    "write_failures": "puts_refused",
    "evictions": "evictions",
    "promotions": "promotions_in",
    "demotions": "demotions_in",
    "admission_refused": "admission_refusals",
}
# Usage name -> sample field.
_USAGE_FIELDS = {"pages": "resident_pages", "used_bytes": "resident_bytes",
                 "capacity_bytes": "capacity_bytes", "holdable_bytes": "holdable_bytes"}
# The tier's own counter of checksum failures (the LMDB tier; the others cannot detect any).
_TIER_CORRUPT = "corrupt_pages"
# The tier's own seconds with its writer busy (the LMDB tier).
_TIER_WRITE_BUSY = "write_busy_s"


def _section(d: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    sub = d.get(name)
    return sub if isinstance(sub, Mapping) else {}


def tier_sample(entry: Mapping[str, Any], position: int) -> TierSample:
    """A sample from one tier's entry of ``store.stats()["tiers"]``."""
    store = _section(entry, "store")
    usage = _section(entry, "usage")
    tier = _section(entry, "tier")
    vals: dict[str, float] = {"position": float(position)}
    for name, f in _STORE_FIELDS.items():
        vals[f] = float(store.get(name, 0.0))
    for name, f in _USAGE_FIELDS.items():
        vals[f] = float(usage.get(name, 0.0))
    vals["corrupt_pages"] = float(tier.get(_TIER_CORRUPT, 0.0))
    vals["write_busy_seconds"] = float(tier.get(_TIER_WRITE_BUSY, 0.0))
    return TierSample(**vals)


def snapshot_of(stats: Mapping[str, Any], rank: str = "", taken_at: float | None = None) -> Snapshot:
    """Every tier of one store's ``stats()`` under ``rank``."""
    tiers = _section(stats, "tiers")
    samples = {(rank, name): tier_sample(entry, i) for i, (name, entry) in enumerate(tiers.items())
               if isinstance(entry, Mapping)}
    first = next(iter(samples.values()), TierSample())
    store = _section(stats, "store")
    costs = _section(_section(stats, "curves"), "costs")
    router = _section(stats, "router_events")
    counters = {"read_pages": first.hits + first.misses,
                "lookup_pages": float(store.get("lookup_pages", 0.0)),
                "lookup_hit_pages": float(store.get("lookup_hit_pages", 0.0)),
                **{f"curve_{name}": float(costs.get(name, 0.0))
                   for name in ("busy_seconds", "process_seconds", "dropped_pages")},
                **{f"router_{name}": float(router.get(field, 0.0))
                   for name, field in (("announced_pages", "stored"), ("removed_pages", "removed"),
                                       ("unannounced_pages", "unannounced"),
                                       ("skipped_other_namespace", "skipped_other_namespace"),
                                       ("skipped_not_sglang_hash", "skipped_not_sglang_hash"))},
                **gate_counters(stats.get("load_gate"))}
    return Snapshot(samples, time.time() if taken_at is None else taken_at, {rank: counters},
                    curve_points(stats, rank))


def gate_counters(gate: object) -> dict[str, float]:
    """The load gate's counters (``policy/load_gate.py``), field by field; zeros with it off."""
    if isinstance(gate, Mapping):  # read back from a counter file
        gate = LoadGateStats.from_plain(gate)
    if not isinstance(gate, LoadGateStats):
        return {"gate_lookups": 0.0, "gate_declined_lookups": 0.0, "gate_declined_pages": 0.0,
                "gate_probe_lookups": 0.0}
    return {"gate_lookups": float(gate.lookups), "gate_declined_lookups": float(gate.declined_lookups),
            "gate_declined_pages": float(gate.declined_pages),
            "gate_probe_lookups": float(gate.probe_lookups)}


def curve_points(stats: Mapping[str, Any], rank: str = "") -> dict[CurveKey, dict[str, float]]:
    """From a store's ``stats()["curves"]["points"]`` (``policy/curve_feed.py``): per (rank, tier,
    size label), the point's lookups, hits and capacity in bytes."""
    out: dict[CurveKey, dict[str, float]] = {}
    for tier, points in _section(_section(stats, "curves"), "points").items():
        for point in points if isinstance(points, list) else []:
            if isinstance(point, Mapping) and "multiplier" in point:
                out[(rank, tier, size_label(float(point["multiplier"])))] = {
                    f: float(point.get(f, 0.0)) for f in CURVE_FIELDS}
    return out


def policy_series(stats: Mapping[str, Any]
                  ) -> tuple[dict[tuple[str, str, str], float], dict[str, float]]:
    """From a store's ``stats()["experts"]`` (the policy's ``standings()``, by tier name):
    ``{(field, tier, expert): value}`` for ``POLICY_GAUGES`` fields and ``{tier: leader switches}``;
    empty for a policy without experts. No name is parsed: a renamed expert is a renamed label."""
    gauges: dict[tuple[str, str, str], float] = {}
    switches: dict[str, float] = {}
    for tier, entry in _section(stats, "experts").items():
        if not isinstance(entry, Mapping):
            continue
        switches[tier] = float(entry.get("leader_switches", 0.0))
        for expert, standing in _section(entry, "experts").items():
            if isinstance(standing, Mapping):
                gauges[("lead", tier, expert)] = float(standing.get("lead", 0.0))
                gauges[("shadow_hit_ratio", tier, expert)] = float(standing.get("shadow_hit_ratio", 0.0))
    return gauges, switches
