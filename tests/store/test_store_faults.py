"""Fault injection at the store seam: real tiers (two host DRAM tiers over LMDB files) whose remove,
put or get fails on demand, in every tier position, under both policies and both movers. After the
faults stop, the store, the policy and the tiers must agree on which pages each tier holds, and the
store must take and serve fresh pages again."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from mooncake_sgl.api import PageKey, PageView, PlacementPolicy, PutResult, Tier
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig, PolicyConfig
from mooncake_sgl.errors import TierError
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.ssd import LmdbTier
from tests.store_record import policy_residents, resident_keys
from tests.tiers.conformance import empty_like, key, make_page, same
from tests.wrapped_tier import WrappedTier

SEG = 8 * 1024
PAGE = 2 * SEG


class FaultyTier(WrappedTier):
    """A real tier whose next calls of one kind fail: ``fail(op, times, how)`` with ``op`` one of
    ``remove``, ``put``, ``get``, ``contains``, ``size`` (``page_size_of``) and ``how`` ``raise``
    (the tier is broken) or ``false`` (per-page refusal, or an absent page). ``chance`` < 1 makes
    each call fail with that probability while failures remain."""

    def __init__(self, inner: Tier, seed: int = 0) -> None:
        super().__init__(inner)
        self._left: dict[str, int] = {}
        self._how: dict[str, str] = {}
        self._chance = 1.0
        self._rng = random.Random(seed)
        self.injected = 0

    def fail(self, op: str, times: int, how: str = "raise", chance: float = 1.0) -> None:
        self._left[op], self._how[op], self._chance = times, how, chance

    def heal(self) -> None:
        self._left.clear()

    def _failing(self, op: str) -> str | None:
        if self._left.get(op, 0) <= 0 or self._rng.random() >= self._chance:
            return None
        self._left[op] -= 1
        self.injected += 1
        if self._how[op] == "raise":
            raise TierError(f"injected {op} failure in {self.name}")
        return self._how[op]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        if self._failing("get"):
            return [False] * len(keys)
        return self.inner.get_into(keys, pages)

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *, soft_pin=None) -> PutResult:
        if self._failing("put"):
            return PutResult.missed(len(keys))
        return self.inner.put_from(keys, pages, soft_pin=soft_pin)

    def remove(self, keys: Sequence[PageKey]) -> int:
        self._failing("remove")
        return self.inner.remove(keys)

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        if self._failing("contains"):
            return [False] * len(keys)
        return self.inner.contains(keys)

    def page_size_of(self, key: PageKey) -> int | None:
        if self._failing("size"):
            return None
        return self.inner.page_size_of(key)


def host(pages: int) -> HostTier:
    return HostTier(HostTierConfig(capacity=pages * PAGE, slot_size=PAGE, pin_memory=False))


def lmdb(path: Path) -> LmdbTier:
    return LmdbTier(LmdbTierConfig(path=str(path), capacity="64MiB", sync=False))


def agree(store: TieredStore) -> None:
    """Store, policy and tiers name the same pages for every tier."""
    assert store.drain()
    for t, tier in enumerate(store.tiers):
        held = {k for k, _ in tier.scan()}
        assert resident_keys(store, t) == held, f"store vs tier {tier.name}"
        assert policy_residents(store.policy, t) == held, f"policy vs tier {tier.name}"


def usable(store: TieredStore, base: int) -> None:
    """Fresh pages are acknowledged and read back exactly."""
    pages = {i: make_page(i, SEG) for i in range(base, base + 6)}
    for b in range(base, base + 6, 2):
        assert store.put_from([key(b), key(b + 1)], [pages[b], pages[b + 1]]) == [True, True]
    outs = {i: empty_like(p) for i, p in pages.items()}
    assert store.get_into([key(i) for i in outs], list(outs.values())) == [True] * 6
    assert all(same(pages[i], outs[i]) for i in pages)


@pytest.mark.parametrize("mover", ["inline", "background"])
def test_a_full_tier_whose_removes_failed_takes_fresh_pages_once_they_work(mover: str) -> None:
    # One tier of 8 slots, full; ten removes in a row fail. Victims whose removal failed stay
    # resident and evictable: once removes work, the next 8 fresh pages are all accepted.
    tier = FaultyTier(host(8))
    store = TieredStore([tier], policy_for_capacities(PolicyConfig(name="lru"), [8 * PAGE]),
                        mover=mover, room_wait=2.0)
    try:
        for i in range(8):
            assert store.put_from([key(i)], [make_page(i, SEG)]) == [True]
        assert store.drain()
        tier.fail("remove", 10)
        i = 100
        while tier._left["remove"] > 0 and i < 200:
            store.put_from([key(i)], [make_page(i, SEG)])  # refused: no room can be made
            assert store.drain()
            i += 1
        assert tier._left["remove"] == 0
        agree(store)
        fresh = [store.put_from([key(j)], [make_page(j, SEG)]) for j in range(1000, 1008)]
        assert fresh == [[True]] * 8
        agree(store)
        assert store.stats().tiers["host"].placement.eviction_aborts >= 10
    finally:
        store.close()


FAULTS = [("remove", "raise"), ("put", "raise"), ("put", "false"), ("get", "raise"), ("get", "false"),
          ("contains", "raise")]


@pytest.mark.parametrize("mover", ["inline", "background"])
@pytest.mark.parametrize("policy", ["lru", "heat", "adaptive"])
@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("op,how", FAULTS)
def test_faults_in_any_tier_leave_store_policy_and_tiers_in_agreement(
        tmp_path: Path, op: str, how: str, position: int, policy: str, mover: str) -> None:
    tiers = [FaultyTier(host(4), seed=1), FaultyTier(host(8), seed=2),
             FaultyTier(lmdb(tmp_path / "db"), seed=3)]
    # Small admission thresholds so heat writes, demotes and promotes within a short workload.
    config = (PolicyConfig(name="heat", admission_min_hits=2, demotion_min_hits=1, promotion_min_hits=1)
              if policy == "heat" else PolicyConfig(name=policy))
    pol: PlacementPolicy = policy_for_capacities(config, [4 * PAGE, 8 * PAGE, 64 << 20])
    store = TieredStore(tiers, pol, mover=mover, room_wait=2.0)
    rng = random.Random(f"{op}{how}{position}{policy}")
    pages = {i: make_page(i, SEG) for i in range(32)}
    try:
        tiers[position].fail(op, 25, how, chance=0.5)
        for _ in range(80):
            if rng.random() < 0.1:  # SGLang never removes, but the store's API does (and LMDB fills)
                store.remove([key(rng.randrange(32))])
            start = rng.randrange(0, 28)
            chain = list(range(start, start + rng.randint(1, 4)))
            keys = [key(i) for i in chain]
            run = store.exists_prefix(keys)
            if run:
                outs = [empty_like(pages[i]) for i in chain[:run]]
                for good, i, out in zip(store.get_into(keys[:run], outs), chain, outs):
                    assert not good or same(pages[i], out), f"page {i} came back wrong"
            if run < len(keys):
                store.put_from(keys[run:], [pages[i] for i in chain[run:]], keys[run - 1] if run else None)
        assert tiers[position].injected > 0, "the workload never reached the injected fault"
        tiers[position].heal()
        agree(store)
        usable(store, 100)
        agree(store)
    finally:
        store.close()


class WriteBackLru(LruPolicy):
    """Admits pages to DRAM only: overflow must demote them, and a read below DRAM promotes."""

    def admit(self, keys, tier):
        return [tier == 0] * len(keys)


# Every call a demotion (DRAM -> LMDB) or a promotion (LMDB -> DRAM) makes into a tier, by side.
STEPS = [("source", "size"), ("source", "get"), ("source", "remove"), ("target", "contains"),
         ("target", "put")]


def below_dram(dram: FaultyTier, disk: FaultyTier, n: int) -> list[int]:
    return [i for i in range(n) if disk.inner.contains([key(i)]) == [True]
            and dram.inner.contains([key(i)]) == [False]]


@pytest.mark.parametrize("mover", ["inline", "background"])
@pytest.mark.parametrize("side,op", STEPS)
def test_a_tier_raising_at_any_step_of_a_demotion_or_promotion_leaves_no_page_leaving(
        tmp_path: Path, side: str, op: str, mover: str) -> None:
    """A raise inside a demotion once skipped the eviction's commit and abort (``page_size_of`` was
    called outside the store's error boundary): the victims stayed "leaving", out of the policy's
    view with their bytes still in the tier, until a restart. Each step fails on its own here."""
    dram, disk = FaultyTier(host(4)), FaultyTier(lmdb(tmp_path / "db"))
    store = TieredStore([dram, disk], WriteBackLru(2), mover=mover)
    pages = {i: make_page(i, SEG) for i in range(24)}

    def put_each(numbers: range) -> None:
        for i in numbers:  # DRAM holds 4: every put past it demotes
            store.put_from([key(i)], [pages[i]])
            assert store.drain()

    try:
        demoting = dram if side == "source" else disk
        put_each(range(0, 6))
        demoting.fail(op, 1000, "raise")
        put_each(range(6, 12))
        assert demoting.injected > 0, "no demotion made that call"
        demoting.heal()
        agree(store)

        put_each(range(12, 24))  # healthy demotions: pages below DRAM to read back up
        promoting = disk if side == "source" else dram
        found = below_dram(dram, disk, 24)
        assert found, "nothing below DRAM to promote"
        # A first read, so that the next one is within reach of DRAM and promotes.
        assert store.get_into([key(i) for i in found], [empty_like(pages[i]) for i in found]) \
            == [True] * len(found)
        assert store.drain()
        promoting.fail(op, 1000, "raise")
        injected = promoting.injected
        outs = [empty_like(pages[i]) for i in found]
        for good, i, out in zip(store.get_into([key(i) for i in found], outs), found, outs):
            assert not good or same(pages[i], out)
        assert store.drain()
        promoting.heal()
        if op in ("get", "put"):
            assert promoting.injected > injected, "no promotion made that call"
        if op == "size":  # re-read at the size it was read at: no tier is asked
            assert promoting.injected == injected
        agree(store)
        usable(store, 100)
        agree(store)
    finally:
        store.close()
