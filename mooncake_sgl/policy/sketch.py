"""Frequency sketches: bounded-memory estimates of how often a page was accessed recently.

Two estimators with one interface (``ensure_capacity``, ``increment``, ``estimate``, ``advance``),
so the heat policy can use either and the simulator can measure which predicts reuse better:

- ``FrequencySketch`` — a count-min sketch of one-byte counters saturating at 15 (TinyLFU's range;
  a byte each, not packed 4-bit, so halving is one ``bytes.translate``), aged by halving every counter
  after ``sample_size`` increments (TinyLFU's "reset", Einziger, Friedman & Manes, ACM ToS 2017).
  Aging is by access count, so the memory horizon scales with the cache, not with wall time.
- ``DecayingSketch`` — a count-min sketch of float counters, exponentially decayed in logical time
  with a configurable half-life (an exponentially decayed counter per sketch cell, as LRFU's
  combined recency-frequency value, Lee et al., IEEE ToC 2001).

Both are count-min sketches (Cormode & Muthukrishnan, 2005): ``depth`` rows of ``width`` counters; a key
maps to one counter per row and its estimate is the minimum of them, so it never underestimates
(until aging) and overestimates by at most ``e * N / width`` with probability ``1 - e^-depth`` for ``N``
increments in the current aging period. Conservative update (only the counters that equal the
minimum are raised) tightens that bound further. Memory is ``depth * width`` counters, fixed by
``ensure_capacity`` and independent of how many distinct pages were ever seen.

Keys are hashed with xxHash3 (not Python's ``hash``, which is salted per process), so replays are
reproducible run to run.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

from ..api import PageKey

# Rows in the sketch: 4 is the usual count-min/TinyLFU choice (error probability e^-4 < 2 %).
DEPTH = 4
# Counters per row for each page the cache can hold. Arbitrary within 4-16: below ~4 collisions
# make one-hit wonders look warm; above 16 the gain in accuracy is no longer measurable.
COUNTERS_PER_PAGE = 8
# Largest row (counters). Bounds the sketch at DEPTH * 4 Mi bytes however large the tiers are.
MAX_WIDTH = 1 << 22
# Smallest row, so tiny test caches still get a meaningful sketch.
MIN_WIDTH = 64
# Counters saturate here (TinyLFU: frequencies above ~15 add no admission information).
MAX_COUNT = 15
# Increments per aging period, per page of capacity (Caffeine uses 10).
SAMPLE_PER_PAGE = 10

# Halving every counter at once: one C-speed ``bytes.translate`` over the table.
_HALVE = bytes(v >> 1 for v in range(256))


def _row_width(capacity_pages: int) -> int:
    want = max(MIN_WIDTH, capacity_pages * COUNTERS_PER_PAGE)
    return min(MAX_WIDTH, 1 << (want - 1).bit_length())


class FrequencySketch:
    """Count-min sketch of byte counters saturating at 15, with periodic halving (TinyLFU aging).

    ``estimate`` is an int in ``0..15``. Aging happens inside ``increment``: once ``sample_size``
    increments were counted, every counter is halved, so a page that stops being accessed fades
    within a few periods while a steadily hot one keeps a high count.
    """

    def __init__(self, capacity_pages: int = 0):
        self._width = 0
        self.ensure_capacity(capacity_pages)

    def ensure_capacity(self, capacity_pages: int) -> None:
        """Size for ``capacity_pages`` resident pages; grows (and resets) only when needed."""
        width = _row_width(max(1, capacity_pages))
        self._capacity = max(1, capacity_pages)
        self.sample_size = SAMPLE_PER_PAGE * self._capacity
        if width <= self._width:
            return
        self._width = width
        self._mask = width - 1
        self._table = bytearray(DEPTH * width)
        self._additions = 0
        self._periods = 0

    def _cells(self, key: PageKey) -> tuple[int, int, int, int]:
        h = xxhash.xxh3_64_intdigest(key)
        # Double hashing (Kirsch & Mitzenmacher): rows use h1 + i*h2, as good as independent hashes.
        h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1
        w, m = self._width, self._mask
        return (h1 & m, w + ((h1 + h2) & m), 2 * w + ((h1 + 2 * h2) & m), 3 * w + ((h1 + 3 * h2) & m))

    def estimate(self, key: PageKey) -> int:
        t = self._table
        a, b, c, d = self._cells(key)
        return min(t[a], t[b], t[c], t[d])

    def estimates(self, keys: Sequence[PageKey]) -> list[int]:
        """``estimate`` of each page, in one call (``_cells`` inline: a write asks it of every page)."""
        t = self._table
        w, m = self._width, self._mask
        w2, w3 = 2 * w, 3 * w
        digest = xxhash.xxh3_64_intdigest
        out = []
        for key in keys:
            h = digest(key)
            h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1
            out.append(min(t[h1 & m], t[w + ((h1 + h2) & m)], t[w2 + ((h1 + 2 * h2) & m)],
                           t[w3 + ((h1 + 3 * h2) & m)]))
        return out

    def increment(self, key: PageKey, floor: int = 0) -> int:
        """Count one access; returns the new estimate. ``floor`` raises the estimate to at least
        that value (the heat policy uses it to keep ancestors at least as warm as descendants)."""
        return self.increment_chain((key,), floor)

    def increment_chain(self, keys: Sequence[PageKey], floor: int = 0) -> int:
        """``increment`` each page of a chain, tail to head, each at least as high as the page
        after it (``floor`` for the tail); returns the head's new estimate. One call per lookup:
        the heat policy and each of its curves' miniatures run this for every page looked up, so
        it is unrolled (``_cells`` inline, comparisons for ``min``/``max``, the aging count kept
        local): a third of its cost was those calls and attribute reads."""
        t = self._table
        w, m = self._width, self._mask
        w2, w3 = 2 * w, 3 * w
        digest = xxhash.xxh3_64_intdigest
        additions, sample_size = self._additions, self.sample_size
        for key in reversed(keys):
            h = digest(key)
            h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1
            a, b, c, d = h1 & m, w + ((h1 + h2) & m), w2 + ((h1 + 2 * h2) & m), w3 + ((h1 + 3 * h2) & m)
            ta, tb, tc, td = t[a], t[b], t[c], t[d]
            low = ta if ta < tb else tb
            if tc < low:
                low = tc
            if td < low:
                low = td
            low += 1
            if low > floor:
                floor = low
            if floor > MAX_COUNT:
                floor = MAX_COUNT
            # Conservative update: only the cells below the new estimate rise.
            if ta < floor:
                t[a] = floor
            if tb < floor:
                t[b] = floor
            if tc < floor:
                t[c] = floor
            if td < floor:
                t[d] = floor
            additions += 1
            if additions >= sample_size:
                self._additions = additions
                self._age()
                additions, t = self._additions, self._table
        self._additions = additions
        return floor

    def _age(self) -> None:
        self._table = bytearray(self._table.translate(_HALVE))
        self._additions //= 2
        self._periods += 1

    def stamp(self) -> float:
        """Opaque aging clock: the number of halvings so far."""
        return float(self._periods)

    def advance(self, now: float) -> None:
        """Time plays no part in this sketch's aging (it ages by access count)."""

    def memory_bytes(self) -> int:
        return len(self._table)


class DecayingSketch:
    """Count-min sketch of exponentially decayed counters (half-life in logical seconds).

    An access at time ``t`` adds ``2 ** ((t - t0) / half_life)`` to the cells, and an estimate divides
    by the same factor for ``now``: every counter decays continuously without ever being touched
    (the forward-decay trick, Cormode et al., ICDE 2009). When the weights grow large the whole table
    is rescaled once (O(width), about once per 500 half-lives).
    """

    # Rescale before weights reach 2**RESCALE_EXP so float precision is never the limit.
    RESCALE_EXP = 500.0

    def __init__(self, capacity_pages: int = 0, half_life: float = 600.0):
        if half_life <= 0:
            raise ValueError(f"half_life must be positive, got {half_life}")
        self.half_life = float(half_life)
        self._width = 0
        self._t0 = 0.0
        self._now = 0.0
        self.ensure_capacity(capacity_pages)

    def ensure_capacity(self, capacity_pages: int) -> None:
        width = _row_width(max(1, capacity_pages))
        if width <= self._width:
            return
        self._width = width
        self._mask = width - 1
        self._table = array("d", bytes(8 * DEPTH * width))

    def advance(self, now: float) -> None:
        """Move the logical clock forward (never back)."""
        if now <= self._now:
            return
        self._now = now
        exp = (now - self._t0) / self.half_life
        if exp > self.RESCALE_EXP:
            scale = 2.0 ** -exp
            self._table = array("d", (v * scale for v in self._table))
            self._t0 = now

    def _cells(self, key: PageKey) -> tuple[int, int, int, int]:
        h = xxhash.xxh3_64_intdigest(key)
        h1, h2 = h & 0xFFFFFFFF, (h >> 32) | 1
        w, m = self._width, self._mask
        return (h1 & m, w + ((h1 + h2) & m), 2 * w + ((h1 + 2 * h2) & m), 3 * w + ((h1 + 3 * h2) & m))

    def _weight(self) -> float:
        return 2.0 ** ((self._now - self._t0) / self.half_life)

    def estimate(self, key: PageKey) -> float:
        t = self._table
        a, b, c, d = self._cells(key)
        return min(t[a], t[b], t[c], t[d]) / self._weight()

    def estimates(self, keys: Sequence[PageKey]) -> list[float]:
        """``estimate`` of each page (``FrequencySketch.estimates``' contract)."""
        return [self.estimate(key) for key in keys]

    def increment(self, key: PageKey, floor: float = 0.0) -> float:
        t = self._table
        w = self._weight()
        cells = self._cells(key)
        low = min(t[i] for i in cells)
        new = max(low + w, floor * w)
        for i in cells:
            if t[i] < new:
                t[i] = new
        return new / w

    def increment_chain(self, keys: Sequence[PageKey], floor: float = 0.0) -> float:
        """``FrequencySketch.increment_chain``'s contract, with decayed counters."""
        increment = self.increment
        for key in reversed(keys):
            floor = increment(key, floor)
        return floor

    def stamp(self) -> float:
        return self._now

    def memory_bytes(self) -> int:
        return 8 * len(self._table)


def make_sketch(kind: str, capacity_pages: int, half_life: float | None = None
                ) -> FrequencySketch | DecayingSketch:
    """The sketch named by the policy config (``count_min`` or ``decay``; only ``decay`` takes a
    ``half_life``, 10 minutes when ``None``)."""
    if kind == "count_min":
        return FrequencySketch(capacity_pages)
    if kind == "decay":
        return DecayingSketch(capacity_pages, 600.0 if half_life is None else half_life)
    raise ValueError(f"unknown sketch kind {kind!r}; expected 'count_min' or 'decay'")
