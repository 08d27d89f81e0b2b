"""Frequency sketches, white-box: each test says which property the heat policy relies on."""

from __future__ import annotations

import pytest

from mooncake_sgl.policy.sketch import (
    DEPTH,
    MAX_COUNT,
    MAX_WIDTH,
    SAMPLE_PER_PAGE,
    DecayingSketch,
    FrequencySketch,
    make_sketch,
)


def k(i: int) -> bytes:
    return b"page-" + i.to_bytes(8, "big")


def test_count_min_never_undercounts_before_aging():
    # Admission compares estimates with small thresholds (2): an undercount would refuse a page
    # that really was reused.
    s = FrequencySketch(1000)
    for i in range(300):
        for _ in range(i % 5 + 1):
            s.increment(k(i))
    assert all(s.estimate(k(i)) >= i % 5 + 1 for i in range(300))
    assert s.estimate(k(10_000)) <= 1  # an unseen key is (almost surely) cold


def test_count_min_saturates_at_four_bits():
    s = FrequencySketch(100)
    for _ in range(40):
        s.increment(k(1))
    assert s.estimate(k(1)) == MAX_COUNT


def test_count_min_ages_by_halving_after_the_sample_period():
    # Aging is what lets a once-hot page become a victim; without it a burst pins pages forever.
    s = FrequencySketch(10)
    for _ in range(12):
        s.increment(k(1))
    before = s.estimate(k(1))
    stamp = s.stamp()
    filler = 0
    while s.stamp() == stamp:  # other pages' accesses fill the period
        s.increment(k(100 + filler % 50))
        filler += 1
    assert filler <= SAMPLE_PER_PAGE * 10
    assert s.estimate(k(1)) == before // 2


def test_increment_floor_raises_to_at_least_the_floor():
    s = FrequencySketch(100)
    assert s.increment(k(1), floor=7) == 7
    assert s.estimate(k(1)) == 7
    assert s.increment(k(1), floor=3) == 8  # a floor below the count still counts one access


def test_memory_is_fixed_however_many_pages_are_seen():
    s = FrequencySketch(1000)
    size = s.memory_bytes()
    for i in range(200_000):
        s.increment(k(i))
    assert s.memory_bytes() == size
    huge = FrequencySketch(10**9)  # a petabyte of small pages still gets a bounded sketch
    assert huge.memory_bytes() == DEPTH * MAX_WIDTH


def test_ensure_capacity_only_grows():
    s = FrequencySketch(100)
    small = s.memory_bytes()
    s.increment(k(1))
    s.ensure_capacity(50)
    assert s.memory_bytes() == small and s.estimate(k(1)) == 1  # no reset when already big enough
    s.ensure_capacity(100_000)
    assert s.memory_bytes() > small


def test_decaying_sketch_halves_per_half_life():
    s = DecayingSketch(100, half_life=10.0)
    for _ in range(4):
        s.increment(k(1))
    assert s.estimate(k(1)) == pytest.approx(4.0)
    s.advance(10.0)
    assert s.estimate(k(1)) == pytest.approx(2.0)
    s.advance(30.0)
    assert s.estimate(k(1)) == pytest.approx(0.5)
    s.increment(k(1))
    assert s.estimate(k(1)) == pytest.approx(1.5)


def test_decaying_sketch_survives_rescaling():
    # Weights grow as 2**(t / half_life); the table is rescaled before floats overflow.
    s = DecayingSketch(100, half_life=1.0)
    s.increment(k(1))
    for t in range(1, 2000, 50):
        s.advance(float(t))
        s.increment(k(2))
    s.increment(k(1))
    assert s.estimate(k(1)) == pytest.approx(1.0)
    assert 1.0 <= s.estimate(k(2)) < 2.0


def test_make_sketch_rejects_unknown_kinds():
    assert isinstance(make_sketch("count_min", 10, 60.0), FrequencySketch)
    assert isinstance(make_sketch("decay", 10, 60.0), DecayingSketch)
    with pytest.raises(ValueError, match="unknown sketch kind"):
        make_sketch("lfu", 10, 60.0)
