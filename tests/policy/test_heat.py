"""HeatPolicy invariants, fed events directly (no tiers): prefix order of heat, leaves-first eviction,
admission of one-hit wonders, demotion and promotion by heat, atomic victims, bounded memory, pins."""

from __future__ import annotations

import random

import pytest

from mooncake_sgl.config import PinConfig, PolicyConfig
from mooncake_sgl.keys import KeyNamespace, page_key
from mooncake_sgl.policy import build_policy, policy_for_capacities
from mooncake_sgl.policy.adaptive import AdaptivePolicy
from mooncake_sgl.policy.heat import HeatPolicy
from mooncake_sgl.policy.ledger import Ledger
from mooncake_sgl.policy.lru import LruPolicy

PAGE = 100
NS = KeyNamespace(model="m", dtype="bf16", layout="page_first", page_size=64)


def pk(i: int | str) -> bytes:
    return page_key(NS, str(i))


def chain(*ids: int | str) -> list[bytes]:
    return [pk(i) for i in ids]


def lookup(p: HeatPolicy, keys: list[bytes], resident: dict[bytes, int] | None = None,
           parent: bytes | None = None) -> None:
    resident = resident or {}
    p.on_lookup(keys, [resident.get(key) for key in keys], parent)


def insert(p: HeatPolicy, keys: list[bytes], tier: int = 0, parent: bytes | None = None) -> None:
    p.on_insert(keys, tier, [PAGE] * len(keys), parent)


def test_ancestors_never_colder_than_descendants():
    # A page is useless without its ancestors, so an ancestor must never rank below a descendant.
    # Random chains sharing heads, looked up from the root or, as SGLang does when the device
    # holds the start of a prefix, continued from a parent whose chain was looked up before.
    rng = random.Random(5)
    p = Ledger(HeatPolicy([PAGE * 200], PolicyConfig()))
    insert(p, chain("seed"))
    chains = []
    for n in range(400):
        if chains and rng.random() < 0.6:
            base = rng.choice(chains)
            keys = base[: rng.randint(1, len(base))] + chain(*(f"{n}.{j}" for j in range(rng.randint(0, 4))))
        else:
            keys = chain(*(f"{n}.{j}" for j in range(rng.randint(1, 8))))
        chains.append(keys)
        if len(keys) > 2 and rng.random() < 0.3:  # a lookup that starts mid-chain
            cut = rng.randint(1, len(keys) - 1)
            lookup(p, keys[:cut])
            p.on_lookup(keys[cut:], [None] * (len(keys) - cut), keys[cut - 1])
        else:
            lookup(p, keys)
        for a, b in zip(keys, keys[1:]):
            assert p.heat(a) >= p.heat(b), f"lookup {n}: parent colder than child"
    # Aging (halving) is uniform, so it keeps the order of every chain seen.
    for keys in chains[-50:]:
        for a, b in zip(keys, keys[1:]):
            assert p.heat(a) >= p.heat(b)


def test_chain_tails_are_evicted_before_heads():
    p = Ledger(HeatPolicy([PAGE * 10], PolicyConfig()))
    keys = chain(1, 2, 3, 4, 5)
    lookup(p, keys)
    insert(p, keys)
    assert p.victims(0, 2 * PAGE) == [keys[4], keys[3]]


def test_a_parent_with_a_resident_child_is_not_a_victim_before_the_child():
    # The parent is older (written first) but still needed by its child: evict the child first.
    p = Ledger(HeatPolicy([PAGE * 10], PolicyConfig()))
    head, tail = chain(1), chain(2)
    lookup(p, head + tail)
    insert(p, head)
    insert(p, tail, parent=head[0])
    assert p.victims(0, PAGE) == tail
    p.on_remove(tail, 0)
    assert p.victims(0, PAGE) == head  # once the child is gone the parent is a leaf


def test_victims_is_atomic_and_never_picks_protected_pages():
    p = Ledger(HeatPolicy([PAGE * 10], PolicyConfig()))
    keys = chain(1, 2, 3)
    lookup(p, keys)
    insert(p, keys)
    before = p.stats()
    assert p.victims(0, 3 * PAGE, protected=frozenset(keys[:1])) is None
    assert p.stats() == before  # no state change on None
    got = p.victims(0, 2 * PAGE, protected=frozenset(keys[2:]))
    assert got is not None and keys[2] not in got and len(got) == 2
    assert p.victims(0, 0) == []


def test_reused_pages_survive_a_scan_of_one_hit_wonders():
    # The probation segment absorbs pages seen once; a reused chain sits in main.
    p = Ledger(HeatPolicy([PAGE * 20], PolicyConfig()))
    hot = chain("h1", "h2", "h3")
    for _ in range(3):
        lookup(p, hot, {k: 0 for k in hot} if hot[0] in p.pages(0) else None)
        if hot[0] not in p.pages(0):
            insert(p, hot)
    resident = set(hot)
    for i in range(200):  # a scan: every page once
        cold = chain(f"c{i}")
        lookup(p, cold)
        if len(resident) >= 20:
            gone = p.victims(0, PAGE, frozenset(cold))
            p.on_remove(gone, 0)
            resident -= set(gone)
        insert(p, cold)
        resident |= set(cold)
    assert set(hot) <= resident


def test_slow_tiers_admit_only_pages_seen_before():
    p = Ledger(HeatPolicy([PAGE * 10, PAGE * 100],
                          PolicyConfig(name="heat", admission_min_hits=2, admission_min_reuse=1.0)))
    keys = chain(1, 2)
    lookup(p, keys)
    assert p.admit(keys, 0) == [True, True]  # tier 0 takes every write
    assert p.admit(keys, 1) == [False, False]  # a one-hit wonder stays off the SSD
    lookup(p, keys)
    assert p.admit(keys, 1) == [True, True]
    write_through = Ledger(HeatPolicy([PAGE, PAGE], PolicyConfig(name="heat", admission_min_hits=1)))
    lookup(write_through, keys)
    assert write_through.admit(keys, 1) == [True, True]


def _stream(p: HeatPolicy, start: int, n: int, comeback: bool) -> list[bool]:
    """Write-backs of pages seen once; with ``comeback`` each is looked up again soon after."""
    decisions = []
    for i in range(start, start + n):
        keys = chain(f"s{i}")
        lookup(p, keys)
        decisions += p.admit(keys, 1)
        if comeback and i > start + 5:
            lookup(p, chain(f"s{i - 5}"))
    return decisions


def test_admission_of_cold_pages_follows_their_measured_reuse():
    # One-off pages: the watch sees none come back within the slow tier's horizon, the door closes.
    # Sessions that return: the door opens again, so cold-admission never costs those hits.
    p = Ledger(HeatPolicy([PAGE * 10, PAGE * 100], PolicyConfig(name="heat", admission_min_reuse=0.1)))
    p.on_insert(chain("sizer"), 1, [PAGE])
    p.on_remove(chain("sizer"), 1)
    assert _stream(p, 0, 50, comeback=False)[-1]  # no evidence yet: open (prior 1 in 2)
    assert not any(_stream(p, 50, 3000, comeback=False)[-100:])
    assert p.stats().tiers[1].cold_reuse_rate < 0.1
    assert all(_stream(p, 10_000, 3000, comeback=True)[-100:])
    assert len(p._watch[1].ghost) <= 100  # the watch is bounded by the tier's pages


def test_demotion_keeps_warm_pages_and_drops_cold_ones():
    p = Ledger(HeatPolicy([PAGE * 10, PAGE * 100, PAGE * 1000], PolicyConfig()))
    warm, cold = chain(1), chain(2)
    lookup(p, warm)
    lookup(p, warm)
    lookup(p, cold)
    assert p.demotion_target(warm[0], 0) == 1
    assert p.demotion_target(warm[0], 1) == 2
    assert p.demotion_target(cold[0], 0) is None
    assert p.demotion_target(warm[0], 2) is None  # nothing below the last tier


def test_promotion_of_hot_pages_found_below():
    p = Ledger(HeatPolicy([PAGE * 10, PAGE * 100], PolicyConfig(name="heat", promotion_min_hits=3)))
    keys = chain(1)
    lookup(p, keys)
    lookup(p, keys, {keys[0]: 1})
    assert p.promotion_target(keys[0], 1) is None  # heat 2 < 3
    lookup(p, keys, {keys[0]: 1})
    assert p.promotion_target(keys[0], 1) == 0
    assert p.promotion_target(keys[0], 0) is None


def test_heat_decays_with_logical_time():
    p = Ledger(HeatPolicy([PAGE * 10], PolicyConfig(name="heat", sketch="decay", half_life="1m")))
    keys = chain(1)
    p.tick(1.0)
    for _ in range(4):
        lookup(p, keys)
    assert p.heat(keys[0]) == pytest.approx(4.0)
    p.tick(121.0)
    assert p.heat(keys[0]) == pytest.approx(1.0)
    assert p.demotion_target(keys[0], 0) is None  # cooled below the demotion threshold


def test_memory_is_bounded_by_resident_pages():
    # 50k distinct pages stream through a 100-page tier: per-page state must follow residency,
    # not history (ghosts and pending links are bounded too).
    p = Ledger(HeatPolicy([PAGE * 100], PolicyConfig()))
    resident: set[bytes] = set()
    for i in range(0, 50_000, 5):
        keys = chain(*range(i, i + 5))
        lookup(p, keys)
        need = len(resident) + 5 - 100
        if need > 0:
            gone = p.victims(0, need * PAGE, frozenset(keys))
            p.on_remove(gone, 0)
            resident -= set(gone)
        insert(p, keys)
        resident |= set(keys)
    seg = p._tiers[0]
    assert p.stats().chained.tracked_pages == len(resident) == 100
    assert len(p._links) <= 100 and len(seg.kids) <= 100
    assert len(seg.ghost_probation) <= 100 and len(seg.ghost_main) <= 100
    assert p.stats().sketch_bytes == p._sketch.memory_bytes()


def test_self_evicting_tiers_keep_no_per_page_state():
    # Such a tier (a pool with watermarks) never reports its evictions: state kept for it would leak.
    p = Ledger(HeatPolicy([PAGE * 10, None], PolicyConfig()))
    keys = chain(*range(1000))
    lookup(p, keys)
    insert(p, keys, tier=1)
    assert p.stats().chained.tracked_pages == 0
    lookup(p, keys)
    assert p.demotion_target(keys[0], 0) == 1


def test_pinned_prefix_is_kept_until_its_ttl_expires():
    pin_hash = "ab" * 32  # SGLang's page hashes are 64 hex digits
    p = Ledger(HeatPolicy([PAGE * 4, PAGE * 100],
                          PolicyConfig(name="heat", pins=[PinConfig(prefix_hash=pin_hash, ttl="30s")])))
    system = [page_key(NS, pin_hash)] + chain("s2")
    p.tick(100.0)
    lookup(p, system)
    insert(p, system)
    other = chain("u1", "u2")
    lookup(p, other)
    insert(p, other)
    assert p.is_pinned(system[0]) and p.is_pinned(system[1])
    assert set(p.victims(0, 2 * PAGE)) == set(other)
    p.on_remove(other, 0)
    assert p.victims(0, PAGE) is None  # only pinned pages left
    assert p.promotion_target(system[0], 1) == 0 and p.admit(system, 1) == [True, True]
    p.tick(131.0)
    assert not p.is_pinned(system[0])
    assert p.victims(0, 2 * PAGE) == [system[1], system[0]]


def test_probation_grows_when_its_victims_come_back():
    # ARC's rule: a returning probation victim means probation was too small.
    p = Ledger(HeatPolicy([PAGE * 100], PolicyConfig(name="heat", probation_fraction=0.1)))
    seg = p._tiers[0]
    start = seg.target
    keys = chain(1)
    lookup(p, keys)
    insert(p, keys)
    p.on_remove(p.victims(0, PAGE), 0)
    assert keys[0] in seg.ghost_probation
    insert(p, keys)
    assert seg.target > start and keys[0] in seg.main


def test_factory_builds_what_the_config_names(tmp_path):
    assert isinstance(policy_for_capacities(PolicyConfig(name="lru"), [PAGE]), LruPolicy)
    assert isinstance(policy_for_capacities(PolicyConfig(name="heat"), [PAGE, None]), HeatPolicy)
    from mooncake_sgl.config import HostTierConfig
    from mooncake_sgl.tiers.host import HostTier

    tier = HostTier(HostTierConfig(capacity=4 * 4096, slot_size=4096, pin_memory=False))
    try:
        # The product's default: the adaptive policy (docs/replay_hit_ratio.md).
        assert isinstance(build_policy(PolicyConfig(), [tier]), AdaptivePolicy)
        assert isinstance(build_policy(PolicyConfig(name="heat"), [tier]), HeatPolicy)
    finally:
        tier.close()
    with pytest.raises(ValueError, match="at least one tier"):
        policy_for_capacities(PolicyConfig(), [])


def test_policy_config_validates_heat_fields():
    with pytest.raises(ValueError, match="admission_min_hits"):
        PolicyConfig(name="heat", admission_min_hits=0)
    with pytest.raises(ValueError, match="probation_fraction"):
        PolicyConfig(name="heat", probation_fraction=1.5)
    assert PolicyConfig(name="heat", sketch="decay", half_life="2m").half_life == 120.0
    assert PolicyConfig(name="heat", sketch="decay").half_life == 600.0


def test_half_life_for_the_count_min_sketch_is_an_error_naming_the_key(tmp_path):
    # The count-min sketch ages by access count and has no half-life: a config setting one must
    # hear so instead of believing it tuned something.
    from mooncake_sgl.config_text import load_config_file
    from mooncake_sgl.errors import ConfigError

    path = tmp_path / "tiers.yaml"
    path.write_text("policy:\n  name: heat\n  half_life: 10m\n")
    with pytest.raises(ConfigError, match=r"policy\.half_life.*tiers\.yaml"):
        load_config_file(path)
    assert PolicyConfig().half_life is None


def test_yaml_selects_and_tunes_the_policy(tmp_path):
    from mooncake_sgl.config_text import load_config_file

    path = tmp_path / "tiers.yaml"
    path.write_text("policy:\n  name: heat\n  sketch: decay\n  half_life: 2m\n  admission_min_reuse: 1.0\n"
                    "  pins:\n    - prefix_hash: sys-prompt\n      ttl: 30s\n")
    cfg = load_config_file(path).policy
    p = policy_for_capacities(cfg, [PAGE * 10, PAGE * 100])
    assert isinstance(p, HeatPolicy) and p._sketch.half_life == 120.0
    lookup(Ledger(p), chain("sys-prompt", "x"))
    assert p.is_pinned(pk("x"))
    path.write_text("policy:\n  name: lru\n")
    assert isinstance(policy_for_capacities(load_config_file(path).policy, [PAGE]), LruPolicy)
