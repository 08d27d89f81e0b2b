"""What our series mean: their names, one per-tier sample type, and the arithmetic on samples.

Every reader of our counters goes through this module: the Prometheus exporter (names), the
``/metrics`` scraper, the counter file on the LMDB tier and ``mooncake-sgl stats`` (samples,
``diff``, hit shares). Keeping the names here means a renamed series breaks the tests that load the
dashboard, not a production graph.

Meaning of a tier's counters (pages, unless the name says bytes):

- ``hits``: pages SGLang read from this tier; ``misses``: pages asked of this tier and not found
  there (they go on to the next tier). Every page read asks tier 0 first, so
  ``hits[0] + misses[0]`` is every page requested, and a tier's *hit share* is its hits over that.
- ``read_bytes`` / ``written_bytes``: bytes moved out of / into the tier, promotions and demotions
  included.
- ``puts_refused``: pages the tier did not take (no room after eviction, tier down).
- ``evictions``: pages the store evicted from the tier; ``promotions_in`` / ``demotions_in``: pages
  copied into the tier from a slower / faster one.
- ``corrupt_pages``: pages that failed their checksum on read (a miss; the page is dropped).
- ``admission_refusals``: pages the policy did not admit to this (slower) tier on a write.
- ``write_busy_seconds``: seconds the tier's writer was busy (the LMDB tier: its write lock held
  for puts and removals; 0 elsewhere). Its rate near 1 means the writer is never idle: pages are
  offered faster than the tier stores them, and SGLang's backup queue grows until it drops backups.
- ``resident_pages``, ``resident_bytes``, ``capacity_bytes``: gauges; ``holdable_bytes``: what the
  tier can hold now, its capacity or less where the medium has less room (a disk other data filled).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..config import TIER_SPEED

PREFIX = "mooncake_sgl_"
# SGLang's own storage collector labels by these (and more), so our series join its series.
RANK_LABELS = ("tp_rank", "pp_rank", "dp_rank", "attn_cp_rank")
_RANK_SHORT = {"tp_rank": "tp", "pp_rank": "pp", "dp_rank": "dp", "attn_cp_rank": "cp"}

# Counter fields of a tier sample -> exported name (prometheus_client appends ``_total``).
COUNTERS: dict[str, str] = {
    "hits": "mooncake_sgl_tier_hits",
    "misses": "mooncake_sgl_tier_misses",
    "read_bytes": "mooncake_sgl_tier_read_bytes",
    "written_bytes": "mooncake_sgl_tier_written_bytes",
    "puts_refused": "mooncake_sgl_tier_puts_refused",
    "evictions": "mooncake_sgl_tier_evictions",
    "promotions_in": "mooncake_sgl_tier_promotions_in",
    "demotions_in": "mooncake_sgl_tier_demotions_in",
    "corrupt_pages": "mooncake_sgl_tier_corrupt_pages",
    "admission_refusals": "mooncake_sgl_policy_admission_refusals",
    "write_busy_seconds": "mooncake_sgl_tier_write_busy_seconds",
}
# Per rank, not per tier: pages SGLang asked to read (``hits[0] + misses[0]``: the denominator of
# hit shares in PromQL), pages/hits of its prefix lookups (``batch_exists``), and the CPU seconds the
# capacity curves cost (0 with curves off).
STORE_COUNTERS: dict[str, str] = {
    "read_pages": "mooncake_sgl_read_pages",
    "lookup_pages": "mooncake_sgl_lookup_pages",
    "lookup_hit_pages": "mooncake_sgl_lookup_hit_pages",
    "curve_busy_seconds": "mooncake_sgl_curve_busy_seconds",
    "curve_process_seconds": "mooncake_sgl_curve_process_seconds",
    "curve_dropped_pages": "mooncake_sgl_curve_dropped_pages",
    # Router events (``router_events: local``; 0 with them off): pages announced to and removed
    # from SGLang's KV event stream, pages that reached our local tiers and could not be announced
    # at once (SGLang never published their tokens under that hash: a LoRA or cache_salt namespace,
    # or no publisher in this process), and page keys of other namespaces or hash kinds left out.
    "router_announced_pages": "mooncake_sgl_router_announced_pages",
    "router_removed_pages": "mooncake_sgl_router_removed_pages",
    "router_unannounced_pages": "mooncake_sgl_router_unannounced_pages",
    "router_skipped_other_namespace": "mooncake_sgl_router_skipped_other_namespace",
    "router_skipped_not_sglang_hash": "mooncake_sgl_router_skipped_not_sglang_hash",
    # The load gate (``load_gate``; 0 with it off): hits it judged, hits it cut short because
    # loading their rest was expected to be slower than recomputing it, the page objects it left
    # out of them, hits that asked for a probe read of a tier not read lately, and hits admitted but
    # given up once their first page read slower than recomputing the rest (and the objects left).
    "gate_lookups": "mooncake_sgl_gate_lookups",
    "gate_declined_lookups": "mooncake_sgl_gate_declined_lookups",
    "gate_declined_pages": "mooncake_sgl_gate_declined_pages",
    "gate_probe_lookups": "mooncake_sgl_gate_probe_lookups",
    "gate_abandoned_lookups": "mooncake_sgl_gate_abandoned_lookups",
    "gate_abandoned_pages": "mooncake_sgl_gate_abandoned_pages",
}
GAUGES: dict[str, str] = {
    "resident_pages": "mooncake_sgl_tier_resident_pages",
    "resident_bytes": "mooncake_sgl_tier_resident_bytes",
    "capacity_bytes": "mooncake_sgl_tier_capacity_bytes",
    "holdable_bytes": "mooncake_sgl_tier_holdable_bytes",
    "position": "mooncake_sgl_tier_position",
}
# The adaptive policy's choice per tier (``policy.name: adaptive``): which expert leads (1 for the
# leader, 0 for the others), each expert's shadow hit ratio, and how often the lead changed.
POLICY_GAUGES: dict[str, str] = {
    "lead": "mooncake_sgl_policy_leader",
    "shadow_hit_ratio": "mooncake_sgl_policy_shadow_hit_ratio",
}
POLICY_COUNTERS: dict[str, str] = {
    "leader_switches": "mooncake_sgl_policy_leader_changes",
}
LATENCY: dict[str, str] = {
    "get": "mooncake_sgl_tier_get_latency_seconds",
    "put": "mooncake_sgl_tier_put_latency_seconds",
}
# Seconds. Spans a DRAM memcpy of one small page (tens of microseconds) to a remote tier timing
# out (seconds); arbitrary otherwise.
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0)

POOL_PREFIX = "mooncake_sgl_pool_"

# Capacity curves (``policy/curve.py``), per tier and size (label ``size``: ``0.125x`` to ``8x``, a
# fixed set): the pages looked up and the prefix hits a tier of that size would have had (estimates,
# so floats), and that size in bytes. ``rate(hits) / rate(lookups)`` is the curve over a window.
CURVE_COUNTERS: dict[str, str] = {
    "lookups": "mooncake_sgl_tier_curve_lookup_pages",
    "hits": "mooncake_sgl_tier_curve_hit_pages",
}
CURVE_GAUGES: dict[str, str] = {"capacity_bytes": "mooncake_sgl_tier_curve_capacity_bytes"}
CURVE_FIELDS = (*CURVE_COUNTERS, *CURVE_GAUGES)
# This rank's key namespace (``hicache.namespace_board.NamespaceRecord``'s fields, no secrets) and the
# shared tiers it keys into (``shared``: ``pool:HOST:PORT,...`` / ``mooncake_store:MASTER``), as a
# gauge at 1; the previous namespace's series drops to 0 after a weight update. One series per rank:
# ``mooncake-sgl doctor`` reads it to tell which instances on one shared tier cannot meet.
NAMESPACE_INFO = "mooncake_sgl_namespace_info"
NAMESPACE_LABELS = ("role", "model", "weights", "dtype", "layout", "page_size", "key_tp", "pp_size",
                    "cp_size", "tag", "shared")
# (rank, tier, size label): one point of one rank's curve.
CurveKey = tuple[str, str, str]


def size_label(multiplier: float) -> str:
    """The ``size`` label of a curve point: ``0.5x``, ``1x``, ``8x``."""
    return f"{multiplier:g}x"


def size_multiplier(label: str) -> float:
    """``size_label``'s inverse; ``ValueError`` for any other text (a label read from a
    ``/metrics`` page is whatever the endpoint served)."""
    value = float(label.removesuffix("x")) if label.endswith("x") else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"curve size {label[:40]!r} is not a multiplier such as 0.5x")
    return value


@dataclass(frozen=True)
class TierSample:
    """One tier's counters and gauges in one process (or summed over processes)."""

    hits: float = 0.0
    misses: float = 0.0
    read_bytes: float = 0.0
    written_bytes: float = 0.0
    puts_refused: float = 0.0
    evictions: float = 0.0
    promotions_in: float = 0.0
    demotions_in: float = 0.0
    corrupt_pages: float = 0.0
    admission_refusals: float = 0.0
    write_busy_seconds: float = 0.0
    resident_pages: float = 0.0
    resident_bytes: float = 0.0
    capacity_bytes: float = 0.0
    holdable_bytes: float = 0.0
    position: float = 0.0

    def plus(self, other: TierSample) -> TierSample:
        """Sum of two ranks' samples of one tier (gauges add too: ranks hold distinct pages)."""
        sums = {f: getattr(self, f) + getattr(other, f) for f in COUNTERS.keys() | GAUGES.keys()}
        sums["position"] = min(self.position, other.position)
        return TierSample(**sums)


# (rank, tier): rank is "tp0_pp0_dp0_cp0" style (``rank_name``).
SampleKey = tuple[str, str]


@dataclass(frozen=True)
class Snapshot:
    """Per (rank, tier) samples and per rank store counters (``STORE_COUNTERS`` fields) at one
    moment; ``taken_at`` is a Unix time."""

    tiers: Mapping[SampleKey, TierSample] = field(default_factory=dict)
    taken_at: float = 0.0
    store: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    curves: Mapping[CurveKey, Mapping[str, float]] = field(default_factory=dict)

    def curve_of(self, tier: str) -> list[tuple[float, float, float, float]]:
        """``tier``'s curve, ranks summed: ``(multiplier, capacity bytes, lookups, hits)`` per size,
        smallest first."""
        sums: dict[str, dict[str, float]] = {}
        for (_, t, size), vals in self.curves.items():
            if t == tier:
                acc = sums.setdefault(size, dict.fromkeys(CURVE_FIELDS, 0.0))
                for f in CURVE_FIELDS:
                    acc[f] += vals.get(f, 0.0)
        return sorted((size_multiplier(size), v["capacity_bytes"], v["lookups"], v["hits"])
                      for size, v in sums.items())

    def store_total(self, name: str) -> float:
        """A store counter summed over ranks."""
        return sum(v.get(name, 0.0) for v in self.store.values())

    def by_tier(self) -> dict[str, TierSample]:
        """Ranks summed, tiers in speed order (fastest first)."""
        out: dict[str, TierSample] = {}
        for (_, tier), s in self.tiers.items():
            out[tier] = out[tier].plus(s) if tier in out else s
        return dict(sorted(out.items(), key=lambda kv: (kv[1].position, _speed(kv[0]), kv[0])))


def _speed(tier: str) -> int:
    # Samples of the same position (several stores summed) fall back to the config's tier order.
    return TIER_SPEED.get(tier, len(TIER_SPEED))


def rank_name(labels: Mapping[str, object]) -> str:
    """``tp0_pp0_dp0_cp0`` from SGLang's rank labels."""
    return "_".join(f"{_RANK_SHORT[k]}{labels.get(k, 0)}" for k in RANK_LABELS)


def _increase(now: float, then: float) -> float:
    # A counter that went down (its process restarted and counts from zero again) counts from zero,
    # as Prometheus' ``increase`` does.
    return now - then if now >= then else now


def diff(before: Snapshot, after: Snapshot) -> Snapshot:
    """What happened between two snapshots: counters subtract, gauges are ``after``'s. Keys only in
    ``before`` are dropped."""
    out: dict[SampleKey, TierSample] = {}
    for key, a in after.tiers.items():
        b = before.tiers.get(key, TierSample())
        vals = {f: _increase(getattr(a, f), getattr(b, f)) for f in COUNTERS}
        vals.update({f: getattr(a, f) for f in GAUGES})
        out[key] = TierSample(**vals)
    store = {rank: {f: _increase(v, before.store.get(rank, {}).get(f, 0.0)) for f, v in c.items()}
             for rank, c in after.store.items()}
    curves = {key: {**{f: _increase(v.get(f, 0.0), before.curves.get(key, {}).get(f, 0.0))
                       for f in CURVE_COUNTERS},
                    **{f: v.get(f, 0.0) for f in CURVE_GAUGES}}
              for key, v in after.curves.items()}
    return Snapshot(out, after.taken_at, store, curves)


@dataclass(frozen=True)
class TierRow:
    """One line of ``mooncake-sgl stats``: ranks summed."""

    tier: str
    hit_share: float  # of every page requested; the row "miss" holds what no tier had
    hits: float
    read_bytes: float
    written_bytes: float
    evictions: float
    puts_refused: float
    corrupt_pages: float
    resident_pages: float
    resident_bytes: float
    capacity_bytes: float
    holdable_bytes: float


def rows(snapshot: Snapshot) -> list[TierRow]:
    """Per tier, fastest first, plus a final ``miss`` row (pages found in no tier)."""
    tiers = snapshot.by_tier()
    if not tiers:
        return []
    first = next(iter(tiers.values()))
    last = list(tiers.values())[-1]
    requested = first.hits + first.misses
    share = (lambda n: n / requested) if requested else (lambda n: 0.0)
    out = [TierRow(name, share(s.hits), s.hits, s.read_bytes, s.written_bytes, s.evictions,
                   s.puts_refused, s.corrupt_pages, s.resident_pages, s.resident_bytes,
                   s.capacity_bytes, s.holdable_bytes) for name, s in tiers.items()]
    out.append(TierRow("miss", share(last.misses), last.misses, 0, 0, 0, 0, 0, 0, 0, 0, 0))
    return out


def as_json(snapshot: Snapshot) -> dict[str, object]:
    """JSON-ready: per tier (ranks summed) with hit shares, and per rank."""
    per_rank: dict[str, dict[str, object]] = {}
    for (rank, tier), s in snapshot.tiers.items():
        per_rank.setdefault(rank, {})[tier] = dataclasses.asdict(s)
    curves = {tier: [{"multiplier": m, "capacity_bytes": cap, "lookups": looked, "hits": hits,
                      "hit_ratio": hits / looked if looked else 0.0}
                     for m, cap, looked, hits in snapshot.curve_of(tier)]
              for tier in sorted({t for _, t, _ in snapshot.curves})}
    return {"taken_at": snapshot.taken_at,
            "tiers": [dataclasses.asdict(r) for r in rows(snapshot)],
            "store": {f: snapshot.store_total(f) for f in STORE_COUNTERS},
            "ranks": per_rank, "curves": curves}


def merge(snapshots: Iterable[Snapshot]) -> Snapshot:
    """Samples of several sources (counter files of several ranks) side by side."""
    tiers: dict[SampleKey, TierSample] = {}
    store: dict[str, Mapping[str, float]] = {}
    curves: dict[CurveKey, Mapping[str, float]] = {}
    taken = 0.0
    for s in snapshots:
        tiers.update(s.tiers)
        store.update(s.store)
        curves.update(s.curves)
        taken = max(taken, s.taken_at)
    return Snapshot(tiers, taken, store, curves)
