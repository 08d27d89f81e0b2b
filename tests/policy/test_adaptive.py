"""AdaptivePolicy: the experts it chooses among, the shadows that rate them, and the policy driven by
the simulator as the store drives it (prefix awareness, protection, pins, tiers, bounded memory)."""

from __future__ import annotations

import random

import pytest

from mooncake_sgl.config import PinConfig, PolicyConfig
from mooncake_sgl.keys import KeyNamespace, page_key
from mooncake_sgl.policy import policy_for_capacities, shadow
from mooncake_sgl.policy.adaptive import AdaptivePolicy
from mooncake_sgl.policy.experts import EXPERTS, LfuDaExpert, LirsExpert
from mooncake_sgl.policy.ledger import Ledger
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.policy.shadow import (
    MIN_LEAD,
    MIN_SHADOW_PAGES,
    SAMPLE_RATE,
    SWITCH_SIGMAS,
    Tournament,
    sample_rate,
)
from mooncake_sgl.sim.gen_agent import AgentShape, agent_loops
from mooncake_sgl.sim.reference import ArcPolicy, LfuDaPolicy, LirsPolicy
from mooncake_sgl.sim.simulator import Simulator
from mooncake_sgl.sim.synth import chat_sessions
from mooncake_sgl.sim.trace import Request, block_key

PAGE = 1024


def k(i: int) -> bytes:
    return block_key(i)


def as_requests(records: list[dict]) -> list[Request]:
    return [Request(r["timestamp"] / 1000.0, tuple(block_key(h) for h in r["hash_ids"]),
                    tuple(r["hash_ids"])) for r in records]


@pytest.mark.parametrize("cls", EXPERTS, ids=lambda c: c.name)
def test_expert_candidates_are_exactly_the_resident_pages(cls):
    # An expert must rank every resident page and nothing else, whoever chose the departures: the
    # adaptive policy drops pages other experts chose, and a victim that is not resident would
    # corrupt the tier's accounting.
    rng = random.Random(5)
    expert = cls(20)
    resident: set[bytes] = set()
    for _ in range(3000):
        key = k(rng.randrange(60))
        if key in resident:
            if rng.random() < 0.3:
                expert.drop(key)
                resident.discard(key)
            else:
                expert.hit(key)
        else:
            if len(resident) >= 20:
                it = expert.candidates()
                victim = next(it) if rng.random() < 0.5 else rng.choice(sorted(resident))
                it.close()
                expert.drop(victim)
                resident.discard(victim)
            expert.add(key)
            resident.add(key)
        it = expert.candidates()
        ranked = list(it)
        assert len(ranked) == len(set(ranked)) and set(ranked) == resident


def test_lfuda_candidates_leave_the_heap_intact_when_closed_early():
    expert = LfuDaExpert(10)
    for i in range(5):
        expert.add(k(i))
        for _ in range(i):
            expert.hit(k(i))
    it = expert.candidates()
    assert next(it) == k(0)  # fewest references first
    it.close()
    assert list(expert.candidates()) == [k(i) for i in range(5)]


def test_lirs_page_evicted_by_another_expert_is_lir_again_when_it_returns_soon():
    # Another leader evicted an LIR page; LIRS alone would still hold it, so when it comes back
    # within the LIR span it must rank as LIR (last to go), not as a newcomer.
    lirs = LirsExpert(10)
    for i in range(10):
        lirs.add(k(i))  # warm-up: LIR
    lirs.drop(k(3))
    lirs.add(k(3))
    ranked = list(lirs.candidates())
    assert ranked[0] == k(9) and ranked[-1] == k(3)  # the HIR newcomer goes first, k3 last


def test_sample_rate_is_a_fixed_fraction_for_large_tiers_and_full_for_small():
    assert sample_rate(MIN_SHADOW_PAGES // 2) == 1.0
    assert sample_rate(100 * MIN_SHADOW_PAGES) == SAMPLE_RATE
    assert sample_rate(2 * MIN_SHADOW_PAGES) == pytest.approx(0.5)


def test_tournament_needs_significant_evidence_to_change_leader():
    # A few hits more are noise: the leader stays until the challenger leads by three standard
    # deviations of the difference.
    experts = [cls(4) for cls in EXPERTS]
    tour = Tournament(experts, 1.0, leader=0)
    tour.score = [30.0, 50.0, 0.0, 0.0]
    tour.observe([k(10**6)])  # a miss for everyone: only decay
    assert tour.leader == 0
    tour.score = [30.0, 70.0, 0.0, 0.0]
    tour.observe([k(10**6 + 1)])
    assert tour.leader == 1 and tour.switches == 1


def test_a_steady_small_lead_on_shared_hits_changes_the_leader():
    # Both shadows hit the same long chains; the challenger also keeps two pages the leader drops
    # (a 5 % lead). Independent-Poisson noise on thousands of shared hits would hide that lead for a
    # long time; paired by request, every request differs by exactly two hits, so the lead is plain.
    experts = [cls(4) for cls in EXPERTS]
    tour = Tournament(experts, 1.0, leader=0)
    shared, extra = 40.0, 2.0
    for _ in range(40):
        tour.score = [s * 0.999 for s in tour.score]
        tour.score[0] += shared
        tour.score[1] += shared + extra
        tour.spread[1][0] = tour.spread[1][0] * 0.999 + extra * extra
        tour.differ[1][0] = tour.differ[1][0] * 0.999 + 1
    gap = tour.score[1] - tour.score[0]
    assert gap < SWITCH_SIGMAS * (tour.score[1] + tour.score[0]) ** 0.5  # Poisson: not significant
    tour._elect()
    assert tour.leader == 1 and tour.switches == 1


def test_a_lead_of_many_pages_one_way_changes_the_leader_when_squares_hide_it():
    # 30 requests differ: 20 by ten pages for the challenger, 10 by ten for the leader (a document
    # kept by one, not the other). The paired test weighs each as its square and the shared hits
    # swamp the Poisson one; counted page by page (McNemar), 300 discordant pages lean 200 to 100.
    experts = [cls(4) for cls in EXPERTS]
    tour = Tournament(experts, 1.0, leader=0)
    tour.score = [1000.0, 1100.0, 0.0, 0.0]
    tour.spread[1][0], tour.discord[1][0], tour.differ[1][0] = 30 * 10.0 ** 2, 300.0, 30.0
    assert 100 < SWITCH_SIGMAS * (1000 + 1100) ** 0.5  # Poisson: not significant
    assert 100 < SWITCH_SIGMAS * tour.spread[1][0] ** 0.5  # paired: not significant
    tour._elect()
    assert tour.leader == 1 and tour.switches == 1


def test_a_certain_but_tiny_lead_does_not_change_the_leader():
    # 2 % more hits on every one of many requests: as significant as can be, but too small to pay for
    # the tier's transition towards another expert's pages (MIN_LEAD).
    experts = [cls(4) for cls in EXPERTS]
    tour = Tournament(experts, 1.0, leader=0)
    tour.score = [10000.0, 10000.0 * (1 + MIN_LEAD / 1.5), 0.0, 0.0]
    gap = tour.score[1] - tour.score[0]
    tour.spread[1][0] = tour.discord[1][0] = tour.differ[1][0] = gap  # one page on each of them
    tour._elect()
    assert tour.leader == 0
    tour.score[1] = 10000.0 * (1 + MIN_LEAD * 1.5)
    tour._elect()
    assert tour.leader == 1


def test_few_differing_requests_do_not_change_the_leader():
    # A big lead from three requests is no evidence under the paired or McNemar tests (the customary
    # 30 events).
    experts = [cls(4) for cls in EXPERTS]
    tour = Tournament(experts, 1.0, leader=0)
    tour.score = [1000.0, 1040.0, 0.0, 0.0]
    tour.spread[1][0], tour.discord[1][0], tour.differ[1][0] = 3 * 13.0 ** 2, 3 * 13.0, 3.0
    tour._elect()
    assert tour.leader == 0


def frequency_with_scans(n: int = 6000, seed: int = 3) -> list[Request]:
    """A hot set of 30 pages re-read at random amid one-off scans: frequency wins, LRU loses."""
    rng = random.Random(seed)
    out, fresh = [], 10**6
    for i in range(n):
        if rng.random() < 0.35:
            page = rng.randrange(30)
        else:
            page, fresh = fresh, fresh + 1
        out.append(Request(float(i), (k(page),), (page,)))
    return out


def loop(n_pages: int = 120, rounds: int = 40) -> list[Request]:
    """A loop slightly larger than the cache: LRU and ARC thrash, LIRS keeps most of it."""
    return [Request(float(r * n_pages + i), (k(i),), (i,)) for r in range(rounds) for i in range(n_pages)]


@pytest.mark.parametrize("trace, cap, winners", [
    (frequency_with_scans(), 40, {"lfuda", "arc", "lirs"}),
    (loop(), 100, {"lirs"}),
])
def test_adaptive_follows_the_expert_that_fits_the_workload(trace, cap, winners):
    policy = AdaptivePolicy([cap * PAGE])
    got = Simulator(policy, [cap * PAGE], PAGE).run(trace).hit_ratio
    lru = Simulator(LruPolicy(1), [cap * PAGE], PAGE).run(trace).hit_ratio
    best = max(Simulator(cls([cap * PAGE]), [cap * PAGE], PAGE).run(trace).hit_ratio
               for cls in (ArcPolicy, LirsPolicy, LfuDaPolicy))
    assert policy.leader(0) in winners
    assert got >= 0.95 * best and got > lru


@pytest.mark.parametrize("records", [chat_sessions(300, seed=1), agent_loops(1, AgentShape(agents=100))],
                         ids=["chat", "agent"])
@pytest.mark.parametrize("share", [0.02, 0.09])
def test_adaptive_is_near_the_best_reference_and_never_below_lru(records, share):
    # Regression bound on small generated traces; the 0.95x target is measured on full-size
    # traces in docs/replay_hit_ratio.md (on a 1,000-request chat trace at 2 % the leader changes
    # late enough to cost 6 %).
    trace = as_requests(records)
    cap = round(len({key for r in trace for key in r.keys}) * share) * PAGE
    got = Simulator(AdaptivePolicy([cap]), [cap], PAGE).run(trace).hit_ratio
    lru = Simulator(LruPolicy(1), [cap], PAGE).run(trace).hit_ratio
    refs = [Simulator(cls([cap]), [cap], PAGE).run(trace).hit_ratio
            for cls in (ArcPolicy, LirsPolicy, LfuDaPolicy)]
    assert got >= 0.9 * max(refs + [lru]) and got >= lru


def test_victims_are_leaves_first_so_no_tail_is_orphaned():
    # [0, 1] is written; then [0, 1, 2, 3] hits 0 and 1 and writes 2 and 3, which are now more
    # recent than their ancestors. The leader (LRU until the shadows say otherwise) ranks 1 and 0
    # first, but evicting them would leave 2 and 3 unusable: leaves go first, a parent right after
    # its last child in the same call.
    policy = Ledger(AdaptivePolicy([10 * PAGE]))
    chain = [k(i) for i in range(4)]
    policy.on_lookup(chain[:2], [None, None])
    policy.on_insert(chain[:2], 0, [PAGE] * 2)
    policy.on_lookup(chain, [0, 0, None, None])
    policy.on_insert(chain[2:], 0, [PAGE] * 2, parent=chain[1])
    assert policy.leader(0) == "lru"
    assert policy.victims(0, 3 * PAGE) == [chain[3], chain[2], chain[1]]


def test_victims_respect_protection_and_pins_and_refuse_what_cannot_be_freed():
    pinned_root = "ab" * 32
    config = PolicyConfig(name="adaptive", pins=[PinConfig(prefix_hash=pinned_root, ttl="1m")])
    policy = policy_for_capacities(config, [4 * PAGE])
    assert isinstance(policy, AdaptivePolicy)
    policy = Ledger(policy)
    pinned = page_key(KeyNamespace(model="m", dtype="bf16", layout="page_first", page_size=64), pinned_root)
    keys = [pinned, k(1), k(2), k(3)]
    policy.tick(1.0)
    policy.on_lookup([pinned], [None])
    policy.on_insert(keys, 0, [PAGE] * 4)
    assert policy.is_pinned(pinned)
    assert policy.victims(0, 4 * PAGE) is None  # the pinned page cannot go
    assert policy.victims(0, 3 * PAGE, frozenset(keys[1:2])) is None
    before = policy.stats()
    assert policy.victims(0, 2 * PAGE, frozenset(keys[1:2])) == [k(3), k(2)]
    assert policy.stats().tiers[0].pages == before.tiers[0].pages - 2
    policy.tick(1000.0)  # the pin expired
    assert policy.victims(0, PAGE, frozenset(keys[1:2])) == [pinned]


def test_two_tiers_write_through_promote_and_demote():
    policy = AdaptivePolicy([2 * PAGE, 8 * PAGE])
    assert policy.admit([k(1), k(2)], 1) == [True, True]
    assert policy.promotion_target(k(1), 1) == 0 and policy.promotion_target(k(1), 0) is None
    assert policy.demotion_target(k(1), 0) == 1 and policy.demotion_target(k(1), 1) is None
    trace = as_requests(chat_sessions(150, seed=2))
    res = Simulator(policy, [20 * PAGE, 200 * PAGE], PAGE).run(trace)
    assert res.tiers[0].hit_pages > 0 and res.tiers[1].hit_pages > 0
    assert res.tiers[0].bytes_promoted > 0
    stats = policy.stats()
    assert stats.tiers[0].pages <= 20 and stats.tiers[1].pages <= 200


def test_self_evicting_tier_is_not_tracked():
    policy = Ledger(AdaptivePolicy([4 * PAGE, None]), unmanaged={1})
    policy.on_insert([k(1), k(2)], 1, [PAGE, PAGE])
    assert policy.stats().tiers[1].pages == 0 and policy.victims(1, PAGE) is None


def test_shadow_memory_is_a_fixed_fraction_of_a_large_tier(monkeypatch):
    # A tier of 16x the floor samples 1/16 of the key space: each shadow holds ~1/16 of the pages
    # and the shadows together stay a fixed fraction of the experts' entries over the real pages.
    # (A lower floor than the product's keeps the test small; the arithmetic is the same.)
    monkeypatch.setattr(shadow, "MIN_SHADOW_PAGES", 64)
    pages = 16 * 64
    policy = AdaptivePolicy([pages * PAGE])
    trace = [Request(float(i), tuple(k(i * 8 + j) for j in range(8)), ()) for i in range(pages // 4)]
    Simulator(policy, [pages * PAGE], PAGE).run(trace)
    tour = policy.stats().tiers[0].tournament
    assert tour is not None and tour.sample_rate == pytest.approx(1 / 16)
    assert tour.shadow_entries <= 0.25 * tour.expert_entries


def test_shadows_replay_the_lookups_made_before_the_first_write():
    # The shadows are sized when the first page arrives; a lookup before it (the very first request
    # misses everything) must still reach them, or LIRS's shadow would miss the pages it makes LIR
    # first and under-rate LIRS for the rest of the run.
    policy = Ledger(AdaptivePolicy([100 * PAGE]))
    chain = [k(i) for i in range(5)]
    policy.on_lookup(chain, [None] * 5)
    policy.on_insert(chain, 0, [PAGE] * 5)
    policy.on_lookup(chain, [0] * 5)
    shadows = policy._tiers[0].tournament.shadows
    assert all(s.lookups == 10 and s.hits == 5 for s in shadows)
