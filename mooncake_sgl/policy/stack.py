"""``PrefixStack``: an LRU cache's prefix hits at every size at once, from one pass over the lookups.

LRU keeps the ``C`` most recently used pages, so a page is resident in an LRU cache of ``C`` pages
exactly when its stack distance (its rank by recency, 1 for the most recent) is at most ``C``
(Mattson et al., 1970): one stack gives every size, and a larger cache never hits less. Here a
lookup is a chain of pages and SGLang uses its leading run of resident pages, so a lookup's hits at
size ``C`` are its pages up to the first that ranks past ``C``; then every page of the lookup
becomes most recent (the run is touched, the rest written back), in chain order.

Prefix chains make the stack cheap. A page's key names its whole prefix, so a lookup that touches a
page touches all of its ancestors. Hence the pages a past lookup ``r`` still owns (those no later
lookup touched) are a suffix of its chain, ``[a_r, n_r)``, and a chain looked up now is a run of
groups, each owned by one past lookup (the most recent first, then older ones, then pages never
seen). Within a group ranks are arithmetic: with ``S(r)`` pages owned by lookups after ``r``, the
page at position ``i`` ranks ``S(r) + n_r - i`` when chains are touched head first (``LruPolicy``:
the tail ends most recent) and ``S(r) + i - a_r + 1`` when tail first (the head ends most recent:
the experts' LRU and the prefix-aware policies). A lookup costs a dictionary look-up per page and a
Fenwick-tree query per group, whatever the number of sizes.

Memory: one dictionary entry per page within reach of the largest size (a 64-bit key hash to its
owner), forgotten once every page a lookup owns ranks past it. Past ``budget`` entries the stack
samples (SHARDS, Waldspurger et al., FAST 2015): it tracks a page whose key hash falls in a fraction
of the hash space, counting it for ``1 / rate`` pages, and halves the rates whenever the entries
exceed the budget again. The head of a chain is tracked at a higher rate than its body (up to
``2 ** HEAD_PAGES`` times at the first page): shared heads such as system prompts carry a large
share of all hits, and sampled at the body's rate whether one was drawn swung the whole curve.
Positions stay exact (every lookup's length is known); only where a group ends between two tracked
pages is estimated.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

# Positions at the head of a chain sampled above the body's rate: position ``i < HEAD_PAGES`` at
# ``2 ** (HEAD_PAGES - i)`` times it (at most every page).
HEAD_PAGES = 8
# Most pages tracked by one stack (about 100 bytes each: a dictionary entry and its integers). A
# stack whose largest size reaches at most half of it tracks every page (exact).
TRACKED_PAGES = 1 << 17
# Lookups the Fenwick tree spans: twice the largest size, within these bounds (40 bytes each). One
# that still owns pages within reach after that many later lookups (a workload repeating a small
# working set) is forgotten: its pages count as never seen.
MIN_SPAN = 1 << 12
SPAN = 1 << 16
_NEVER = float("inf")
_CLASS_BITS = 4  # an owner entry is ``lookup << _CLASS_BITS | the page's position class``


class PrefixStack:
    """Prefix hits of an LRU cache at each of ``sizes`` (pages), fed every lookup in order.

    Args:
        sizes: the cache sizes to count hits for.
        head_first: chains are touched head first, so their tail ends most recent (``LruPolicy``);
            otherwise tail first.
        budget: most pages tracked (``TRACKED_PAGES``).
    """

    __slots__ = ("sizes", "head_first", "rate", "hits", "lookups", "_budget", "_reach", "_span",
                 "_thresholds", "_weights", "_owner", "_tree", "_length", "_start", "_tail", "_alive",
                 "_keys", "_total", "_oldest", "_next")

    def __init__(self, sizes: Sequence[int], head_first: bool, budget: int = TRACKED_PAGES):
        if not sizes or min(sizes) < 1:
            raise ValueError(f"a stack needs sizes of at least one page, not {list(sizes)}")
        self.sizes = list(sizes)
        self.head_first = head_first
        self.hits = [0.0] * len(self.sizes)
        self.lookups = 0
        self._budget = budget
        self._reach = max(sizes)
        self._span = span = min(SPAN, max(MIN_SPAN, 1 << (2 * self._reach - 1).bit_length()))
        self._thresholds: list[int] = []
        self._weights: list[float] = []
        self._set_rate(min(1.0, budget / (2 * self._reach)))
        self._owner: dict[int, int] = {}  # key hash -> owner lookup << _CLASS_BITS | class
        self._tree = array("d", bytes(8 * (span + 1)))  # Fenwick tree of ``_alive``, by slot
        self._length = array("q", bytes(8 * span))  # per slot (lookup id mod span): its chain's length
        self._start = array("q", bytes(8 * span))  # ... the first position it still owns (``a_r``)
        self._tail = array("Q", bytes(8 * span))  # ... its chain's last key hash
        self._alive = array("d", bytes(8 * span))  # ... the pages it still owns (by their weights)
        self._keys: dict[int, list[int]] = {}  # ... its tracked key hashes, while it owns any
        self._total = 0.0  # pages owned, all lookups
        self._oldest = 0  # lookups before this one own nothing any more
        self._next = 0

    def observe(self, hashes: Sequence[int]) -> None:
        """A lookup of a chain, in order, by its keys' ``shadow.key_hash``."""
        n = len(hashes)
        if not n:
            return
        self.lookups += n
        groups = self._groups(hashes)
        spans = self._spans(groups, hashes)
        self._count(spans)
        self._touch(groups, spans, n, hashes[-1])
        if len(self._owner) > self._budget:
            self._set_rate(self.rate / 2)
            self._resample()

    def entries(self) -> int:
        """Pages tracked (one dictionary entry each)."""
        return len(self._owner)

    # ------------------------------------------------------------------ the lookup

    def _groups(self, hashes: Sequence[int]) -> list[list]:
        """The chain as runs of tracked pages owned by one lookup (-1: never seen): ``[owner, first
        tracked position, last tracked position, their weight, their owner entries]``."""
        owner, oldest = self._owner, self._oldest
        thresholds, weights = self._thresholds, self._weights
        sampled = self.rate < 1.0
        deep = HEAD_PAGES
        groups: list[list] = []
        current: list = [None]
        for i, h in enumerate(hashes):
            c = i if i < deep else deep
            if sampled and h >= thresholds[c]:
                continue
            r = owner.get(h, -1) >> _CLASS_BITS
            if r < oldest:
                r = -1
            if current[0] == r:
                current[2] = i
                current[3] += weights[c]
                current[4].append((h, c))
            else:
                current = [r, i, i, weights[c], [(h, c)]]
                groups.append(current)
        return groups

    def _spans(self, groups: list[list], hashes: Sequence[int]) -> list[tuple[float, float, float]]:
        """Per group, ``(rank, first position, last position)``, where ``rank`` is its first page's
        (head first: the group's highest) or, tail first, the rank of position ``i`` less ``i``.
        Exact where every page is tracked. Between tracked pages of two lookups, the first one's
        group ends with its lookup's chain when this chain holds that chain's last page (a
        conversation's next turn), else (the chains parted) halfway."""
        spans: list[tuple[float, float, float]] = []
        n, length, start_of, tail = len(hashes), self._length, self._start, self._tail
        start: float = 0
        for g, (r, _, last, _, _) in enumerate(groups):
            following = groups[g + 1][1] if g + 1 < len(groups) else n
            if r < 0:
                spans.append((_NEVER, start, following - 1))
                start = following
                continue
            slot = r % self._span
            bound = min(following, length[slot])
            if bound <= last + 1 or (bound == length[slot] and hashes[bound - 1] == tail[slot]):
                end: float = max(bound, last + 1) - 1
            else:
                end = (last + bound - 1) / 2
            behind = self._total - self._through(r)
            if self.head_first:
                spans.append((behind + length[slot] - start, start, end))
            else:
                spans.append((behind - start_of[slot] + 1, start, end))
            start = end + 1
        return spans

    def _count(self, spans: list[tuple[float, float, float]]) -> None:
        """Add this lookup's hits at every size: its pages up to the first that ranks past the size.
        Ranks grow from group to group (what a lookup still owns is more recent than anything an
        older one owns); within a group they fall (head first) or grow (tail first) by one a page."""
        covered = spans[-1][2] + 1 if spans else 0  # past it, pages are taken as never seen
        head_first, hits = self.head_first, self.hits
        for s, size in enumerate(self.sizes):
            run = covered
            for rank, start, end in spans:
                if head_first or rank == _NEVER:
                    if rank > size:
                        run = start
                        break
                elif rank + end > size:
                    run = max(start, math.floor(size - rank) + 1)
                    break
            hits[s] += run

    def _touch(self, groups: list[list], spans: list[tuple[float, float, float]], n: int,
               tail: int) -> None:
        """Every page of the lookup becomes most recent: it now owns them all."""
        t = self._next
        owned: list[tuple[int, int]] = []
        added = 0.0
        for (r, _, _, w, keys), (_, _, end) in zip(groups, spans):
            if r >= 0:
                slot = r % self._span
                self._alive[slot] -= w
                self._add(slot, -w)
                self._total -= w
                self._start[slot] = max(self._start[slot], math.floor(end) + 1)
            added += w
            owned.extend(keys)
        tag = t << _CLASS_BITS
        self._owner.update((h, tag | c) for h, c in owned)
        if t - self._oldest >= self._span:  # its slot is this lookup's now
            self._forget(self._oldest)
        slot = t % self._span
        self._length[slot], self._start[slot], self._tail[slot] = n, 0, tail
        self._alive[slot] = added
        if owned:
            self._keys[slot] = [h for h, _ in owned]
        self._add(slot, added)
        self._total += added
        self._next = t + 1
        # Forget the lookups whose every page ranks past the largest size.
        while self._oldest < t and self._total - self._alive[self._oldest % self._span] >= self._reach:
            self._forget(self._oldest)

    # ------------------------------------------------------------------ bookkeeping

    def _through(self, r: int) -> float:
        """Pages owned by lookups ``_oldest`` to ``r``."""
        span = self._span
        lo, hi = self._oldest % span, r % span
        if lo <= hi:
            return self._prefix(hi + 1) - self._prefix(lo)
        return self._prefix(span) - self._prefix(lo) + self._prefix(hi + 1)

    def _prefix(self, i: int) -> float:
        tree, s = self._tree, 0.0
        while i > 0:
            s += tree[i]
            i &= i - 1
        return s

    def _add(self, slot: int, value: float) -> None:
        tree, i, span = self._tree, slot + 1, self._span
        while i <= span:
            tree[i] += value
            i += i & -i

    def _forget(self, r: int) -> None:
        slot, owner = r % self._span, self._owner
        for h in self._keys.pop(slot, ()):
            v = owner.get(h)
            if v is not None and v >> _CLASS_BITS == r:
                del owner[h]
        self._add(slot, -self._alive[slot])
        self._total -= self._alive[slot]
        self._alive[slot] = 0.0
        self._oldest = r + 1

    def _set_rate(self, rate: float) -> None:
        """The body's sample rate; position class ``c`` (``min(i, HEAD_PAGES)``) is sampled at
        ``rate * 2 ** (HEAD_PAGES - c)``, at most 1."""
        self.rate = rate
        rates = [min(1.0, rate * 2 ** (HEAD_PAGES - c)) for c in range(HEAD_PAGES + 1)]
        self._thresholds = [int(r * (1 << 64)) for r in rates]
        self._weights = [1.0 / r for r in rates]

    def _resample(self) -> None:
        """Drop the tracked pages the lower rates leave out; the others count for more pages."""
        thresholds, weights = self._thresholds, self._weights
        mask = (1 << _CLASS_BITS) - 1
        kept = {h: v for h, v in self._owner.items() if h < thresholds[v & mask]}
        self._owner = kept
        span = self._span
        alive = array("d", bytes(8 * span))
        for v in kept.values():
            alive[(v >> _CLASS_BITS) % span] += weights[v & mask]
        self._alive = alive
        self._keys = {slot: [h for h in keys if h in kept] for slot, keys in self._keys.items()}
        tree = array("d", bytes(8 * (span + 1)))
        for i in range(1, span + 1):  # Fenwick tree built in place
            tree[i] += alive[i - 1]
            parent = i + (i & -i)
            if parent <= span:
                tree[parent] += tree[i]
        self._tree = tree
        self._total = sum(alive)
