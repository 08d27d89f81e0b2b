"""The tiered page store: ``TieredStore`` and ``build_store``.

Files, one class each, top to bottom (each calls only those below it):

- ``tiered_store``  ``TieredStore``: the request paths (lookup, cascade read, write with admission),
                    remove/clear, and stats gathered from the parts below.
- ``promoter``      ``Promoter``: pages a read found in a slower tier, copied up.
- ``placer``        ``Placer``: a write into one tier with room made first (two-phase eviction
                    with demotion, which is a write of the placer into a slower tier), headroom.
- ``mover``         ``BackgroundMover``: the bounded background thread placement work runs on;
                    ``Mover``: the interface the other parts take.
- ``inline_mover``  ``InlineMover``: the same interface on the caller's thread (simulator).
- ``residency``     ``Residency``: the one record of which managed tier holds which page (with
                    per-page holds in place of "protected" sets), the lookup buffer, every policy call.
- ``tier_calls``    ``TierCalls``: every call into a tier; the store's one error boundary (a tier's
                    failure is a miss, logged through the rate-limited ``failure_log.FailureLog``).
- ``staging``       ``Staging``: reusable buffers for pages the store moves itself.
- ``stats``         the typed stats shapes, one per component that counts (``tally.Tally`` of each).

A read: ``exists_prefix`` → ``TierCalls.locate`` (contains, fastest tier first) → the lookup is
buffered in ``Residency`` for the policy. ``get_into`` → ``TierCalls.call(get)`` tier by tier on the
keys still missing → pages found below tier 0 → ``Promoter.promote`` (on the mover, or inline) →
``Residency.promotion_targets`` → ``Placer.write`` into the faster tier.

A write: ``put_from`` holds its keys on ``Residency`` → ``Residency.admit`` (per tier) →
``Placer.write`` per admitting tier (shared tiers in parallel) → room: ``Residency.plan_room``
(one call: the policy names victims and their demotion tiers) → victims copied down by
``Placer.write`` there → removed → ``commit_evict`` / ``abort_evict`` → ``TierCalls.call(put)`` →
``Residency.inserted`` (the policy hears of it) → headroom kept later on the mover.
"""

from __future__ import annotations

from ..api import Tier
from ..config import StoreConfig
from .tiered_store import TieredStore

__all__ = ["TieredStore", "build_store"]


def build_store(config: StoreConfig, rank_suffix: str = "") -> TieredStore:
    """The store a config describes. ``rank_suffix`` keeps per-rank local files apart."""
    from ..policy import build_policy
    from ..tiers import build_tier

    tiers: list[Tier] = []
    try:
        for tier_config in config.tiers:
            tiers.append(build_tier(tier_config, rank_suffix=rank_suffix))
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return TieredStore(tiers, build_policy(config.policy, tiers))
