"""The store's typed stats: one shape per component that counts (``tally.Tally`` of each), and the
report ``TieredStore.stats()`` returns, a tree of them (``StoreReport``).

Readers (``metrics.source``, the simulator) read the report's fields, so a renamed count is an
``AttributeError`` in their tests, not a series that silently stays 0. ``StoreReport.as_dict()`` is
the nested JSON of ``api.STATS_SHAPE`` (the counter file, ``stats`` output); per tier, the request
paths', the placer's and the promoter's counts of that tier form the tier's ``"store"`` entry (their
field names never overlap, which ``test_store`` checks). ``StoreReport.from_plain`` reads that JSON
back (a counter file).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..api import STATS_SHAPE, PolicyReport, TierReport, TierUsage

C = TypeVar("C")


@dataclass(frozen=True)
class LookupStats:
    """``TieredStore``'s own counts over all tiers."""

    lookups: int = 0  # exists_prefix calls
    lookup_pages: int = 0  # pages asked by them
    lookup_hit_pages: int = 0  # pages of their leading runs found
    promotions_dropped: int = 0  # pages a backlogged mover could not take for promotion


@dataclass(frozen=True)
class TierReadStats:
    """What the request paths did with one tier."""

    hits: int = 0  # pages a read offered this tier and got
    misses: int = 0  # pages a read offered this tier and it lacked
    bytes_read: int = 0
    lookup_hits: int = 0  # pages of lookups' leading runs found here first
    admission_refused: int = 0  # pages the policy did not admit to this tier
    lost: int = 0  # pages gone without an eviction (removed under us, corrupt)


@dataclass(frozen=True)
class TierPlacementStats:
    """What ``Placer`` did in one tier."""

    writes: int = 0  # pages new to the tier
    bytes_written: int = 0
    write_failures: int = 0
    demotions: int = 0  # pages demoted into this tier
    demotion_failures: int = 0  # victims of this tier whose copy down failed or was dropped
    evictions: int = 0
    eviction_aborts: int = 0  # victims whose removal failed (they stay evictable)
    room_refused: int = 0  # room asked and the policy could name no victims


@dataclass(frozen=True)
class TierPromotionStats:
    """What ``Promoter`` did into one tier."""

    promotions: int = 0  # pages promoted into this tier


@dataclass(frozen=True)
class ResidencyStats:
    """``Residency``'s lookup buffer and two-phase evictions."""

    lookups_recorded: int = 0
    lookups_dropped: int = 0  # oldest lookups dropped from a full buffer
    maintenance_runs: int = 0
    evictions_prepared: int = 0
    evictions_committed: int = 0
    evictions_aborted: int = 0
    promotions_beyond_reach: int = 0  # not promoted: last used longer ago than tier 0 turns over


@dataclass(frozen=True)
class MoverStats:
    """A mover's tasks (the same for both movers)."""

    submitted: int = 0
    completed: int = 0
    dropped: int = 0  # refused by a full queue, or cancelled at close
    failed: int = 0  # raised (logged)
    waits: int = 0  # calls a request thread waited for
    timeouts: int = 0  # of those, given up after their timeout


@dataclass(frozen=True)
class UsageReport:
    """A tier's ``usage()`` as reported: bytes and pages now."""

    capacity_bytes: int
    used_bytes: int
    holdable_bytes: int  # ``TierUsage.holdable_bytes``: the budget, or less where the medium is fuller
    pages: int

    @classmethod
    def of(cls, u: TierUsage) -> UsageReport:
        return cls(u.capacity_bytes, u.used_bytes, u.holdable_bytes, u.pages)


@dataclass(frozen=True)
class UsageError:
    """A tier whose ``usage()`` raised (a dead remote tier still reports its counters)."""

    error: str


@dataclass(frozen=True)
class PlainTierReport(TierReport):
    """A tier's own report read back from JSON (a counter file), where its type is not recorded.

    Its two exported quantities are read under the names the SSD tier's report flattens them to
    (``tiers.ssd.tier.SsdTierReport``, the only tier reporting them); ``test_source`` pins that the
    two agree.
    """

    values: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def corrupt_pages(self) -> int:
        return int(self.values.get("corrupt_pages", 0))

    def write_busy_seconds(self) -> float:
        return float(self.values.get("write_busy_s", 0.0))


@dataclass(frozen=True)
class PlainPolicyReport(PolicyReport):
    """A policy's own report read back from JSON (a counter file), whose reader may not know the
    policy that wrote it: its flat names and values as written."""

    values: Mapping[str, float]

    def as_dict(self) -> dict[str, float]:
        return dict(self.values)


@dataclass(frozen=True)
class StoreTierReport:
    """One tier in ``StoreReport``: its usage, what the store moved through it, its own report."""

    # None: another rank reports it (``metrics.attach`` leaves it out of this rank's counter file).
    usage: UsageReport | UsageError | None
    reads: TierReadStats
    placement: TierPlacementStats
    promotion: TierPromotionStats
    tier: TierReport  # ``api.TierReportError`` when the tier's ``stats()`` raised

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.usage is not None:
            out["usage"] = dataclasses.asdict(self.usage)
        out["store"] = {**dataclasses.asdict(self.reads), **dataclasses.asdict(self.placement),
                        **dataclasses.asdict(self.promotion)}
        out["tier"] = self.tier.as_dict()
        return out

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> StoreTierReport:
        usage: UsageReport | UsageError | None = None
        if "usage" in d:
            plain = _mapping(d, "usage")
            usage = UsageError(str(plain["error"])) if "error" in plain else _counts(UsageReport, plain)
        store = _mapping(d, "store")
        return cls(usage, _counts(TierReadStats, store), _counts(TierPlacementStats, store),
                   _counts(TierPromotionStats, store), PlainTierReport(dict(_mapping(d, "tier"))))


@dataclass(frozen=True)
class MoverReport:
    """The mover's kind and its tasks."""

    background: bool  # a ``BackgroundMover`` (else the inline one)
    counts: MoverStats

    def as_dict(self) -> dict[str, Any]:
        return {"background": int(self.background), **dataclasses.asdict(self.counts)}


@dataclass(frozen=True)
class ExpertReport:
    """One expert of an adaptive policy in one tier (``api.ExpertStanding``)."""

    lead: int  # 1 while its ranking chooses the tier's victims, else 0
    shadow_hit_ratio: float


@dataclass(frozen=True)
class TierExpertsReport:
    """The experts of one tier of an adaptive policy."""

    leader_switches: int
    experts: Mapping[str, ExpertReport]

    def as_dict(self) -> dict[str, Any]:
        return {"leader_switches": self.leader_switches,
                "experts": {name: dataclasses.asdict(e) for name, e in self.experts.items()}}

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> TierExpertsReport:
        return cls(int(d.get("leader_switches", 0)),
                   {name: _counts(ExpertReport, e) for name, e in _mapping(d, "experts").items()
                    if isinstance(e, Mapping)})


@dataclass(frozen=True)
class StoreReport:
    """``TieredStore.stats()``: every count of the store, by source (``api.STATS_SHAPE``)."""

    lookups: LookupStats
    residency: ResidencyStats
    mover: MoverReport
    policy: PolicyReport  # the policy's own ``stats()``
    experts: Mapping[str, TierExpertsReport]  # by tier name; empty without an adaptive policy
    tiers: Mapping[str, StoreTierReport]  # by tier name, fastest first
    # By section, each reporting observer's ``stats()`` as it returned it (``api.ReportingObserver``:
    # ``LoadGateStats``, ``CurvesReport``, ``AnnouncerReport``; plain JSON when read back from a
    # counter file, which ``metrics.source`` reads through their ``from_plain``).
    sections: Mapping[str, object]

    def as_dict(self) -> dict[str, Any]:
        """The nested JSON of ``api.STATS_SHAPE`` (observer sections as they are)."""
        return {"store": {**dataclasses.asdict(self.lookups), **dataclasses.asdict(self.residency)},
                "mover": self.mover.as_dict(), "policy": self.policy.as_dict(),
                "experts": {name: e.as_dict() for name, e in self.experts.items()},
                "tiers": {name: t.as_dict() for name, t in self.tiers.items()}, **self.sections}

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> StoreReport:
        """The report ``as_dict`` (then JSON) wrote: a count it lacks (a file of an older version)
        reads as 0, a tier's own report as a ``PlainTierReport``, the policy's as a
        ``PlainPolicyReport``, sections as plain JSON."""
        store = _mapping(d, "store")
        mover = _mapping(d, "mover")
        experts = {name: TierExpertsReport.from_plain(e) for name, e in _mapping(d, "experts").items()
                   if isinstance(e, Mapping)}
        tiers = {name: StoreTierReport.from_plain(e) for name, e in _mapping(d, "tiers").items()
                 if isinstance(e, Mapping)}
        return cls(_counts(LookupStats, store), _counts(ResidencyStats, store),
                   MoverReport(bool(mover.get("background", 0)), _counts(MoverStats, mover)),
                   PlainPolicyReport(dict(_mapping(d, "policy"))), experts, tiers,
                   {k: v for k, v in d.items() if k not in STATS_SHAPE})


def _mapping(d: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    sub = d.get(name)
    return sub if isinstance(sub, Mapping) else {}


def _counts(shape: type[C], d: Mapping[str, Any]) -> C:
    """``shape`` from the fields of it that ``d`` has (JSON numbers), the others 0."""
    return shape(**{f.name: d.get(f.name, 0) for f in dataclasses.fields(shape)})  # type: ignore[arg-type]
