"""``PolicyMiniature``: a real placement policy run alone on a miniature tier (SHARDS' "miniature
simulation": Waldspurger et al., "Cache Modeling and Optimization using Miniature Simulations",
USENIX ATC 2017), through the general machinery of a store: a ``policy.ledger.Ledger`` (pages of
one byte, so capacities and counts are in pages), fed what the store feeds a single-tier policy
for each request (``sim.simulator``, ``store.residency``): the lookup with where each page is,
then the write-back of the pages past the leading run of hits, room made first by the policy's
own victims, the batch's tail lost when the room cannot be made (the store writes what fits).

Not the product's: the estimator before issue 51 ran every size on it (``curves_before``), and
``tests/policy/test_heat_miniature.py`` holds the curves' ``policy.heat_miniature.HeatMiniature``
to it, decision for decision (the same decisions at a third of the cost, without the ledger).
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_sgl.api import PageKey, PlacementPolicy
from mooncake_sgl.policy.ledger import Ledger


class PolicyMiniature:
    """``policy``, built for one tier of ``capacity_pages`` one-byte pages, fed sampled requests.
    Quacks like ``shadow.ShadowCache`` where the curves read one (``access``, ``hits``, ``entries``)."""

    __slots__ = ("ledger", "capacity", "hits", "lookups")

    def __init__(self, policy: PlacementPolicy, capacity_pages: int):
        self.ledger = Ledger(policy)
        self.capacity = capacity_pages
        self.hits = 0
        self.lookups = 0

    def access(self, keys: Sequence[PageKey]) -> int:
        """A request's sampled pages, in chain order; returns its prefix hits in this miniature."""
        ledger = self.ledger
        held = ledger.pages(0)
        where: list[int | None] = [0 if k in held else None for k in keys]
        run = next((i for i, t in enumerate(where) if t is None), len(keys))
        ledger.on_lookup(keys, where, None)
        self.hits += run
        self.lookups += len(keys)
        rest = keys[run:]
        if rest:
            self._write(rest, keys[run - 1] if run else None)
        return run

    def _write(self, keys: Sequence[PageKey], parent: PageKey | None) -> None:
        """SGLang's write-back of the pages it just computed, as the store places it in one tier."""
        ledger = self.ledger
        held = ledger.pages(0)
        need = sum(1 for k in keys if k not in held)
        short = need - (self.capacity - ledger.used(0))
        if short > 0:
            # The pages being written are held by the write: never victims of their own room.
            ledger.victims(0, short, frozenset(keys))
        room = self.capacity - ledger.used(0)
        written = []
        for key in keys:
            if key in held:
                written.append(key)
            elif room > 0:
                written.append(key)
                room -= 1
        if written:
            ledger.on_insert(written, 0, [1] * len(written), parent)

    def entries(self) -> int:
        """Pages the miniature ranks (its policy's ghosts and sketch come on top)."""
        return len(self.ledger.pages(0))
