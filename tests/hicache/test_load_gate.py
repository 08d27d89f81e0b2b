"""``batch_exists`` reports a hit only as far as loading it beats recomputing it (``load_gate``).

Real SGLang host pools and a real LMDB tier; the tier's read rate is what its real reads took. The
scheduler is the one stand-in: an object with SGLang 0.5.23's two prefill totals, handed to the
prefill clock as the touch point's hook hands the real one.
"""

from __future__ import annotations

import pytest

from devtools.testing.backend_record import store_stats
from mooncake_sgl.hicache import prefill_clock
from mooncake_sgl.metrics.source import gate_counters

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
    keys = pools.page_hashes(PAGES, seed=11)
    src = pool.alloc(PAGES * PAGE)
    pools.fill_random(pool, src, seed=12)
    assert backend.batch_set_v1(keys, src) == [True] * PAGES
    assert backend.batch_get_v1(keys, pool.alloc(PAGES * PAGE)) == [True] * PAGES  # the tier's rate
    return backend, keys


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
