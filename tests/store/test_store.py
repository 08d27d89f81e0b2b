"""TieredStore over real tiers (host DRAM + LMDB files): cascade reads, write-through, eviction
with demotion, promotion, warm restart, and failures turned into misses. Each behaviour runs with
placement work on the background mover (the product) and inline (the simulator's mode)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mooncake_sgl.api import STATS_SHAPE
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig, StoreConfig
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore, build_store
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.ssd import LmdbTier
from tests.page_cache import drop_from
from tests.store_record import policy_residents, resident_keys
from tests.tiers.conformance import empty_like, key, make_page, same
from tests.wrapped_tier import SizeBlind

SEG = 8 * 1024  # a page is two segments: 16 KiB


def host(pages: int) -> HostTier:
    return HostTier(HostTierConfig(capacity=pages * 2 * SEG, slot_size=2 * SEG, pin_memory=False))


def lmdb(path: Path, direct_io: str = "auto") -> LmdbTier:
    return LmdbTier(LmdbTierConfig(path=str(path), capacity="64MiB", sync=False, direct_io=direct_io))


@pytest.fixture(params=["background", "inline"])
def store(request, tmp_path: Path):
    s = TieredStore([host(4), lmdb(tmp_path / "db")], LruPolicy(2), mover=request.param)
    yield s
    s.close()


def count(store: TieredStore, t: int, name: str) -> int:
    """A store-side counter of tier ``t`` once queued placement work has run."""
    assert store.drain()
    return store.stats().tiers[store.names[t]].as_dict()["store"][name]


def put(store: TieredStore, ids: range | list[int], batch: int = 2) -> dict[int, list[memoryview]]:
    """Write pages in small batches, as SGLang backs up a growing prefix."""
    pages = {i: make_page(i, SEG) for i in ids}
    ids = list(pages)
    for b in range(0, len(ids), batch):
        chunk = ids[b:b + batch]
        assert store.put_from([key(i) for i in chunk], [pages[i] for i in chunk]) == [True] * len(chunk)
    return pages


def read(store: TieredStore, pages: dict[int, list[memoryview]]) -> list[bool]:
    outs = {i: empty_like(p) for i, p in pages.items()}
    ok = store.get_into([key(i) for i in outs], list(outs.values()))
    for good, (i, out) in zip(ok, outs.items()):
        if good:
            assert same(pages[i], out), f"page {i} came back wrong"
    return ok


def test_write_through_puts_every_page_in_every_admitting_tier(store: TieredStore) -> None:
    put(store, range(3))
    for tier in store.tiers:
        assert tier.contains([key(i) for i in range(3)]) == [True] * 3


def test_overflowing_dram_evicts_lru_and_pages_stay_readable_from_lmdb(store: TieredStore) -> None:
    pages = put(store, range(10))
    assert store.drain()
    assert store.tiers[0].usage().pages <= 4
    assert read(store, pages) == [True] * 10
    assert count(store, 0, "evictions") >= 6


def test_a_page_found_in_lmdb_is_promoted_into_dram_when_read_again_within_reach(store: TieredStore) -> None:
    pages = put(store, range(6))
    assert store.drain()
    assert not store.tiers[0].contains([key(0)])[0]
    # Its first read: DRAM turned over since it was written (that is why it left), so a copy up
    # would likely be evicted unread. Its second read comes with nothing written in between.
    assert read(store, {0: pages[0]}) == [True]
    assert store.drain()
    assert count(store, 0, "promotions") == 0 and not store.tiers[0].contains([key(0)])[0]
    assert store.stats().residency.promotions_beyond_reach == 1
    assert read(store, {0: pages[0]}) == [True]
    assert store.drain()
    assert count(store, 0, "promotions") == 1
    assert store.tiers[0].contains([key(0)]) == [True]
    assert count(store, 1, "hits") == 2


@pytest.mark.parametrize("mover", ["background", "inline"])
def test_a_page_found_in_a_tier_that_cannot_tell_sizes_is_promoted_too(tmp_path: Path, mover: str) -> None:
    """On the mover the page is read again from where it was found, at the size it was read at
    where the tier names none (the pool): before, nothing was read, and no page found in the pool
    ever moved up."""
    store = TieredStore([host(4), SizeBlind(lmdb(tmp_path / "db"))], LruPolicy(2), mover=mover)
    try:
        pages = put(store, range(6))
        assert store.drain()
        assert not store.tiers[0].contains([key(0)])[0]
        for _ in range(2):  # the second read is within reach (see the test above)
            assert read(store, {0: pages[0]}) == [True]
            assert store.drain()
        assert count(store, 0, "promotions") == 1 and store.tiers[0].contains([key(0)]) == [True]
        assert read(store, {0: pages[0]}) == [True]  # from DRAM now, the same bytes
    finally:
        store.close()


def test_exists_prefix_stops_at_first_missing_page(store: TieredStore) -> None:
    put(store, [0, 1, 3])
    assert store.exists_prefix([key(0), key(1), key(2), key(3)]) == 2
    assert store.exists_prefix([key(2), key(3)]) == 0
    assert store.exists_prefix([]) == 0


class WriteBackLru(LruPolicy):
    """Admits pages to DRAM only, so that overflow must demote them into LMDB."""

    def admit(self, keys, tier):
        return [tier == 0] * len(keys)


@pytest.mark.parametrize("mover", ["background", "inline"])
def test_victims_not_yet_in_the_slower_tier_are_demoted_not_lost(tmp_path: Path, mover: str) -> None:
    s = TieredStore([host(4), lmdb(tmp_path / "db")], WriteBackLru(2), mover=mover)
    try:
        pages = put(s, range(9))
        assert s.drain()
        evicted = 9 - s.tiers[0].usage().pages
        assert evicted >= 5
        assert s.tiers[1].contains([key(i) for i in range(5)]) == [True] * 5
        assert count(s, 1, "demotions") == evicted
        assert read(s, pages) == [True] * 9
    finally:
        s.close()


def test_a_page_dropped_by_a_tier_is_found_in_the_next_and_forgotten(store: TieredStore) -> None:
    pages = put(store, range(2))
    store.tiers[0].remove([key(0)])  # e.g. found corrupt by the tier itself
    assert read(store, {0: pages[0]}) == [True]
    assert count(store, 1, "hits") == 1
    # The store learnt the page left tier 0 (and, if promoted back since, that it returned).
    assert resident_keys(store, 0) == {k for k, _ in store.tiers[0].scan()}


def test_a_broken_tier_means_misses_never_exceptions(store: TieredStore) -> None:
    pages = put(store, range(6))  # pages 0, 1 only in LMDB now
    assert store.drain()
    store.tiers[1].close()
    assert read(store, {0: pages[0], 5: pages[5]}) == [False, True]
    assert store.exists_prefix([key(5), key(0)]) == 1
    assert store.put_from([key(7)], [make_page(7, SEG)]) == [True]  # DRAM still takes it


def test_pages_survive_a_restart_and_seed_the_policy(tmp_path: Path) -> None:
    first = TieredStore([host(4), lmdb(tmp_path / "db")], LruPolicy(2))
    pages = put(first, range(5))
    first.close()
    second = TieredStore([host(4), lmdb(tmp_path / "db")], LruPolicy(2))
    try:
        assert second.exists_prefix([key(i) for i in range(5)]) == 5
        assert len(resident_keys(second, 1)) == 5
        assert policy_residents(second.policy, 1) == resident_keys(second, 1)
        assert read(second, pages) == [True] * 5
    finally:
        second.close()


def test_concurrent_puts_gets_and_lookups_return_exact_bytes(store: TieredStore) -> None:
    errors: list[str] = []

    def worker(base: int) -> None:
        ids = list(range(base, base + 4))
        pages = {i: make_page(i, SEG) for i in ids}
        for _ in range(3):  # repeated puts are idempotent; reads race with other threads' evictions
            if store.put_from([key(i) for i in ids], list(pages.values())) != [True] * 4:
                errors.append("put failed")
            store.exists_prefix([key(i) for i in ids])
            outs = [empty_like(p) for p in pages.values()]
            for good, (i, out) in zip(store.get_into([key(i) for i in ids], outs), zip(ids, outs)):
                if not good or not same(pages[i], out):
                    errors.append(f"page {i} missing or wrong")

    threads = [threading.Thread(target=worker, args=(b * 10,)) for b in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_build_store_from_config(tmp_path: Path) -> None:
    config = StoreConfig(tiers=[HostTierConfig(capacity="1MiB", pin_memory=False),
                                LmdbTierConfig(path=str(tmp_path / "db"), capacity="16MiB")])
    s = build_store(config, rank_suffix="tp0")
    try:
        pages = put(s, range(2))
        assert read(s, pages) == [True, True]
        stats = s.stats().as_dict()
        assert tuple(stats) == STATS_SHAPE
        assert set(stats["tiers"]) == {"host", "lmdb"}
        # One namespace per source: the store's and the tier's own ``bytes_written`` both survive.
        host_stats = stats["tiers"]["host"]
        assert host_stats["store"]["bytes_written"] == host_stats["tier"]["bytes_written"] == 2 * 2 * SEG
        assert stats["store"]["lookups"] == 0 and stats["mover"]["background"] == 1
    finally:
        s.close()


@pytest.mark.parametrize("mover", ["background", "inline"])
def test_a_batch_larger_than_dram_is_stored_even_where_the_policy_did_not_admit(tmp_path: Path,
                                                                                mover: str) -> None:
    s = TieredStore([host(4), lmdb(tmp_path / "db")], WriteBackLru(2), mover=mover)
    try:
        pages = put(s, range(6), batch=6)  # asserts every put was acknowledged
        assert s.drain()
        assert s.tiers[0].usage().pages <= 4
        assert read(s, pages) == [True] * 6
    finally:
        s.close()


def test_the_per_tier_counts_of_the_store_s_parts_never_share_a_name() -> None:
    # A tier's "store" entry merges the request paths', the placer's and the promoter's counts;
    # a shared name would silently overwrite one of them.
    from dataclasses import fields

    from mooncake_sgl.store.stats import TierPlacementStats, TierPromotionStats, TierReadStats

    names = [f.name for shape in (TierReadStats, TierPlacementStats, TierPromotionStats)
             for f in fields(shape)]
    assert len(names) == len(set(names))


def test_a_read_within_time_lands_every_segment_of_the_pages_it_found(store: TieredStore) -> None:
    pages = put(store, range(6))  # beyond DRAM: some come from LMDB, through staging memory
    outs = {i: empty_like(p) for i, p in pages.items()}
    ok = store.get_into_within([key(i) for i in [*outs, 99]], [*outs.values(), empty_like(pages[0])], 30.0)
    assert ok == [True] * 6 + [False]
    assert all(same(pages[i], out) for i, out in outs.items())


def test_a_read_within_time_of_pages_in_the_page_cache_needs_no_time_to_spare(tmp_path: Path) -> None:
    # Pages in memory cannot stall: read on the caller's thread, even where no reader thread could
    # have met the bound.
    s = TieredStore([lmdb(tmp_path / "db", "buffered")], LruPolicy(1))
    try:
        pages = put(s, range(4), batch=4)
        outs = [empty_like(pages[i]) for i in range(4)]
        assert s.get_into_within([key(i) for i in range(4)], outs, 0.0) == [True] * 4
        assert all(same(pages[i], out) for i, out in enumerate(outs))
    finally:
        s.close()


def test_a_read_within_time_takes_what_the_page_cache_holds_and_the_rest_from_the_disk(
        tmp_path: Path) -> None:
    s = TieredStore([lmdb(tmp_path / "db", "buffered")], LruPolicy(1))
    try:
        n = (4 << 20) // (2 * SEG)
        pages = put(s, range(n), batch=n)
        # The second half of the pages (extents follow each other from 0).
        drop_from(Path(s.tiers[0].path) / "pages.bin", 2 << 20)
        outs = [empty_like(pages[i]) for i in range(n)]
        assert s.get_into_within([key(i) for i in range(n)], outs, 30.0) == [True] * n
        assert all(same(pages[i], out) for i, out in enumerate(outs))
        reads = s.stats().tiers[s.names[0]].as_dict()["store"]
        assert (reads["hits"], reads["misses"]) == (n, 0)  # pages not in memory were no misses
    finally:
        s.close()


def test_a_closed_store_gives_a_read_within_time_up_at_once(tmp_path: Path) -> None:
    s = TieredStore([host(4)], LruPolicy(1))
    pages = put(s, range(2))
    s.close()
    assert s.get_into_within([key(0)], [empty_like(pages[0])], 30.0) is None
