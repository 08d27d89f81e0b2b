"""What the store's own record holds, and what a policy's ordering state ranks, for consistency
checks: the record is private to the store (``TieredStore`` answers SGLang's calls, not questions
about its bookkeeping) and a policy's ordering state is private to it (it answers for decisions
only), so only tests read them, through here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

from mooncake_sgl.api import PageKey, PlacementPolicy
from mooncake_sgl.policy.adaptive import FIRST_LEADER, AdaptivePolicy
from mooncake_sgl.policy.heat import HeatPolicy
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.sim.reference import _ExpertPolicy
from mooncake_sgl.store.tiered_store import TieredStore


def holding(store: TieredStore, keys: Sequence[PageKey]) -> AbstractContextManager[None]:
    """Hold ``keys`` as a move in flight does: none of them is a victim until the block ends."""
    return store._residency.held(keys)


def resident_keys(store: TieredStore, t: int) -> set[PageKey]:
    """The pages the store knows to be in managed tier ``t``."""
    return store._residency.keys_in(t)


def policy_residents(policy: PlacementPolicy, t: int) -> set[PageKey] | None:
    """The pages ``policy``'s ordering state ranks in tier ``t``: the record's pages, when the
    events kept the two in step. ``None`` where it ranks nothing (a tier that evicts on its own)."""
    if isinstance(policy, LruPolicy):
        return set(policy._order[t])
    if isinstance(policy, HeatPolicy):
        seg = policy._tiers[t]
        return set(seg.probation) | set(seg.main)
    if isinstance(policy, AdaptivePolicy):
        state = policy._tiers[t]
        if state.capacity is None:
            return None
        return _drained(state.experts[FIRST_LEADER].candidates()) if state.experts else set()
    if isinstance(policy, _ExpertPolicy):
        expert = policy._experts[t]
        return set() if expert is None else _drained(expert.candidates())
    raise TypeError(f"no ordering state known for {type(policy).__name__}")


def _drained(candidates: Iterator[PageKey]) -> set[PageKey]:
    # An expert's candidates are a generator over its live state: closed, not left suspended.
    try:
        return set(candidates)
    finally:
        candidates.close()
