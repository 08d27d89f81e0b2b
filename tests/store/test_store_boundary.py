"""The store's one error boundary: a tier that raises on every call is a miss on every call, and
SGLang's log gets one line per operation per interval, not one per call (a dead tier would
otherwise flood it past the adapter's own limiter)."""

from __future__ import annotations

import logging

import pytest

from mooncake_sgl.api import PageKey, PageView, PutResult
from mooncake_sgl.config import HostTierConfig
from mooncake_sgl.errors import TierUnavailable
from mooncake_sgl.failure_log import FailureLog
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.tiers.host import HostTier
from tests.tiers.conformance import empty_like, key, make_page
from tests.wrapped_tier import WrappedTier

SEG = 8 * 1024


class DeadTier(WrappedTier):
    """A remote tier whose peer is gone: every page call raises."""

    def contains(self, keys: list[PageKey]) -> list[bool]:
        raise TierUnavailable("peer gone")

    def get_into(self, keys: list[PageKey], pages: list[PageView]) -> list[bool]:
        raise TierUnavailable("peer gone")

    def put_from(self, keys: list[PageKey], pages: list[PageView], *, soft_pin=None) -> PutResult:
        raise TierUnavailable("peer gone")


def host(pages: int) -> HostTier:
    return HostTier(HostTierConfig(capacity=pages * 2 * SEG, slot_size=2 * SEG, pin_memory=False))


@pytest.mark.parametrize("mover", ["inline", "background"])
def test_a_dead_tier_is_misses_and_one_log_line_per_operation(
        mover: str, caplog: pytest.LogCaptureFixture) -> None:
    store = TieredStore([DeadTier(host(4))], LruPolicy(1), mover=mover)
    try:
        with caplog.at_level(logging.WARNING):
            for i in range(50):
                page = make_page(i, SEG)
                assert store.put_from([key(i)], [page]) == [False]
                assert store.exists_prefix([key(i)]) == 0
                assert store.get_into([key(i)], [empty_like(page)]) == [False]
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(lines) == 3, f"{len(lines)} warnings for 150 failed calls"
        for op in ("contains", "get", "put"):
            assert sum(f"tier host: {op} failed" in line for line in lines) == 1
    finally:
        store.close()


def test_the_failure_log_reports_what_it_held_back_once_the_interval_passed(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = FailureLog(logging.getLogger("test.failure_log"), interval_s=30.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.failure_log"):
        assert log.report("tier x: get", OSError("down"))
        assert not any(log.report("tier x: get", OSError("down")) for _ in range(9))
        assert log.report("tier x: put", OSError("down"))  # another operation has its own limit
        now[0] = 31.0
        assert log.report("tier x: get", OSError("down"))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "(9 similar failures since the last report)" in messages[-1]
