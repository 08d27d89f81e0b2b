"""``HeatMiniature`` (``policy/heat_miniature.py``): the heat policy's decisions for the curves, made
without the ledger. Held to ``HeatPolicy`` driven through one (``PolicyMiniature``) request by
request, in every config that changes a decision; sampled, a leaf is walked past once per page its
chain has after it."""

from __future__ import annotations

import random

import pytest

from devtools.bench.policy_miniature import PolicyMiniature
from mooncake_sgl.config import PinConfig, PolicyConfig
from mooncake_sgl.keys import KeyNamespace, page_key
from mooncake_sgl.policy.heat import HeatPolicy
from mooncake_sgl.policy.heat_miniature import HeatMiniature

NS = KeyNamespace(model="m", dtype="bf16", layout="page_first", page_size=64)


def requests(n: int, seed: int) -> list[list[bytes]]:
    """Hot documents (Pareto-popular, some longer than a small tier) with private tails, and now
    and then a lookup that starts mid-chain or repeats a page."""
    rng = random.Random(seed)
    docs = [[page_key(NS, f"doc{d}-{i}") for i in range(rng.randint(2, 30))] for d in range(40)]
    out = []
    for r in range(n):
        keys = docs[min(int(rng.paretovariate(1.1)) - 1, len(docs) - 1)]
        keys = keys + [page_key(NS, f"tail{r}-{i}") for i in range(rng.randint(0, 8))]
        if r % 17 == 0:
            keys = keys[len(keys) // 2:]
        if r % 29 == 0 and keys:
            keys = keys + keys[:1]
        out.append(keys)
    return out


CONFIGS = {
    "defaults": PolicyConfig(name="heat"),
    "wide probation": PolicyConfig(name="heat", probation_fraction=0.5),
    "decay sketch": PolicyConfig(name="heat", sketch="decay", half_life="1m"),
    # Pins match a chain's first page: two hot documents' heads.
    "pins": PolicyConfig(name="heat", pins=[PinConfig(prefix_hash="doc0-0"),
                                            PinConfig(prefix_hash="doc3-0", ttl="5s")]),
}


@pytest.mark.parametrize("pages", [8, 60, 400])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_miniature_decides_as_the_policy_on_a_ledger_request_by_request(name: str, pages: int) -> None:
    config = CONFIGS[name]
    reference = PolicyMiniature(HeatPolicy([pages], config), pages)
    miniature = HeatMiniature(pages, config)
    for i, keys in enumerate(requests(3000, seed=pages)):
        assert miniature.access(keys) == reference.access(keys), f"request {i}"
    policy = reference.ledger.policy
    ours, theirs = miniature._seg, policy._tiers[0]
    assert list(ours.probation) == list(theirs.probation) and list(ours.main) == list(theirs.main)
    assert list(ours.ghost_main) == list(theirs.ghost_main) and ours.target == theirs.target
    assert ours.kids == theirs.kids and ours.evictions == theirs.evictions
    assert (miniature.hits, miniature.lookups) == (reference.hits, reference.lookups)
    assert miniature.hits > 0 and ours.evictions > 0


def test_a_sampled_leaf_is_walked_past_once_per_page_its_chain_has_after_it() -> None:
    miniature = HeatMiniature(3, PolicyConfig(name="heat"), sampled=True)
    a, b, c, d, e, f = (page_key(NS, x) for x in "abcdef")
    miniature.owe([a], [2])  # a stands for itself and the two unsampled pages after it
    for key in (a, b, c):
        miniature.access([key])
    miniature.access([d])  # the leaves-first pass walks past a (owing 2, now 1): b leaves
    assert set(miniature._resident) == {a, c, d}
    miniature.access([e])  # past a again (now 0): c leaves
    assert set(miniature._resident) == {a, d, e}
    miniature.access([f])  # a has paid: it leaves, and owes nothing any more
    assert set(miniature._resident) == {d, e, f} and miniature.owed == {}


def test_an_exact_miniature_holds_no_debts_and_a_sampled_one_forgets_pages_that_never_arrived() -> None:
    exact = HeatMiniature(4, PolicyConfig(name="heat"))
    exact.owe([b"x"], [3])
    assert exact.owed is None
    sampled = HeatMiniature(4, PolicyConfig(name="heat"), sampled=True)
    keys = [page_key(NS, f"gone{i}") for i in range(2 * 4 + 65)]
    sampled.owe(keys, [1] * len(keys))  # none of them resident: past the bound, all forgotten
    assert sampled.owed == {}
