"""``WrappedTier``: a real tier behind a test's hooks. Every call goes to ``inner``; a test subclass
overrides only the calls it watches or breaks (``FaultyTier``, ``ThreadLog``)."""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_sgl.api import PageKey, PageView, PutResult, Tier, TierReport, TierUsage


class WrappedTier(Tier):
    def __init__(self, inner: Tier) -> None:
        self.inner = inner
        self.name, self.kind, self.capabilities = inner.name, inner.kind, inner.capabilities

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        return self.inner.contains(keys)

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        return self.inner.get_into(keys, pages)

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *, soft_pin=None) -> PutResult:
        return self.inner.put_from(keys, pages, soft_pin=soft_pin)

    def remove(self, keys: Sequence[PageKey]) -> int:
        return self.inner.remove(keys)

    def usage(self) -> TierUsage:
        return self.inner.usage()

    def footprint(self, nbytes: int) -> int:
        return self.inner.footprint(nbytes)

    def reachable(self) -> bool:
        return self.inner.reachable()

    def page_size_of(self, key: PageKey) -> int | None:
        return self.inner.page_size_of(key)

    def scan(self):
        return self.inner.scan()

    def stats(self) -> TierReport:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()


class SizeBlind(WrappedTier):
    """A tier that cannot tell a page's size, as the pool (its protocol names none)."""

    def page_size_of(self, key: PageKey) -> int | None:
        return None
