"""Real stores for the metrics tests: host DRAM over LMDB, placement inline (deterministic)."""

from __future__ import annotations

from pathlib import Path

from mooncake_sgl.api import PlacementPolicy
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.ssd import LmdbTier
from tests.tiers.conformance import empty_like, key, make_page

SEG = 8 * 1024  # two segments: 16 KiB pages
PAGE = 2 * SEG


def host_lmdb_store(path: Path, host_pages: int = 4, policy: PlacementPolicy | None = None
                    ) -> TieredStore:
    host = HostTier(HostTierConfig(capacity=host_pages * PAGE, slot_size=PAGE, pin_memory=False))
    lmdb = LmdbTier(LmdbTierConfig(path=str(path), capacity="64MiB", sync=False))
    return TieredStore([host, lmdb], policy or LruPolicy(2), mover="inline")


def write(store: TieredStore, ids: range) -> None:
    for i in ids:
        assert store.put_from([key(i)], [make_page(i, SEG)]) == [True]


def read(store: TieredStore, ids: range) -> list[bool]:
    return store.get_into([key(i) for i in ids], [empty_like(make_page(0, SEG)) for _ in ids])
