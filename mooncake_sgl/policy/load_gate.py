"""``LoadGate``: how much of a storage hit is worth loading rather than recomputing.

A hit is worth loading only while loading it takes less time than the server would spend
recomputing its tokens. On a GPU a 64-token page of an 8B model recomputes in about a millisecond;
a busy SSD or a remote pool over TCP can take longer to deliver it, and SGLang then waits for the
load (its default prefetch policy, ``timeout``, waits up to a deadline) instead of computing.

The gate learns two rates, each from what really happened:

- each tier's read time, from the store's ``PagesRead`` events (one per tier read call: bytes and
  wall seconds, as SGLang waits for them), fitted per tier as ``seconds = fixed + bytes * per_byte``
  over the recent calls (sums decayed with a half-life of ``_READ_HALF_LIFE_S``; a fit with no
  spread of sizes is through the origin);
- the server's prefill time per computed token, from SGLang's own scheduler counters
  (``hicache/prefill_clock.py``): its busy prefill time over the tokens it computed, differences
  between lookups, smoothed. That rate is of the tokens SGLang computed, which come after their
  cached prefix and so attend over more context than recomputing the prefix from its start would:
  it overstates recompute, and errs towards loading (what SGLang does without a gate).

``admit`` takes the tier of each page object of a hit, in order, and answers the length of the
leading run whose saving, recompute time minus ``margin`` times load time, is largest; none when
no prefix saves anything. A tier with no read yet, and a server with no prefill measured yet, cost
nothing: without evidence the gate admits, as SGLang would. A tier of the hit whose newest read is
``REPROBE_S`` old is named in the answer's ``probe``: the caller times a read of a few of the hit's
pages in that tier off the request path (``TieredStore.probe_reads``), so a tier declined as slow is
found fast again, and one that turned slow is found out, without a request paying for the reading.

A hit is judged again while it is read: ``first_read`` names the leading objects to read first,
through the first object in a tier whose reads can turn slow from one call to the next
(``volatile``: a disk, a link) or which has not been read for ``STALE_S`` (unless it is ``steady``,
memory whose speed its age does not change), and ``admit_rest`` judges the rest after each read
with the reads' evidence. A disk or link that turned slow since the lookup costs two small reads
(one slow read may have waited on the host's scheduling, not the tier), not the whole hit's; the
pages given up are reported missing to SGLang, which loads the leading run it got and computes the
rest. That first read, and each small step after it
until the reading can be judged, waits at most ``give_up_after`` (a tenth of the hit's recompute
time): a tier that stalls costs the request about that much, and the read's own ``PagesRead``,
when it ends, tells the gate what the tier does now.

Policy only: it moves no bytes and reads no tier. Thread context: events arrive on whichever
thread delivers them, ``admit`` runs on SGLang's storage threads; one lock guards the state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api import PagesRead, StoreEvent
from ..tally import plain_number

logger = logging.getLogger(__name__)

# Half-life (seconds) of a read in a tier's fit: the reads of the last several seconds decide, so one
# probe (``REPROBE_S`` after the newest read) of a tier whose disk changed speed outweighs by about a
# thousand to one what it did before.
_READ_HALF_LIFE_S = 3.0
# Weight left to a tier's earlier reads when a probe read reports: a probe is made to find out
# what the tier does now (a disk that was slow may be idle again), so it outweighs them ten to one.
_PROBE_KEEP = 0.1
# Weight of the newest prefill measurement in the recompute rate.
_PREFILL_WEIGHT = 0.3
# Computed tokens between the scheduler readings that make one prefill measurement: fewer are
# dominated by the fixed cost of a step.
_MIN_PREFILL_TOKENS = 64
# Seconds after a tier's newest read past which a hit read from it is read one object first and
# judged again (``first_read``): by then the fit is mostly older evidence than the half-life.
STALE_S = _READ_HALF_LIFE_S
# A hit's reading (``first_read`` and the steps after it) this long is past what a busy host's
# scheduling adds to a healthy read, so the reads' own rate judges the rest of the hit
# (``admit_rest``)...
SLOW_FIRST_READ_S = 0.01
# ...once at least this many reads were made: one read held up by the host (a 512 KiB page's read
# answered in 10.5 ms beside SGLang's backup thread, the disk idle) cannot give a healthy hit up,
# while a disk that turned slow is slow in the next read too.
JUDGING_READS = 2
# Each bounded step of a hit's read (``give_up_after``) reads at most what the tier's recent reads
# say it reads within this share of the bound (``step_objects``): doubling steps until the reading
# has lasted ``SLOW_FIRST_READ_S`` can otherwise outgrow a bound shorter than that, and a healthy
# step past the bound gives a hit worth loading up.
STEP_SHARE = 0.5
# A hit's first read that has not answered within this share of the time its pages recompute in is
# given up whole (``give_up_after``): a tier that stalls (a throttled disk's empty bucket, a link
# retransmitting) costs a request at most about this much more than computing it would.
GIVE_UP_SHARE = 0.1
# ...but never sooner than this: what a busy host's scheduling can add to a healthy read.
GIVE_UP_FLOOR_S = 0.005
# A hit whose rest was given up is reported loaded as far as it was read only where that is at
# least this share of it; less, and it is reported missing whole. Its saving is at most that share
# of the hit's, and a short prefix can cost more to compute beside than the whole: SGLang on CPU
# (torch's attention) computed a 4,096-token request in 58 ms from nothing, 105 ms beside 64
# cached tokens, 87 ms beside 1,024, 61 ms beside 2,048 (scripts/bench_cached_prefix.py).
PARTIAL_KEEP_SHARE = 0.5
# A tier a hit was declined for is read off the request path (``recheck``) at most once per this
# many times those reads' expected duration: a slow disk or link spends at most about a tenth of
# its time on these reads...
RECHECK_SPACING = 10.0
# ...and at most once a second: a tier fast again is found so within about a second of lookups
# declined (at 3 s, on the bench's slow disk, the gate declined the first three requests after the
# disk was fast again and kept 39-54% of the gain over that phase; at 1 s, one request and 83%).
RECHECK_MIN_S = 1.0
# A recheck reads this many objects, one call after the other. A throttle (a cgroup's io.max, tc's
# token bucket) answers the first read of a tier idle for a while from its allowance, at once; the
# next waits at the tier's real rate, and the newest probe read outweighs the reads before it. With
# one read, a disk throttled to 2 MB/s was found "fast again" after every declined request, and
# the next hit was admitted, stalled and given up at its bound: every other request paid it.
RECHECK_READS = 2
# Seconds after a tier's newest read when a lookup that finds pages there asks for a probe read (a
# disk that was busy may be idle now, an idle one busy).
REPROBE_S = 30.0
# A probe read is sized to take about this long at the tier's known rate (at least one page object):
# on a slow link its reply holds up every other reply behind it (a lookup's among them), so a link
# known at 2 MB/s is probed with one object, not the store's 4 MiB (two seconds of the link).
PROBE_S = 0.02


def _judged_by_reads(reads: Sequence[tuple[int, float]]) -> bool:
    """Whether a hit's reads so far (bytes and wall seconds of each) are evidence enough to judge
    the rest of it by their own rate (``admit_rest``)."""
    return (len(reads) >= JUDGING_READS and any(nbytes > 0 for nbytes, _ in reads)
            and sum(seconds for _, seconds in reads) >= SLOW_FIRST_READ_S)


@dataclass(frozen=True)
class RestOfHit:
    """``admit_rest``'s answer: how many of a hit's objects left to read, and whether in bounded
    steps (its reads so far are not evidence enough to read the rest at once)."""

    objects: int
    bounded: bool


@dataclass(frozen=True)
class PrefillReading:
    """The scheduler's running totals: tokens it computed in prefill, and seconds it was busy."""

    tokens: int
    busy_seconds: float


@dataclass(frozen=True)
class Admission:
    """``admit``'s answer: the leading page objects to report, the tiers of the hit to time a
    probe read of (their newest read is ``REPROBE_S`` old) and how many objects each probe reads,
    and the tiers it was declined for to time reads of ``RECHECK_READS`` objects of, one call
    each (``recheck``: a tier declined as slow is found fast again within seconds, not at the next
    ``REPROBE_S``)."""

    objects: int
    probe: tuple[int, ...]
    # Per ``probe`` tier, the most page objects its probe should read (``PROBE_S`` at the tier's
    # known rate); ``None``: no rate known yet, the store's own bound applies.
    probe_objects: tuple[int | None, ...]
    recheck: tuple[int, ...] = ()


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
    probe_lookups: int  # hits that asked for a probe read of a tier
    abandoned_lookups: int  # hits admitted, then cut short once their first object read slowly
    abandoned_pages: int  # page objects of those hits left unread
    prefill_seconds_per_token: float  # 0 before any prefill was measured
    margin: float
    tiers: dict[str, TierGateStats]

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> LoadGateStats:
        """Back from its JSON form (the counter file); a field missing there reads 0."""
        num = plain_number
        tiers = d.get("tiers")
        return cls(int(num(d, "lookups")), int(num(d, "declined_lookups")),
                   int(num(d, "declined_pages")), int(num(d, "probe_lookups")),
                   int(num(d, "abandoned_lookups")), int(num(d, "abandoned_pages")),
                   num(d, "prefill_seconds_per_token"), num(d, "margin"),
                   {str(name): TierGateStats(int(num(t, "declined_pages")), int(num(t, "read_calls")),
                                             num(t, "bytes_per_second"))
                    for name, t in (tiers.items() if isinstance(tiers, Mapping) else ())
                    if isinstance(t, Mapping)})


class _ReadFit:
    """Decayed least squares of a tier's read seconds over bytes."""

    __slots__ = ("n", "x", "y", "xx", "xy", "calls", "read_at", "last_at", "last_bytes")

    def __init__(self) -> None:
        self.n = self.x = self.y = self.xx = self.xy = 0.0
        self.calls = 0
        self.read_at = 0.0  # the newest read
        self.last_at = -REPROBE_S  # the newest read, or probe asked for
        self.last_bytes = 0

    def add(self, nbytes: int, seconds: float, now: float, probe: bool = False) -> None:
        d = 0.5 ** (max(0.0, now - self.read_at) / _READ_HALF_LIFE_S) if self.calls else 0.0
        if probe:
            d *= _PROBE_KEEP
        self.n = self.n * d + 1.0
        self.x = self.x * d + nbytes
        self.y = self.y * d + seconds
        self.xx = self.xx * d + float(nbytes) * nbytes
        self.xy = self.xy * d + nbytes * seconds
        self.calls += 1
        self.read_at = self.last_at = now
        self.last_bytes = nbytes

    def objects_within(self, seconds: float, object_nbytes: int) -> int | None:
        """Page objects of ``object_nbytes`` a read is expected to take about ``seconds`` for (at
        least one); ``None`` before any read."""
        one = self.seconds(object_nbytes)
        if self.x <= 0 or one <= 0:
            return None
        return max(1, int(seconds / one))  # each object costed a call: errs towards a smaller probe

    def objects_in(self, seconds: float, object_nbytes: int) -> int | None:
        """The most page objects of ``object_nbytes`` one call is expected to read within
        ``seconds`` (0 where not even one is); ``None`` before any read."""
        fixed, per_byte = self.line()
        if per_byte <= 0 or object_nbytes <= 0:
            return None
        return max(0, int((seconds - fixed) / (per_byte * object_nbytes)))

    def seconds(self, nbytes: int) -> float:
        """Expected wall seconds of one call reading ``nbytes``."""
        fixed, per_byte = self.line()
        return fixed + per_byte * nbytes

    def line(self) -> tuple[float, float]:
        """(seconds per call, seconds per byte); through the origin where the sizes read have no
        spread; (0, 0) before any read."""
        if self.x <= 0:
            return 0.0, 0.0
        spread = self.n * self.xx - self.x * self.x
        if spread > 1e-9 * self.n * self.xx:
            per_byte = (self.n * self.xy - self.x * self.y) / spread
            fixed = (self.y - per_byte * self.x) / self.n
            if per_byte > 0 and fixed >= 0:
                return fixed, per_byte
        return 0.0, self.y / self.x


class LoadGate:
    """See the module docstring. ``tiers``: the store's tier names, fastest first; ``volatile``: per
    tier, whether its reads can turn slow between one call and the next (a disk others use, a
    link), so a hit there is read one object first and judged again (none without it);
    ``steady``: per tier, whether its reads cannot turn slow at all (HBM, host DRAM), so a hit there
    is read in one call however old the tier's evidence (none without it: stale evidence of a tier
    of unknown kind is checked by its first object)."""

    section = "load_gate"

    def __init__(self, tiers: Sequence[str], margin: float,
                 prefill: Callable[[], PrefillReading | None],
                 clock: Callable[[], float] = time.monotonic,
                 volatile: Sequence[bool] = (), steady: Sequence[bool] = ()) -> None:
        if margin < 1.0:
            raise ValueError(f"margin {margin}: loading must be judged at least at its expected time")
        self._names = list(tiers)
        self._margin = margin
        self._prefill = prefill
        self._clock = clock
        self._lock = threading.Lock()
        self._fits = [_ReadFit() for _ in self._names]
        self._volatile = [bool(v) for v in volatile] + [False] * (len(self._names) - len(volatile))
        self._steady = [bool(v) for v in steady] + [False] * (len(self._names) - len(steady))
        self._declined = [0] * len(self._names)
        self._last_reading: PrefillReading | None = None
        self._per_token: float | None = None
        self._lookups = self._declined_lookups = self._probes = 0
        self._abandoned_lookups = self._abandoned = 0

    # ------------------------------------------------------------------ evidence

    def on_events(self, events: Sequence[StoreEvent]) -> None:
        now = self._clock()
        with self._lock:
            for e in events:
                if isinstance(e, PagesRead) and e.nbytes > 0 and 0 <= e.tier < len(self._fits):
                    self._fits[e.tier].add(e.nbytes, e.seconds, now, e.probe)

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
            if prev is None:
                logger.info("mooncake_sgl: load gate: this server computes prefill at %.0f tokens/s; "
                            "storage hits are judged against it from now on", 1 / sample)
        return self._per_token

    # ------------------------------------------------------------------ the decision

    def admit(self, tiers: Sequence[int], object_nbytes: int, object_tokens: float) -> Admission:
        """How many leading page objects of a hit to report, given the tier each is in now, and the
        tiers to probe."""
        n = len(tiers)
        if not n:
            return Admission(0, (), ())
        with self._lock:
            self._lookups += 1
            fits = self._fits
            now = self._clock()
            probe = tuple(t for t in sorted(set(tiers)) if now - fits[t].last_at >= REPROBE_S)
            for t in probe:
                fits[t].last_at = now  # one probe per tier until it or a read reports back
            self._probes += bool(probe)
            sizes = tuple(fits[t].objects_within(PROBE_S, object_nbytes) for t in probe)
            per_token = self._learn_prefill()
            if not per_token:
                return Admission(n, probe, sizes)
            kept = self._worth(tiers, object_nbytes, object_tokens, per_token)
            if kept == n:
                return Admission(kept, probe, sizes)
            self._decline(tiers, kept, per_token)
            recheck = []
            for t in sorted(set(tiers[kept:]) - set(probe)):
                fit = fits[t]
                spacing = RECHECK_SPACING * RECHECK_READS * fit.seconds(object_nbytes)
                if now - fit.last_at >= max(RECHECK_MIN_S, spacing):
                    fit.last_at = now
                    recheck.append(t)
            self._probes += bool(recheck) and not probe
            return Admission(kept, probe, sizes, tuple(recheck))

    def rereads(self) -> bool:
        """Whether a hit read now may be judged again (``first_read``): a prefill rate is known and
        some tier is volatile or, not steady, was not read for ``STALE_S``. Cheap: the reader
        locates a hit's pages only then."""
        with self._lock:
            now = self._clock()
            return bool(self._learn_prefill()) and any(self._rejudged(t, now) for t in range(len(self._fits)))

    def first_read(self, tiers: Sequence[int]) -> int:
        """Of a hit about to be read (the tier of each leading object now), how many objects to read
        before ``admit_rest`` judges the rest: through the first object in a volatile tier or one
        not steady and not read for ``STALE_S``; all of them where no such tier holds any, or
        nothing is judged yet (no prefill rate)."""
        with self._lock:
            if not self._learn_prefill():
                return len(tiers)
            now = self._clock()
            for i, t in enumerate(tiers):
                if self._rejudged(t, now):
                    return i + 1
            return len(tiers)

    def _rejudged(self, tier: int, now: float) -> bool:
        """Whether a hit's first object in ``tier`` is read before the rest is judged again; the
        caller holds the lock."""
        if self._volatile[tier]:
            return True
        fit = self._fits[tier]
        return not self._steady[tier] and (not fit.calls or now - fit.read_at >= STALE_S)

    def step_objects(self, tier: int, object_nbytes: int, bound: float) -> int | None:
        """The most page objects of ``object_nbytes`` a bounded step of a hit's read in ``tier``
        should take: what the tier's recent reads say one call reads within ``STEP_SHARE`` of the
        ``bound`` (at least one); ``None`` without a read of the tier yet (no limit known)."""
        with self._lock:
            n = self._fits[tier].objects_in(STEP_SHARE * bound, object_nbytes)
        return None if n is None else max(1, n)

    def give_up_after(self, objects: int, object_tokens: float) -> float | None:
        """Seconds the ``first_read`` of a hit of ``objects`` page objects may wait before the whole
        hit is given up (``gave_up``); ``None`` while no prefill rate is known (nothing is judged)."""
        with self._lock:
            per_token = self._learn_prefill()
        if not per_token:
            return None
        return max(GIVE_UP_FLOOR_S, GIVE_UP_SHARE * objects * object_tokens * per_token)

    def gave_up(self, tiers: Sequence[int]) -> None:
        """A read of a hit passed ``give_up_after``: the objects not read yet (their tiers
        ``tiers``) are left for SGLang to compute, counted as abandoned."""
        if tiers:
            with self._lock:
                self._abandon(tiers[0], len(tiers), "a read did not answer within a tenth of the time "
                              "the hit recomputes in; the pages not read yet are left")

    def keeps_partial(self, read_objects: int, hit_objects: int) -> bool:
        """A hit was given up after ``read_objects`` of its ``hit_objects`` were read: whether to
        report those as loaded (``PARTIAL_KEEP_SHARE``); if not, they are counted as abandoned too."""
        if read_objects >= PARTIAL_KEEP_SHARE * hit_objects:
            return True
        with self._lock:
            self._abandoned += read_objects
        return False

    def admit_rest(self, tiers: Sequence[int], object_nbytes: int, object_tokens: float,
                   reads: Sequence[tuple[int, float]] = ()) -> RestOfHit:
        """How to go on reading a hit after its ``first_read`` and the steps after it (``reads``:
        bytes and wall seconds of each; none: the fit alone judges). ``objects``: how many of the
        objects left to read, judged as ``admit`` judges with the reads' evidence (the rest counted
        as abandoned); ``bounded``: whether to read on in bounded steps, the evidence not settled.

        Settled (``_judged_by_reads``): the rest is read at once if the reads' own rate says it is
        worth it, whatever the fit remembers of the tier; abandoned if neither that rate nor the
        newest read's does. Not settled: the fit judges, but a hit is not given up while its newest
        read was fast or it had a single read, which may have waited on the host's scheduling, not
        on the disk; the bounded steps bound what reading on can cost."""
        n = len(tiers)
        with self._lock:
            per_token = self._learn_prefill()
            if not n or not per_token:
                return RestOfHit(n, False)

            def worth_at(nbytes: float, seconds: float) -> bool:
                # Each read's per-call cost included: errs to recompute.
                load = self._margin * object_nbytes * seconds / nbytes if nbytes > 0 else float("inf")
                return object_tokens * per_token > load

            newest_fast = bool(reads) and worth_at(*reads[-1])
            if _judged_by_reads(reads):
                if worth_at(sum(b for b, _ in reads), sum(t for _, t in reads)):
                    return RestOfHit(n, False)
                kept = n if newest_fast else 0
            else:
                kept = self._worth(tiers, object_nbytes, object_tokens, per_token)
                if kept < n and (newest_fast or len(reads) == 1):
                    kept = n
            if kept < n:
                self._abandon(tiers[kept], n - kept, "its first pages read slower than recomputing the "
                              "rest; the other pages are left")
            return RestOfHit(kept, True)

    def _abandon(self, tier: int, objects: int, why: str) -> None:
        """Count a hit given up (in part); the caller holds the lock."""
        if not self._abandoned_lookups:
            logger.warning("mooncake_sgl: load gate: reading a hit from tier %s, %s for SGLang "
                           "to compute (SGLang logs them as pages it failed to retrieve); counted in "
                           "mooncake_sgl_gate_abandoned_lookups", self._names[tier], why)
        self._abandoned_lookups += 1
        self._abandoned += objects

    def _worth(self, tiers: Sequence[int], object_nbytes: int, object_tokens: float,
               per_token: float) -> int:
        """The length of the leading run of ``tiers`` whose saving is largest; the caller holds the
        lock."""
        fits = self._fits
        count = [0] * len(fits)
        best_k, best_gain = 0, 0.0
        for k, t in enumerate(tiers, 1):
            count[t] += 1
            load = sum(fits[i].seconds(c * object_nbytes) for i, c in enumerate(count) if c)
            gain = k * object_tokens * per_token - self._margin * load
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k

    def _decline(self, tiers: Sequence[int], kept: int, per_token: float) -> None:
        """Count the objects past ``kept``; the caller holds the lock."""
        if not self._declined_lookups:
            fit = self._fits[tiers[kept]]
            took = fit.seconds(fit.last_bytes)
            logger.warning("mooncake_sgl: load gate: declining hits in tier %s, read at %.1f MB/s where this "
                           "server recomputes %.0f tokens/s; counted in mooncake_sgl_gate_declined_lookups",
                           self._names[tiers[kept]], fit.last_bytes / took / 1e6 if took > 0 else 0.0,
                           1 / per_token)
        self._declined_lookups += 1
        for t in tiers[kept:]:
            self._declined[t] += 1

    # ------------------------------------------------------------------ report

    def stats(self) -> LoadGateStats:
        with self._lock:
            tiers = {}
            for name, fit, declined in zip(self._names, self._fits, self._declined):
                took = fit.seconds(fit.last_bytes)
                rate = fit.last_bytes / took if took > 0 else 0.0
                tiers[name] = TierGateStats(declined, fit.calls, rate)
            return LoadGateStats(self._lookups, self._declined_lookups, sum(self._declined),
                                 self._probes, self._abandoned_lookups, self._abandoned,
                                 self._per_token or 0.0, self._margin, tiers)
