"""``Residency``, the one record of which managed tier holds which page: holds in place of
"protected" sets, and a policy that names a page the record lacks is a bug it reports (the policy's
view is fed only from the record, so there is no drift left to repair)."""

from __future__ import annotations

import random
import threading

import pytest

from mooncake_sgl.api import PlacementPolicy
from mooncake_sgl.config import PolicyConfig
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.sim.reference import ArcPolicy, LfuDaPolicy, LirsPolicy
from mooncake_sgl.store.residency import Residency

PAGE = 1 << 20


def record(pages: int) -> Residency:
    residency = Residency(LruPolicy(1), [True], clock=lambda: 0.0)
    residency.inserted(0, [b"k%d" % i for i in range(pages)], [PAGE] * pages, None)
    return residency


def test_held_pages_are_never_victims_until_every_holder_is_done() -> None:
    residency = record(4)
    with residency.held([b"k0", b"k1"]):
        with residency.held([b"k0"]):
            assert residency.prepare_evict(0, 3 * PAGE) is None  # only two pages are free to go
        victims = residency.prepare_evict(0, 2 * PAGE)
        assert victims is not None and {k for k, _ in victims} == {b"k2", b"k3"}
        residency.commit_evict(0, [k for k, _ in victims])
        assert residency.prepare_evict(0, PAGE) is None  # k0, k1 still held
    victims = residency.prepare_evict(0, 2 * PAGE)
    assert victims is not None and {k for k, _ in victims} == {b"k0", b"k1"}


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
    assert residency.prepare_evict(0, PAGE) is None
    release.set()
    for th in threads:
        th.join()
    assert residency.prepare_evict(0, PAGE) == [(b"k0", PAGE)]


def test_an_aborted_eviction_makes_its_victims_evictable_again() -> None:
    residency = record(2)
    victims = residency.prepare_evict(0, 2 * PAGE)
    assert victims is not None
    assert residency.prepare_evict(0, PAGE) is None  # both leaving
    residency.abort_evict(0, victims)
    assert residency.keys_in(0) == {b"k0", b"k1"}
    assert residency.prepare_evict(0, 2 * PAGE) is not None


class Forgetful(LruPolicy):
    """A broken policy: names a page it was never told of."""

    def victims(self, tier, nbytes, protected=frozenset()):
        return [b"never-inserted"]


def test_a_policy_naming_a_page_the_record_lacks_is_reported_not_repaired() -> None:
    residency = Residency(Forgetful(1), [True], clock=lambda: 0.0)
    residency.inserted(0, [b"k0"], [PAGE], None)
    with pytest.raises(RuntimeError, match="not resident"):
        residency.prepare_evict(0, PAGE)
    assert residency.keys_in(0) == {b"k0"}


def build(name: str, caps: list[int]) -> PlacementPolicy:
    refs = {"arc": ArcPolicy, "lirs": LirsPolicy, "lfuda": LfuDaPolicy}
    return refs[name](caps) if name in refs else policy_for_capacities(PolicyConfig(name=name), caps)


@pytest.mark.parametrize("name", ["lru", "heat", "adaptive", "arc", "lirs", "lfuda"])
def test_victims_come_from_the_record_however_pages_left_it(name: str) -> None:
    # Pages leave a tier by ``lost`` (removed, corrupt; also while an eviction of them is under
    # way), by evictions committed and by evictions aborted. After any mix of them, every policy
    # ranks exactly the record's pages and names no other as a victim: it reads sizes and
    # membership from the record, so the drift check in ``prepare_evict`` cannot fire.
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
            victims = residency.prepare_evict(t, rng.randint(1, 3) * PAGE)
            if victims:
                names = [k for k, _ in victims]
                assert set(names) <= residency.keys_in(t)
                residency.lost(t, names[:1])  # ignored: its eviction decides
                if rng.random() < 0.3:
                    residency.abort_evict(t, victims)
                else:
                    residency.commit_evict(t, names)
        for u in (0, 1):
            assert policy.residents(u) == residency.keys_in(u)
            assert policy.residency.used(u) == PAGE * len(residency.keys_in(u))
