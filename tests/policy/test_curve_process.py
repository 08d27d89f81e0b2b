"""Capacity curves in their own process (``policy/curve_process.py``): the same points as in this
thread, a serving side that never waits for the child, and a dead, stalled or lagging child that
costs the curves, never the store."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mooncake_sgl.policy.curve import TierCurves
from mooncake_sgl.policy.curve_process import (
    CurveProcess,
    Lookups,
    Start,
    Sync,
    read_frame,
    serve,
    write_frame,
)

from .test_curve import chains

PAGE = 1 << 20


def _pid_gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            # A zombie still answers kill(0); it is gone once reaped (by us, if it is our child).
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("policy", ["lru", "heat", "adaptive"])
def test_the_process_reports_the_points_the_same_curves_give_in_this_thread(policy: str) -> None:
    inline = TierCurves([50 * PAGE, None], policy)
    inline.start(PAGE)
    child = CurveProcess([50 * PAGE, None], policy)
    child.start(PAGE)
    try:
        for keys in chains(600, seed=3):
            inline.on_lookup(keys)
            child.on_lookup(keys)
        assert child.sync(60)
        assert child.points() == inline.points() and child.points()[0] and child.points()[1] == []
        assert child.entries() == inline.entries() > 0
        assert child.process_seconds > 0 and child.stopped is None and child.dropped_pages == 0
    finally:
        child.close()


def test_nothing_is_started_or_kept_before_the_first_page_and_close_stops_the_child() -> None:
    child = CurveProcess([50 * PAGE], "lru")
    child.on_lookup([b"a", b"b"])  # no page size yet: nothing to size the miniatures by
    assert child.points() == [[]] and not child.sync(0.1)
    child.start(PAGE)
    child.on_lookup([b"a", b"b"])
    assert child.sync(30) and child.points()[0][3].lookups == 2
    proc = child._proc
    assert proc is not None
    child.close()
    assert proc.poll() is not None


def test_a_store_of_self_evicting_tiers_starts_no_process() -> None:
    child = CurveProcess([None, None], "adaptive")
    child.start(PAGE)
    child.on_lookup([b"a"])
    assert child._proc is None and child.points() == [[], []] and not child.sync(0.1)
    child.close()


def test_a_killed_child_ends_the_curves_with_one_warning_and_their_last_points(caplog) -> None:
    child = CurveProcess([50 * PAGE], "lru")
    child.start(PAGE)
    child.on_lookup([b"a", b"b"])
    assert child.sync(30)
    before = child.points()
    assert child._proc is not None
    with caplog.at_level(logging.WARNING, logger="mooncake_sgl.policy.curve_process"):
        child._proc.kill()
        deadline = time.monotonic() + 10
        while child.stopped is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert child.stopped == "killed by signal 9"
        child.on_lookup([b"a", b"b"])  # a no-op now, never an exception
        assert child.points() == before and not child.sync(0.1)
    warnings = [r for r in caplog.records if "capacity curves stopped" in r.getMessage()]
    assert len(warnings) == 1 and "killed by signal 9" in warnings[0].getMessage()
    child.close()


def test_a_stalled_child_never_blocks_lookups_and_a_full_queue_drops_whole_lookups_counted() -> None:
    child = CurveProcess([50 * PAGE], "lru", max_pending_pages=1000)
    child.start(PAGE)
    child.on_lookup([b"first"])
    assert child.sync(30)
    assert child._proc is not None
    os.kill(child._proc.pid, signal.SIGSTOP)
    try:
        keys = [b"k%d" % i for i in range(100)]
        t0 = time.monotonic()
        # Far more than a pipe buffer and the queue hold: the sender blocks in write, lookups don't.
        for _ in range(5000):
            child.on_lookup(keys)
        assert time.monotonic() - t0 < 5
        assert child.dropped_pages >= 5000 * 100 - 1000 - 100_000  # the queue, and what the pipe took
        assert child.points()[0][3].lookups == 1  # what it last reported, at once
        t0 = time.monotonic()
        assert not child.sync(0.3) and time.monotonic() - t0 < 2
    finally:
        os.kill(child._proc.pid, signal.SIGCONT)
    assert child.sync(60)
    looked = child.points()[0][3].lookups
    assert looked == 1 + 5000 * 100 - child.dropped_pages  # every page not dropped was counted
    child.close()


def test_closing_a_stalled_child_returns_at_once() -> None:
    child = CurveProcess([50 * PAGE], "lru")
    child.start(PAGE)
    child.on_lookup([b"first"])
    assert child.sync(30) and child._proc is not None
    os.kill(child._proc.pid, signal.SIGSTOP)
    for _ in range(3000):  # past the pipe's buffer: the sender blocks in write
        child.on_lookup([b"k%d" % i for i in range(100)])
    t0 = time.monotonic()
    child.close()
    assert time.monotonic() - t0 < 10 and child._proc.poll() is not None


def test_a_print_in_the_child_goes_to_its_stderr_not_into_the_frames() -> None:
    script = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import mooncake_sgl.policy.curve as curve
        real = curve.TierCurves.on_lookup
        def chatty(self, keys):
            print("a library talking on stdout")
            return real(self, keys)
        curve.TierCurves.on_lookup = chatty
        from mooncake_sgl.policy.curve_process import main
        main()
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r_in, w_in = os.pipe()
    os.write(w_in, _frames(Start([8 * PAGE], "lru", None, PAGE), Lookups([[b"a"], [b"a"]]), Sync(3)))
    os.close(w_in)
    out = subprocess.run([sys.executable, "-c", script, root], stdin=r_in, capture_output=True, timeout=60)
    os.close(r_in)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count(b"a library talking on stdout") == 2
    from mooncake_sgl.policy.curve_process import _from_child

    stream, states = io.BytesIO(out.stdout), []
    while (body := read_frame(stream)) is not None:
        states.append(_from_child.decode(body))
    assert states[-1].seq == 3 and states[-1].points[0][3].hits == 1


def test_the_child_exits_when_its_parent_dies() -> None:
    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[1])
        from mooncake_sgl.policy.curve_process import CurveProcess
        c = CurveProcess([1 << 26], "lru")
        c.start(1 << 20)
        c.on_lookup([b"a"])
        assert c.sync(30)
        print(c._proc.pid, flush=True)
        os._exit(0)  # no close(): a crash, as far as the child can tell
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert _pid_gone(int(out.stdout.strip()), within=10)


def _frames(*messages: object) -> bytes:
    buf = io.BytesIO()
    for m in messages:
        write_frame(buf, m)  # type: ignore[arg-type]
    return buf.getvalue()


def _serve(data: bytes) -> list[object]:
    """``serve`` fed ``data`` through a pipe (it selects on a descriptor); what it answered."""
    from mooncake_sgl.policy.curve_process import State, _from_child

    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    out = io.BytesIO()
    with os.fdopen(r, "rb", buffering=0) as src:
        serve(src, out)
    out.seek(0)
    states: list[object] = []
    while (body := read_frame(out)) is not None:
        states.append(_from_child.decode(body))
    assert all(isinstance(s, State) for s in states)
    return states


def test_the_child_answers_a_sync_after_the_lookups_before_it() -> None:
    states = _serve(_frames(Start([8 * PAGE], "lru", None, PAGE), Lookups([[b"a", b"b"], [b"a"]]), Sync(7)))
    last = states[-1]
    assert last.seq == 7 and last.points[0][3].lookups == 3 and last.points[0][3].hits == 1


@pytest.mark.parametrize("data, error", [
    (_frames(Sync(1)), "first message must be start"),
    (_frames(Start([PAGE], "lru", None, PAGE))[:-3], "cut inside a frame"),
    (_frames(Start([PAGE], "lru", None, PAGE)) + b"\x00\x00", "cut inside a frame header"),
    (b"\xff\xff\xff\xff", "more than the"),
    (_frames(Start([PAGE], "lru", None, PAGE), Start([PAGE], "lru", None, PAGE)), "a second start"),
])
def test_a_broken_stream_stops_the_child_with_an_error_naming_it(data: bytes, error: str) -> None:
    with pytest.raises((ValueError, EOFError), match=error):
        _serve(data)


def test_a_store_with_curves_in_a_process_reports_them_and_their_cost_and_stops_them_on_close() -> None:
    from mooncake_sgl.config import HostTierConfig
    from mooncake_sgl.policy.curve_feed import CurveFeed, CurvesReport
    from mooncake_sgl.policy.lru import LruPolicy
    from mooncake_sgl.store.tiered_store import TieredStore
    from mooncake_sgl.tiers.host import HostTier

    page = 4096
    host = HostTier(HostTierConfig(capacity=8 * page, slot_size=page, pin_memory=False))
    store = TieredStore([host], LruPolicy(1), mover="inline")
    feed = CurveFeed(store.tiers, store.names, store.policy, "process")
    store.observe(feed)
    keys = [b"p%d" % i for i in range(4)]
    store.put_from(keys, [[memoryview(bytearray(page))] for _ in keys])
    for _ in range(3):
        assert store.exists_prefix(keys) == 4
    assert feed.sync(30)
    stats = store.stats().sections
    curves = feed._curves
    assert isinstance(curves, CurveProcess)
    store.close()
    feed.close()
    assert curves._proc is not None and curves._proc.poll() is not None
    curves_report = stats["curves"]
    assert isinstance(curves_report, CurvesReport)
    assert curves_report.points["host"][3].lookups == 12
    costs = curves_report.costs
    assert 0 < costs.busy_seconds < costs.process_seconds
    assert costs.dropped_pages == 0
    with pytest.raises(ValueError, match="capacity curves run 'process' or 'inline'"):
        CurveFeed(store.tiers, store.names, store.policy, "thread")  # type: ignore[arg-type]
