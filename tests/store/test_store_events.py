"""The store's event stream (``api.StoreEvent``, ``store.observers``): every change to the record of
the managed tiers and every lookup the policy learns from reaches each observer once, in commit
order, after the record's lock is released, one delivery at a time; a failing observer costs only
itself. Real tiers (host DRAM over LMDB files), both movers."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from mooncake_sgl.api import (
    PageKey,
    PagesLookedUp,
    PagesRead,
    PagesRemoved,
    PagesStored,
    RemovalCause,
    StoreEvent,
)
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore
from tests.store.test_store import host, lmdb, put, read
from tests.store_record import resident_keys
from tests.tiers.conformance import key
from tests.wrapped_tier import SizeBlind


class Replica:
    """What an observer can rebuild from the events alone: per tier, the pages there."""

    def __init__(self, store: TieredStore | None = None) -> None:
        self.held: dict[int, set[PageKey]] = {}
        self.events: list[StoreEvent] = []
        self.lookups: list[Sequence[PageKey]] = []
        self.reads: list[PagesRead] = []
        self._store = store
        self._inside = 0
        self.lock_was_free = True

    def on_events(self, events: Sequence[StoreEvent]) -> None:
        self._inside += 1
        assert self._inside == 1, "two deliveries at once"
        if self._store is not None:  # the record's lock is released before observers run
            lock = self._store._residency._lock
            free = lock.acquire(blocking=False)
            if free:
                lock.release()
            self.lock_was_free = self.lock_was_free and free
        for e in events:
            self.events.append(e)
            if isinstance(e, PagesStored):
                assert not self.held.setdefault(e.tier, set()) & set(e.keys), "stored twice"
                self.held[e.tier].update(e.keys)
            elif isinstance(e, PagesRemoved):
                assert set(e.keys) <= self.held.get(e.tier, set()), "removed what was never stored"
                self.held[e.tier] -= set(e.keys)
            elif isinstance(e, PagesLookedUp):
                self.lookups.append(e.keys)
            else:
                self.reads.append(e)
        self._inside -= 1


@pytest.fixture(params=["background", "inline"])
def store(request, tmp_path: Path):
    s = TieredStore([host(4), lmdb(tmp_path / "db")], LruPolicy(2), mover=request.param)
    yield s
    s.close()


def test_an_observer_rebuilds_the_record_of_every_managed_tier_from_the_events(store: TieredStore) -> None:
    replica = Replica(store)
    store.observe(replica)
    rng = random.Random(3)
    pages = put(store, range(12))  # host holds 4: evictions
    for _ in range(40):
        i = rng.randrange(12)
        if rng.random() < 0.2:
            store.remove([key(i)])
            pages.pop(i, None)
        elif i in pages:
            store.exists_prefix([key(i)])
            read(store, {i: pages[i]})
        else:
            pages.update(put(store, [i]))
    assert store.drain()
    store.maintain()
    for t in range(len(store.tiers)):
        assert replica.held.get(t, set()) == resident_keys(store, t)
    assert replica.lock_was_free
    causes = {e.cause for e in replica.events if isinstance(e, PagesRemoved)}
    assert causes == {RemovalCause.EVICTED, RemovalCause.LOST}
    assert len(replica.lookups) == store.stats().lookups.lookups


def test_clear_tells_each_page_cleared(store: TieredStore) -> None:
    replica = Replica()
    store.observe(replica)
    put(store, range(3))
    assert store.drain()
    store.clear()
    cleared = [e for e in replica.events if isinstance(e, PagesRemoved)]
    assert {e.cause for e in cleared} == {RemovalCause.CLEARED}
    assert all(not keys for keys in replica.held.values())


def test_lookups_reach_observers_in_order_once_applied_to_the_policy(store: TieredStore) -> None:
    replica = Replica()
    store.observe(replica)
    put(store, range(2))
    for i in range(5):
        store.exists_prefix([key(i), key(i + 1)])
    store.maintain()
    assert [list(k) for k in replica.lookups] == [[key(i), key(i + 1)] for i in range(5)]
    assert all(isinstance(e, (PagesStored, PagesRemoved, PagesLookedUp, PagesRead)) for e in replica.events)


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    def on_events(self, events: Sequence[StoreEvent]) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")


def test_an_observer_that_raises_costs_only_itself(store: TieredStore, caplog) -> None:
    failing, replica = Failing(), Replica()
    store.observe(failing)
    store.observe(replica)
    pages = put(store, range(6))
    assert read(store, pages) == [True] * 6
    assert store.drain()
    assert failing.calls > 1  # it goes on receiving
    assert replica.held[0] == resident_keys(store, 0)
    assert "store observer Failing failed" in caplog.text


def test_threads_writing_at_once_deliver_one_at_a_time_and_lose_nothing(tmp_path: Path) -> None:
    store = TieredStore([host(64), lmdb(tmp_path / "db")], LruPolicy(2))
    replica = Replica(store)
    store.observe(replica)
    try:
        def writer(base: int) -> None:
            for i in range(base, base + 40, 2):
                put(store, [i, i + 1])
                store.exists_prefix([key(i)])

        threads = [threading.Thread(target=writer, args=(b,)) for b in (0, 1000, 2000, 3000)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert store.drain()
        store.maintain()
        for t in range(len(store.tiers)):
            assert replica.held.get(t, set()) == resident_keys(store, t)
    finally:
        store.close()


class Reporting:
    section = "counted"

    def __init__(self) -> None:
        self.n = 0

    def on_events(self, events: Sequence[StoreEvent]) -> None:
        self.n += len(events)

    def stats(self) -> dict[str, int]:
        return {"events": self.n}


def test_a_reporting_observer_adds_its_own_section_to_the_stats(store: TieredStore) -> None:
    reporting = Reporting()
    store.observe(reporting)
    put(store, range(2))
    assert store.drain()
    assert store.stats().sections["counted"] == {"events": reporting.n} and reporting.n > 0


def test_an_observer_added_later_can_start_from_what_the_tiers_hold(tmp_path: Path) -> None:
    first = TieredStore([host(4), lmdb(tmp_path / "db")], LruPolicy(2), mover="inline")
    put(first, range(6))
    first.close()
    store = TieredStore([host(4), lmdb(tmp_path / "db")], LruPolicy(2), mover="inline")  # a restart
    try:
        late, plain = Replica(store), Replica()
        store.observe(late, with_current=True)
        store.observe(plain)
        pages = put(store, range(6, 10))
        assert read(store, pages) == [True] * 4
        for t in range(len(store.tiers)):
            assert late.held.get(t, set()) == resident_keys(store, t)
        assert plain.held.get(1, set()) == {key(i) for i in range(6, 10)}  # only what happened since
    finally:
        store.close()


def test_every_tier_read_is_told_with_its_bytes_and_time(store: TieredStore) -> None:
    replica = Replica()
    store.observe(replica)
    pages = put(store, range(4))
    assert read(store, pages) == [True] * 4
    assert store.drain()
    reads = replica.reads
    assert reads and reads[0].tier == 0 and reads[0].asked == 4
    # Each page is read from the fastest tier holding it; misses pass on to the next tier.
    assert sum(e.pages for e in reads) == 4
    assert all(e.asked >= e.pages and e.seconds > 0 for e in reads)
    assert sum(e.nbytes for e in reads) == sum(p.nbytes for page in pages.values() for p in page)


def test_a_tier_that_cannot_tell_sizes_is_probed_at_the_size_the_caller_stored(tmp_path: Path) -> None:
    store = TieredStore([host(4), SizeBlind(lmdb(tmp_path / "db"))], LruPolicy(2))
    try:
        pages = put(store, range(4))
        assert store.drain()
        replica = Replica()
        store.observe(replica)
        nbytes = sum(p.nbytes for p in pages[0])
        store.probe_reads(1, [key(i) for i in range(4)] + [b"no-such-page"], nbytes)
        assert store.drain()
        [e] = replica.reads
        assert (e.tier, e.asked, e.pages) == (1, 5, 4)  # the absent key is read too, and misses
        assert e.nbytes == 4 * nbytes and e.probe
    finally:
        store.close()


def test_a_probe_read_one_call_each_tells_a_read_per_page_in_order(store: TieredStore) -> None:
    pages = put(store, range(3))
    assert store.drain()
    replica = Replica()
    store.observe(replica)
    store.probe_reads(1, [key(i) for i in range(3)], 1 << 20, one_call_each=True)
    assert store.drain()
    assert [(e.tier, e.asked, e.pages, e.probe) for e in replica.reads] == [(1, 1, 1, True)] * 3
    assert [e.nbytes for e in replica.reads] == [sum(p.nbytes for p in pages[i]) for i in range(3)]


def test_a_probe_read_is_told_like_a_read_and_changes_nothing_else(store: TieredStore) -> None:
    replica = Replica()
    pages = put(store, range(4))
    assert store.drain()
    store.observe(replica)
    before = store.stats()
    store.probe_reads(1, [key(i) for i in range(4)] + [b"no-such-page"], 1 << 20)
    assert store.drain()
    [e] = replica.reads
    assert (e.tier, e.asked, e.pages) == (1, 4, 4)  # the absent key is not read at all
    assert e.nbytes == sum(p.nbytes for page in pages.values() for p in page)
    after = store.stats()
    assert (after.lookups, after.residency) == (before.lookups, before.residency)
    assert not replica.lookups  # no lookup, no heat
