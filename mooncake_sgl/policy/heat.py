"""HeatPolicy: placement across tiers by decayed access frequency ("heat"), prefix-aware and adaptive.

Design
------
Heat is a frequency sketch's estimate (``sketch.py``): every lookup counts once for every page of the
requested chain, hit or miss, so heat measures demand, not residency. Memory is bounded: the sketch is
fixed size; per-page state exists only for resident pages, and the ghost lists are bounded by the
number of resident pages.

Each bounded tier is split in two, as S3-FIFO's small/main queues (Yang et al., SOSP'23), with ARC's
self-tuning split (Megiddo & Modha, FAST'03):

- ``probation``: a FIFO for newcomers that have shown no reuse yet. Most KV pages are one-hit wonders
  (58 % of the distinct blocks of the Mooncake trace); they leave from here without disturbing
  ``main``.
- ``main``: an LRU of pages with reuse. (A CLOCK with S3-FIFO's 2-bit reference counts was measured
  and lost on a recency-heavy chat workload: counts earned by a finished session outlive it.)
- A newcomer enters ``main`` directly when the sketch says it was demanded before (heat >= 2), which
  remembers far longer than any ghost list, or when it is in a ghost list; otherwise it enters
  ``probation``, where a hit moves it to ``main``.
- Adaptivity: two bounded ghost lists remember recent victims of each segment. A newcomer found in
  the probation ghost would have hit with a larger probation, so its target grows; one found in the
  main ghost shrinks it (ARC's ``p``). No constant is fitted to a trace: the split follows the
  workload, from FIFO-like (large probation) to frequency-protected (tiny probation).

Prefix awareness (a page is useless without the pages before it in its chain):

- Chains are queued tail first, so at equal standing a chain's tail is evicted before its head.
- A page with a resident child in the same tier is skipped when victims are chosen (leaves first,
  as SGLang's radix cache evicts leaves), unless nothing else can be freed. Skipped pages keep their
  place (no rotation): their order is untouched.
- Heat never decreases toward the root: a lookup walks its chain tail to head and raises each page's
  sketch counters to at least its child's estimate, and aging (halving or exponential decay) is
  uniform, so it keeps that order.
- Only the leading run of hits of a lookup counts as hits (as SGLang uses it); pages resident past
  the first miss are demanded (heat) but not referenced.

Across tiers: tier 0 takes every write; a slower tier admits a page when its heat reached
``admission_min_hits``, and a colder page only while the tier's reuse watch sees at least
``admission_min_reuse`` of such pages come back within the tier's residence horizon (one-hit wonders
stay off the SSD when they really are one-hit; when first accesses do come back, as with chat
sessions, the filter opens instead of costing those hits); a victim of a tier is demoted to the next tier
when warm (heat >= ``demotion_min_hits``) and dropped when cold; a page found in a slower tier is
promoted to tier 0 when hot (heat >= ``promotion_min_hits``). Pinned prefixes (a system prompt's
chain, matched by the page hash of its first page) are never victims until ``ttl`` after their last
lookup.

The policy is pure: events in, decisions out; it reads no clock (``tick``) and moves no bytes. Pages'
sizes, and which tier holds a page, are the record's (``api.ResidencyView``); the segments keep
order only. Chain links, pins and the ``on_insert`` prologue are ``chained.ChainedPolicy``'s, shared
with the adaptive policy; this module holds heat, the segments and the decisions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import filterfalse

from ..api import PageKey, PolicyReport
from ..config import PolicyConfig
from .chained import ChainedPolicy, ChainedReport, TierState
from .chains import ChainLinks
from .rules import demotion_tier, promotion_tier
from .sketch import make_sketch

# Heat of a page demanded at least once before this write: it skips probation. The sketch
# remembers ~10 accesses per page of capacity, far longer than a ghost list.
SEEN_BEFORE = 2
# Ghost entries kept per segment, as a multiple of the tier's resident pages (ARC keeps 1x each).
GHOST_PER_PAGE = 1
# Lower bound of the adaptive probation target, as a share of the tier: keeps room for newcomers
# to prove themselves even after a long frequency-heavy phase. Arbitrary (S3-FIFO's fixed share is 10 %).
MIN_PROBATION = 0.01
# Upper bound of the probation target: ``main`` always keeps some protected room.
MAX_PROBATION = 0.9
# Largest reuse-watch ghost per tier (keys): bounds memory for tiers of millions of pages, at the
# price of measuring reuse over a shorter horizon than such a tier's. Arbitrary.
WATCH_LIMIT = 1 << 18
# Outcomes (reused or expired candidates) the admission reuse rate is measured over. Arbitrary.
WATCH_WINDOW = 1024


def reached(heat: float, hits: int) -> bool:
    """A page's heat (its sketch estimate) counts ``hits`` accesses. Half an access of slack: a
    decayed count of two recent accesses is just under 2, and for integer counts the slack
    changes nothing."""
    return heat >= hits - 0.5


def reached_all(heats: Sequence[float], hits: int) -> list[bool]:
    """``reached`` for each of ``heats``."""
    bar = hits - 0.5
    return [heat >= bar for heat in heats]


class HeatSegments(TierState):
    """One tier: probation FIFO + main LRU, both ordered oldest first, with their ghost lists. Every
    value is ``None``: ``pop(key, 0) is None`` means "was there"; sizes are the record's."""

    __slots__ = ("probation", "main", "used_probation", "target", "ghost_probation", "ghost_main",
                 "ghost_hits_probation", "ghost_hits_main")

    def __init__(self, capacity: int | None, probation_fraction: float):
        super().__init__(capacity)
        self.probation: OrderedDict[PageKey, None] = OrderedDict()
        self.main: OrderedDict[PageKey, None] = OrderedDict()
        self.used_probation = 0  # bytes in probation; main holds the rest of the tier's
        self.target = (capacity or 0) * probation_fraction
        self.ghost_probation: OrderedDict[PageKey, None] = OrderedDict()
        self.ghost_main: OrderedDict[PageKey, None] = OrderedDict()
        self.ghost_hits_probation = 0
        self.ghost_hits_main = 0

    def pages(self) -> int:
        return len(self.main) + len(self.probation)

    def place(self, key: PageKey, nbytes: int, warm: bool) -> None:
        """``key`` arrived: ``place_all`` of one page."""
        self.place_all((key,), nbytes, (warm,))

    def place_all(self, keys: Sequence[PageKey], nbytes: int, warm: Sequence[bool]) -> None:
        """``keys`` arrived, in this order, ``nbytes`` each: into ``main`` when a ghost remembers
        the page (moving the split, ARC's rule) or ``warm`` says it was demanded before, else into
        ``probation``. Ghost values are ``None``: ``pop(key, 0) is None`` means "was in that
        ghost". One call for a write's pages: the curves' miniatures place most of the pages they
        are fed."""
        ghost_probation, ghost_main = self.ghost_probation, self.ghost_main
        probation, main = self.probation, self.main
        for key, hot in zip(keys, warm):
            if ghost_probation.pop(key, 0) is None:
                self.ghost_hits_probation += 1
                self.adapt(nbytes, grow=True)
                main[key] = None
            elif ghost_main.pop(key, 0) is None:
                self.ghost_hits_main += 1
                self.adapt(nbytes, grow=False)
                main[key] = None
            elif hot:
                main[key] = None
            else:
                probation[key] = None
                self.used_probation += nbytes

    def referenced(self, key: PageKey, sizes: Mapping[PageKey, int]) -> None:
        """A hit on ``key``: reuse proven, out of probation into ``main``; in ``main``, most recent."""
        if self.probation.pop(key, 0) is None:
            self.used_probation -= sizes[key]
            self.main[key] = None
        elif key in self.main:
            self.main.move_to_end(key)

    def evict_all(self, chosen: Mapping[PageKey, bool], sizes: Mapping[PageKey, int] | None) -> None:
        """The victims ``pick`` chose (victim -> from probation) leave their segments for those
        segments' ghosts, each ghost kept to ``GHOST_PER_PAGE`` entries per page left (at least
        64); ``sizes``: the pages' bytes, ``None`` where every page is one unit."""
        probation, main = self.probation, self.main
        ghost_probation, ghost_main = self.ghost_probation, self.ghost_main
        for key, from_probation in chosen.items():
            if from_probation:
                del probation[key]
                self.used_probation -= 1 if sizes is None else sizes[key]
                ghost = ghost_probation
            else:
                del main[key]
                ghost = ghost_main
            ghost[key] = None
            limit = max(64, GHOST_PER_PAGE * (len(main) + len(probation)))
            while len(ghost) > limit:
                ghost.popitem(last=False)

    def pick(self, sizes: Mapping[PageKey, int], nbytes: int, held: AbstractSet[PageKey],
             pinned: Callable[[PageKey], bool], chosen: dict[PageKey, bool],
             walk_past: Sequence[Callable[[PageKey], bool]] = ()) -> int:
        """Walk both segments oldest first, taking from probation while it is over its target,
        until ``nbytes`` are chosen (``chosen``: victim -> from probation); returns the bytes.
        ``walk_past`` (a leaves-first pass: ``kids.__contains__``, then any other test): the pages
        it skips, each test asked only of the pages the ones before it let through. Skipped pages
        keep their place (no rotation), so a parent is walked past on every call: a tier's old
        shared prefixes gather at the head of its segments. ``kids.__contains__`` filters them out
        in C; walked in Python, they were most of a small tier's eviction work (about 2 us each, on
        every call)."""
        over = self.used_probation - self.target
        freed = 0
        prob, main = iter(self.probation), iter(self.main)
        for skip in walk_past:
            prob, main = filterfalse(skip, prob), filterfalse(skip, main)
        prob_left = main_left = True
        while freed < nbytes and (prob_left or main_left):
            from_probation = prob_left and (over > 0 or not main_left)
            try:
                key = next(prob if from_probation else main)
            except StopIteration:
                if from_probation:
                    prob_left = False
                else:
                    main_left = False
                continue
            n = sizes.get(key)
            if n is None or key in chosen or key in held or pinned(key):
                continue  # only the record's pages can be victims
            chosen[key] = from_probation
            freed += n
            if from_probation:
                over -= n
        return freed

    def adapt(self, nbytes: int, grow: bool) -> None:
        """ARC's rule: move the probation target by one page, more when the other ghost is larger."""
        if not self.capacity:
            return
        gp, gm = len(self.ghost_probation) + 1, len(self.ghost_main) + 1
        step = nbytes * (max(1.0, gm / gp) if grow else max(1.0, gp / gm))
        target = self.target + step if grow else self.target - step
        self.target = min(MAX_PROBATION * self.capacity, max(MIN_PROBATION * self.capacity, target))


class _ReuseWatch:
    """How often pages too cold for a slower tier's admission threshold are looked up again while
    they would still be in that tier: the evidence that makes admission adaptive.

    Every such candidate (admitted or not) enters a FIFO ghost as long as the tier holds pages
    (its residence horizon, capped at ``WATCH_LIMIT``). A lookup of a ghost is a reuse; a ghost
    falling out unseen is not. The rate is kept over a sliding window (counts halved past
    ``WATCH_WINDOW``), so it follows the workload: a chat service whose sessions come back
    opens the door, a stream of one-off documents closes it.
    """

    __slots__ = ("ghost", "limit", "reused", "expired")

    def __init__(self, capacity_pages: int):
        self.ghost: OrderedDict[PageKey, None] = OrderedDict()
        self.limit = max(64, min(WATCH_LIMIT, capacity_pages))
        # Prior of one reuse in two: the door starts open, so nothing is lost before evidence.
        self.reused = 1.0
        self.expired = 1.0

    def reuse_rate(self) -> float:
        return self.reused / (self.reused + self.expired)

    def candidate(self, key: PageKey) -> None:
        ghost = self.ghost
        ghost[key] = None
        ghost.move_to_end(key)
        if len(ghost) > self.limit:
            ghost.popitem(last=False)
            self._count(expired=1.0)

    def looked_up(self, key: PageKey) -> None:
        if self.ghost.pop(key, 0) is None:
            self._count(reused=1.0)

    def _count(self, reused: float = 0.0, expired: float = 0.0) -> None:
        self.reused += reused
        self.expired += expired
        if self.reused + self.expired > WATCH_WINDOW:
            self.reused /= 2
            self.expired /= 2


@dataclass(frozen=True)
class HeatTierReport:
    """One tier of ``HeatReport`` (``tier{i}_<field>``)."""

    pages: int
    probation_pages: int
    probation_target: float | None  # share of the capacity; None: the tier has no capacity
    ghost_hits_probation: int
    ghost_hits_main: int
    cold_reuse_rate: float | None  # the admission filter's watch; None in tier 0, which admits all


@dataclass(frozen=True)
class HeatReport(PolicyReport):
    lookups: int
    hit_pages: int
    slow_tier_admitted: int
    slow_tier_refused: int
    sketch_bytes: int
    chained: ChainedReport
    tiers: tuple[HeatTierReport, ...]  # fastest first


class HeatPolicy(ChainedPolicy):
    """Heat-based admission, eviction, promotion and demotion over ``len(capacities)`` tiers.

    Args:
        capacities: per tier (fastest first), its capacity in bytes, or ``None`` for a tier that
            makes room on its own (the store never asks for its victims).
        config: the ``policy`` section of the store config.
    """

    name = "heat"
    _tiers: list[HeatSegments]

    def __init__(self, capacities: Sequence[int | None], config: PolicyConfig | None = None):
        self.config = config = config or PolicyConfig()
        super().__init__([HeatSegments(c, config.probation_fraction) for c in capacities], config.pins,
                         ChainLinks())
        self._sketch = make_sketch(config.sketch, 0, config.half_life)
        self._watch = [_ReuseWatch(0) for _ in capacities]  # sized with the sketch (page size)
        self.lookups = 0
        self.hit_pages = 0
        self.admitted = 0
        self.refused = 0

    # ------------------------------------------------------------------ heat

    def heat(self, key: PageKey) -> float:
        """Decayed access frequency of ``key`` (sketch estimate; 0 for a page never seen)."""
        return self._sketch.estimate(key)

    def _hot(self, key: PageKey, hits: int) -> bool:
        return reached(self._sketch.estimate(key), hits)

    def _advance(self, now: float) -> None:
        self._sketch.advance(now)

    # ------------------------------------------------------------------ events

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        self.lookups += 1
        self._learn_links(keys, parent)
        run = next((i for i, t in enumerate(tiers) if t is None), len(tiers))
        self.hit_pages += run
        for watch in self._watch[1:]:
            if watch.ghost:
                for key in keys:
                    watch.looked_up(key)
        # Tail to head: each page's counters end at least as high as its child's estimate.
        floor = self._sketch.increment_chain(keys)
        if parent is not None:
            self._raise_ancestors(parent, floor)
        for i in range(run - 1, -1, -1):  # tail to head, so a chain's head ends most recent
            key, tier = keys[i], tiers[i]
            self._tiers[tier].referenced(key, self.residency.pages(tier))
        self._pins.on_lookup(keys, parent)

    def _sized(self) -> None:
        total = sum(s.capacity or 0 for s in self._tiers)
        self._sketch.ensure_capacity(max(1, total // self._page_bytes))
        for seg, watch in zip(self._tiers, self._watch):
            # A tier that evicts on its own: assume its capacity is that of the largest bounded tier.
            pages = (seg.capacity or max(s.capacity or 0 for s in self._tiers)) // self._page_bytes
            watch.limit = max(64, min(WATCH_LIMIT, pages))

    def _place(self, seg: HeatSegments, tier: int, key: PageKey, nbytes: int) -> None:
        seg.place(key, nbytes, self._hot(key, SEEN_BEFORE))

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        seg = self._tiers[tier]
        sizes = self.residency.pages(tier)
        for key in keys:
            if seg.probation.pop(key, 0) is None:
                seg.used_probation -= sizes[key]
            elif seg.main.pop(key, 0) is not None:  # in neither segment: nothing is ranked there
                continue
            self._depart(seg, tier, key)

    def on_evict_aborted(self, keys: Sequence[PageKey], tier: int, nbytes: Sequence[int]) -> None:
        # ``victims`` already moved them to a ghost list; they never left, so they are no ghost hit.
        seg = self._tiers[tier]
        for key in keys:
            seg.ghost_probation.pop(key, None)
            seg.ghost_main.pop(key, None)
        seg.evictions -= len(keys)
        self.on_insert(keys, tier, nbytes)

    # ------------------------------------------------------------------ decisions

    def admit(self, keys: Sequence[PageKey], tier: int) -> list[bool]:
        if tier == 0:
            return [True] * len(keys)
        need = self.config.admission_min_hits
        watch = self._watch[tier]
        open_door = watch.reuse_rate() >= self.config.admission_min_reuse
        out = []
        for k in keys:
            if self._hot(k, need) or self.is_pinned(k):
                out.append(True)
            else:
                watch.candidate(k)
                out.append(open_door)
        ok = sum(out)
        self.admitted += ok
        self.refused += len(out) - ok
        return out

    def promotion_target(self, key: PageKey, found_tier: int) -> int | None:
        target = promotion_tier(found_tier)
        if target is None:
            return None
        if self.is_pinned(key) or self._hot(key, self.config.promotion_min_hits):
            return target
        return None

    def demotion_target(self, key: PageKey, from_tier: int) -> int | None:
        below = demotion_tier(from_tier, len(self._tiers))
        if below is None:
            return None
        if self._hot(key, self.config.demotion_min_hits) or self.is_pinned(key):
            return below
        return None

    def victims(self, tier: int, nbytes: int) -> list[PageKey] | None:
        seg = self._tiers[tier]
        if nbytes <= 0:
            return []
        if self._evictable(tier) < nbytes:
            return None
        sizes, held = self.residency.pages(tier), self.residency.held()
        chosen: dict[PageKey, bool] = {}  # victim -> it came from probation
        pinned = self._pins.is_pinned
        freed = seg.pick(sizes, nbytes, held, pinned, chosen, (seg.kids.__contains__,))
        if freed < nbytes:  # only parents of resident children are left: take them too
            freed += seg.pick(sizes, nbytes - freed, held, pinned, chosen)
        seg.evict_all(chosen, sizes)
        for key in chosen:
            self._depart(seg, tier, key)
        seg.evictions += len(chosen)
        return list(chosen)

    def stats(self) -> HeatReport:
        tiers = tuple(HeatTierReport(seg.pages(), len(seg.probation),
                                     seg.target / seg.capacity if seg.capacity else None,
                                     seg.ghost_hits_probation, seg.ghost_hits_main,
                                     self._watch[i].reuse_rate() if i else None)
                      for i, seg in enumerate(self._tiers))
        return HeatReport(self.lookups, self.hit_pages, self.admitted, self.refused,
                          self._sketch.memory_bytes(), self._chained_report(), tiers)

    # ------------------------------------------------------------------ internals

    def _raise_ancestors(self, key: PageKey | None, floor: float) -> None:
        """A lookup that started mid-chain: keep the known ancestors (resident, or looked up recently)
        at least as warm. Stops at the first ancestor already as warm: those above it are too."""
        sketch = self._sketch
        for ancestor in self._links.ancestors(key):
            if sketch.estimate(ancestor) >= floor:
                return
            sketch.increment(ancestor, floor)
