"""The load gate: a hit is reported only as far as loading it beats recomputing it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mooncake_sgl.api import PagesRead
from mooncake_sgl.policy.load_gate import (
    PROBE_S,
    REPROBE_S,
    STALE_S,
    LoadGate,
    LoadGateStats,
    PrefillReading,
    RestOfHit,
)

MIB = 1 << 20
PAGE_TOKENS = 64.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Prefill:
    """The scheduler's running totals, advanced as if it computed ``tokens`` at ``per_token`` s."""

    def __init__(self) -> None:
        self.reading: PrefillReading | None = None

    def compute(self, tokens: int, per_token: float) -> None:
        r = self.reading or PrefillReading(0, 0.0)
        self.reading = PrefillReading(r.tokens + tokens, r.busy_seconds + tokens * per_token)

    def __call__(self) -> PrefillReading | None:
        return self.reading


def gate(per_token: float | None = 1e-3, margin: float = 1.25, volatile: tuple[bool, ...] = (),
         steady: tuple[bool, ...] = ()) -> tuple[LoadGate, Prefill, Clock]:
    prefill, clock = Prefill(), Clock()
    g = LoadGate(["host", "lmdb"], margin, prefill, clock, volatile=volatile, steady=steady)
    if per_token is not None:
        prefill.compute(0, per_token)
        g.admit([0], MIB, PAGE_TOKENS)  # the first reading is the base the next ones differ from
        prefill.compute(4096, per_token)
    return g, prefill, clock


def reads(g: LoadGate, tier: int, bytes_per_s: float,
          sizes: tuple[int, ...] = (MIB, 4 * MIB, 16 * MIB)) -> None:
    g.on_events([PagesRead(tier, n // MIB, n // MIB, n, n / bytes_per_s) for n in sizes])


def test_without_a_prefill_rate_every_hit_is_reported() -> None:
    g, _, _ = gate(per_token=None)
    reads(g, 1, 1e6)  # a very slow tier, but nothing to compare it with
    assert g.admit([1] * 8, MIB, PAGE_TOKENS).objects == 8


def test_a_tier_never_read_costs_nothing() -> None:
    g, _, _ = gate()
    assert g.admit([0, 0, 1, 1], MIB, PAGE_TOKENS).objects == 4


def test_a_tier_faster_than_recompute_is_loaded_whole() -> None:
    g, _, _ = gate(per_token=1e-3)  # 64 ms per 64-token page
    reads(g, 1, 1e9)  # 1 ms per MiB page
    assert g.admit([1] * 10, MIB, PAGE_TOKENS).objects == 10
    assert g.stats().declined_lookups == 0


def test_a_tier_slower_than_recompute_is_declined_and_counted() -> None:
    g, _, _ = gate(per_token=1e-4)  # 6.4 ms per page
    reads(g, 1, 50e6)  # 21 ms per MiB page
    assert g.admit([1] * 10, MIB, PAGE_TOKENS).objects == 0
    s = g.stats()
    assert (s.lookups, s.declined_lookups, s.declined_pages) == (2, 1, 10)
    assert s.tiers["lmdb"].declined_pages == 10 and s.tiers["host"].declined_pages == 0
    assert s.tiers["lmdb"].bytes_per_second == pytest.approx(50e6, rel=0.01)


def test_the_fast_tier_prefix_is_kept_where_the_rest_sits_in_a_slow_tier() -> None:
    g, _, _ = gate(per_token=1e-4)
    reads(g, 0, 10e9)
    reads(g, 1, 50e6)
    assert g.admit([0, 0, 0, 1, 1, 1], MIB, PAGE_TOKENS).objects == 3
    assert g.stats().tiers["lmdb"].declined_pages == 3


def test_the_margin_declines_a_tier_only_just_faster_than_recompute() -> None:
    # Loading takes 0.9x the recompute time: worth it at margin 1, not at 1.25.
    per_page = 64 * 1e-3
    for margin, expected in ((1.0, 4), (1.25, 0)):
        g, _, _ = gate(per_token=1e-3, margin=margin)
        reads(g, 1, MIB / (0.9 * per_page))
        assert g.admit([1] * 4, MIB, PAGE_TOKENS).objects == expected


def test_a_per_call_cost_makes_one_page_not_worth_it_where_many_are() -> None:
    g, _, _ = gate(per_token=1e-4)  # 6.4 ms a page
    # Each call costs 20 ms before its bytes, then 1 ms per MiB.
    g.on_events([PagesRead(1, n, n, n * MIB, 0.02 + n * 1e-3) for n in (1, 2, 8, 32, 64)])
    assert g.admit([1], MIB, PAGE_TOKENS).objects == 0
    assert g.admit([1] * 32, MIB, PAGE_TOKENS).objects == 32


def test_a_probe_reads_what_the_tier_is_known_to_read_in_a_moment_and_at_least_one_object() -> None:
    """On a slow link a probe's reply holds up every reply behind it: a tier known slow is probed
    with one object; a fast one with as many as ``PROBE_S`` of its reads; an unread one, unbounded."""
    g, _, clock = gate(per_token=1e-4)
    reads(g, 0, 10e9)  # host: 0.1 ms a MiB
    reads(g, 1, 2e6)  # a link at 2 MB/s: half a second a MiB
    clock.now += REPROBE_S
    probed = g.admit([0, 0, 1, 1], MIB, PAGE_TOKENS)
    assert probed.probe == (0, 1)
    fast, slow = probed.probe_objects
    assert slow == 1 and fast is not None and fast * MIB / 10e9 <= PROBE_S < (fast + 1) * MIB / 10e9 * 1.5
    unread, _, _ = gate(per_token=None)
    assert unread.admit([1, 1], MIB, PAGE_TOKENS).probe_objects == (None,)


def test_a_hit_given_up_keeps_what_was_read_only_from_half_of_it_on() -> None:
    g, _, _ = gate()
    assert g.keeps_partial(4, 8) and g.keeps_partial(8, 8)
    assert not g.keeps_partial(3, 8) and not g.keeps_partial(1, 64)
    assert g.stats().abandoned_pages == 3 + 1  # what is reported missing after all is counted


def test_a_tier_not_read_lately_is_probed_off_the_request_path_once_per_interval() -> None:
    g, _, clock = gate(per_token=1e-4)
    reads(g, 1, 50e6)
    first = g.admit([1] * 4, MIB, PAGE_TOKENS)
    assert (first.objects, first.probe) == (0, ())  # just read: no probe
    clock.now += REPROBE_S
    again = g.admit([0, 1, 1], MIB, PAGE_TOKENS)
    assert again.objects == 1 and again.probe == (0, 1)  # declined on old evidence, both asked for
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).probe == ()  # one probe until it reports back
    reads(g, 1, 10e9, sizes=(4 * MIB,))  # the probe's one read: the disk is idle again
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).objects == 4  # it outweighs reads 30 s old
    assert g.stats().probe_lookups == 2  # the helper's first lookup asked for tier 0 too


def test_a_hit_is_read_whole_while_every_tier_was_read_lately() -> None:
    g, _, clock = gate(per_token=1e-4)
    reads(g, 0, 10e9)
    reads(g, 1, 1e9)
    assert g.first_read([0, 0, 1, 1]) == 4
    clock.now += STALE_S / 2
    assert g.first_read([0, 1]) == 2
    assert not g.rereads()  # nothing to judge again: the reader need not locate the hit's pages


def test_a_tier_not_read_lately_is_read_one_object_first() -> None:
    g, _, clock = gate(per_token=1e-4)
    reads(g, 0, 10e9)
    assert g.first_read([0, 0, 1, 1]) == 3  # lmdb was never read: its first object, then judge
    reads(g, 1, 1e9)
    clock.now += STALE_S
    assert g.first_read([0, 0, 1, 1]) == 1  # both are stale now: the first object of the hit


def test_a_steady_tier_is_read_whole_however_old_its_evidence() -> None:
    g, _, clock = gate(per_token=1e-4, steady=(True, False))
    assert g.first_read([0, 0, 1, 1]) == 3  # host memory never read: still read whole; lmdb judged
    reads(g, 0, 10e9)
    reads(g, 1, 1e9)
    clock.now += 10 * STALE_S
    assert g.first_read([0, 0, 1, 1]) == 3
    assert g.first_read([0, 0]) == 2
    assert g.rereads()  # lmdb's evidence is old
    reads(g, 1, 1e9)
    assert not g.rereads()


def test_a_volatile_tier_is_read_one_object_first_however_fresh_its_evidence() -> None:
    g, _, _ = gate(per_token=1e-4, volatile=(False, True))
    reads(g, 0, 10e9)
    reads(g, 1, 1e9)
    assert g.rereads()
    assert g.first_read([0, 0, 1, 1]) == 3  # a disk may have turned slow since its last read
    assert g.first_read([0, 0]) == 2  # memory did not


def test_a_bounded_step_reads_what_the_tier_reads_within_half_the_bound() -> None:
    g, _, _ = gate()
    assert g.step_objects(1, MIB, 0.02) is None  # lmdb not read yet: no limit known
    reads(g, 1, 1e9)  # 1 GB/s, no cost per call
    assert g.step_objects(1, MIB, 0.02) == int(0.01 / (MIB / 1e9))  # 10 ms of reading
    assert g.step_objects(1, MIB, 1e-6) == 1  # never none: a step reads at least one object


def test_without_a_prefill_rate_a_hit_is_read_whole() -> None:
    g, _, _ = gate(per_token=None)
    assert g.first_read([1] * 8) == 8
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS) == RestOfHit(7, False)


def test_a_hit_whose_first_objects_read_slowly_is_abandoned_and_counted() -> None:
    g, _, clock = gate(per_token=1e-4)  # 6.4 ms a page
    reads(g, 1, 1e9)
    assert g.admit([1] * 8, MIB, PAGE_TOKENS).objects == 8  # fast when last read
    clock.now += 10 * STALE_S  # the disk turned slow since
    assert g.first_read([1] * 8) == 1
    slow = (MIB, MIB / 20e6)  # 52 ms
    reads(g, 1, 20e6, sizes=(MIB,))  # the first object
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS, [slow]) == RestOfHit(7, True)  # one read: on, bounded
    reads(g, 1, 20e6, sizes=(MIB,))  # the second
    assert g.admit_rest([1] * 6, MIB, PAGE_TOKENS, [slow, slow]) == RestOfHit(0, True)
    s = g.stats()
    assert (s.abandoned_lookups, s.abandoned_pages, s.declined_lookups) == (1, 6, 0)
    assert g.admit([1] * 8, MIB, PAGE_TOKENS).objects == 0  # and the next hit is declined at lookup


def test_slow_reads_judge_the_rest_where_the_fit_still_remembers_a_fast_disk() -> None:
    g, _, _ = gate(per_token=1e-4)  # 6.4 ms a page
    reads(g, 1, 2e9)  # fast a moment ago, in large reads
    reads(g, 1, 20e6, sizes=(MIB, MIB))  # this hit's first two objects: 52 ms each
    slow = (MIB, MIB / 20e6)
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS) == RestOfHit(7, True)  # the fit averages them away
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS, [slow, slow]) == RestOfHit(0, True)  # their rate: no
    # A few ms is a busy host, not a disk: read on in bounded steps...
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS, [(MIB, 0.002), (MIB, 0.003)]) == RestOfHit(7, True)
    # ...and reads long enough to judge by, at a rate worth loading, read the rest at once.
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS, [(MIB, 0.005), (MIB, 0.005)]) == RestOfHit(7, False)


def test_one_read_held_up_does_not_give_a_hit_up() -> None:
    # A read held up by the host's scheduling looks like a slow disk; the next read tells them apart.
    slow, fast = (MIB, MIB / 20e6), (MIB, 0.0005)
    g, _, clock = gate(per_token=1e-4)  # 6.4 ms a page
    reads(g, 1, 2e9)
    clock.now += 10 * STALE_S  # old evidence: the held-up read is most of what the fit knows
    reads(g, 1, 20e6, sizes=(MIB,))
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS) == RestOfHit(0, True)  # the fit alone gives it up
    g, _, clock = gate(per_token=1e-4)
    reads(g, 1, 2e9)
    clock.now += 10 * STALE_S
    reads(g, 1, 20e6, sizes=(MIB,))
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS, [slow]) == RestOfHit(7, True)  # one read is not enough
    reads(g, 1, 2e9, sizes=(MIB,))
    # Slow on average, but the newest read was fast: read on, still bounded.
    assert g.admit_rest([1] * 6, MIB, PAGE_TOKENS, [slow, fast]) == RestOfHit(6, True)
    assert g.stats().abandoned_lookups == 0


def test_a_hit_whose_first_object_read_fast_is_read_on() -> None:
    g, _, clock = gate(per_token=1e-4)
    reads(g, 1, 50e6)
    clock.now += 10 * STALE_S  # slow when last read, idle again now
    assert g.first_read([1] * 8) == 1
    reads(g, 1, 2e9, sizes=(MIB,))
    assert g.admit_rest([1] * 7, MIB, PAGE_TOKENS) == RestOfHit(7, True)
    assert g.stats().abandoned_lookups == 0


def test_a_tier_declined_as_slow_is_rechecked_one_object_at_a_time_and_found_fast_again() -> None:
    g, _, clock = gate(per_token=1e-4)  # 6.4 ms a page
    reads(g, 1, 50e6)  # 21 ms per MiB page: declined
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == ()  # just read
    clock.now += STALE_S
    declined = g.admit([1] * 4, MIB, PAGE_TOKENS)
    assert (declined.objects, declined.recheck, declined.probe) == (0, (1,), ())
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == ()  # one until it reports back
    rechecks = 1
    while True:
        g.on_events([PagesRead(1, 1, 1, MIB, MIB / 2e9, probe=True)])  # the disk is fast again
        if g.admit([1] * 4, MIB, PAGE_TOKENS).objects == 4:
            break
        clock.now += STALE_S
        assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == (1,)
        rechecks += 1
    assert rechecks <= 2  # a probe outweighs the slow past: found fast within two rechecks


def test_a_declined_tier_is_rechecked_a_second_after_its_newest_read_at_the_soonest() -> None:
    g, _, clock = gate(per_token=1e-4)
    reads(g, 1, 50e6)  # 21 ms per MiB object: ten of those are well under the second
    clock.now += 0.5
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == ()
    clock.now += 0.5
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == (1,)


def test_a_tier_that_stays_slow_is_rechecked_at_most_a_tenth_of_the_time() -> None:
    g, _, clock = gate(per_token=1e-6)
    reads(g, 1, 1e6)  # about a second to read one MiB object; a recheck reads two
    clock.now += STALE_S
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == ()  # 20 s after the last read, not 1
    clock.now += 8
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == ()  # nor 10
    clock.now += 10
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).recheck == (1,)


def test_the_recompute_rate_follows_the_schedulers_totals() -> None:
    g, prefill, _ = gate(per_token=1e-4)
    reads(g, 1, 50e6)
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).objects == 0
    for _ in range(12):  # the server got 100x slower (a bigger batch, a loaded host)
        prefill.compute(4096, 1e-2)
        g.admit([0], MIB, PAGE_TOKENS)
    assert g.admit([1] * 4, MIB, PAGE_TOKENS).objects == 4
    assert g.stats().prefill_seconds_per_token == pytest.approx(1e-2, rel=0.05)


def test_counters_that_restart_are_a_new_base_not_a_negative_rate() -> None:
    g, prefill, _ = gate(per_token=1e-3)
    g.admit([0], MIB, PAGE_TOKENS)
    prefill.reading = PrefillReading(10, 0.5)  # a new scheduler: its totals start again
    g.admit([0], MIB, PAGE_TOKENS)
    prefill.compute(4096, 1e-3)
    g.admit([0], MIB, PAGE_TOKENS)
    assert g.stats().prefill_seconds_per_token == pytest.approx(1e-3)


def test_a_margin_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="margin"):
        LoadGate(["host"], 0.5, lambda: None)


def test_the_stats_survive_their_json_form_field_by_field() -> None:
    g, _, _ = gate(per_token=1e-4)
    reads(g, 1, 50e6)
    g.admit([0, 1, 1], MIB, PAGE_TOKENS)
    s = g.stats()
    assert LoadGateStats.from_plain(json.loads(json.dumps(dataclasses.asdict(s)))) == s
    assert LoadGateStats.from_plain({"lookups": "x"}).lookups == 0  # a damaged file reads zeros
