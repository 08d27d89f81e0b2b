"""``HeatMiniature``: the heat policy's decisions on one tier of one-page pages, for the curves.

A capacity curve of ``heat`` runs the policy at seven sizes on every looked-up page it samples
(``curve``): that work is the curves' cost. Driven through a ``ledger.Ledger``, the general
machinery of a store of several tiers with pages of any size (views of the record, residency in
other tiers, arrivals and departures as events), the policy spent a third of each page's cost
there (docs/capacity_curves.md, Cost). Here the same decisions are made directly: the segments,
victim pass and split (``heat.HeatSegments``), the chain links (``chains.ChainLinks``), the sketch
and the pins are heat's own objects, fed in the order the store feeds them
(``tests/policy/test_heat_miniature.py`` holds it to ``HeatPolicy`` on a ledger, decision for
decision).

Sampled (a fraction ``R`` of the key space), one rule of heat's is scaled to the sample: its
leaves-first victim pass takes one page of a chain per pass (the chain's leaf), so a chain of
``n`` pages leaves the tier over ``n`` passes; a sample holds chains of ``R * n`` pages, which
left ``1 / R`` times too fast (heat's lead over LRU grew as the sample shrank:
docs/capacity_curves.md). So a sampled page is held back from that pass as many times as its
chain has pages after it before the next sampled one (``owe``, set by the curve from each
lookup): the chain then leaves in as many passes as the whole chain would.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..api import PageKey
from ..config import PolicyConfig
from .chains import ChainLinks
from .heat import SEEN_BEFORE, HeatSegments, reached_all
from .pins import Pins
from .shadow import prefix_hits
from .sketch import make_sketch

_NEVER = frozenset().__contains__  # the pin test where none is configured


class HeatMiniature:
    """``heat`` with ``config`` on a tier of ``capacity_pages`` pages; ``sampled``: fed a sample of
    the key space, its leaves held back for the chains' unsampled pages (``owe``)."""

    __slots__ = ("capacity", "config", "hits", "lookups", "owed", "_seg", "_resident", "_links",
                 "_pins", "_sketch", "_sized")

    def __init__(self, capacity_pages: int, config: PolicyConfig, sampled: bool = False):
        self.capacity = capacity_pages
        self.config = config
        self.hits = 0
        self.lookups = 0
        # Sampled page -> leaves-first passes it is still held back from.
        self.owed: dict[PageKey, int] | None = {} if sampled else None
        self._seg = HeatSegments(capacity_pages, config.probation_fraction)
        self._resident: dict[PageKey, int] = {}  # every page one unit: the segments' sizes
        self._links = ChainLinks()
        # Without pins configured (the usual case) their checks cost nothing per page.
        self._pins = Pins(config.pins) if config.pins else None
        # Sized for the tier at its first write, as the policy sizes it when it learns the page size.
        self._sketch = make_sketch(config.sketch, 0, config.half_life)
        self._sized = False

    def owe(self, keys: Sequence[PageKey], passes: Sequence[int]) -> None:
        """The next lookup's sampled pages, each with the pages after it in its chain up to the
        next sampled one (the chain's end for the last)."""
        owed = self.owed
        if owed is None:
            return
        for key, n in zip(keys, passes):
            if n > 0:
                owed[key] = n
            else:
                owed.pop(key, None)
        if len(owed) > 2 * self.capacity + 64:
            # Pages a write could not make room for never departed: keep the resident ones' only.
            resident = self._resident
            for key in [k for k in owed if k not in resident]:
                del owed[key]

    def access(self, keys: Sequence[PageKey]) -> int:
        """A request's sampled pages, in chain order; returns its prefix hits in this miniature."""
        resident = self._resident
        run = prefix_hits(keys, resident)
        seg = self._seg
        self._links.link_children(keys, None, [resident], [seg.kids])
        self._sketch.increment_chain(keys)
        for i in range(run - 1, -1, -1):  # tail to head, so a chain's head ends most recent
            seg.referenced(keys[i], resident)
        if self._pins is not None:
            self._pins.on_lookup(keys, None)
        self.hits += run
        self.lookups += len(keys)
        if run < len(keys):
            self._write(keys[run:])
        return run

    def entries(self) -> int:
        """Pages the miniature ranks (its ghosts and sketch come on top)."""
        return len(self._resident)

    def _write(self, keys: Sequence[PageKey]) -> None:
        """SGLang's write-back of the pages it just computed: room made first by heat's victims
        (never the write's own pages), the batch's tail lost when the room cannot be made."""
        resident = self._resident
        fresh = [k for k in keys if k not in resident]
        short = len(fresh) - (self.capacity - len(resident))
        if short > 0:
            self._evict(short, frozenset(keys))
            del fresh[max(0, self.capacity - len(resident)):]
        if not fresh:
            return
        fresh = list(dict.fromkeys(fresh))  # twice in a write: room taken twice, as a ledger counts it
        if not self._sized:
            self._sized = True
            self._sketch.ensure_capacity(max(1, self.capacity))
        resident.update(dict.fromkeys(fresh, 1))
        fresh.reverse()  # tail first: tails leave first
        sketch, seg = self._sketch, self._seg
        seg.place_all(fresh, 1, reached_all(sketch.estimates(fresh), SEEN_BEFORE))
        self._links.adopt_all(fresh, seg.kids)

    def _evict(self, pages: int, held: frozenset[PageKey]) -> None:
        resident, pins, seg = self._resident, self._pins, self._seg
        pinned = _NEVER if pins is None else pins.is_pinned
        stuck = len(held & resident.keys())
        if pins is not None:
            stuck += sum(1 for k in pins.keys() if k in resident and k not in held and pinned(k))
        if len(resident) - stuck < pages:
            return  # the policy frees nothing when it cannot free enough
        chosen: dict[PageKey, bool] = {}
        walk_past = ((seg.kids.__contains__, self._pays_a_pass) if self.owed
                     else (seg.kids.__contains__,))
        freed = seg.pick(resident, pages, held, pinned, chosen, walk_past)
        if freed < pages:  # only parents of resident children are left: take them too
            seg.pick(resident, pages - freed, held, pinned, chosen)
        seg.evict_all(chosen, None)
        self._links.depart_all(chosen, seg.kids)
        owed = self.owed
        for key in chosen:
            del resident[key]
            if pins is not None:
                pins.forget(key)
            if owed is not None:
                owed.pop(key, None)
        seg.evictions += len(chosen)

    def _pays_a_pass(self, key: PageKey) -> bool:
        """A sampled leaf that still owes passes is walked past, and pays one."""
        owed = self.owed
        n = owed.get(key)
        if n:
            owed[key] = n - 1
            return True
        return False
