"""The host DRAM tier: the conformance suite plus its slot allocator and reader protection."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from mooncake_sgl.api import Tier
from mooncake_sgl.config import HostTierConfig, StoreConfig
from mooncake_sgl.errors import TierError
from mooncake_sgl.memory import Headroom
from mooncake_sgl.tiers import build_tier
from mooncake_sgl.tiers import host as host_mod
from mooncake_sgl.tiers.host import HostTier

from .conformance import ParkedPage, TierConformance, empty_like, key, make_page, same


def host(capacity: int | str, slot_size: int | str = "auto") -> HostTier:
    return HostTier(HostTierConfig(capacity=capacity, slot_size=slot_size, pin_memory=False))


class TestHostConformance(TierConformance):
    def make_tier(self, capacity_bytes: int) -> Tier:
        return host(capacity_bytes)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="pinning needs CUDA (scripts/gpu_check.py runs this on a GPU host)")
class TestHostPinnedConformance(TierConformance):
    def make_tier(self, capacity_bytes: int) -> Tier:
        t = HostTier(HostTierConfig(capacity=capacity_bytes, pin_memory=True))
        assert t.pinned  # else this would only repeat the unpinned suite
        return t


def test_build_tier_makes_a_host_tier_from_the_default_config() -> None:
    cfg = StoreConfig().tiers[0]
    assert isinstance(cfg, HostTierConfig)
    t = build_tier(HostTierConfig(capacity="1MiB"))
    assert isinstance(t, HostTier)
    t.close()


def test_auto_slot_size_is_the_first_page_and_larger_pages_are_refused() -> None:
    t = host(1 << 20)
    assert t.slot_size == 0
    assert t.put_from([key(1)], [make_page(1, 4096)]).ok == (True,)  # 8 KiB page fixes the slot size
    assert t.slot_size == 8192
    assert t.stats().slots == (1 << 20) // 8192
    # Too large for a slot: refused per key, the others in the batch still land.
    big, small = make_page(2, 8192), make_page(3, 1024)
    assert t.put_from([key(2), key(3)], [big, small]).ok == (False, True)
    assert t.stats().counts.put_too_large == 1
    out = empty_like(small)
    assert t.get_into([key(3)], [out]) == [True] and same(small, out)
    t.close()


def test_configured_slot_size_and_capacity_round_down_to_whole_slots() -> None:
    t = host(10_000, slot_size=4096)
    assert t.usage().capacity_bytes == 2 * 4096
    page = make_page(1, 2048)
    assert t.put_from([key(i) for i in range(3)], [page, page, page]).ok == (True, True, False)
    assert t.stats().counts.put_full == 1
    t.close()


def test_freed_slots_are_reused_and_usage_counts_slots() -> None:
    t = host(4 * 8192, slot_size=8192)
    pages = [make_page(i, 4096) for i in range(4)]
    assert t.put_from([key(i) for i in range(4)], pages).ok == (True,) * 4
    assert t.put_from([key(9)], [make_page(9, 4096)]).ok == (False,)
    assert t.usage().used_bytes == 4 * 8192
    assert t.remove([key(1), key(2)]) == 2
    assert t.usage().used_bytes == 2 * 8192
    assert t.footprint(4096 * 2) == t.footprint(100) == 8192  # the store sizes evictions in slots
    new = [make_page(10 + i, 4096) for i in range(2)]
    assert t.put_from([key(10), key(11)], new).ok == (True, True)
    # The survivors were not disturbed by the reuse of their neighbours' slots.
    for i, page in ((0, pages[0]), (3, pages[3]), (10, new[0]), (11, new[1])):
        out = empty_like(page)
        assert t.get_into([key(i)], [out]) == [True] and same(page, out)
    assert t.stats().slots_free == 0
    t.close()


def test_a_page_being_read_is_not_overwritten_by_a_remove_and_reuse() -> None:
    # One slot only: if remove freed it while a reader is mid-copy, the next put would reuse it
    # and the reader would return the new page's bytes under the old key.
    t = host(8192, slot_size=8192)
    old, new = make_page(1, 4096), make_page(2, 4096)
    assert t.put_from([key(1)], [old]).ok == (True,)
    dst = ParkedPage(empty_like(old))
    result: list[list[bool]] = []
    reader = threading.Thread(target=lambda: result.append(t.get_into([key(1)], [dst])))
    reader.start()
    assert dst.parked.wait(10)
    assert t.remove([key(1)]) == 1
    assert t.contains([key(1)]) == [False]
    assert t.put_from([key(2)], [new]).ok == (False,), "the slot under a reader must not be handed out"
    dst.go.set()
    reader.join(10)
    assert result == [[True]] and same(old, dst)
    # The last reader gone, the slot is free again.
    assert t.put_from([key(2)], [new]).ok == (True,)
    out = empty_like(new)
    assert t.get_into([key(2)], [out]) == [True] and same(new, out)
    t.close()


def test_buffer_is_not_pinned_without_cuda_and_copies_use_it() -> None:
    t = HostTier(HostTierConfig(capacity="1MiB", pin_memory=True))
    import torch

    assert t.pinned == torch.cuda.is_available()
    page = [memoryview(np.arange(4096, dtype=np.uint8))]
    assert t.put_from([key(1)], [page]).ok == (True,)
    assert t.page_size_of(key(1)) == 4096 and t.page_size_of(key(2)) is None
    assert dict(t.scan()) == {key(1): 4096}
    t.close()


def test_counters_track_hits_misses_and_bytes() -> None:
    t = host(1 << 20)
    page = make_page(1, 4096)
    t.put_from([key(1)], [page])
    t.get_into([key(1), key(2)], [empty_like(page), empty_like(page)])
    t.get_into([key(1)], [[memoryview(bytearray(100))]])
    s = t.stats().counts
    assert (s.get_hits, s.get_misses, s.get_size_mismatch) == (1, 1, 1)
    assert s.bytes_written == s.bytes_read == 8192
    t.close()


def test_mismatched_batch_lengths_are_a_caller_error() -> None:
    t = host(1 << 20)
    with pytest.raises(ValueError, match="2 keys but 1"):
        t.put_from([key(1), key(2)], [make_page(1, 1024)])
    t.close()


def _pool_pages(pool: np.ndarray, order: list[int], seg: int) -> list[list[memoryview]]:
    """Pages of two segments (K, V) laid out as SGLang's page_first_direct host pool does: every
    page's K segment in one region, its V segment in another."""
    half = len(pool) // 2
    return [[memoryview(pool[p * seg:(p + 1) * seg]), memoryview(pool[half + p * seg:half + (p + 1) * seg])]
            for p in order]


def test_a_batch_of_pages_is_copied_in_one_numpy_call_per_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every numpy copy is a GIL hand-off, up to 5 ms while SGLang's scheduler thread runs Python:
    # a 12k-token prefetch copied segment by segment (384 calls) ran at 48 MB/s inside a server.
    seg, npages = 4096, 48
    t = host(4 * npages * 2 * seg)
    src = np.random.default_rng(7).integers(0, 256, 2 * npages * seg, dtype=np.uint8)
    keys = [key(i) for i in range(npages)]
    assert t.put_from(keys, _pool_pages(src, list(range(npages)), seg)).ok == (True,) * npages
    calls = []
    real = np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, s: calls.append(1) or real(dst, s))
    dst = np.zeros_like(src)
    assert t.get_into(keys, _pool_pages(dst, list(range(npages)), seg)) == [True] * npages
    assert len(calls) == 2 and np.array_equal(dst, src)


def test_pages_in_any_order_and_slots_read_back_byte_for_byte() -> None:
    seg, npages = 4096, 40
    rng = np.random.default_rng(8)
    t = host(4 * npages * 2 * seg)
    src = rng.integers(0, 256, 2 * npages * seg, dtype=np.uint8)
    keys = [key(i) for i in range(npages)]
    # Written in two interleaved halves and one removal, so slots are neither in order nor contiguous.
    for half in (keys[1::2], keys[0::2]):
        idx = [keys.index(k) for k in half]
        assert t.put_from(half, _pool_pages(src, idx, seg)).ok == (True,) * len(half)
    t.remove([keys[5]])
    order = [int(i) for i in rng.permutation(npages)]
    dst = np.zeros_like(src)
    got = t.get_into([keys[i] for i in order], _pool_pages(dst, order, seg))
    assert got == [i != 5 for i in order]
    for p in range(npages):
        for part in (0, 1):
            lo = part * npages * seg + p * seg
            want = src[lo:lo + seg] if p != 5 else np.zeros(seg, np.uint8)
            assert np.array_equal(dst[lo:lo + seg], want), (p, part)


def test_copy_batch_refuses_pairs_of_different_sizes() -> None:
    from mooncake_sgl.buffers import copy_batch

    with pytest.raises(ValueError, match="cannot copy 8 bytes into 4"):
        copy_batch([(np.zeros(4, np.uint8), np.ones(8, np.uint8))])
    copy_batch([])  # nothing to do


CGROUP_1MIB = Headroom(1 << 20, "the cgroup limit memory.max of 2097152 bytes at /sys/fs/cgroup/x, "
                                "1048576 bytes of it in use")


def test_copy_batch_of_sources_far_apart_copies_them_instead_of_overflowing_numpys_stack() -> None:
    # Two sources far apart (a heap buffer, then a large mapping) made one strided view whose
    # bounds spanned the heap; numpy's overlap check then copied through temporaries that fell
    # inside those bounds, recursing until the process died of SIGSEGV (a suite worker, once every
    # few runs). In a fresh interpreter: on the old code this process dies, not the test's.
    code = """if True:
        import numpy as np
        from mooncake_sgl.buffers import copy_batch
        n = 4096
        low = np.frombuffer(bytearray(b"\\x07" * n), dtype=np.uint8)
        high = np.full(64 << 20, 9, dtype=np.uint8)
        dst = np.zeros(2 * n, dtype=np.uint8)
        copy_batch([(dst[:n], low), (dst[n:], high[:n])])
        assert (dst[:n] == 7).all() and (dst[n:] == 9).all()
    """
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])


def test_a_pinned_capacity_over_the_containers_memory_is_refused_naming_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Pinned memory is committed when allocated: in a container it was the OOM killer, no message.
    monkeypatch.setattr(host_mod, "memory_headroom", lambda: CGROUP_1MIB, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(TierError, match=r"capacity of 4194304 bytes exceeds the 1048576 bytes of memory "
                                        r"available \(bounded by the cgroup limit memory.max"):
        HostTier(HostTierConfig(capacity="4MiB", pin_memory=True))


def test_an_unpinned_capacity_over_the_containers_memory_is_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(host_mod, "memory_headroom", lambda: CGROUP_1MIB, raising=False)
    with caplog.at_level(logging.WARNING, "mooncake_sgl.tiers.host"):
        tier = host("4MiB")
    tier.close()
    assert "OOM-killed once the tier fills" in caplog.text and "memory.max" in caplog.text
