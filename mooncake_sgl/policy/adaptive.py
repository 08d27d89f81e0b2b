"""AdaptivePolicy: every tier evicts as the textbook policy that would be doing best on this workload
right now, chosen online by miniature simulations.

Why: no fixed policy wins everywhere. On the Mooncake trace LIRS wins at small capacities of the
first half and loses to LRU at large ones; LFU-DA wins at 2 % and loses at 9 %; on chat sessions LRU
is near optimal (docs/replay_hit_ratio.md). An operator cannot know in advance which one fits.

Design
------
Per bounded tier:

- **Experts over the real pages** (``experts.py``): LRU, ARC, LIRS and LFU-DA each keep their own
  ranking of the tier's resident pages and see every event (reference, arrival, departure, whoever
  chose it), so each one's ghosts and aging stay current while another leads.
- **Shadows** (``shadow.py``): one miniature cache per expert, SHARDS-sampled, replays every
  lookup's sampled pages alone (from the first lookup on); its prefix hits over a decayed window
  rate the expert. The tier's victims are chosen by the leader, LRU until another expert's shadow
  leads it by at least 3 % and by three standard deviations under any of three noise models (so
  near-equal experts do not take turns): once the lead has changed, first the sampled pages the
  leader's shadow would not hold (the tier converges to what that expert alone would hold), then
  the leader's ranking. It is the product's default policy (``PolicyConfig.name``). Cost per page
  access: O(experts) for the real rankings plus O(experts) for the sampled fraction in the shadows,
  and O(experts²) per request for the tests; memory: four rankings of the resident pages plus four
  shadows of ``max(R * pages, MIN_SHADOW_PAGES)`` (``R`` = 1/16), a fixed fraction above the floor.

Prefix awareness: only a lookup's leading run of hits is referenced (pages past the first miss are
not used by SGLang); chains are referenced and inserted tail first, so at equal standing a chain's
head outlives its tail; and victims are leaves first: a page with a resident child in the tier is
skipped while anything else can be freed, so no tail is left without its head. Chain links come from
lookups (a write may be a filtered or demoted batch, not a chain).

Across tiers: every tier runs its own experts and shadows (a slower tier's shadows model a cache of
its size on the whole stream: the tiers are inclusive, as every write reaches them). A page is written
to every tier (write-through), a page found in a slower tier is promoted to tier 0, and a victim of a
tier moves one tier down. Pinned prefixes (``policy.pins``) are never victims until ``ttl`` after their
last lookup.

Pure, like every policy here: events in, decisions out, no clock (``tick``), no I/O. Pages' sizes,
and which tier holds a page, are the record's (``api.ResidencyView``): the experts keep order only.
The write-through rules are ``rules.WriteThrough``'s; chain links, pins and the ``on_insert``
prologue are ``chained.ChainedPolicy``'s, shared with the heat policy.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from ..api import ExpertStanding, PageKey, PolicyReport
from ..config import PolicyConfig
from .chained import ChainedPolicy, ChainedReport, TierState
from .chains import ChainLinks
from .experts import EXPERTS, Expert, LruExpert
from .rules import WriteThrough
from .shadow import Tournament, key_hash, sample_rate

# Chain links of looked-up pages not yet resident, kept until their write arrives, and lookups kept
# for the shadows until the first write (pages). Arbitrary; tighter than ``chains.PENDING_LINKS``.
PENDING_LINKS = 1 << 14
# Expert followed until the shadows have evidence: LRU, the baseline the policy must never fall below.
FIRST_LEADER = next(i for i, e in enumerate(EXPERTS) if e is LruExpert)


class _Tier(TierState):
    """One bounded tier: the experts ranking its resident pages, their shadows."""

    __slots__ = ("experts", "tournament")

    def __init__(self, capacity: int | None):
        super().__init__(capacity)
        self.experts: list[Expert] = []  # built once the page size is known
        self.tournament: Tournament | None = None

    def start(self, page_bytes: int, real: Container[PageKey]) -> None:
        """Size the experts and shadows; ``real``: the tier's resident pages (the record's)."""
        pages = max(1, self.capacity // page_bytes)
        rate = sample_rate(pages)
        self.experts = [cls(pages) for cls in EXPERTS]
        self.tournament = Tournament([cls(max(1, round(pages * rate))) for cls in EXPERTS], rate,
                                     FIRST_LEADER, real)

    @property
    def leader(self) -> Expert:
        return self.experts[self.tournament.leader]


class _Links(ChainLinks):
    """``ChainLinks`` with this policy's own bound on pending links (``PENDING_LINKS``)."""

    __slots__ = ()

    def learn(self, keys: Sequence[PageKey], parent: PageKey | None,
              resident: Callable[[PageKey], bool]) -> list[tuple[PageKey, PageKey | None]]:
        learnt = super().learn(keys, parent, resident)
        pending = self._pending
        while len(pending) > PENDING_LINKS:  # oldest first, as ``ChainLinks`` trims
            pending.popitem(last=False)
        return learnt


def _eviction_order(state: _Tier) -> Iterator[PageKey]:
    """The leader's order: first the sampled pages its shadow would not hold, then its ranking.

    The first part converges the tier to what the leader alone would hold after the lead changed.
    A leader that has led from the start already holds exactly that, and a sampled shadow's
    outcasts would only add its sampling error, so they are skipped until a first change."""
    if state.tournament.switches:
        yield from state.tournament.outcasts()
    yield from state.leader.candidates()


@dataclass(frozen=True)
class TournamentReport:
    """A tier's experts and shadows, flattened into its ``tier{i}_<field>`` names."""

    leader: int  # index of the leading expert in ``experts.EXPERTS``
    sample_rate: float
    expert_entries: int
    shadow_entries: int


@dataclass(frozen=True)
class AdaptiveTierReport:
    pages: int
    tournament: TournamentReport | None  # None before the first write, and in a self-evicting tier


@dataclass(frozen=True)
class AdaptiveReport(PolicyReport):
    chained: ChainedReport
    tiers: tuple[AdaptiveTierReport, ...]  # fastest first


class AdaptivePolicy(WriteThrough, ChainedPolicy):
    """Shadow-rated choice among LRU, ARC, LIRS and LFU-DA, per tier, over ``len(capacities)`` tiers.

    Args:
        capacities: per tier (fastest first), its capacity in bytes, or ``None`` for a tier that
            makes room on its own (the store never asks for its victims; nothing is tracked there).
        config: the ``policy`` section of the store config (``pins`` is used).
    """

    name = "adaptive"
    _tiers: list[_Tier]

    def __init__(self, capacities: Sequence[int | None], config: PolicyConfig | None = None):
        self.config = config = config or PolicyConfig()
        ChainedPolicy.__init__(self, [_Tier(c) for c in capacities], config.pins, _Links())
        WriteThrough.__init__(self, len(capacities))
        # Lookups before the first write (the page size, hence the shadows' size, is not known yet):
        # the shadows replay them once built, so they see the stream from its first request.
        self._early: list[Sequence[PageKey]] = []

    # ------------------------------------------------------------------ events

    def on_lookup(self, keys: Sequence[PageKey], tiers: Sequence[int | None],
                  parent: PageKey | None = None) -> None:
        run = next((i for i, t in enumerate(tiers) if t is None), len(tiers))
        self._learn_links(keys, parent)
        for i in range(run - 1, -1, -1):  # tail first, so a chain's head ends most recent
            if keys[i] in self.residency.pages(tiers[i]):
                for expert in self._tiers[tiers[i]].experts:
                    expert.hit(keys[i])
        if not self._page_bytes:
            if sum(map(len, self._early)) + len(keys) <= PENDING_LINKS:
                self._early.append(keys)
        else:
            self._observe(keys)
        self._pins.on_lookup(keys, parent)

    def _sized(self) -> None:
        for t, state in enumerate(self._tiers):
            if state.capacity is not None:
                state.start(self._page_bytes, self.residency.pages(t))
        for early in self._early:
            self._observe(early)
        self._early.clear()

    def _place(self, state: _Tier, tier: int, key: PageKey, nbytes: int) -> None:
        for expert in state.experts:
            expert.add(key)
        if state.tournament.is_sampled(key):
            state.tournament.real_added(key)

    def on_remove(self, keys: Sequence[PageKey], tier: int) -> None:
        state, sizes = self._tiers[tier], self.residency.pages(tier)
        if state.capacity is None:
            return
        for key in keys:
            if key in sizes:
                self._leave(state, tier, key)

    # ------------------------------------------------------------------ decisions

    def victims(self, tier: int, nbytes: int) -> list[PageKey] | None:
        state = self._tiers[tier]
        if nbytes <= 0:
            return []
        if state.capacity is None or not state.experts or self._evictable(tier) < nbytes:
            return None
        sizes, held = self.residency.pages(tier), self.residency.held()
        chosen: dict[PageKey, None] = {}
        freed = self._pick(state, sizes, nbytes, held, chosen, leaves_only=True)
        if freed < nbytes:  # only parents of resident children are left: take them too
            self._pick(state, sizes, nbytes - freed, held, chosen, leaves_only=False)
        for key in chosen:
            self._leave(state, tier, key)
        state.evictions += len(chosen)
        return list(chosen)

    def stats(self) -> AdaptiveReport:
        tiers = []
        for i, t in enumerate(self._tiers):
            tour = t.tournament
            tiers.append(AdaptiveTierReport(len(self.residency.pages(i)), None if tour is None else
                                            TournamentReport(tour.leader, tour.rate,
                                                             sum(e.entries() for e in t.experts),
                                                             tour.entries())))
        return AdaptiveReport(self._chained_report(), tuple(tiers))

    def standings(self) -> list[ExpertStanding]:
        out = []
        for i, t in enumerate(self._tiers):
            tour = t.tournament
            if tour is None:
                continue
            for j, s in enumerate(tour.shadows):
                out.append(ExpertStanding(i, s.expert.name, j == tour.leader,
                                          s.hits / s.lookups if s.lookups else 0.0, tour.switches))
        return out

    def leader(self, tier: int) -> str | None:
        """Name of the expert choosing ``tier``'s victims now (``None`` before the first write)."""
        t = self._tiers[tier]
        return t.leader.name if t.experts else None

    # ------------------------------------------------------------------ internals

    def _observe(self, keys: Sequence[PageKey]) -> None:
        """Every tier's shadows replay a lookup's sampled pages."""
        if not keys:
            return
        hashes = [key_hash(k) for k in keys]
        for tier in self._tiers:
            if tier.tournament is not None:
                tier.tournament.observe(tier.tournament.sampled(keys, hashes))

    def _pick(self, state: _Tier, sizes: Mapping[PageKey, int], nbytes: int,
              held: AbstractSet[PageKey], chosen: dict[PageKey, None], leaves_only: bool) -> int:
        freed = 0
        kids = state.kids
        parent_of, pinned = self._links.parent_of, self._pins.is_pinned  # bound once: per candidate
        # Children chosen in this call: their parent is a leaf once they are all chosen, and comes
        # right after them in an order that inserts and references chains tail first.
        gone: dict[PageKey, int] = {}
        it = _eviction_order(state)
        try:
            for key in it:
                n = sizes.get(key)
                if n is None or key in chosen or key in held or pinned(key):
                    continue  # only the record's pages can be victims
                if leaves_only and kids.get(key, 0) > gone.get(key, 0):
                    continue
                chosen[key] = None
                freed += n
                if freed >= nbytes:
                    break
                p = parent_of(key)
                if p is not None:
                    gone[p] = gone.get(p, 0) + 1
        finally:
            it.close()
        return freed

    def _leave(self, state: _Tier, tier: int, key: PageKey) -> None:
        for expert in state.experts:
            expert.drop(key)
        state.tournament.real_removed(key)
        self._depart(state, tier, key)
