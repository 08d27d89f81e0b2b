"""What the store's own record holds, for consistency checks: the record is private to the store
(``TieredStore`` answers SGLang's calls, not questions about its bookkeeping), so only tests read
it, through here."""

from __future__ import annotations

from mooncake_sgl.api import PageKey
from mooncake_sgl.store.tiered_store import TieredStore


def resident_keys(store: TieredStore, t: int) -> set[PageKey]:
    """The pages the store knows to be in managed tier ``t``."""
    return store._residency.keys_in(t)
