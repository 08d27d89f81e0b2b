"""Snapshot arithmetic every reader relies on: diff across a restart, hit shares, rank sums."""

from __future__ import annotations

import pytest

from mooncake_sgl.metrics.model import Snapshot, TierSample, diff, rows


def snap(taken: float, **tiers: TierSample) -> Snapshot:
    return Snapshot({("tp0_pp0_dp0_cp0", name): s for name, s in tiers.items()}, taken)


def test_diff_subtracts_counters_and_keeps_the_latest_gauges() -> None:
    before = snap(1.0, host=TierSample(hits=10, read_bytes=100, resident_pages=5, capacity_bytes=64))
    after = snap(2.0, host=TierSample(hits=15, read_bytes=180, resident_pages=3, capacity_bytes=64))
    d = diff(before, after).by_tier()["host"]
    assert (d.hits, d.read_bytes) == (5, 80)
    assert (d.resident_pages, d.capacity_bytes) == (3, 64)


def test_diff_counts_a_restarted_process_from_zero() -> None:
    # A rank restarted between the scrapes: its counters went down. Like Prometheus' increase(),
    # what it counted since the restart is the increase, never a negative number.
    before = snap(1.0, lmdb=TierSample(hits=100))
    after = snap(2.0, lmdb=TierSample(hits=7))
    assert diff(before, after).by_tier()["lmdb"].hits == 7


def test_hit_shares_are_of_every_page_requested_and_add_up_to_one() -> None:
    # 10 pages asked of host: 6 found there; 4 went on to lmdb: 3 found, 1 in no tier.
    s = snap(1.0, host=TierSample(hits=6, misses=4, position=0),
             lmdb=TierSample(hits=3, misses=1, position=1))
    shares = {r.tier: r.hit_share for r in rows(s)}
    assert shares == pytest.approx({"host": 0.6, "lmdb": 0.3, "miss": 0.1})
    assert list(shares) == ["host", "lmdb", "miss"]


def test_ranks_are_summed_per_tier() -> None:
    s = Snapshot({("tp0_pp0_dp0_cp0", "host"): TierSample(hits=2, resident_bytes=10),
                  ("tp1_pp0_dp0_cp0", "host"): TierSample(hits=3, resident_bytes=20)}, 0.0)
    host = s.by_tier()["host"]
    assert (host.hits, host.resident_bytes) == (5, 30)
