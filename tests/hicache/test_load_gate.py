"""``batch_exists`` reports a hit only as far as loading it beats recomputing it (``load_gate``).

Real SGLang host pools and a real LMDB tier; the tier's read rate is what its real reads took. The
scheduler is the one stand-in: an object with SGLang 0.5.23's two prefill totals, handed to the
prefill clock as the touch point's hook hands the real one.
"""

from __future__ import annotations

import time

import pytest

from devtools.testing.backend_record import store_stats
from mooncake_sgl.api import PagesRead
from mooncake_sgl.hicache import prefill_clock
from mooncake_sgl.metrics.source import gate_counters
from mooncake_sgl.policy import load_gate
from mooncake_sgl.pool.config import PoolServerConfig
from mooncake_sgl.pool.server import PoolServer

from . import pools
from .pools import PAGE

PAGES = 8


class Scheduler:
    """SGLang 0.5.23's prefill totals (``Scheduler._record_step_counters``), and nothing else."""

    def __init__(self) -> None:
        self.total_prefill_uncached_tokens = 0
        self.total_prefill_busy_us = 0


@pytest.fixture
def scheduler(monkeypatch):
    """A scheduler whose totals the test advances; gone again at teardown."""
    s = Scheduler()
    prefill_clock._remember(None, s)
    yield s
    monkeypatch.setattr(prefill_clock, "_scheduler", None)


def lmdb_only(root) -> dict:
    return {"tiers": [{"kind": "lmdb", "path": str(root / "lmdb"), "capacity": "64MiB"}],
            "policy": {"name": "lru"}}


def stored(make_backend, tmp_path, gate: dict | None = None):
    extra = lmdb_only(tmp_path) | ({"load_gate": gate} if gate is not None else {})
    backend, pool = make_backend("mha", "page_first", extra=extra)
    return backend, stored_in(backend, pool)


def stored_in(backend, pool) -> list[str]:
    """``PAGES`` pages stored and read once (the tier's read rate); their hashes."""
    keys = pools.page_hashes(PAGES, seed=11)
    src = pool.alloc(PAGES * PAGE)
    pools.fill_random(pool, src, seed=12)
    assert backend.batch_set_v1(keys, src) == [True] * PAGES
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [True] * PAGES
    return keys


def computes(scheduler, tokens: int, seconds_per_token: float, backend, keys) -> None:
    """The server computed ``tokens`` at that rate; the gate reads the totals at each lookup."""
    backend.batch_exists(keys[:1])
    scheduler.total_prefill_uncached_tokens += tokens
    scheduler.total_prefill_busy_us += int(tokens * seconds_per_token * 1e6)


def test_a_hit_slower_to_load_than_to_recompute_is_not_reported(make_backend, tmp_path, scheduler) -> None:
    backend, keys = stored(make_backend, tmp_path)
    computes(scheduler, 4096, 1e-9, backend, keys)  # recomputing is (absurdly) fast
    assert backend.batch_exists(keys) == 0
    counters = gate_counters(store_stats(backend)["load_gate"])
    assert counters["gate_declined_lookups"] >= 1 and counters["gate_declined_pages"] >= PAGES


def test_a_hit_faster_to_load_is_reported_whole(make_backend, tmp_path, scheduler) -> None:
    backend, keys = stored(make_backend, tmp_path)
    computes(scheduler, 4096, 1.0, backend, keys)  # a second per token
    assert backend.batch_exists(keys) == PAGES
    assert gate_counters(store_stats(backend)["load_gate"])["gate_declined_lookups"] == 0


def old_evidence(monkeypatch) -> None:
    """As if every tier's newest read were long ago: reads are judged again, older ones forgotten."""
    monkeypatch.setattr(load_gate, "STALE_S", 0.0)
    monkeypatch.setattr(load_gate, "_READ_HALF_LIFE_S", 1e-3)


def judged_again(make_backend, tmp_path, scheduler, monkeypatch):
    """An LMDB-only backend whose hit is admitted (16 ms a page to recompute: a read is given up
    after 12.8 ms) and read again as if its evidence were old."""
    backend, pool = make_backend("mha", "page_first", extra=lmdb_only(tmp_path))
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1e-3, backend, keys)
    assert backend.batch_exists(keys) == PAGES
    old_evidence(monkeypatch)
    return backend, pool, keys


def uncached(tier, monkeypatch) -> None:
    """None of the LMDB tier's pages are in the page cache (as after it was dropped): every read
    waits on the disk, which the tests slow down."""
    monkeypatch.setattr(tier, "get_into_cached", lambda keys, pages: [False] * len(keys))


def slowed(backend, monkeypatch, seconds_per_call: float, after: int = 0,
           per_page: bool = False) -> list[int]:
    """The LMDB tier's disk turns slow: every read call past the first ``after`` waits first (that
    long a page, ``per_page``). Returns the pages per call."""
    tier = backend._store.tiers[0]
    uncached(tier, monkeypatch)
    inner, calls = tier.get_into, []

    def slow(keys, pages):
        calls.append(len(keys))
        if len(calls) > after:
            time.sleep(seconds_per_call * (len(keys) if per_page else 1))
        return inner(keys, pages)

    monkeypatch.setattr(tier, "get_into", slow)
    return calls


def never_long(monkeypatch) -> None:
    """No read of the test is long enough to judge the disk by: on a loaded host a fast read, handed
    to the store's reader thread, can take 100 ms, which would end the doubling steps the test
    counts."""
    monkeypatch.setattr(load_gate, "SLOW_FIRST_READ_S", 60.0)


def never_given_up(monkeypatch) -> None:
    """Nor long enough to be given up."""
    monkeypatch.setattr(load_gate, "GIVE_UP_SHARE", 100.0)


def test_a_hit_whose_disk_turned_slow_is_given_up_after_its_first_two_pages(make_backend, tmp_path,
                                                                            scheduler, monkeypatch) -> None:
    backend, pool = make_backend("mha", "page_first", extra=lmdb_only(tmp_path))
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1e-3, backend, keys)  # 16 ms a page: the tier's hits are worth loading
    assert backend.batch_exists(keys) == PAGES
    old_evidence(monkeypatch)
    monkeypatch.setattr(load_gate, "GIVE_UP_SHARE", 100.0)  # the first read is waited for whole
    calls = slowed(backend, monkeypatch, 0.05)  # 50 ms to read a page now
    # The page read is reported missing too: a prefix that short costs SGLang more beside it.
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [False] * PAGES
    assert calls == [1, 1]  # one read slow might be the host; two are the disk; the rest never read
    counters = gate_counters(store_stats(backend)["load_gate"])
    assert (counters["gate_abandoned_lookups"], counters["gate_abandoned_pages"]) == (1, PAGES)
    assert backend.batch_exists(keys) == 0  # and the next lookup declines the hit up front


def test_a_hit_whose_first_read_alone_was_held_up_is_read_on(make_backend, tmp_path, scheduler,
                                                             monkeypatch) -> None:
    # The host's scheduling, not the disk: the first read answered late, the next ones at once.
    backend, pool = make_backend("mha", "page_first", extra=lmdb_only(tmp_path))
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1e-2, backend, keys)  # 160 ms a page: a read well under it is fast
    assert backend.batch_exists(keys) == PAGES
    old_evidence(monkeypatch)
    never_given_up(monkeypatch)
    tier = backend._store.tiers[0]
    uncached(tier, monkeypatch)
    inner, calls = tier.get_into, []

    def first_held_up(k, p):
        calls.append(len(k))
        if len(calls) == 1:
            time.sleep(0.3)  # slower than recomputing the page (160 ms), were it the disk
        return inner(k, p)

    monkeypatch.setattr(tier, "get_into", first_held_up)
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [True] * PAGES
    assert calls == [1, 1, 2, 4]  # slow on average, the newest read fast: read on in bounded steps
    assert gate_counters(store_stats(backend)["load_gate"])["gate_abandoned_lookups"] == 0


def test_a_first_read_that_stalls_is_given_up_whole_and_never_lands_in_sglangs_pages(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    backend, pool, keys = judged_again(make_backend, tmp_path, scheduler, monkeypatch)
    calls = slowed(backend, monkeypatch, 1.0)  # the disk stalls for a second
    dst = pool.alloc(PAGES * PAGE)
    pools.fill_random(pool, dst, seed=99)
    before = pools.page_bytes(pool, dst)
    t0 = time.monotonic()
    assert backend.batch_get_v1(keys, dst) == [False] * PAGES
    assert time.monotonic() - t0 < 0.5  # not the second the read takes
    counters = gate_counters(store_stats(backend)["load_gate"])
    assert (counters["gate_abandoned_lookups"], counters["gate_abandoned_pages"]) == (1, PAGES)
    time.sleep(1.5)  # the read given up ends meanwhile, into staging memory only
    assert calls == [1]
    assert pools.page_bytes(pool, dst) == before  # SGLang may have handed these slots on
    assert backend.batch_exists(keys) == 0  # its own time told the gate what the disk does now


def test_a_disk_whose_burst_let_the_first_page_through_stalls_the_next_step_no_longer(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    # A throttle's allowance lets one page through at once; the next read waits for the bucket.
    backend, pool, keys = judged_again(make_backend, tmp_path, scheduler, monkeypatch)
    never_long(monkeypatch)
    calls = slowed(backend, monkeypatch, 1.0, after=1)
    t0 = time.monotonic()
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [False] * PAGES
    assert time.monotonic() - t0 < 0.5
    counters = gate_counters(store_stats(backend)["load_gate"])
    assert (counters["gate_abandoned_lookups"], counters["gate_abandoned_pages"]) == (1, PAGES)
    time.sleep(1.2)  # let the read given up end before the tier closes
    assert calls == [1, 1]


def test_a_hit_given_up_after_half_of_it_was_read_reports_that_half_loaded(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    backend, pool, keys = judged_again(make_backend, tmp_path, scheduler, monkeypatch)
    never_long(monkeypatch)
    # 128 ms to answer each read: the three before the stall are not given up on a busy host.
    monkeypatch.setattr(load_gate, "GIVE_UP_SHARE", 1.0)
    calls = slowed(backend, monkeypatch, 1.0, after=3)  # the fourth read stalls
    dst = pool.alloc(PAGES * PAGE)
    half = PAGES // 2
    assert backend.batch_get_v1(keys, dst) == [True] * half + [False] * (PAGES - half)
    assert calls == [1, 1, 2, half]  # 1 + 1 + 2 pages read, the fourth step stalled
    counters = gate_counters(store_stats(backend)["load_gate"])
    assert (counters["gate_abandoned_lookups"], counters["gate_abandoned_pages"]) == (1, PAGES - half)
    time.sleep(1.2)


def test_a_hit_wholly_in_dram_beside_a_disk_tier_is_read_in_one_call_however_long_ago_dram_was_read(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    # The gate judges hits in the disk tier again as they are read; one in DRAM cannot turn slow.
    extra = {"tiers": [{"kind": "host", "capacity": "64MiB", "pin_memory": False},
                       {"kind": "lmdb", "path": str(tmp_path / "lmdb"), "capacity": "64MiB"}],
             "policy": {"name": "lru"}}
    backend, pool = make_backend("mha", "page_first", extra=extra)
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1e-3, backend, keys)
    old_evidence(monkeypatch)
    assert backend._gate.rereads()  # the disk tier is volatile
    tier = backend._store.tiers[0]
    inner, calls = tier.get_into, []
    monkeypatch.setattr(tier, "get_into", lambda k, p: (calls.append(len(k)), inner(k, p))[1])
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [True] * PAGES
    assert calls == [PAGES]  # not the last page apart, through the bounded reader


def test_a_hit_read_slower_than_its_bound_allows_a_doubling_step_is_read_in_steps_the_bound_holds(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    # 4 ms a page, a bound of 12.8 ms: a step of 4 pages would take 16 ms and be given up, though
    # the hit is worth loading (32 ms to read, 128 ms to recompute).
    backend, pool, keys = judged_again(make_backend, tmp_path, scheduler, monkeypatch)
    never_long(monkeypatch)
    calls = slowed(backend, monkeypatch, 0.004, per_page=True)
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [True] * PAGES
    assert max(calls) <= 2 and sum(calls) == PAGES  # each step within half the bound, at that rate
    assert gate_counters(store_stats(backend)["load_gate"])["gate_abandoned_lookups"] == 0


def test_a_hit_whose_first_page_read_fast_is_read_whole(make_backend, tmp_path, scheduler,
                                                        monkeypatch) -> None:
    backend, pool = make_backend("mha", "page_first", extra=lmdb_only(tmp_path))
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1e-2, backend, keys)  # 160 ms a page: loading wins, however busy the host
    assert backend.batch_exists(keys) == PAGES
    old_evidence(monkeypatch)
    calls = slowed(backend, monkeypatch, 0.0)
    never_long(monkeypatch)
    never_given_up(monkeypatch)
    dst = pool.alloc(PAGES * PAGE)
    assert backend.batch_get_v1(keys, dst) == [True] * PAGES
    assert calls == [1, 1, 2, 4]  # one page first, then doubling: each read too short to judge by
    assert gate_counters(store_stats(backend)["load_gate"])["gate_abandoned_lookups"] == 0


def test_a_hit_in_the_ssd_tier_is_judged_again_after_its_first_page_however_fresh(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    # A disk others use can turn slow between two reads a moment apart: no staleness needed.
    backend, pool = make_backend("mha", "page_first", extra=lmdb_only(tmp_path))
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1e-2, backend, keys)  # 160 ms a page: loading wins, however busy the host
    assert backend.batch_exists(keys) == PAGES
    calls = slowed(backend, monkeypatch, 0.0)
    never_long(monkeypatch)
    never_given_up(monkeypatch)
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [True] * PAGES
    assert calls == [1, 1, 2, 4]


def test_reads_long_enough_to_judge_by_read_the_rest_in_one_call(make_backend, tmp_path, scheduler,
                                                                 monkeypatch) -> None:
    backend, pool = make_backend("mha", "page_first", extra=lmdb_only(tmp_path))
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1.0, backend, keys)  # a second a token: loading always wins
    assert backend.batch_exists(keys) == PAGES
    calls = slowed(backend, monkeypatch, 0.02)  # 20 ms a call: past a busy host's noise
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [True] * PAGES
    assert calls == [1, 1, PAGES - 2]  # two reads to judge by, then the rest at once


def test_with_the_gate_off_every_hit_is_reported(make_backend, tmp_path, scheduler) -> None:
    backend, keys = stored(make_backend, tmp_path, gate={"enabled": False})
    computes(scheduler, 4096, 1e-9, backend, keys)
    assert backend.batch_exists(keys) == PAGES
    assert "load_gate" not in store_stats(backend)


def test_without_a_scheduler_every_hit_is_reported(make_backend, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(prefill_clock, "_scheduler", None)
    backend, keys = stored(make_backend, tmp_path)
    assert backend.batch_exists(keys) == PAGES


def test_a_scheduler_without_sglangs_totals_is_no_evidence(monkeypatch) -> None:
    odd = Scheduler()
    del odd.total_prefill_busy_us
    prefill_clock._remember(None, odd)
    try:
        assert prefill_clock.reading() is None
    finally:
        monkeypatch.setattr(prefill_clock, "_scheduler", None)


def test_a_pool_tier_declined_as_slow_is_found_fast_again_by_its_recheck_read(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    """The pool cannot tell a page's size (its protocol names none): a recheck read of it is made at
    the size the backend stores objects at. Before, the store asked the pool for the size, got
    none and read nothing, so a pool tier declined once (a link slow for a while) stayed declined
    (found on a link shaped with ``tc``: ``scripts/bench_load_gate.py --medium link``)."""
    server = PoolServer(PoolServerConfig(port=0, capacity="64MiB", slab_size="1MiB")).start()
    try:
        host, port = server.address
        extra = {"tiers": [{"kind": "pool", "endpoints": [f"{host}:{port}"], "transport": "tcp"}],
                 "policy": {"name": "lru"}}
        backend, pool = make_backend("mha", "page_first", extra=extra)
        keys = stored_in(backend, pool)
        computes(scheduler, 4096, 4e-3, backend, keys)  # 64 ms a page
        assert backend.batch_exists(keys) == PAGES
        monkeypatch.setattr(load_gate, "RECHECK_MIN_S", 0.0)  # a declined tier is rechecked at once
        monkeypatch.setattr(load_gate, "RECHECK_SPACING", 0.0)
        # The link was slow a moment ago: a probe read a page in 0.2 s, three times its recompute
        # (a probe outweighs the reads before it).
        backend._gate.on_events([PagesRead(0, 1, 1, backend._geometry.page_nbytes, 0.2, probe=True)])
        assert backend.batch_exists(keys) == 0  # declined, and a recheck read asked for
        assert backend._store.drain()
        assert backend.batch_exists(keys) == PAGES  # the recheck found the link fast again
    finally:
        server.stop()


def test_a_declined_disk_whose_burst_answers_the_first_recheck_read_fast_stays_declined(
        make_backend, tmp_path, scheduler, monkeypatch) -> None:
    """A throttle answers the first read of a tier idle for a while from its allowance; the recheck's
    second read waits at the tier's real rate and decides. Before, the one read came back fast, the
    next hit was admitted, and its read stalled until given up (every other request on
    ``bench_load_gate.py``'s 2 MB/s disk)."""
    backend, pool = make_backend("mha", "page_first", extra=lmdb_only(tmp_path))
    keys = stored_in(backend, pool)
    computes(scheduler, 4096, 1e-3, backend, keys)  # 64 ms a page to recompute
    assert backend.batch_exists(keys) == PAGES
    monkeypatch.setattr(load_gate, "RECHECK_MIN_S", 0.0)  # a declined tier is rechecked at once
    monkeypatch.setattr(load_gate, "RECHECK_SPACING", 0.0)
    # The disk was slow a moment ago: a probe read a page in 0.2 s, three times its recompute.
    backend._gate.on_events([PagesRead(0, 1, 1, backend._geometry.page_nbytes, 0.2, probe=True)])
    fast = backend._store.tiers[0].get_into
    calls = slowed(backend, monkeypatch, 0.2, after=1)  # the first read from the allowance
    assert backend.batch_exists(keys) == 0  # declined, and a recheck asked for
    assert backend._store.drain()
    assert calls == [1, 1]  # two reads, one call each
    assert backend.batch_exists(keys) == 0  # the second read said slow: still declined
    assert backend._store.drain()  # and the recheck that lookup asked for read the slow disk too
    assert calls == [1, 1, 1, 1]

    monkeypatch.setattr(backend._store.tiers[0], "get_into", fast)  # the disk is fast again
    assert backend.batch_exists(keys) == 0  # declined once more, and rechecked
    assert backend._store.drain()
    assert backend.batch_exists(keys) == PAGES  # both recheck reads fast: admitted again
