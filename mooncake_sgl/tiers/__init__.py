"""Tier implementations and ``build_tier``, the one place a tier config becomes a ``Tier``.

- ``hbm``             ``HbmTier``: spare GPU memory, cut into slots as the host tier cuts DRAM.
- ``host``            ``HostTier``: host DRAM slots.
- ``pool``            ``PoolTier``: pages in ``mooncake-sgl pool`` servers (client: ``transfer``).
- ``mooncake_store``  ``MooncakeStoreTier``: the real Mooncake Store; ``mooncake_link`` is the
                      client's link to its master, kept up by a watcher thread.
- ``ssd``             ``LmdbTier`` (``kind: lmdb``): the SSD tier, a package: an LMDB index over
                      an extent file (``ssd/__init__.py`` is its design); ``tier`` (the API),
                      ``index`` (environment, reader table, sweep, free log), ``extents`` (space),
                      ``page_io`` and ``write_route`` (checksummed I/O), ``records``, ``probe``,
                      ``aside`` (damaged directories) and ``resident`` (the index kept in memory).

Tier modules are imported lazily, inside their branch, so an optional dependency (CUDA for
``hbm``, the Mooncake client for ``mooncake_store``, the pool transport) is only imported when a
deployment configures that tier.
"""

from __future__ import annotations

import os

import msgspec

from ..api import Tier
from ..config import (
    HbmTierConfig,
    HostTierConfig,
    LmdbTierConfig,
    MooncakeStoreTierConfig,
    PoolTierConfig,
    TierConfig,
)


def build_tier(cfg: TierConfig, *, rank_suffix: str = "") -> Tier:
    """Construct the tier a config section describes.

    Args:
        cfg: one entry of ``StoreConfig.tiers``.
        rank_suffix: names this process among the ranks of one deployment (e.g. ``tp0``). Tiers
            backed by a local file take a subdirectory per rank, so TP ranks never contend for one
            LMDB write lock.

    Raises:
        TierError: the tier cannot be brought up (bad path, no memory, unreachable service).
    """
    if isinstance(cfg, HostTierConfig):
        from .host import HostTier

        return HostTier(cfg)
    if isinstance(cfg, LmdbTierConfig):
        from .ssd import LmdbTier, default_lmdb_path

        if rank_suffix:
            path = os.path.join(cfg.path or default_lmdb_path(), rank_suffix)
            cfg = msgspec.structs.replace(cfg, path=path)
        return LmdbTier(cfg)
    if isinstance(cfg, HbmTierConfig):
        from .hbm import HbmTier  # type: ignore[import-not-found]

        return HbmTier(cfg)
    if isinstance(cfg, PoolTierConfig):
        from .pool import PoolTier

        return PoolTier(cfg)
    if isinstance(cfg, MooncakeStoreTierConfig):
        from .mooncake_store import MooncakeStoreTier

        return MooncakeStoreTier(cfg)
    raise TypeError(f"no tier is registered for config {type(cfg).__name__}")
