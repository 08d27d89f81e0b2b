"""Each policy's typed report (``api.PolicyReport``) flattens to the names and order the stats JSON
and the counter files have always had, and reads back from that JSON as a ``PlainPolicyReport``."""

from __future__ import annotations

import json

import pytest

from mooncake_sgl.api import PageKey, PlacementPolicy, PolicyReport
from mooncake_sgl.config import PolicyConfig
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.adaptive import AdaptiveReport
from mooncake_sgl.policy.heat import HeatReport
from mooncake_sgl.policy.ledger import Ledger
from mooncake_sgl.policy.lru import LruReport
from mooncake_sgl.sim.reference import ArcPolicy, ArcReport, LfuDaPolicy, LirsPolicy
from mooncake_sgl.sim.simulator import Simulator
from mooncake_sgl.sim.trace import Request
from mooncake_sgl.store.stats import PlainPolicyReport, StoreReport

PAGE = 4096
REFS = {"arc": ArcPolicy, "lirs": LirsPolicy, "lfuda": LfuDaPolicy}


def build(name: str, caps: list[int | None]) -> PlacementPolicy:
    return REFS[name](caps) if name in REFS else policy_for_capacities(PolicyConfig(name=name), caps)


def keys(*ids: int) -> list[PageKey]:
    return [b"r%04d" % i for i in ids]


def feed(ledger: Ledger, tiers: tuple[int, ...]) -> None:
    """Two chains written to ``tiers`` and looked up again, well within every tier's room."""
    for chain in (keys(1, 2, 3), keys(4, 5)):
        ledger.on_lookup(chain, [None] * len(chain), None)
        for t in tiers:
            ledger.on_insert(chain, t, [PAGE] * len(chain), None)
        ledger.on_lookup(chain, [0] * len(chain), None)


def tier_names(i: int, *fields: str) -> list[str]:
    return [f"tier{i}_{f}" for f in fields]


HEAT_HEAD = ["lookups", "hit_pages", "slow_tier_admitted", "slow_tier_refused", "sketch_bytes",
             "tracked_pages", "pinned_pages"]
HEAT_TIER = ("pages", "probation_pages", "probation_target", "ghost_hits_probation", "ghost_hits_main")
ADAPTIVE_TIER = ("pages", "leader", "sample_rate", "expert_entries", "shadow_entries")


def test_lru_report_names_each_tiers_pages() -> None:
    policy = Ledger(build("lru", [64 * PAGE, 256 * PAGE]))
    feed(policy, (0, 1))
    report = policy.stats()
    assert isinstance(report, LruReport) and [t.pages for t in report.tiers] == [5, 5]
    assert report.as_dict() == {"tier0_pages": 5.0, "tier1_pages": 5.0}


def test_heat_report_keeps_its_names_and_leaves_out_what_a_tier_lacks() -> None:
    # Tier 0 admits everything (no reuse watch); tier 1 makes room on its own (no probation target).
    policy = Ledger(build("heat", [64 * PAGE, None]), unmanaged={1})
    feed(policy, (0, 1))
    report = policy.stats()
    assert isinstance(report, HeatReport)
    assert report.tiers[0].cold_reuse_rate is None and report.tiers[1].probation_target is None
    flat = report.as_dict()
    assert list(flat) == (HEAT_HEAD + tier_names(0, *HEAT_TIER)
                          + tier_names(1, "pages", "probation_pages", "ghost_hits_probation",
                                       "ghost_hits_main", "cold_reuse_rate"))
    assert (flat["lookups"], flat["tracked_pages"], flat["tier0_pages"]) == (4.0, 5.0, 5.0)
    assert all(type(v) is float for v in flat.values())


def test_heat_report_of_two_bounded_tiers() -> None:
    policy = Ledger(build("heat", [64 * PAGE, 256 * PAGE]))
    feed(policy, (0, 1))
    assert list(policy.stats().as_dict()) == (HEAT_HEAD + tier_names(0, *HEAT_TIER)
                                              + tier_names(1, *HEAT_TIER, "cold_reuse_rate"))


def test_adaptive_report_names_a_tiers_tournament_once_it_has_one() -> None:
    policy = Ledger(build("adaptive", [64 * PAGE, None]), unmanaged={1})
    before = policy.stats()
    assert isinstance(before, AdaptiveReport) and before.tiers[0].tournament is None
    assert list(before.as_dict()) == ["tracked_pages", "pinned_pages", "tier0_pages", "tier1_pages"]
    feed(policy, (0, 1))
    report = policy.stats()
    assert report.tiers[0].tournament is not None and report.tiers[1].tournament is None
    flat = report.as_dict()
    assert list(flat) == ["tracked_pages", "pinned_pages", *tier_names(0, *ADAPTIVE_TIER), "tier1_pages"]
    assert (flat["tracked_pages"], flat["tier0_pages"], flat["tier1_pages"]) == (5.0, 5.0, 0.0)


def test_arc_report_names_the_tiers_that_hold_a_page() -> None:
    policy = Ledger(build("arc", [64 * PAGE, 256 * PAGE]))
    feed(policy, (0,))
    report = policy.stats()
    assert isinstance(report, ArcReport) and report.tiers[1].p is None
    assert report.as_dict() == {"tier0_p": 0.0}
    feed(policy, (1,))
    assert list(policy.stats().as_dict()) == ["tier0_p", "tier1_p"]


@pytest.mark.parametrize("name", ["lirs", "lfuda"])
def test_references_without_counts_report_nothing(name: str) -> None:
    policy = Ledger(build(name, [64 * PAGE]))
    feed(policy, (0,))
    assert type(policy.stats()) is PolicyReport and policy.stats().as_dict() == {}


@pytest.mark.parametrize("name", ["lru", "heat", "adaptive", "arc", "lirs", "lfuda"])
def test_a_policy_report_reads_back_from_the_stats_json(name: str) -> None:
    # A counter file is read by a process that may run another policy: the names and values as written.
    caps = [8 * PAGE, 32 * PAGE]
    sim = Simulator(build(name, list(caps)), caps, PAGE, name)
    sim.run([Request(float(i), tuple(keys(*range(i % 7 * 4, i % 7 * 4 + 4))), ()) for i in range(40)])
    report = sim.store.stats()
    back = StoreReport.from_plain(json.loads(json.dumps(report.as_dict())))
    assert isinstance(back.policy, PlainPolicyReport)
    assert list(back.policy.as_dict().items()) == list(report.policy.as_dict().items())
    assert json.dumps(back.as_dict()) == json.dumps(report.as_dict())
    assert sim.result.as_dict()["policy_stats"] == report.policy.as_dict()
