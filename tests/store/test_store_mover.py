"""Placement work off SGLang's threads: the background mover (bounded, urgent lane, clean shutdown),
the lossy lookup buffer, shared tiers written beside local ones, and thread-safe counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from mooncake_sgl.api import PageKey, PageView, PutResult, Tier, TierCapabilities
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.store.mover import BackgroundMover
from mooncake_sgl.store.residency import LOOKUP_BUFFER, Residency
from mooncake_sgl.store.stats import MoverStats
from mooncake_sgl.tally import Tally
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.ssd import LmdbTier
from tests.store_record import policy_residents, resident_keys
from tests.tiers.conformance import empty_like, key, make_page, same
from tests.wrapped_tier import WrappedTier

SEG = 8 * 1024
PAGE = 2 * SEG


def blocked_mover(capacity: int = 4) -> tuple[BackgroundMover, threading.Event]:
    """A mover whose thread is parked in a task until the returned event is set."""
    mover = BackgroundMover(capacity=capacity)
    go, parked = threading.Event(), threading.Event()

    def park() -> None:
        parked.set()
        go.wait(10)

    assert mover.submit(park)
    assert parked.wait(10)
    return mover, go


def test_a_full_queue_refuses_work_instead_of_blocking_the_caller() -> None:
    mover, go = blocked_mover(capacity=2)
    try:
        ran: list[int] = []
        assert [mover.submit(ran.append, i) for i in range(4)] == [True, True, False, False]
        assert mover.counters["dropped"] == 2
        go.set()
        assert mover.drain()
        assert ran == [0, 1]
    finally:
        go.set()
        mover.close()


def test_a_waited_for_task_runs_before_queued_ones() -> None:
    mover, go = blocked_mover()
    order: list[str] = []
    try:
        mover.submit(order.append, "queued-1")
        mover.submit(order.append, "queued-2")
        result: list[str] = []
        waiter = threading.Thread(target=lambda: result.append(
            mover.call(lambda: order.append("urgent") or "done", default="timeout", timeout=10)))
        waiter.start()
        time.sleep(0.05)  # the waiter's task is queued behind the parked one
        go.set()
        waiter.join(10)
        assert mover.drain()
        assert result == ["done"] and order == ["urgent", "queued-1", "queued-2"]
    finally:
        go.set()
        mover.close()


def test_close_cancels_queued_work_answers_waiters_and_joins() -> None:
    mover, go = blocked_mover()
    ran: list[int] = []
    mover.submit(ran.append, 1)
    answers: list[str] = []
    waiter = threading.Thread(target=lambda: answers.append(
        mover.call(lambda: "ran", default="cancelled", timeout=10)))
    waiter.start()
    time.sleep(0.05)
    closer = threading.Thread(target=mover.close)
    closer.start()
    time.sleep(0.05)
    go.set()  # the running task finishes; nothing queued runs after it
    closer.join(10)
    waiter.join(10)
    assert not closer.is_alive() and not mover._thread.is_alive()
    assert ran == [] and answers == ["cancelled"]
    assert mover.submit(ran.append, 2) is False
    assert mover.call(lambda: "late", default="closed", timeout=1) == "closed"


def test_a_failing_task_is_counted_and_the_mover_keeps_running() -> None:
    mover = BackgroundMover()
    try:
        assert mover.call(lambda: 1 / 0, default=-1, timeout=10) == -1
        assert mover.call(lambda: 7, default=-1, timeout=10) == 7
        assert mover.counters["failed"] == 1
    finally:
        mover.close()


class ThreadLog(WrappedTier):
    """A real tier that records which thread wrote into it, and can declare itself shared."""

    def __init__(self, inner: Tier, shared: bool = False) -> None:
        super().__init__(inner)
        self.capabilities = (TierCapabilities(shared=True, self_evicting=True) if shared
                             else inner.capabilities)
        self.writers: list[str] = []
        self.started = threading.Event()
        self.wait_for: threading.Event | None = None

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *, soft_pin=None) -> PutResult:
        self.writers.append(threading.current_thread().name)
        self.started.set()
        if self.wait_for is not None:
            self.wait_for.wait(2)
        return self.inner.put_from(keys, pages)


def host(pages: int) -> HostTier:
    return HostTier(HostTierConfig(capacity=pages * PAGE, slot_size=PAGE, pin_memory=False))


class WriteBackLru(LruPolicy):
    def admit(self, keys, tier):
        return [tier == 0] * len(keys)


def test_promotion_and_demotion_io_runs_on_the_mover_not_on_the_callers_thread(tmp_path: Path) -> None:
    dram, disk = ThreadLog(host(4)), ThreadLog(LmdbTier(LmdbTierConfig(path=str(tmp_path / "db"))))
    store = TieredStore([dram, disk], WriteBackLru(2))
    caller = threading.current_thread().name
    try:
        pages = {i: make_page(i, SEG) for i in range(8)}
        for i in range(8):  # DRAM holds 4: the first pages are demoted into LMDB on the mover
            assert store.put_from([key(i)], [pages[i]]) == [True]
            assert store.drain()
        assert disk.writers and caller not in disk.writers
        dram.writers.clear()
        for _ in range(2):  # found in LMDB; the second read, within reach, is promoted
            assert store.get_into([key(0)], [empty_like(pages[0])]) == [True]
            assert store.drain()
        assert dram.writers and caller not in dram.writers  # promoted into DRAM by the mover
    finally:
        store.close()


def test_a_shared_tier_is_written_alongside_the_local_one_not_after_it() -> None:
    # The local tier's write waits (up to 2 s) for the shared tier's write to start: written one
    # after the other, the shared write would only start once the local one gave up waiting.
    local, shared = ThreadLog(host(8)), ThreadLog(host(8), shared=True)
    local.wait_for = shared.started
    store = TieredStore([local, shared], LruPolicy(2))
    try:
        t0 = time.monotonic()
        assert store.put_from([key(1)], [make_page(1, SEG)]) == [True]
        assert time.monotonic() - t0 < 1.5
        assert shared.contains([key(1)]) == [True]  # readable there when put_from returned
    finally:
        store.close()


def test_the_lookup_buffer_drops_the_oldest_lookups_instead_of_blocking() -> None:
    policy = LruPolicy(1)
    seen: list[PageKey] = []
    policy.on_lookup = lambda keys, tiers, parent=None: seen.extend(keys)  # type: ignore[method-assign]
    residency = Residency(policy, [True], clock=lambda: 0.0)
    for i in range(LOOKUP_BUFFER + 10):
        residency.record_lookup([key(i)], [None], None)
    assert seen == []  # recorded, not applied
    residency.maintain()
    assert seen == [key(i) for i in range(10, LOOKUP_BUFFER + 10)]
    assert residency.counters["lookups_dropped"] == 10


def test_counters_lose_no_increments_across_threads() -> None:
    counters = Tally(MoverStats)

    def bump() -> None:
        for _ in range(20_000):
            counters.add(submitted=1, completed=2)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert counters.snapshot() == MoverStats(submitted=80_000, completed=160_000)
    with pytest.raises(KeyError, match="MoverStats has no count c"):
        counters.add(c=1)


class StalledPeer(WrappedTier):
    """A remote tier whose peer stops answering: calls already in flight hang until ``release``;
    once the tier knows it is cut off (``cut``), new calls are quick misses, as the Mooncake Store
    tier's are after its master is lost."""

    def __init__(self, inner: Tier) -> None:
        super().__init__(inner)
        self.cut = False
        self.hanging = threading.Event()
        self.release = threading.Event()

    def reachable(self) -> bool:
        return not self.cut

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *, soft_pin=None) -> PutResult:
        if self.cut:
            return PutResult.missed(len(keys))
        self.hanging.set()
        self.release.wait(20)
        return PutResult.missed(len(keys))


def test_a_write_needing_room_does_not_wait_for_a_mover_stuck_on_a_lost_peer() -> None:
    # The mover demotes a victim into the remote tier just as its peer dies: that call hangs for the
    # peer's RPC timeout. A write that then needs room in DRAM must not queue behind it (it waited
    # up to ``room_wait``, 5 s, on SGLang's thread): a victim bound for a tier known to be cut off
    # is dropped at once, as its copy would only fail.
    dram, peer = host(4), StalledPeer(host(16))
    store = TieredStore([dram, peer], WriteBackLru(2))
    try:
        for i in range(4):
            assert store.put_from([key(i)], [make_page(i, SEG)]) == [True]
        assert peer.hanging.wait(10), "the mover never started a demotion"
        peer.cut = True
        pages = {i: make_page(i, SEG) for i in range(10, 13)}
        for i, page in pages.items():
            t0 = time.monotonic()
            assert store.put_from([key(i)], [page]) == [True]
            assert time.monotonic() - t0 < 1.0, f"a write waited {time.monotonic() - t0:.2f}s"
        out = empty_like(pages[12])
        assert store.get_into([key(12)], [out]) == [True] and same(out, pages[12])
        assert store.stats().tiers[dram.name].placement.demotion_failures >= 3  # dropped, counted
    finally:
        peer.release.set()
        store.close()


def test_victims_whose_copy_the_mover_never_runs_go_back_to_the_policy(tmp_path: Path) -> None:
    # A write racing the store's close: the victims it chose need a copy into LMDB, and the closed
    # mover answers at once without running it. They were left leaving for good, out of the
    # policy's view with their bytes still in DRAM; now the write gives them back.
    dram, disk = host(4), LmdbTier(LmdbTierConfig(path=str(tmp_path / "db")))
    store = TieredStore([dram, disk], WriteBackLru(2))
    try:
        for i in range(5):
            assert store.put_from([key(i)], [make_page(i, SEG)]) == [True]
            assert store.drain()
        store._mover.close()
        for i in range(5, 7):  # DRAM is full now: the second needs a victim copied down
            store.put_from([key(i)], [make_page(i, SEG)])
        held = {k for k, _ in dram.scan()}
        assert len(held) == 4
        assert policy_residents(store.policy, 0) == resident_keys(store, 0) == held
        assert store.stats().tiers[dram.name].placement.eviction_aborts >= 1
    finally:
        store.close()


# ---------------------------------------------------------------------------------- close

def parked(store: TieredStore) -> threading.Event:
    """Park the store's mover in a task until the returned event is set: placement work queued
    meanwhile is certainly still queued."""
    go, running = threading.Event(), threading.Event()

    def park() -> None:
        running.set()
        go.wait(10)

    assert store._mover.submit(park)
    assert running.wait(10)
    return go


def wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def fill_dram_with_a_demotion_queued(store: TieredStore) -> dict[int, list[memoryview]]:
    """Fill a 4-page DRAM tier: the mover's headroom task, queued behind the parked one, is to
    demote the oldest pages into LMDB."""
    pages = {i: make_page(i, SEG) for i in range(4)}
    for i, p in pages.items():
        assert store.put_from([key(i)], [p]) == [True]
    return pages


def on_disk(path: Path, pages: dict[int, list[memoryview]]) -> dict[int, bool]:
    """Which ``pages`` a store opened afresh over the LMDB files in ``path`` reads back byte-exact."""
    store = TieredStore([host(4), LmdbTier(LmdbTierConfig(path=str(path)))], WriteBackLru(2))
    try:
        outs = {i: empty_like(p) for i, p in pages.items()}
        ok = store.get_into([key(i) for i in outs], list(outs.values()))
        return {i: good and same(pages[i], outs[i]) for i, good in zip(outs, ok)}
    finally:
        store.close()


def drain_then_close(store: TieredStore, drain_s: float) -> None:
    """What a detach does (``MooncakeSglStorage.close``)."""
    store.drain(drain_s)
    store.close()


def close_once(close: Callable[[], None], ready: Callable[[], bool], go: threading.Event) -> None:
    """Run ``close`` on a thread until ``ready``, then release the mover's parked task (a close
    waits for a running task) and see the close end."""
    closer = threading.Thread(target=close)
    closer.start()
    wait_for(ready)
    go.set()
    closer.join(10)
    assert not closer.is_alive()


def test_close_after_a_drain_keeps_the_queued_demotions_in_the_persistent_tier(tmp_path: Path) -> None:
    disk = LmdbTier(LmdbTierConfig(path=str(tmp_path / "db")))
    store = TieredStore([host(4), disk], WriteBackLru(2))
    go = parked(store)
    try:
        pages = fill_dram_with_a_demotion_queued(store)
        assert disk.contains([key(i) for i in pages]) == [False] * 4
        queued = len(store._mover._queued)
        # Ready once the drain's barrier is queued behind the demotion.
        close_once(lambda: drain_then_close(store, 10.0), lambda: len(store._mover._queued) > queued, go)
    finally:
        go.set()
        store.close()
    kept = on_disk(tmp_path / "db", pages)
    assert kept[0], kept  # the oldest page went down; DRAM's copies are gone


def test_close_without_a_drain_drops_the_queued_demotions(tmp_path: Path, caplog) -> None:
    store = TieredStore([host(4), LmdbTier(LmdbTierConfig(path=str(tmp_path / "db")))], WriteBackLru(2))
    go = parked(store)
    try:
        pages = fill_dram_with_a_demotion_queued(store)
        caplog.set_level("INFO", logger="mooncake_sgl.store.tiered_store")
        close_once(store.close, lambda: store._mover.counters["dropped"] > 0, go)
    finally:
        go.set()
        store.close()
    assert "closed with 1 placement tasks still queued" in caplog.text
    assert not any(on_disk(tmp_path / "db", pages).values())


def test_a_drain_that_times_out_says_so_and_close_still_completes(tmp_path: Path, caplog) -> None:
    store = TieredStore([host(4), LmdbTier(LmdbTierConfig(path=str(tmp_path / "db")))], WriteBackLru(2))
    go = parked(store)
    try:
        fill_dram_with_a_demotion_queued(store)
        t0 = time.monotonic()
        assert store.drain(0.2) is False
        assert time.monotonic() - t0 < 5
        caplog.set_level("INFO", logger="mooncake_sgl.store.tiered_store")
        close_once(lambda: drain_then_close(store, 0.2), lambda: store._mover.counters["dropped"] > 0, go)
        # The headroom task was dropped; the drains' barriers are no tasks.
        assert "closed with 1 placement tasks still queued" in caplog.text
    finally:
        go.set()
        store.close()
