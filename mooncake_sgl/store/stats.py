"""The store's typed stats: one shape per component that counts (``tally.Tally`` of each).

``TieredStore.stats()`` nests them as ``api.STATS_SHAPE`` says; per tier, the request paths', the
placer's and the promoter's counts of that tier form the tier's ``"store"`` entry (their field names
never overlap, which ``test_store`` checks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LookupStats:
    """``TieredStore``'s own counts over all tiers."""

    lookups: int = 0  # exists_prefix calls
    lookup_pages: int = 0  # pages asked by them
    lookup_hit_pages: int = 0  # pages of their leading runs found
    promotions_dropped: int = 0  # pages a backlogged mover could not take for promotion


@dataclass(frozen=True)
class TierReadStats:
    """What the request paths did with one tier."""

    hits: int = 0  # pages a read offered this tier and got
    misses: int = 0  # pages a read offered this tier and it lacked
    bytes_read: int = 0
    lookup_hits: int = 0  # pages of lookups' leading runs found here first
    admission_refused: int = 0  # pages the policy did not admit to this tier
    lost: int = 0  # pages gone without an eviction (removed under us, corrupt)


@dataclass(frozen=True)
class TierPlacementStats:
    """What ``Placer`` did in one tier."""

    writes: int = 0  # pages new to the tier
    bytes_written: int = 0
    write_failures: int = 0
    demotions: int = 0  # pages demoted into this tier
    demotion_failures: int = 0  # victims of this tier whose copy down failed or was dropped
    evictions: int = 0
    eviction_aborts: int = 0  # victims whose removal failed (they stay evictable)
    room_refused: int = 0  # room asked and the policy could name no victims


@dataclass(frozen=True)
class TierPromotionStats:
    """What ``Promoter`` did into one tier."""

    promotions: int = 0  # pages promoted into this tier


@dataclass(frozen=True)
class ResidencyStats:
    """``Residency``'s lookup buffer and two-phase evictions."""

    lookups_recorded: int = 0
    lookups_dropped: int = 0  # oldest lookups dropped from a full buffer
    maintenance_runs: int = 0
    evictions_prepared: int = 0
    evictions_committed: int = 0
    evictions_aborted: int = 0
    promotions_beyond_reach: int = 0  # not promoted: last used longer ago than tier 0 turns over


@dataclass(frozen=True)
class MoverStats:
    """A mover's tasks (the same for both movers)."""

    submitted: int = 0
    completed: int = 0
    dropped: int = 0  # refused by a full queue, or cancelled at close
    failed: int = 0  # raised (logged)
    waits: int = 0  # calls a request thread waited for
    timeouts: int = 0  # of those, given up after their timeout
