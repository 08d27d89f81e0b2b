"""The capacity-curve estimator as it was until issue 51, kept for ``scripts/bench_capacity_curves.py``
only: its accuracy and cost beside the current one's, in the same run. Not the product's.

Every size ran a miniature of the policy on a SHARDS sample of at most ``SHADOW_PAGES`` pages
(``lru``: the LRU expert touching chains head first; ``heat``, ``adaptive``: the policy itself, on a
``Ledger``), and reported the miniature's hits and sampled lookups scaled by ``1 / R``: hits counted
on sampled pages alone (a chain whose unsampled first page missed still hit past it) and a hit
ratio set by whichever shared heads the hash drew, both biased (docs/capacity_curves.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from devtools.bench.policy_miniature import PolicyMiniature
from mooncake_sgl.api import PageKey
from mooncake_sgl.config import PolicyConfig
from mooncake_sgl.policy.adaptive import AdaptivePolicy
from mooncake_sgl.policy.curve import MULTIPLIERS, CurvePoint
from mooncake_sgl.policy.experts import ArcExpert, Expert, LfuDaExpert, LirsExpert, LruExpert
from mooncake_sgl.policy.heat import HeatPolicy
from mooncake_sgl.policy.shadow import ShadowCache, key_hash

SHADOW_PAGES = 4096


def _miniatures(policy_name: str, pages: int, config: PolicyConfig | None
                ) -> list[ShadowCache | PolicyMiniature]:
    cls = {"heat": HeatPolicy, "adaptive": AdaptivePolicy}.get(policy_name)
    if cls is not None:
        return [PolicyMiniature(cls([pages], config or PolicyConfig(name=policy_name)), pages)]
    expert: type[Expert] = {"arc": ArcExpert, "lirs": LirsExpert, "lfuda": LfuDaExpert}.get(
        policy_name, LruExpert)
    return [ShadowCache(expert(pages), head_first=policy_name == "lru")]


class CurvesBefore:
    """One tier's curve as the old estimator kept it, fed what ``TierCurves.on_lookup`` is fed."""

    def __init__(self, capacity_pages: int, policy_name: str, config: PolicyConfig | None = None,
                 multipliers: Sequence[float] = MULTIPLIERS):
        self._sizes = []
        for m in multipliers:
            pages = max(1, round(capacity_pages * m))
            rate = min(1.0, SHADOW_PAGES / pages)
            small = max(1, round(pages * rate))
            self._sizes.append((m, pages, rate, int(rate * (1 << 64)),
                                _miniatures(policy_name, small, config), [0]))

    def on_lookup(self, keys: Sequence[PageKey]) -> None:
        hashes = [key_hash(k) for k in keys]
        for _, _, _, threshold, miniatures, lookups in self._sizes:
            sampled = [k for k, h in zip(keys, hashes) if h < threshold]
            if sampled:
                lookups[0] += len(sampled)
                for miniature in miniatures:
                    miniature.access(sampled)

    def points(self) -> list[CurvePoint]:
        return [CurvePoint(m, pages, pages, lookups[0] / rate, max(x.hits for x in miniatures) / rate)
                for m, pages, rate, _, miniatures, lookups in self._sizes]

    def entries(self) -> int:
        return sum(x.entries() for *_, miniatures, _ in self._sizes for x in miniatures)

