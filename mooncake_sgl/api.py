"""Contracts of mooncake_sgl, and nothing else.

Primitives, one line each:

- ``PageKey``        bytes naming one KV page in one namespace (built only by ``keys.page_key``).
- ``PageView``       the scatter-gather segments of one page (memoryviews over host memory).
- ``TierKind``       HBM, HOST, REMOTE, SSD: what medium a tier lives on.
- ``TierCapabilities`` declared facts about a tier (persistent, shared, self-evicting, acts on
                     the soft-pin hint, keeps local files); callers test these, never a tier's class.
- ``TierUsage``      capacity / used bytes and page count of a tier.
- ``Tier``           batch contains / get_into / put_from / remove over pages; never raises for a
                     per-page failure (that is a ``False``), raises ``TierError`` only when broken.
- ``PutResult``      what ``put_from`` returns (frozen): per page ``ok``, and which pages the tier
                     already held (``present``).
- ``PlacementPolicy`` pure, event-fed object deciding admission, victims, promotion and demotion;
                     never moves bytes, reads no clock, takes no tier lock.
- ``ResidencyView``  the record of which page is in which tier, as a policy reads it (sizes,
                     membership, and the pages held for a move in flight, which are never victims);
                     the policy keeps ordering state only.
- ``ExpertStanding`` one expert of an adaptive policy's tier: leading or not, its shadow's hit ratio.
- ``TierReport``     a tier's own counters and gauges (``Tier.stats()``), as declared fields.
- ``PolicyReport``   a policy's own counters and gauges (``PlacementPolicy.stats()``), as declared
                     fields.
- ``STATS_SHAPE``    the nesting of ``TieredStore.stats()`` (one namespace per source of counts).
- ``PagesStored``, ``PagesRemoved``, ``PagesLookedUp``, ``PagesRead`` the store's events: what its
                     record of the managed tiers committed, the lookups its policy learns from,
                     and what each tier's reads took, in order.
- ``StoreObserver``  receives those events after the store's lock is released (capacity curves,
                     router announcements, the load gate); may add a section of its own to
                     ``TieredStore.stats()``.

Tier indices are positions in the store's speed order: 0 is the fastest tier.
"""

from __future__ import annotations

import dataclasses
import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Protocol

PageKey = bytes
PageView = Sequence[memoryview]


def page_nbytes(page: PageView) -> int:
    """Total size of a page given as scatter-gather segments."""
    if len(page) == 1:  # the common page_first layout, and every page the simulator moves
        return page[0].nbytes
    return sum([seg.nbytes for seg in page])  # a list is faster than a generator for a few segments


# The shape of ``TieredStore.stats().as_dict()`` (``store.stats.StoreReport``, whose typed fields
# say the same): one namespace per source of counts, so no two sources can overwrite each other's
# names. Counters only grow; gauges (usage, queue depth) are current values.
#
#   {"store":  {lookups, lookup_pages, lookup_hit_pages, lookups_recorded, lookups_dropped,
#               maintenance_runs, evictions_prepared, evictions_committed, evictions_aborted,
#               promotions_dropped},
#    "mover":  {background (0/1), submitted, completed, dropped, failed, waits, timeouts},
#    "policy": {...}  the policy's own ``stats().as_dict()``,
#    "experts": {<tier name>: {"leader_switches": n, "experts": {<expert>: {"lead": 0/1,
#                "shadow_hit_ratio": r}}}}  from ``PlacementPolicy.standings()`` (adaptive only),
#    "tiers":  {<unique tier name, e.g. "host", "lmdb", "host.1" for a second host tier>: {
#        "usage": {capacity_bytes, used_bytes, holdable_bytes, pages}  (or {"error": "..."} for a
#                  dead tier; absent from a counter file where another rank reports it),
#        "store": {hits, misses (pages a read offered this tier and it lacked), bytes_read,
#                  lookup_hits (pages of lookups' leading runs found here first), writes and
#                  bytes_written (pages new to the tier), write_failures, admission_refused,
#                  promotions / demotions (pages moved into this tier), demotion_failures,
#                  evictions, eviction_aborts (victims whose removal failed), room_refused,
#                  lost (pages gone without an eviction)}  counted by the store for this tier,
#        "tier":  {...}  the tier's own ``stats().as_dict()``}},
#    <section>: ...  one per observer that reports (``ReportingObserver``), e.g. "curves":
#              {"points": {<tier name>: [{multiplier, capacity_pages, lookups, hits}, ...]},
#               "costs": {busy_seconds, process_seconds, dropped_pages}}  (``policy.curve_feed``)}
STATS_SHAPE = ("store", "mover", "policy", "experts", "tiers")


@dataclass(frozen=True)
class TierReport:
    """A tier's own counters and gauges (``Tier.stats()``), as declared fields.

    A tier subclasses it with its fields: numbers, or nested shapes (its ``tally.Tally`` counts, a
    link's report) whose fields ``as_dict`` flattens into the one namespace of the tier, in field
    order, so the flat names of every nested shape must be distinct. Readers that need a quantity
    every tier may have (the exporter) call the methods below, never look a name up: a tier that
    renames its field must update its override, or the tests of that tier fail.
    """

    def as_dict(self) -> dict[str, Any]:
        """The flat ``{name: value}`` of the stats JSON (``["tiers"][<name>]["tier"]``)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, TierReport):
                out.update(value.as_dict())
            elif dataclasses.is_dataclass(value) and not isinstance(value, type):
                out.update(dataclasses.asdict(value))
            else:
                out[f.name] = value
        return out

    def corrupt_pages(self) -> int:
        """Pages found corrupt on read and dropped; 0 for a tier that cannot tell (no checksums)."""
        return 0

    def write_busy_seconds(self) -> float:
        """Seconds the tier's writer was busy (a tier with one serialised writer); 0 otherwise."""
        return 0.0


@dataclass(frozen=True)
class TierReportError(TierReport):
    """A tier whose ``stats()`` raised (a dead remote tier): the store reports the error instead."""

    error: str


@dataclass(frozen=True)
class ExpertStanding:
    """One expert (``lru``, ``arc``, ...) of an adaptive policy in one tier."""

    tier: int
    expert: str
    leading: bool  # its ranking chooses the tier's victims now
    shadow_hit_ratio: float  # prefix hit ratio of its sampled shadow cache
    leader_switches: int  # changes of the tier's leader so far (the same for every expert of it)


class TierKind(enum.Enum):
    HBM = "hbm"
    HOST = "host"
    REMOTE = "remote"
    SSD = "ssd"


@dataclass(frozen=True)
class TierCapabilities:
    # Pages survive a restart of this process; the store seeds the policy from ``scan()``.
    persistent: bool = False
    # Other processes or machines read and write the same pages (pool, Mooncake Store).
    shared: bool = False
    # The tier makes room on its own when full (a pool server with watermarks); the store
    # never asks the policy for victims there.
    self_evicting: bool = False
    # The tier acts on ``put_from``'s ``soft_pin`` hint: it keeps pinned pages longest itself
    # (Mooncake Store's soft pin), which matters where the tier evicts on its own. Every tier
    # accepts the hint; the store works it out only for a tier that acts on it.
    soft_pin: bool = False
    # Pages live in files under the tier's ``path`` on this machine. Ranks given the same
    # directory share those files, so only one of them reports their usage; the store's counter
    # file is kept beside them, so counts survive a restart as the pages do.
    local_files: bool = False
    # Some reads are served from memory the kernel holds (a disk's page cache) and ``get_into_cached``
    # copies those alone, never waiting on the device: the store reads them so first where it
    # would otherwise have to bound the read by a thread of its own (``get_into_within``).
    cached_reads: bool = False


@dataclass(frozen=True)
class TierUsage:
    capacity_bytes: int  # the budget (what the policy sizes itself for)
    used_bytes: int
    pages: int
    # What the medium can still take, when that may be less than the budget's free bytes (a disk
    # that other data filled); ``None``: the budget decides. The store makes room by this.
    room_bytes: int | None = None

    @property
    def free_bytes(self) -> int:
        free = self.capacity_bytes - self.used_bytes
        if self.room_bytes is not None:
            free = min(free, self.room_bytes)
        return max(0, free)

    @property
    def holdable_bytes(self) -> int:
        """What the tier can hold now: the budget, or less where the medium has less room."""
        return self.used_bytes + self.free_bytes


@dataclass(frozen=True)
class PutResult:
    """What ``Tier.put_from`` returns, one entry per key in both fields (their lengths must agree).

    ``ok[i]``: page ``i`` is readable now. ``present[i]``: the tier says it already held page ``i``
    and wrote nothing for it. A tier that does not say leaves ``present`` all ``False``; the store
    then goes by its own record, which a tier whose contents it does not track (a pool, Mooncake
    Store) lacks, so for those tiers ``present`` is how it learns a page was not new.
    """

    ok: tuple[bool, ...]  # per key: readable now
    present: tuple[bool, ...]  # per key: the tier already held it and wrote nothing

    def __post_init__(self) -> None:
        if len(self.ok) != len(self.present):
            raise ValueError(f"PutResult: {len(self.ok)} ok answers but {len(self.present)} "
                             "present answers")

    @classmethod
    def written(cls, ok: Iterable[bool]) -> PutResult:
        """``ok`` per key, and no page reported present (a tier that does not say)."""
        oks = tuple(ok)
        return cls(oks, (False,) * len(oks))

    @classmethod
    def missed(cls, n: int) -> PutResult:
        """``n`` keys, none written nor present: the answer of a call that failed as a whole."""
        return cls((False,) * n, (False,) * n)


class Tier(ABC):
    """One storage medium holding whole pages under ``PageKey``s.

    Thread-safety: every method may be called from several threads at once.
    Failure: a page that is absent, corrupt, the wrong size or unreachable is a per-key ``False``;
    a tier that is closed or broken as a whole raises ``errors.TierError``.
    Atomicity: a page is readable only once ``put_from`` answered ``ok`` for it; a reader never
    sees a half-written page, and a page being read is not overwritten or evicted under the reader.
    """

    name: str
    kind: TierKind
    capabilities: TierCapabilities
    path: str  # the directory of a tier with ``capabilities.local_files``; others have none

    @abstractmethod
    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        """Per key: is the page readable now."""

    @abstractmethod
    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        """Copy each stored page into its destination segments.

        ``False`` for a key that is absent, fails its checksum (then it is also removed), or whose
        stored size differs from the destination's total size. Destinations of failed keys may
        have been partly written.
        """

    def get_into_cached(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        """``get_into`` of the pages whose bytes are in memory now, never waiting on the device
        (only a tier with ``capabilities.cached_reads`` has any). ``False`` for a page not read now
        says nothing of whether the tier holds it (its destination may be partly written); one
        read and found corrupt is also removed, as ``get_into`` does. Default: none."""
        return [False] * len(keys)

    @abstractmethod
    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *,
                 soft_pin: Sequence[bool] | None = None) -> PutResult:
        """Store each page (the concatenation of its segments); the answer is a ``PutResult``.
        Idempotent: a key already present is ``ok`` without rewriting (and may be reported
        ``present``). Not ``ok`` where there is no room; a tier does not evict on its own unless
        it declares ``self_evicting``.

        Hints, which a tier may ignore (its capabilities say which it acts on): ``soft_pin[i]``,
        page ``i`` belongs to a pinned prefix and should be kept longest (``None``: no page is).
        """

    @abstractmethod
    def remove(self, keys: Sequence[PageKey]) -> int:
        """Drop pages; returns how many were present."""

    @abstractmethod
    def usage(self) -> TierUsage: ...

    def footprint(self, nbytes: int) -> int:
        """Capacity a page of ``nbytes`` consumes here (a slot tier charges a whole slot). The store
        sizes evictions with it."""
        return nbytes

    def reachable(self) -> bool:
        """``False`` while the tier is known to be cut off (a lost master, every pool server down),
        so a write to it would only be a miss: the store then drops a victim instead of waiting
        for a copy into it. Must be cheap and never block. Default: a local tier is always there."""
        return True

    def register_memory(self, ptr: int, nbytes: int) -> None:
        """Host memory that pages will be read from and written to (SGLang's host KV pool), so a
        tier with a zero-copy transport can register it once. Default: nothing to do."""

    def page_size_of(self, key: PageKey) -> int | None:
        """Stored size of a page, or ``None`` if absent or where the tier cannot tell (the pool's
        protocol names no sizes): the store then reads a page at the size it knows it by (its
        footprint, the size a read found it at, the size the backend stores objects at). Used to
        size the staging of demotions, promotions and probe reads."""
        return None

    def page_sizes(self, keys: Sequence[PageKey]) -> list[int | None]:
        """``page_size_of`` for each key, in one call (the store asks through its error boundary,
        ``store.tier_calls``, a batch at a time). Default: one ``page_size_of`` per key."""
        return [self.page_size_of(k) for k in keys]

    def scan(self) -> Iterator[tuple[PageKey, int]]:
        """(key, nbytes) of every stored page; only persistent tiers need to yield anything."""
        return iter(())

    def stats(self) -> TierReport:
        """This tier's own counters and gauges (fields are tier specific). ``TieredStore.stats``
        nests them under each tier's ``tier``, so they never collide with the store's counters."""
        return TierReport()

    def clear(self) -> None:
        """Drop every page."""
        keys = [k for k, _ in self.scan()]
        if keys:
            self.remove(keys)

    def close(self) -> None:
        """Release resources; idempotent. Later calls raise ``errors.TierClosed``."""


class ResidencyView(Protocol):
    """The record of residency as a policy reads it: per tier, the pages the policy ranks there and
    their footprints. ``store.residency.Residency`` keeps it for the store (pages being evicted are
    not in it: their policy forgot them), ``policy.ledger.Ledger`` without a store. Live and read-only:
    a policy reads sizes and membership here and never keeps a map of its own beside it, so what it
    ranks and what the store holds cannot drift apart."""

    def pages(self, tier: int) -> Mapping[PageKey, int]:
        """Pages of ``tier`` and their footprints (empty for a tier the store does not track); the
        same live mapping on every call."""

    def used(self, tier: int) -> int:
        """Sum of the footprints in ``pages(tier)``."""

    def held(self) -> AbstractSet[PageKey]:
        """Pages held for a move in flight (a write, a demotion or a promotion of them), in any
        tier: never victims. Live: a page leaves it when its last hold ends, so it is evictable
        again from the next ``victims`` on, without an event of its own."""

    def held_bytes(self, tier: int) -> int:
        """Footprints of the pages in both ``pages(tier)`` and ``held()``, kept current as each hold
        begins and ends: what a policy cannot free in ``tier`` now, known without walking the
        holds (a write holding a large batch would otherwise cost every eviction that walk)."""


class PlacementPolicy(ABC):
    """Where pages should live. Pure: fed events by the store (or by the trace simulator), it never
    moves bytes, reads no clock (time arrives through ``tick``) and takes no tier lock. The store
    serialises calls, so implementations need no lock of their own.

    Lookups reach the policy in batches: the store buffers them and replays them, with their own
    ``tick`` times and in arrival order, before any decision (``admit``, ``victims``,
    ``promotion_target``); under a flood of lookups the oldest buffered ones may be dropped.
    Residency is the store's record, which the policy reads through the ``ResidencyView`` it is
    bound to (``bind``); the policy keeps the ordering state its decisions need and nothing else.
    Events keep the two in step: ``on_insert`` names pages once the record holds them (each page
    new to the tier, once), ``on_remove`` names pages the record still holds and drops right after,
    so a policy reads the size of every page it ranks from the record.
    ``victims`` starts an eviction and forgets the victims at once, in every policy: they leave the
    view as the call returns, the store never reports ``on_remove`` for them, and hands back those it
    could not remove through ``on_evict_aborted``. Which pages cannot be victims now (held for a
    move in flight) is the record's too (``ResidencyView.held``), not an argument.

    ``name`` is the policy's name as the config's ``policy.name`` spells it (``lru``, ``heat``,
    ``adaptive``; the simulator's references ``arc``, ``lirs``, ``lfuda``): metrics label by it.

    A *chain* is a run of keys in prefix order: ``keys[i]`` is only useful when ``keys[:i]`` are.
    ``parent`` is the key before ``keys[0]`` in its chain, or ``None`` at the root.
    """

    name: str
    residency: ResidencyView  # set by ``bind``

    def bind(self, residency: ResidencyView) -> None:
        """Hand the policy the record it reads. ``Residency`` binds its policy when the store is
        built, ``policy.ledger.Ledger`` without a store. Once: ordering state describes one record."""
        bound = getattr(self, "residency", None)
        if bound is not None and bound is not residency:
            raise ValueError(f"{type(self).__name__} is bound to another residency record already")
        self.residency = residency

    @abstractmethod
    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        """A lookup of a chain; ``tiers[i]`` is the fastest tier holding ``keys[i]`` or ``None``.
        Only the leading run of hits counts as hits (as SGLang counts them)."""

    @abstractmethod
    def on_insert(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int],
                  parent: PageKey | None = None) -> None:
        """Pages of a chain became readable in ``tier``, each new there (the record holds them)."""

    @abstractmethod
    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        """Pages left ``tier`` outside an eviction (removed, found corrupt); the record holds them
        until this returns."""

    @abstractmethod
    def admit(self, keys: Sequence[PageKey], tier: int) -> list[bool]:
        """Per key: is it worth writing into ``tier`` now (tier 0 always admits)."""

    @abstractmethod
    def victims(self, tier: int, nbytes: int) -> list[PageKey] | None:
        """Pages of ``tier`` to evict to free at least ``nbytes``, never a held one
        (``ResidencyView.held``: a move of it is in flight) and never one the record lacks there
        (their sizes are read from it). The returned pages are forgotten at once (a later
        ``victims`` never names them again). ``None`` if that much cannot be freed; then no state
        changes."""

    @abstractmethod
    def promotion_target(self, key: PageKey, found_tier: int) -> int | None:
        """Faster tier to copy a page found in ``found_tier`` into, or ``None`` to leave it."""

    @abstractmethod
    def demotion_target(self, key: PageKey, from_tier: int) -> int | None:
        """Slower tier to move a victim of ``from_tier`` into, or ``None`` to drop it."""

    def on_evict_aborted(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int]) -> None:
        """Victims returned by ``victims`` that stay in ``tier`` after all (their removal failed; the
        record holds them again): they must be evictable again later. Default: treat them as
        inserted again."""
        self.on_insert(keys, tier, nbytes)

    def is_pinned(self, key: PageKey) -> bool:
        """Is ``key`` part of a configured pinned prefix (a system prompt) right now."""
        return False

    def tick(self, now: float) -> None:
        """Logical time advanced to ``now`` (seconds); drives decay and pin expiry."""

    def standings(self) -> list[ExpertStanding]:
        """The experts an adaptive policy chooses among, per tier; empty for any other policy."""
        return []

    def stats(self) -> PolicyReport:
        """The policy's own counters and gauges; an empty report for a policy that keeps none."""
        return PolicyReport()


@dataclass(frozen=True)
class PolicyReport:
    """A policy's own counters and gauges (``PlacementPolicy.stats()``), as declared fields.

    A policy subclasses it with its fields: numbers, a nested shape (the fields ``ChainedPolicy``
    shares) flattened in place, and a per-tier tuple (fastest first) whose entries' fields flatten to
    ``tier{i}_<field>``. A field that is ``None`` has no value now (a tier without a capacity has no
    probation target) and is left out, so the flat names are those the stats JSON always had. Readers
    read the fields, never look a name up: a renamed field fails where it is read.
    """

    def as_dict(self) -> dict[str, float]:
        """The flat ``{name: value}`` of the stats JSON (``["policy"]``), in field order."""
        out: dict[str, float] = {}
        _flatten(self, "", out)
        return out


def _flatten(shape: Any, prefix: str, out: dict[str, float]) -> None:
    for f in dataclasses.fields(shape):
        value = getattr(shape, f.name)
        if value is None:
            continue
        if isinstance(value, tuple):
            for i, entry in enumerate(value):
                _flatten(entry, f"tier{i}_", out)
        elif dataclasses.is_dataclass(value):
            _flatten(value, prefix, out)
        else:
            out[prefix + f.name] = float(value)


# ------------------------------------------------------------------------------------ store events


class RemovalCause(enum.Enum):
    """Why pages left a tier's record."""

    EVICTED = "evicted"  # the policy's victims, removed (after their demotion, if any)
    LOST = "lost"  # removed by a caller, found corrupt or missing by the tier
    CLEARED = "cleared"  # ``TieredStore.clear``


@dataclass(frozen=True, slots=True)
class PagesStored:
    """Pages newly readable in managed ``tier`` (not those it already held), with footprints."""

    tier: int
    keys: tuple[PageKey, ...]
    footprints: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PagesRemoved:
    """Pages that left managed ``tier``'s record."""

    tier: int
    keys: tuple[PageKey, ...]
    cause: RemovalCause


@dataclass(frozen=True, slots=True)
class PagesLookedUp:
    """One lookup as the policy received it (a prefix of pages, in order)."""

    keys: Sequence[PageKey]


@dataclass(frozen=True, slots=True)
class PagesRead:
    """One read call into ``tier`` (any tier, managed or not): ``pages`` found of ``asked``,
    ``nbytes`` copied, in ``seconds`` of wall time. What the tier's reads cost, as SGLang waits
    for them (``policy/load_gate.py`` learns each tier's read rate from these). ``probe``: a read
    made only to time the tier (``TieredStore.probe_reads``), the freshest evidence of its speed."""

    tier: int
    asked: int
    pages: int
    nbytes: int
    seconds: float
    probe: bool = False


StoreEvent = PagesStored | PagesRemoved | PagesLookedUp | PagesRead


class StoreObserver(Protocol):
    """What the store tells about itself, in the order its record committed it.

    ``on_events`` is called with the lock of the store's record released, on whichever thread made
    the change (SGLang's storage threads among them) or on another thread delivering at the same
    time: one at a time, in order, never concurrently. It must be quick and must not call back into
    the store; an exception is logged and the observer keeps receiving later events. Event kinds
    an observer does not know it must skip: new kinds are added (``PagesRead`` was). Only managed
    tiers (``TierCapabilities.self_evicting`` false) have a record: a self-evicting tier evicts
    without telling.
    """

    def on_events(self, events: Sequence[StoreEvent]) -> None: ...


class ReportingObserver(StoreObserver, Protocol):
    """An observer that adds ``stats()[section]`` to ``TieredStore.stats()``."""

    section: str

    def stats(self) -> object: ...
