"""``PromotionReach``: promote a page found below tier 0 only if its last use lies within tier 0's
turnover."""

from __future__ import annotations

import pytest

from mooncake_sgl.policy.promotion_reach import PromotionReach

PAGE = 100


def k(i: int) -> bytes:
    return b"p%d" % i


def test_a_cycle_longer_than_tier_0_is_never_promoted_and_a_page_reused_soon_is() -> None:
    reach = PromotionReach(capacity_bytes=4 * PAGE)
    # Eight conversations' pages written in turn; each comes back after the seven others: the
    # distance (7 pages) is past tier 0's 4, every round.
    for i in range(8):
        reach.arrived([k(i)], [PAGE])
    for _ in range(3):
        for i in range(8):
            assert not reach.judge(k(i))
            reach.arrived([k(100 + i)], [PAGE])  # the turn's new page
    # A page read twice with little written in between: its second read is within reach.
    assert not reach.judge(k(3))
    reach.arrived([k(200)], [PAGE])
    assert reach.judge(k(3))


def test_a_page_never_seen_is_not_promoted_and_reads_do_not_move_the_clock() -> None:
    reach = PromotionReach(capacity_bytes=2 * PAGE)
    assert not reach.judge(k(1))  # unknown: its first read is its first use
    for _ in range(100):  # reads alone: nothing arrives in tier 0, the distance stays 0
        assert reach.judge(k(1))


def test_a_lookup_hit_in_tier_0_is_a_use() -> None:
    reach = PromotionReach(capacity_bytes=3 * PAGE)
    reach.arrived([k(1)], [PAGE])
    reach.arrived([k(2), k(3)], [PAGE, PAGE])
    reach.used([k(1)])  # found in tier 0 by a lookup
    reach.arrived([k(4), k(5)], [PAGE, PAGE])
    assert reach.judge(k(1))  # 2 pages since its use, under 3
    reach.arrived([k(6), k(7), k(8)], [PAGE] * 3)
    assert not reach.judge(k(2))  # 6 pages since it was written


def test_stamps_older_than_the_reach_are_dropped_and_the_count_is_bounded() -> None:
    reach = PromotionReach(capacity_bytes=4 * PAGE, max_tracked=50)
    for i in range(1000):
        reach.arrived([k(i)], [PAGE])
    assert reach.tracked() <= 5  # only those within 4 pages of the clock can still qualify
    for i in range(1000):  # reads of unknown pages: no clock movement, the cap holds
        reach.judge(k(10_000 + i))
    assert reach.tracked() == 50


@pytest.mark.parametrize("capacity,share", [(0, 1.0), (-5, 1.0), (100, 0.0), (100, -1.0)])
def test_a_capacity_or_reach_that_is_not_positive_is_refused(capacity: int, share: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        PromotionReach(capacity, reach=share)
