"""``Pins``: pinned prefixes (a system prompt's chain) and when their pins expire.

A pin is configured by the page hash of a chain's first page (``policy.pins``). A lookup whose chain
starts with that page, or continues a page pinned now, pins every page of the chain until ``ttl``
after that lookup. Pinned pages are never victims, are admitted to every tier, and reach a tier
that supports it (Mooncake Store) soft-pinned. Time is the policy's logical clock (``tick``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..api import PageKey
from ..config import PinConfig
from ..keys import hash_part_of, page_hash_part

# TTL assumed for the sweep schedule when no pin is configured (seconds). Arbitrary.
_DEFAULT_TTL = 60.0


class Pins:
    """Which pages are pinned, and until when."""

    __slots__ = ("_roots", "_until", "_now", "_next_sweep")

    def __init__(self, pins: Sequence[PinConfig]) -> None:
        self._roots = {page_hash_part(p.prefix_hash): p.ttl for p in pins}
        self._until: dict[PageKey, float] = {}  # page -> time its pin expires
        self._now = 0.0
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._until)

    def is_pinned(self, key: PageKey) -> bool:
        return self._until.get(key, -1.0) > self._now

    def keys(self) -> Sequence[PageKey]:
        """Pages holding a pin (some possibly expired: check ``is_pinned``)."""
        return list(self._until)

    def tick(self, now: float) -> None:
        self._now = now
        if self._until and now >= self._next_sweep:
            self._until = {k: t for k, t in self._until.items() if t > now}
            ttl = min(self._roots.values(), default=_DEFAULT_TTL)
            self._next_sweep = now + ttl / 4  # a stale pin is harmless: is_pinned checks time

    def on_lookup(self, keys: Sequence[PageKey], parent: PageKey | None) -> None:
        """A pinned chain (its first page matches a pin, or it continues a pinned page) is pinned
        for the pin's ttl from now."""
        if not self._roots or not keys:
            return
        if parent is None:
            ttl = self._roots.get(hash_part_of(keys[0]))
        else:
            ttl = self._until[parent] - self._now if self.is_pinned(parent) else None
        if ttl is not None:
            expiry = self._now + ttl
            for key in keys:
                self._until[key] = expiry

    def forget(self, key: PageKey) -> None:
        self._until.pop(key, None)
