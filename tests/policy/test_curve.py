"""Capacity curves (``policy/curve.py``): exact where the tier is small, sampled and bounded where it
is large, and kept by the store only where asked."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from mooncake_sgl.config import PolicyConfig
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.curve import (
    MULTIPLIERS,
    SHADOW_PAGES,
    CapacityCurve,
    TierCurves,
    curve_experts,
    curve_policy,
)
from mooncake_sgl.policy.experts import EXPERTS, LruExpert
from mooncake_sgl.policy.shadow import key_hash
from mooncake_sgl.sim.simulator import Simulator


def chains(n: int, seed: int = 1) -> list[list[bytes]]:
    """Requests sharing prefixes: a few hot documents followed by a private tail each."""
    rng = random.Random(seed)
    docs = [[b"doc%d-%d" % (d, i) for i in range(rng.randint(4, 24))] for d in range(60)]
    out = []
    for r in range(n):
        doc = docs[min(int(rng.paretovariate(1.2)) - 1, len(docs) - 1)]
        out.append(doc + [b"tail%d-%d" % (r, i) for i in range(rng.randint(1, 6))])
    return out


def lru_prefix_hits(requests: list[list[bytes]], pages: int) -> tuple[int, int]:
    """A plain LRU cache of ``pages`` pages with the store's prefix rule: the leading run hits, the
    pages after it are written back, the batch's tail lost when it does not fit."""
    cache: OrderedDict[bytes, None] = OrderedDict()
    hits = total = 0
    for keys in requests:
        run = 0
        while run < len(keys) and keys[run] in cache:
            run += 1
        for k in reversed(keys[:run]):
            cache.move_to_end(k)
        fresh = [k for k in keys[run:] if k not in cache]
        protected = set(keys)
        over = len(cache) + len(fresh) - pages
        for k in [k for k in cache if k not in protected][:max(0, over)]:
            del cache[k]
        for k in reversed(fresh[:max(0, pages - len(cache))]):
            cache[k] = None
        hits += run
        total += len(keys)
    return hits, total


def feed(curve: CapacityCurve, requests: list[list[bytes]]) -> None:
    for keys in requests:
        curve.observe(keys, [key_hash(k) for k in keys])


def test_a_small_tier_is_modelled_exactly_at_every_size() -> None:
    requests = chains(1500)
    curve = CapacityCurve(100, (LruExpert,))
    feed(curve, requests)
    points = curve.points()
    assert [p.multiplier for p in points] == list(MULTIPLIERS)
    for p in points:  # every size is under SHADOW_PAGES: sampled at rate 1, so it is the cache itself
        hits, total = lru_prefix_hits(requests, p.capacity_pages)
        assert (p.hits, p.lookups) == (hits, total), p


def test_a_large_tier_is_sampled_and_its_memory_bounded_whatever_its_size() -> None:
    requests = [[b"k%d" % i for i in range(j * 40, j * 40 + 40)] for j in range(2000)]  # 80k distinct
    curve = CapacityCurve(1_000_000, EXPERTS)
    feed(curve, requests)
    sizes = len(MULTIPLIERS) * len(EXPERTS)
    # Every miniature holds at most SHADOW_PAGES pages, plus what its expert keeps beside them (ARC's
    # and LIRS's ghosts, bounded by their own capacity).
    assert curve.entries() <= sizes * 4 * SHADOW_PAGES
    points = curve.points()
    for p in points:  # scaled back to the whole stream, within sampling error (4 standard errors)
        sampled = 80_000 * min(1.0, SHADOW_PAGES / p.capacity_pages)
        assert p.lookups == pytest.approx(80_000, rel=4 / sampled ** 0.5), p
    assert all(p.hits == 0 for p in points)  # no page is ever looked up twice


def test_lru_is_modelled_by_its_expert_and_several_experts_by_the_best_of_them() -> None:
    assert curve_experts("lru") == (LruExpert,) and curve_policy("lru") is None
    assert curve_experts("heat") == curve_experts("adaptive") == ()  # miniatures of themselves
    requests = chains(300, seed=5)
    best = CapacityCurve(40, EXPERTS)
    alone = [CapacityCurve(40, (cls,)) for cls in EXPERTS]
    feed(best, requests)
    for curve in alone:
        feed(curve, requests)
    for i, point in enumerate(best.points()):
        assert point.hits == max(curve.points()[i].hits for curve in alone)


def test_a_self_evicting_tier_has_no_curve_and_none_is_kept_before_the_first_page() -> None:
    curves = TierCurves([64 << 20, None], "lru")
    curves.on_lookup([b"a", b"b"])
    assert curves.points() == [[], []]
    curves.start(1 << 20)
    curves.on_lookup([b"a", b"b"])
    first, second = curves.points()
    assert [p.capacity_pages for p in first] == [round(64 * m) for m in MULTIPLIERS] and second == []
    assert first[3].lookups == 2


def test_the_store_keeps_curves_only_where_asked_and_reports_them_in_its_stats() -> None:
    page = 1 << 20
    requests = chains(800, seed=9)
    with_curves = Simulator(policy_for_capacities(PolicyConfig(name="lru"), [200 * page]), [200 * page],
                            page, curves=True)
    without = Simulator(policy_for_capacities(PolicyConfig(name="lru"), [200 * page]), [200 * page], page)
    for i, keys in enumerate(requests):
        with_curves.request(keys, float(i))
        without.request(keys, float(i))
    assert "curves" not in without.store.stats()
    points = with_curves.store.stats()["curves"]["points"]["t0"]
    own = next(p for p in points if p["multiplier"] == 1.0)
    # At its own size the curve is the tier as it ran (both LRU, both exact at this size).
    assert own["hits"] / own["lookups"] == pytest.approx(with_curves.result.hit_ratio, abs=0.02)
    assert with_curves.result.hit_ratio == without.result.hit_ratio  # the curves change nothing


@pytest.mark.parametrize("name", ["heat", "adaptive"])
def test_a_policy_is_modelled_by_a_miniature_of_itself_exact_where_it_holds_the_whole_tier(
        name: str) -> None:
    """Every size of a small tier is sampled at rate 1: the miniature is the policy alone on the
    whole stream at that size, fed what the store feeds it, so each point is the store's replay."""
    page = 1 << 20
    requests = chains(1200, seed=3)
    config = PolicyConfig(name=name)
    curve = CapacityCurve(120, curve_experts(name), policy=curve_policy(name, config))
    feed(curve, requests)
    points = curve.points()
    assert [p.multiplier for p in points] == list(MULTIPLIERS)
    for point in points:
        pages = point.capacity_pages
        exact = Simulator(policy_for_capacities(config, [pages * page]), [pages * page], page)
        for i, keys in enumerate(requests):
            exact.request(keys, float(i))
        assert (point.hits, point.lookups) == (exact.result.hit_pages, exact.result.lookup_pages), point
    # Not LRU's curve (the stand-in heat had before): their hits differ at the tier's own size.
    assert points[3].hits != lru_prefix_hits(requests, 120)[0]


def test_a_policys_miniature_runs_with_the_policys_own_config() -> None:
    from mooncake_sgl.policy.curve import curve_policy

    config = PolicyConfig(name="heat", probation_fraction=0.3, admission_min_hits=3)
    assert curve_policy("heat", config)(64).config == config
    assert curve_policy("adaptive")(64).config == PolicyConfig(name="adaptive")
    assert curve_policy("lru") is None  # modelled by its expert
