"""The attach says when SGLang's host pool cannot stage the storage hits we find
(``hicache/staging_room.py``): real host pools at SGLang's ratios, SGLang's own server-argument
fields."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from mooncake_sgl.hicache import staging_room
from mooncake_sgl.hicache.sglang_pool import HostPool

from .pools import DEVICE_TOKENS, build_pool


def check(pool: Any, role: str, extra: Any) -> str | None:
    """``staging_room.check`` for a real pool, as the attach reads it."""
    record = HostPool.read(pool)
    return staging_room.check(record.host_tokens, record.device_tokens, role, extra)


def args(mode: str = "cache", policy: str = "write_through") -> SimpleNamespace:
    return SimpleNamespace(hicache_host_memory_mode=mode, hicache_write_policy=policy)


@pytest.fixture
def server_args(monkeypatch: pytest.MonkeyPatch):
    import sglang.srt.runtime_context as rc

    def use(a: SimpleNamespace) -> None:
        monkeypatch.setattr(rc, "get_server_args", lambda: a)
    return use


def test_a_host_pool_the_size_of_the_device_pool_is_named_with_the_fix(server_args, caplog) -> None:
    pool = build_pool("mha", "page_first", ratio=1.0)
    assert pool.size - DEVICE_TOKENS < staging_room.SGLANG_PREFETCH_THRESHOLD  # SGLang adds one page
    server_args(args())
    with caplog.at_level(logging.WARNING, logger="mooncake_sgl.hicache.staging_room"):
        text = check(pool, "colocated", {})
    assert text and f"host pool holds {pool.size} tokens and the device pool {DEVICE_TOKENS}" in text
    assert "--hicache-ratio 2" in text and "buffer_only" in text
    assert [r.getMessage() for r in caplog.records] == [text]


def test_sglangs_default_ratio_and_the_settings_that_do_not_pin_give_no_warning(server_args) -> None:
    server_args(args())
    assert check(build_pool("mha", "page_first", ratio=2.0), "colocated", {}) is None
    small = build_pool("mha", "page_first", ratio=1.0)
    for a, role in ((args(mode="buffer_only"), "colocated"), (args(policy="write_back"), "colocated"),
                    (args(policy="write_through_selective"), "colocated"), (args(), "decode")):
        server_args(a)
        assert check(small, role, {}) is None, (a, role)


def test_a_lower_prefetch_threshold_needs_less_room(server_args) -> None:
    pool = build_pool("mha", "page_first", ratio=1.0)
    server_args(args())
    room = pool.size - DEVICE_TOKENS
    assert check(pool, "colocated", {"prefetch_threshold": room}) is None
    assert check(pool, "colocated", {"prefetch_threshold": room + 1})
    assert check(pool, "colocated", "@tiers.yaml")  # not a dict: SGLang's default threshold


def test_without_sglangs_server_arguments_there_is_no_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang.srt.runtime_context as rc

    def unpublished() -> None:
        raise RuntimeError("no server args here")
    monkeypatch.setattr(rc, "get_server_args", unpublished)
    assert check(build_pool("mha", "page_first", ratio=1.0), "colocated", {}) is None
