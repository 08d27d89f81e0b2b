"""``ChainLinks``: which page comes before which in its prefix chain, as far as the policy knows.

Links come from lookups only (a write may be a filtered or demoted batch, not a chain). A link of a
resident page is kept while the page is resident anywhere; a link of a page looked up but not yet
written waits in a bounded FIFO (``PENDING_LINKS``) until its write arrives. The heat and adaptive
policies use the links to evict leaves before their parents, heat also to keep ancestors at least as
warm as their chains. Which tier holds a page is the record's (``api.ResidencyView``), never kept here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Iterator, Sequence

from ..api import PageKey

# Chain links of looked-up pages not yet resident, kept until their write arrives (pages).
PENDING_LINKS = 1 << 16


class ChainLinks:
    """Parent links of resident pages and of pages looked up but not yet written."""

    __slots__ = ("_parent", "_pending")

    def __init__(self) -> None:
        self._parent: dict[PageKey, PageKey | None] = {}
        self._pending: OrderedDict[PageKey, PageKey | None] = OrderedDict()

    def __len__(self) -> int:
        """Links of resident pages."""
        return len(self._parent)

    def parent_of(self, key: PageKey) -> PageKey | None:
        """The parent of a resident page, when known."""
        return self._parent.get(key)

    def learn(self, keys: Sequence[PageKey], parent: PageKey | None,
              resident: Callable[[PageKey], bool]) -> list[tuple[PageKey, PageKey | None]]:
        """Record the links of a looked-up chain; returns the (page, parent) links newly learnt for
        pages already resident (their parents gain a resident child)."""
        learnt = []
        links, pending = self._parent, self._pending
        prev = parent
        for key in keys:
            if key not in links:
                if resident(key):
                    links[key] = prev
                    learnt.append((key, prev))
                else:
                    pending[key] = prev
            prev = key
        while len(pending) > PENDING_LINKS:
            pending.popitem(last=False)
        return learnt

    def adopt(self, key: PageKey) -> None:
        """``key`` became resident: its pending link (if any) becomes a resident one."""
        if key in self._pending:
            self._parent[key] = self._pending.pop(key)

    def adopt_all(self, keys: Sequence[PageKey], kids: dict[PageKey, int]) -> None:
        """``keys`` became resident in a tier where no other tier holds them (``kids``: that tier's
        resident children per page): ``adopt`` each, and its parent gains a child there."""
        links, pending = self._parent, self._pending
        for key in keys:
            if key in pending:
                links[key] = pending.pop(key)
            p = links.get(key)
            if p is not None:
                kids[p] = kids.get(p, 0) + 1

    def drop(self, key: PageKey) -> None:
        """``key`` is resident nowhere any more."""
        self._parent.pop(key, None)

    def link_children(self, keys: Sequence[PageKey], parent: PageKey | None,
                      holders: Sequence[Container[PageKey]], kids: Sequence[dict[PageKey, int]]) -> None:
        """Learn a looked-up chain's links: each resident page learnt gives its parent a resident child
        in every tier holding it. ``holders[i]``: the pages a tier holds; ``kids[i]``: that tier's
        resident children per page (a page with children there is not a victim before them)."""

        def in_any(key: PageKey) -> bool:
            for held in holders:
                if key in held:
                    return True
            return False

        resident = holders[0].__contains__ if len(holders) == 1 else in_any

        for key, p in self.learn(keys, parent, resident):
            if p is None:
                continue
            for held, tier_kids in zip(holders, kids):
                if key in held:
                    tier_kids[p] = tier_kids.get(p, 0) + 1

    def leave_tier(self, key: PageKey, kids: dict[PageKey, int]) -> None:
        """``key`` left a tier (``kids``: that tier's resident children per page): its parent loses a
        child there."""
        p = self._parent.get(key)
        if p is not None:
            _lose_child(kids, p)

    def depart_all(self, keys: Sequence[PageKey], kids: dict[PageKey, int]) -> None:
        """``keys`` left the only tier holding them (``kids``: its resident children per page):
        ``leave_tier`` and ``drop`` each."""
        links = self._parent
        for key in keys:
            p = links.pop(key, None)
            if p is not None:
                _lose_child(kids, p)

    def ancestors(self, key: PageKey | None) -> Iterator[PageKey]:
        """``key`` and the known pages before it, nearest first (resident or pending links)."""
        steps = len(self._parent) + len(self._pending) + 1  # guards a corrupt cycle only
        while key is not None and steps > 0:
            yield key
            key = self._parent[key] if key in self._parent else self._pending.get(key)
            steps -= 1


def _lose_child(kids: dict[PageKey, int], parent: PageKey) -> None:
    """``parent`` has one resident child fewer in the tier ``kids`` counts them for."""
    left = kids.get(parent, 0) - 1
    if left > 0:
        kids[parent] = left
    else:
        kids.pop(parent, None)
