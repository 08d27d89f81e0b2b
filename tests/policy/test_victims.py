"""One meaning of ``PlacementPolicy.victims`` across every policy: the pages it returns are forgotten
at once (a second call never names them again, and nothing else has to tell the policy they left),
a ``None`` answer changes nothing, and held (``protected``) pages are never named."""

from __future__ import annotations

import pytest

from mooncake_sgl.api import PlacementPolicy
from mooncake_sgl.config import PolicyConfig
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.ledger import Ledger
from mooncake_sgl.sim.reference import ArcPolicy, LfuDaPolicy, LirsPolicy

PAGE = 1 << 20
NAMES = ["lru", "heat", "adaptive", "arc", "lirs", "lfuda"]


def build(name: str, pages: int) -> PlacementPolicy:
    caps = [pages * PAGE]
    refs = {"arc": ArcPolicy, "lirs": LirsPolicy, "lfuda": LfuDaPolicy}
    return refs[name](caps) if name in refs else policy_for_capacities(PolicyConfig(name=name), caps)


def filled(name: str, pages: int = 8) -> tuple[PlacementPolicy, list[bytes]]:
    policy = Ledger(build(name, pages))
    keys = [b"k%02d" % i for i in range(pages)]
    for k in keys:  # separate chains: every page is a leaf
        policy.on_insert([k], 0, [PAGE])
    return policy, keys


@pytest.mark.parametrize("name", NAMES)
def test_victims_are_forgotten_at_once_in_every_policy(name: str) -> None:
    policy, keys = filled(name)
    first = policy.victims(0, 2 * PAGE)
    second = policy.victims(0, 2 * PAGE)
    assert first and second and not set(first) & set(second)
    rest = policy.victims(0, 4 * PAGE)  # exactly the four pages never named
    assert rest is not None and set(rest) == set(keys) - set(first) - set(second)
    assert policy.victims(0, PAGE) is None


@pytest.mark.parametrize("name", NAMES)
def test_a_refused_eviction_changes_nothing(name: str) -> None:
    policy, keys = filled(name)
    assert policy.victims(0, 9 * PAGE) is None
    assert policy.victims(0, 8 * PAGE, frozenset(keys[:1])) is None
    got = policy.victims(0, 8 * PAGE)  # every page is still there to be named
    assert got is not None and set(got) == set(keys)


@pytest.mark.parametrize("name", NAMES)
def test_held_pages_are_never_victims(name: str) -> None:
    policy, keys = filled(name)
    held = frozenset(keys[::2])
    got = policy.victims(0, 4 * PAGE, held)
    assert got is not None and len(got) == 4 and not held & set(got)


@pytest.mark.parametrize("name", NAMES)
def test_the_policy_names_itself(name: str) -> None:
    assert build(name, 4).name == name
