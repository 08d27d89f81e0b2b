"""The conformance suite every tier passes.

A tier's test module subclasses ``TierConformance`` and implements ``make_tier(capacity_bytes)``
(return a fresh, empty tier; the suite closes it). Class attributes tune the suite for a tier:
``page_bytes`` (segment size of the pages written) and ``self_evicting`` (a full tier makes room by
itself instead of refusing a put).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from mooncake_sgl.api import PageView, Tier
from mooncake_sgl.errors import TierClosed


def make_page(seed: int, seg_bytes: int, nseg: int = 2) -> list[memoryview]:
    """A page of ``nseg`` segments whose bytes depend on ``seed`` (so a mix-up shows)."""
    rnd = os.urandom(16) + seed.to_bytes(8, "little")
    body = (rnd * (seg_bytes * nseg // len(rnd) + 1))[: seg_bytes * nseg]
    data = bytearray(body)
    data[:8] = seed.to_bytes(8, "little")
    view = memoryview(data)
    return [view[i * seg_bytes:(i + 1) * seg_bytes] for i in range(nseg)]


def empty_like(page: PageView) -> list[memoryview]:
    return [memoryview(bytearray(seg.nbytes)) for seg in page]


def same(a: PageView, b: PageView) -> bool:
    return b"".join(bytes(s) for s in a) == b"".join(bytes(s) for s in b)


def key(i: int) -> bytes:
    return b"conformance-key-" + i.to_bytes(8, "big")


class ParkedPage(list):
    """A destination page that parks its reader: a tier iterates a page once to size it and again to
    copy into it, so on the second iteration the reader holds whatever the tier guards a read with
    (a slot's reader count, a read transaction) until the test sets ``go``."""

    def __init__(self, segs: list[memoryview]) -> None:
        super().__init__(segs)
        self.iterations = 0
        self.parked, self.go = threading.Event(), threading.Event()

    def __iter__(self) -> Iterator[memoryview]:
        self.iterations += 1
        if self.iterations == 2:
            self.parked.set()
            assert self.go.wait(10)
        return super().__iter__()


class TierConformance:
    page_bytes = 16 * 1024  # per segment; a page is two segments (K and V)
    self_evicting = False

    def make_tier(self, capacity_bytes: int) -> Tier:
        raise NotImplementedError

    @pytest.fixture
    def tier(self) -> Iterator[Tier]:
        t = self.make_tier(64 * 2 * self.page_bytes)
        yield t
        t.close()

    @pytest.fixture
    def small_tier(self) -> Iterator[Tier]:
        t = self.make_tier(8 * 2 * self.page_bytes)
        yield t
        t.close()

    def test_round_trip_is_byte_exact_across_segments(self, tier: Tier) -> None:
        pages = [make_page(i, self.page_bytes) for i in range(8)]
        assert tier.put_from([key(i) for i in range(8)], pages).ok == (True,) * 8
        out = [empty_like(p) for p in pages]
        assert tier.get_into([key(i) for i in range(8)], out) == [True] * 8
        assert all(same(a, b) for a, b in zip(pages, out))

    def test_contains_reports_each_key(self, tier: Tier) -> None:
        tier.put_from([key(1)], [make_page(1, self.page_bytes)])
        assert tier.contains([key(0), key(1), key(2)]) == [False, True, False]

    def test_absent_page_is_a_miss_not_an_error(self, tier: Tier) -> None:
        page = make_page(5, self.page_bytes)
        assert tier.get_into([key(5)], [empty_like(page)]) == [False]

    def test_empty_batches_are_empty_results(self, tier: Tier) -> None:
        assert tier.contains([]) == []
        assert tier.get_into([], []) == []
        assert tier.put_from([], []).ok == ()

    def test_put_is_idempotent_and_keeps_the_first_value(self, tier: Tier) -> None:
        first, second = make_page(1, self.page_bytes), make_page(2, self.page_bytes)
        assert tier.put_from([key(1)], [first]).ok == (True,)
        assert tier.put_from([key(1)], [second]).ok == (True,)
        out = empty_like(first)
        assert tier.get_into([key(1)], [out]) == [True]
        assert same(first, out)

    def test_wrong_destination_size_is_a_miss(self, tier: Tier) -> None:
        page = make_page(1, self.page_bytes)
        tier.put_from([key(1)], [page])
        short = [memoryview(bytearray(self.page_bytes)), memoryview(bytearray(self.page_bytes // 2))]
        assert tier.get_into([key(1)], [short]) == [False]

    def test_remove_drops_pages_and_counts_them(self, tier: Tier) -> None:
        pages = [make_page(i, self.page_bytes) for i in range(3)]
        tier.put_from([key(i) for i in range(3)], pages)
        assert tier.remove([key(0), key(1), key(9)]) == 2
        assert tier.contains([key(0), key(1), key(2)]) == [False, False, True]
        assert tier.get_into([key(0)], [empty_like(pages[0])]) == [False]

    def test_usage_counts_pages(self, tier: Tier) -> None:
        before = tier.usage()
        tier.put_from([key(i) for i in range(4)], [make_page(i, self.page_bytes) for i in range(4)])
        after = tier.usage()
        assert after.pages == before.pages + 4
        assert after.used_bytes > before.used_bytes
        assert after.capacity_bytes >= after.used_bytes

    def test_full_tier_never_loses_or_corrupts_acknowledged_pages(self, small_tier: Tier) -> None:
        pages = {i: make_page(i, self.page_bytes) for i in range(40)}
        acked = []
        for i, page in pages.items():
            if small_tier.put_from([key(i)], [page]).ok == (True,):
                acked.append(i)
        assert acked, "a tier must accept pages while it has room"
        if not self.self_evicting:
            assert len(acked) < len(pages), "a bounded tier must refuse pages once full"
        for i in acked:
            out = empty_like(pages[i])
            hit = small_tier.get_into([key(i)], [out])[0]
            if not self.self_evicting:
                assert hit, f"acknowledged page {i} was lost"
            if hit:
                assert same(pages[i], out), f"page {i} came back with wrong bytes"

    def test_concurrent_writers_and_readers_see_exact_bytes(self, tier: Tier) -> None:
        errors: list[str] = []

        def worker(base: int) -> None:
            for i in range(base, base + 6):
                page = make_page(i, self.page_bytes)
                if tier.put_from([key(i)], [page]).ok != (True,):
                    errors.append(f"put {i} failed")
                    continue
                out = empty_like(page)
                if tier.get_into([key(i)], [out]) != [True] or not same(page, out):
                    errors.append(f"get {i} wrong")

        threads = [threading.Thread(target=worker, args=(b * 100,)) for b in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []

    def test_clear_drops_everything(self, tier: Tier) -> None:
        tier.put_from([key(i) for i in range(3)], [make_page(i, self.page_bytes) for i in range(3)])
        tier.clear()
        assert tier.contains([key(i) for i in range(3)]) == [False] * 3

    def test_closed_tier_raises_tier_closed(self) -> None:
        t = self.make_tier(8 * 2 * self.page_bytes)
        t.close()
        t.close()  # idempotent
        with pytest.raises(TierClosed):
            t.contains([key(1)])
