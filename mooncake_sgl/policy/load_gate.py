"""``LoadGate``: how much of a storage hit is worth loading rather than recomputing.

A hit is worth loading only while loading it takes less time than the server would spend
recomputing its tokens. On a GPU a 64-token page of an 8B model recomputes in about a millisecond;
a busy SSD or a remote pool over TCP can take longer to deliver it, and SGLang then waits for the
load (its default prefetch policy, ``timeout``, waits up to a deadline) instead of computing.

The gate learns two rates, each from what really happened:

- each tier's read time, from the store's ``PagesRead`` events (one per tier read call: bytes and
  wall seconds, as SGLang waits for them), fitted per tier as ``seconds = fixed + bytes * per_byte``
  over the recent calls (decayed sums; a fit with no spread of sizes is through the origin);
- the server's prefill time per computed token, from SGLang's own scheduler counters
  (``hicache/prefill_clock.py``): its busy prefill time over the tokens it computed, differences
  between lookups, smoothed. That rate is of the tokens SGLang computed, which come after their
  cached prefix and so attend over more context than recomputing the prefix from its start would:
  it overstates recompute, and errs towards loading (what SGLang does without a gate).

``admit`` takes the tier of each page object of a hit, in order, and answers the length of the
leading run whose saving, recompute time minus ``margin`` times load time, is largest; none when
no prefix saves anything. A tier with no read yet, and a server with no prefill measured yet, cost
nothing: without evidence the gate admits, as SGLang would. A tier declined because its rate says
slow is measured again: once its newest read is ``REPROBE_S`` old, one lookup is admitted whole. Each
probe that finds the tier still slow doubles that wait (to ``MAX_REPROBE_S``), since every probe of a
slow tier costs one request its load; a tier found fast again starts over at ``REPROBE_S``.

Policy only: it moves no bytes and reads no tier. Thread context: events arrive on whichever
thread delivers them, ``admit`` runs on SGLang's storage threads; one lock guards the state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api import PagesRead, StoreEvent

# Weight of the past in the read fit, per read call: about the last 20 calls decide.
_READ_DECAY = 0.95
# Weight of the newest prefill measurement in the recompute rate.
_PREFILL_WEIGHT = 0.3
# Computed tokens between the scheduler readings that make one prefill measurement: fewer are
# dominated by the fixed cost of a step.
_MIN_PREFILL_TOKENS = 64
# Seconds after a tier's newest read when a lookup it would decline is admitted, to measure it again
# (a disk that was busy may be idle now), and the most that wait grows to while probes find it slow.
REPROBE_S = 30.0
MAX_REPROBE_S = 600.0


@dataclass(frozen=True)
class PrefillReading:
    """The scheduler's running totals: tokens it computed in prefill, and seconds it was busy."""

    tokens: int
    busy_seconds: float


@dataclass(frozen=True)
class TierGateStats:
    """One tier, as the gate sees it."""

    declined_pages: int  # page objects of hits declined because of this tier
    read_calls: int
    bytes_per_second: float  # at the size of the last call; 0 before any read


@dataclass(frozen=True)
class LoadGateStats:
    """``stats()["load_gate"]``: what the gate admitted and declined, and the rates it judged by."""

    lookups: int  # hits judged
    declined_lookups: int  # hits cut short (any page declined)
    declined_pages: int  # page objects declined, over all tiers
    probe_lookups: int  # hits admitted whole to measure a tier again
    prefill_seconds_per_token: float  # 0 before any prefill was measured
    margin: float
    tiers: dict[str, TierGateStats]

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> LoadGateStats:
        """Back from its JSON form (the counter file); a field missing there reads 0."""
        def num(m: Mapping[str, Any], name: str) -> float:
            v = m.get(name, 0)
            return float(v) if isinstance(v, (int, float)) else 0.0
        tiers = d.get("tiers")
        return cls(int(num(d, "lookups")), int(num(d, "declined_lookups")),
                   int(num(d, "declined_pages")), int(num(d, "probe_lookups")),
                   num(d, "prefill_seconds_per_token"), num(d, "margin"),
                   {str(name): TierGateStats(int(num(t, "declined_pages")), int(num(t, "read_calls")),
                                             num(t, "bytes_per_second"))
                    for name, t in (tiers.items() if isinstance(tiers, Mapping) else ())
                    if isinstance(t, Mapping)})


class _ReadFit:
    """Decayed least squares of a tier's read seconds over bytes."""

    __slots__ = ("n", "x", "y", "xx", "xy", "calls", "last_at", "last_bytes", "reprobe_s")

    def __init__(self) -> None:
        self.n = self.x = self.y = self.xx = self.xy = 0.0
        self.calls = 0
        self.last_at = 0.0
        self.last_bytes = 0
        self.reprobe_s = REPROBE_S  # the wait before this tier is measured again, once declined

    def add(self, nbytes: int, seconds: float, now: float) -> None:
        d = _READ_DECAY
        self.n = self.n * d + 1.0
        self.x = self.x * d + nbytes
        self.y = self.y * d + seconds
        self.xx = self.xx * d + float(nbytes) * nbytes
        self.xy = self.xy * d + nbytes * seconds
        self.calls += 1
        self.last_at = now
        self.last_bytes = nbytes

    def seconds(self, nbytes: int) -> float:
        """Expected wall seconds of one call reading ``nbytes``."""
        if self.x <= 0:
            return 0.0
        spread = self.n * self.xx - self.x * self.x
        if spread > 1e-9 * self.n * self.xx:
            per_byte = (self.n * self.xy - self.x * self.y) / spread
            fixed = (self.y - per_byte * self.x) / self.n
            if per_byte > 0 and fixed >= 0:
                return fixed + per_byte * nbytes
        return self.y / self.x * nbytes


class LoadGate:
    """See the module docstring. ``tiers``: the store's tier names, fastest first."""

    section = "load_gate"

    def __init__(self, tiers: Sequence[str], margin: float,
                 prefill: Callable[[], PrefillReading | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if margin < 1.0:
            raise ValueError(f"margin {margin}: loading must be judged at least at its expected time")
        self._names = list(tiers)
        self._margin = margin
        self._prefill = prefill
        self._clock = clock
        self._lock = threading.Lock()
        self._fits = [_ReadFit() for _ in self._names]
        self._declined = [0] * len(self._names)
        self._last_reading: PrefillReading | None = None
        self._per_token: float | None = None
        self._lookups = self._declined_lookups = self._probes = 0

    # ------------------------------------------------------------------ evidence

    def on_events(self, events: Sequence[StoreEvent]) -> None:
        now = self._clock()
        with self._lock:
            for e in events:
                if isinstance(e, PagesRead) and e.nbytes > 0 and 0 <= e.tier < len(self._fits):
                    self._fits[e.tier].add(e.nbytes, e.seconds, now)

    def _learn_prefill(self) -> float | None:
        """Seconds per computed token; the caller holds the lock."""
        reading = self._prefill()
        last = self._last_reading
        if reading is None:
            return self._per_token
        if last is None or reading.tokens < last.tokens:  # first reading, or the counters restarted
            self._last_reading = reading
            return self._per_token
        tokens = reading.tokens - last.tokens
        if tokens < _MIN_PREFILL_TOKENS:
            return self._per_token
        self._last_reading = reading
        seconds = reading.busy_seconds - last.busy_seconds
        if seconds > 0:
            sample = seconds / tokens
            prev = self._per_token
            self._per_token = sample if prev is None else prev + _PREFILL_WEIGHT * (sample - prev)
        return self._per_token

    # ------------------------------------------------------------------ the decision

    def admit(self, tiers: Sequence[int], object_nbytes: int, object_tokens: float) -> int:
        """How many leading page objects of a hit to report, given the tier each is in now."""
        n = len(tiers)
        if not n:
            return 0
        with self._lock:
            self._lookups += 1
            per_token = self._learn_prefill()
            if not per_token:
                return n
            fits = self._fits
            count = [0] * len(fits)
            best_k, best_gain = 0, 0.0
            for k, t in enumerate(tiers, 1):
                count[t] += 1
                load = sum(fits[i].seconds(c * object_nbytes) for i, c in enumerate(count) if c)
                gain = k * object_tokens * per_token - self._margin * load
                if gain > best_gain:
                    best_k, best_gain = k, gain
            if best_k == n:
                for t in set(tiers):
                    fits[t].reprobe_s = REPROBE_S
                return n
            now = self._clock()
            stale = {t for t in tiers[best_k:] if now - fits[t].last_at >= fits[t].reprobe_s}
            if stale:
                for t in stale:
                    fits[t].last_at = now  # one probe per tier until its read reports back
                    fits[t].reprobe_s = min(fits[t].reprobe_s * 2, MAX_REPROBE_S)
                self._probes += 1
                return n
            self._declined_lookups += 1
            for t in tiers[best_k:]:
                self._declined[t] += 1
            return best_k

    # ------------------------------------------------------------------ report

    def stats(self) -> LoadGateStats:
        with self._lock:
            tiers = {}
            for name, fit, declined in zip(self._names, self._fits, self._declined):
                took = fit.seconds(fit.last_bytes)
                rate = fit.last_bytes / took if took > 0 else 0.0
                tiers[name] = TierGateStats(declined, fit.calls, rate)
            return LoadGateStats(self._lookups, self._declined_lookups, sum(self._declined),
                                 self._probes, self._per_token or 0.0, self._margin, tiers)
