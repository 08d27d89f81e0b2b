"""Every policy keeps ordering state only: sizes and membership are the record's (``api.ResidencyView``),
so no policy holds a map of pages to sizes of its own beside it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping

import pytest

from mooncake_sgl.config import PolicyConfig
from mooncake_sgl.policy import policy_for_capacities
from mooncake_sgl.policy.ledger import Ledger
from mooncake_sgl.sim.reference import ArcPolicy, LfuDaPolicy, LirsPolicy
from tests.store_record import policy_residents

# A page size no count, heat or time in any policy's state comes near, so a value equal to it is a size.
SIZE = 987_654_321
NAMES = ["lru", "heat", "adaptive", "arc", "lirs", "lfuda"]


def mappings_held_by(root: object, skip: set[int]) -> Iterator[Mapping]:
    """Every mapping reachable from ``root`` through containers and mooncake_sgl objects, except
    the objects in ``skip`` (by id) and what only they reach."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in skip:
            continue
        seen.add(id(obj))
        if isinstance(obj, Mapping):
            yield obj
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            stack.extend(obj)
        elif type(obj).__module__.startswith("mooncake_sgl"):
            slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())]
            stack.extend(getattr(obj, s) for s in slots if hasattr(obj, s))
            stack.extend(getattr(obj, "__dict__", {}).values())


@pytest.mark.parametrize("name", NAMES)
def test_no_policy_keeps_a_size_of_its_own(name: str) -> None:
    caps = [40 * SIZE, 80 * SIZE]
    refs = {"arc": ArcPolicy, "lirs": LirsPolicy, "lfuda": LfuDaPolicy}
    policy = refs[name](caps) if name in refs else policy_for_capacities(PolicyConfig(name=name), caps)
    ledger = Ledger(policy)
    keys = [b"k%03d" % i for i in range(120)]
    for i in range(0, 120, 4):  # chains of four, looked up, written to both tiers, some evicted
        chain = keys[i:i + 4]
        ledger.on_lookup(chain, [None] * 4, None)
        for t in (0, 1):
            room = len(ledger.pages(t)) + 4 - caps[t] // SIZE
            if room > 0:
                assert ledger.victims(t, room * SIZE, frozenset(chain))
            ledger.on_insert(chain, t, [SIZE] * 4, None)
        ledger.on_lookup(keys[:i + 4:3], [0] * len(keys[:i + 4:3]), None)
    ledger.on_remove(keys[-8:], 0)
    assert 0 < ledger.used(0) == len(ledger.pages(0)) * SIZE <= caps[0]
    assert policy_residents(policy, 0) == set(ledger.pages(0))
    skip = {id(ledger)} | {id(ledger.pages(t)) for t in (0, 1)}
    for held in mappings_held_by(policy, skip):
        assert SIZE not in held.values(), f"{name} keeps sizes beside the record: {type(held)}"


def test_a_policy_reads_one_record() -> None:
    # Its ordering state describes the pages of the record it was bound to, and no other's.
    policy = policy_for_capacities(PolicyConfig(name="lru"), [4 * SIZE])
    ledger = Ledger(policy)
    policy.bind(ledger)  # the same record again: nothing changes
    with pytest.raises(ValueError, match="bound to another"):
        Ledger(policy)
