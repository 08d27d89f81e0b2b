"""How ``run_fault`` measures a fault, on a traffic and metrics whose timing the test sets.

No cluster is needed: the traffic's answers and the servers' metrics are fed by the test, so the
cases a live run meets only by chance (a gauge published after the first answers came) are met on
every run.
"""

from __future__ import annotations

import threading
import time

from devtools.testing import cluster_faults as F
from mooncake_sgl.metrics.model import Snapshot, TierSample

FULL, FREED = 320 << 10, 24 << 20


def gauges(lmdb_holdable: float, pool_hits: float) -> Snapshot:
    return Snapshot({("tp0", "pool"): TierSample(hits=pool_hits, holdable_bytes=128 << 20),
                     ("tp0", "lmdb"): TierSample(holdable_bytes=lmdb_holdable, position=1)},
                    time.time())


class Answers:
    """A ``Traffic`` whose answers (every one a storage hit, identical to cold) arrive every 20 ms."""

    def __init__(self) -> None:
        self.traffic = F.Traffic("http://unused", [], [[1]], [], 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.traffic.samples.append(F.Sample(time.monotonic(), 0, "", True, 64, True))

    def __enter__(self) -> F.Traffic:
        self._thread.start()
        return self.traffic

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_the_disk_faults_after_window_ends_only_once_the_freed_room_shows_in_the_gauges() -> None:
    # The filler is removed at the heal; the exporter publishes the new room 1.5 s later, long
    # after the first answers with hits (one every 20 ms), as a server's sync thread does.
    healed_at: list[float] = []

    def scrape() -> Snapshot:
        shown = bool(healed_at) and time.monotonic() - healed_at[0] > 1.5
        return gauges(FREED if shown else FULL, 10.0 * len(healed_at))

    with Answers() as traffic:
        report = F.run_fault("disk full", traffic, lambda: None, lambda: healed_at.append(time.monotonic()),
                             0.1, scrape=scrape, timeout_s=30.0, settle_until=F.ssd_has_room_again)
    assert report.tiers["after"]["lmdb"]["holdable_bytes"] == FREED, report
    assert report.tiers["during"]["lmdb"]["holdable_bytes"] == FULL, report
    assert report.failed == report.differing == 0 and report.hits_resume_after_heal_s is not None


def test_the_schedule_waits_for_the_freed_disk_to_show_and_for_nothing_else() -> None:
    # Only the disk fault's end is a gauge (the others' ends are answers with hits), and it is the
    # check that failed when the after window closed 55 ms after the heal.
    rig = F.Rig(None, None, None, lambda: None, [], None, [])  # type: ignore[arg-type]
    steps = {s.name: s for s in F.steps(rig)}
    assert [s.settle_until for s in steps.values()] == [F.ssd_has_room_again, None, None, None]
    assert steps["SSD tier's disk full from the start"].hold_until is F.ssd_refused_and_hits_returned


def test_a_fault_whose_heal_never_shows_ends_at_its_deadline_with_the_last_gauges() -> None:
    with Answers() as traffic:
        t0 = time.monotonic()
        report = F.run_fault("disk full", traffic, lambda: None, lambda: None, 0.1,
                             scrape=lambda: gauges(FULL, 1.0), timeout_s=2.0,
                             settle_until=F.ssd_has_room_again)
    assert time.monotonic() - t0 < 10
    assert report.tiers["after"]["lmdb"]["holdable_bytes"] == FULL
