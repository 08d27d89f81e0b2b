"""``Residency``, the one record of which managed tier holds which page: holds in place of
"protected" sets, one planning call for room (victims marked leaving, each with its demotion target),
and a policy that names a page the record lacks is a bug it reports (the policy's view is fed only
from the record, so there is no drift left to repair)."""

from __future__ import annotations

import random
import threading

import pytest

from mooncake_sgl.api import PlacementPolicy
from mooncake_sgl.config import HostTierConfig, PolicyConfig
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.sim.reference import ArcPolicy, LfuDaPolicy, LirsPolicy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.store.residency import Residency, Victim
from mooncake_sgl.tiers.host import HostTier
from tests.store_record import policy_residents, resident_keys
from tests.tiers.conformance import key, make_page

PAGE = 1 << 20


def record(pages: int, ntiers: int = 1) -> Residency:
    residency = Residency(LruPolicy(ntiers), [True] * ntiers, clock=lambda: 0.0)
    residency.inserted(0, [b"k%d" % i for i in range(pages)], [PAGE] * pages, None)
    return residency


def evict(residency: Residency, t: int, nbytes: int) -> tuple[Victim, ...]:
    """Victims (marked leaving) making room in full tier ``t`` for a new page of ``nbytes``."""
    return residency.plan_room(t, 0, [b"incoming"], [nbytes]).victims


def names(victims: tuple[Victim, ...]) -> set[bytes]:
    return {v.key for v in victims}


def test_held_pages_are_never_victims_until_every_holder_is_done() -> None:
    residency = record(4)
    with residency.held([b"k0", b"k1"]):
        with residency.held([b"k0"]):
            assert evict(residency, 0, 3 * PAGE) == ()  # only two pages are free to go
        victims = evict(residency, 0, 2 * PAGE)
        assert names(victims) == {b"k2", b"k3"}
        residency.commit_evict(0, [v.key for v in victims])
        assert evict(residency, 0, PAGE) == ()  # k0, k1 still held
    assert names(evict(residency, 0, 2 * PAGE)) == {b"k0", b"k1"}


def test_holds_from_several_threads_add_up() -> None:
    residency = record(1)
    start, release = threading.Barrier(9), threading.Event()

    def hold() -> None:
        with residency.held([b"k0"]):
            start.wait()
            release.wait()

    threads = [threading.Thread(target=hold) for _ in range(8)]
    for th in threads:
        th.start()
    start.wait()
    assert evict(residency, 0, PAGE) == ()
    release.set()
    for th in threads:
        th.join()
    assert evict(residency, 0, PAGE) == (Victim(b"k0", PAGE, None),)


def held_bytes_by_hand(residency: Residency, t: int) -> int:
    view = residency.policy.residency
    return sum(n for k, n in view.pages(t).items() if k in view.held())


@pytest.mark.parametrize("name", ["lru", "heat"])
def test_held_bytes_stay_current_through_every_change_of_holds_and_residency(name: str) -> None:
    # The policies learn what they cannot free from ``held_bytes`` instead of walking the holds,
    # so every path that changes a hold, a page's residency or its leaving must keep it exact.
    rng = random.Random(7)
    policy = policy_for_capacities(PolicyConfig(name=name), [8 * PAGE, 16 * PAGE])
    residency = Residency(policy, [True, True], clock=lambda: 0.0)
    keys = [b"p%d" % i for i in range(24)]
    holds: list = []  # open ``held`` blocks, closed in random order
    leaving: list[tuple[int, tuple[Victim, ...]]] = []
    for _ in range(600):
        op = rng.randrange(6)
        t = rng.randrange(2)
        if op == 0:
            block = residency.held(rng.sample(keys, rng.randrange(1, 6)))
            block.__enter__()
            holds.append(block)
        elif op == 1 and holds:
            holds.pop(rng.randrange(len(holds))).__exit__(None, None, None)
        elif op == 2:
            batch = rng.sample(keys, rng.randrange(1, 4))
            residency.inserted(t, batch, [PAGE * rng.choice((1, 2))] * len(batch), None)
        elif op == 3:
            residency.lost(t, rng.sample(keys, 2))
        elif op == 4:
            victims = residency.plan_room(t, 0, [b"incoming"], [rng.randrange(1, 4) * PAGE]).victims
            assert not {v.key for v in victims} & set(residency.policy.residency.held())
            if victims:
                leaving.append((t, victims))
        elif op == 5 and leaving:
            lt, victims = leaving.pop(rng.randrange(len(leaving)))
            if rng.random() < 0.5:
                residency.commit_evict(lt, [v.key for v in victims])
            else:
                residency.abort_evict(lt, victims)
        for tier in (0, 1):
            assert residency.policy.residency.held_bytes(tier) == held_bytes_by_hand(residency, tier)
    for block in holds:
        block.__exit__(None, None, None)
    assert [residency.policy.residency.held_bytes(t) for t in (0, 1)] == [0, 0]


def test_an_aborted_eviction_makes_its_victims_evictable_again() -> None:
    residency = record(2)
    victims = evict(residency, 0, 2 * PAGE)
    assert len(victims) == 2
    assert evict(residency, 0, PAGE) == ()  # both leaving
    residency.abort_evict(0, victims)
    assert residency.keys_in(0) == {b"k0", b"k1"}
    assert len(evict(residency, 0, 2 * PAGE)) == 2


def test_one_plan_answers_what_a_write_asks_before_it_writes() -> None:
    # Room for a batch of three, one of which the tier holds already: only the other two need
    # room, and with one page's worth free, one victim goes, with the tier the policy demotes it to.
    residency = record(3, ntiers=2)
    plan = residency.plan_room(0, PAGE, [b"k2", b"n0", b"n1"], [PAGE] * 3, pins=True)
    assert plan.need == 2 * PAGE and plan.short
    assert plan.victims == (Victim(b"k0", PAGE, 1),)  # LRU demotes one tier down
    assert plan.pins == (False, False, False)
    assert evict(residency, 0, PAGE) == (Victim(b"k1", PAGE, 1),)  # k0 is leaving now


def test_a_plan_evicts_nothing_where_the_batch_fits_or_the_tier_cannot_say() -> None:
    residency = record(2)
    fits = residency.plan_room(0, 2 * PAGE, [b"n0", b"n1"], [PAGE] * 2)
    held = residency.plan_room(0, 0, [b"k0", b"k1"], [PAGE] * 2, reserve=lambda need: PAGE)
    unknown = residency.plan_room(0, -1, [b"n0"], [PAGE])
    assert (fits.short, fits.victims, fits.pins) == (False, (), None)
    assert (held.need, held.short, held.victims) == (0, False, ())  # no reserve for a held batch
    assert unknown.short and unknown.victims == ()
    assert len(evict(residency, 0, 2 * PAGE)) == 2  # none of those plans marked a page leaving


def test_a_plan_keeps_the_reserve_free_beyond_the_batch() -> None:
    residency = record(4)
    asked: list[int] = []

    def reserve(need: int) -> int:
        asked.append(need)
        return PAGE

    assert len(residency.plan_room(0, 0, [b"n0"], [PAGE], reserve=reserve).victims) == 2
    assert len(residency.plan_room(0, 0, reserve=lambda need: PAGE).victims) == 1  # the reserve alone
    assert asked == [PAGE]


class CountingLock:
    """``Residency``'s lock, counting how often it is taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_an_evicting_write_takes_the_record_lock_once_to_plan() -> None:
    # A write into a full tier, evicting one page: hold, admit, plan (which pages the tier holds,
    # the victim, its demotion tier, all at once), commit, insert, release. It took seven before
    # the plan was one call (prepare, then the victims' demotion tiers asked apart).
    seg = 8 * 1024
    tier = HostTier(HostTierConfig(capacity=4 * seg * 2, slot_size=2 * seg, pin_memory=False))
    store = TieredStore([tier], LruPolicy(1), mover="inline")
    try:
        for i in range(4):
            assert store.put_from([key(i)], [make_page(i, seg)]) == [True]
        lock = CountingLock()
        store._residency._lock = lock  # type: ignore[assignment]
        assert store.put_from([key(4)], [make_page(4, seg)]) == [True]
        assert lock.taken == 6
        assert resident_keys(store, 0) == {key(i) for i in range(1, 5)}
    finally:
        store.close()


class Forgetful(LruPolicy):
    """A broken policy: names a page it was never told of."""

    def victims(self, tier, nbytes):
        return [b"never-inserted"]


def test_a_policy_naming_a_page_the_record_lacks_is_reported_not_repaired() -> None:
    residency = Residency(Forgetful(1), [True], clock=lambda: 0.0)
    residency.inserted(0, [b"k0"], [PAGE], None)
    with pytest.raises(RuntimeError, match="not resident"):
        evict(residency, 0, PAGE)
    assert residency.keys_in(0) == {b"k0"}


class NoTargets(LruPolicy):
    """A broken policy: cannot say where its victims go."""

    def demotion_target(self, key, from_tier):
        raise ValueError("no target")


def test_a_policy_raising_while_planning_gets_its_victims_back() -> None:
    # The victims were marked leaving when the raise came: the caller never saw them, so only the
    # plan can give them back, or they would stay out of the policy's view for good.
    residency = Residency(NoTargets(1), [True], clock=lambda: 0.0)
    residency.inserted(0, [b"k0", b"k1"], [PAGE] * 2, None)
    with pytest.raises(ValueError, match="no target"):
        evict(residency, 0, PAGE)
    assert policy_residents(residency.policy, 0) == residency.keys_in(0) == {b"k0", b"k1"}
    assert residency.policy.residency.used(0) == 2 * PAGE


def build(name: str, caps: list[int]) -> PlacementPolicy:
    refs = {"arc": ArcPolicy, "lirs": LirsPolicy, "lfuda": LfuDaPolicy}
    return refs[name](caps) if name in refs else policy_for_capacities(PolicyConfig(name=name), caps)


@pytest.mark.parametrize("name", ["lru", "heat", "adaptive", "arc", "lirs", "lfuda"])
def test_victims_come_from_the_record_however_pages_left_it(name: str) -> None:
    # Pages leave a tier by ``lost`` (removed, corrupt; also while an eviction of them is under
    # way), by evictions committed and by evictions aborted. After any mix of them, every policy
    # ranks exactly the record's pages and names no other as a victim: it reads sizes and
    # membership from the record, so the drift check in ``plan_room`` cannot fire.
    rng = random.Random(name)
    residency = Residency(build(name, [6 * PAGE, 12 * PAGE]), [True, True], clock=lambda: 0.0)
    policy = residency.policy
    for _ in range(600):
        t = rng.randrange(2)
        ids = rng.sample(range(30), rng.randint(2, 5))
        parent, keys = (b"k%d" % ids[0] if rng.random() < 0.5 else None), [b"k%d" % i for i in ids[1:]]
        op = rng.random()
        if op < 0.4:
            residency.inserted(t, keys, [PAGE] * len(keys), parent)
        elif op < 0.55:
            residency.lost(t, keys)
        elif op < 0.75:
            where = [0 if residency.holds(0, k) else 1 if residency.holds(1, k) else None for k in keys]
            residency.record_lookup(keys, where, parent)
        else:
            victims = evict(residency, t, rng.randint(1, 3) * PAGE)
            if victims:
                keys = [v.key for v in victims]
                assert set(keys) <= residency.keys_in(t)
                residency.lost(t, keys[:1])  # ignored: its eviction decides
                if rng.random() < 0.3:
                    residency.abort_evict(t, victims)
                else:
                    residency.commit_evict(t, keys)
        for u in (0, 1):
            assert policy_residents(policy, u) == residency.keys_in(u)
            assert policy.residency.used(u) == PAGE * len(residency.keys_in(u))
