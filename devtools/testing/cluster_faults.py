"""Faults under live traffic in a test cluster (``devtools.testing.cluster``), and what they cost.

``Traffic`` sends a fixed list of greedy requests in a loop, one at a time, through a URL (the
router), flushing SGLang's own caches before each so every reused prefix comes from our tiers. Each
answer is compared with the same request's cold answer (``cold_outputs``: computed with nothing
cached); one at a time, so batching cannot differ, and outputs must then be identical: greedy ids
and bit-identical logprobs. ``run_fault`` injects one fault while the traffic runs, heals it, and
reports the failed requests, the outputs that differ, and how long until storage hits resumed.

The faults: ``cut_host`` (a host off the bridge for a while), ``restart_host`` (SIGKILL of every
process of a host, then its components start again), ``kill_leader`` (the active Mooncake master,
while a standby takes over), ``disk_full`` (the SSD tier's file system filled by ``fill`` before the
tier opened, so it never had room, then freed). ``schedule`` is the one order of all four that the
CI test and ``scripts/bench_cluster.py --faults`` both run.

Every wait is bounded by a deadline generous for a loaded two-core machine (the servers share it
with whatever else runs); nothing depends on how fast a step is, only on its outcome.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mooncake_sgl.metrics.model import Snapshot, diff, merge

from .cluster import Cluster, Host

# sglang-router's flags for traffic through faults: retry a request whose server went away for
# longer than a cut lasts, never drop the server for failed health checks meanwhile (the faults
# are what is measured, not the router's ejection), and wait out a slow answer on a loaded CPU.
ROUTER_RETRIES = ("--retry-max-retries", "30", "--retry-initial-backoff-ms", "500",
                  "--retry-max-backoff-ms", "2000", "--disable-circuit-breaker",
                  "--health-failure-threshold", "1000", "--request-timeout-secs", "300")


@dataclass(frozen=True)
class Answer:
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    cached_tokens: int
    storage_tokens: int


# How long a client waits for one answer: the router's own request timeout (``ROUTER_RETRIES``),
# so a request counts as failed when the router gave up on it, never for a client's impatience
# with a loaded machine.
ANSWER_TIMEOUT_S = 300.0


def generate(url: str, input_ids: Sequence[int], new_tokens: int,
             timeout_s: float = ANSWER_TIMEOUT_S) -> Answer:
    """One greedy request with logprobs; raises on any failure (HTTP status, timeout, bad body)."""
    body = {"input_ids": list(input_ids), "return_logprob": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(f"{url}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        out = json.loads(resp.read())
    meta = out["meta_info"]
    details = meta.get("cached_tokens_details") or {}
    return Answer(tuple(out["output_ids"]), tuple(lp[0] for lp in meta["output_token_logprobs"]),
                  int(meta.get("cached_tokens") or 0), int(details.get("storage", 0)))


def post(url: str, path: str, timeout_s: float = 90.0) -> bytes:
    req = urllib.request.Request(f"{url}{path}", data=b"{}", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read()


def flush(server_url: str, wait_s: float = 30.0, http_timeout_s: float | None = None) -> None:
    """SGLang's device and host caches dropped (our tiers keep their pages)."""
    post(server_url, f"/flush_cache?timeout={wait_s:g}", http_timeout_s or wait_s + 30.0)


def cold_outputs(server_url: str, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[Answer]:
    """Each prompt's answer with nothing cached anywhere: storage emptied and caches flushed first."""
    out = []
    for ids in prompts:
        post(server_url, "/hicache/storage-backend/clear", 120.0)
        flush(server_url)
        out.append(generate(server_url, ids, new_tokens))
    return out


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic time the request was sent
    index: int  # which prompt
    error: str
    same: bool  # greedy ids and logprobs bit-identical to the cold answer
    storage_tokens: int
    same_ids: bool = False  # the greedy ids alone


class Traffic:
    """The prompts in a loop through ``url``, one at a time, each after a flush of ``server_urls``."""

    def __init__(self, url: str, server_urls: Sequence[str], prompts: Sequence[Sequence[int]],
                 cold: Sequence[Answer], new_tokens: int, timeout_s: float = ANSWER_TIMEOUT_S) -> None:
        self.url, self.server_urls = url, list(server_urls)
        self.prompts, self.cold, self.new_tokens = list(prompts), list(cold), new_tokens
        self.timeout_s = timeout_s
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cluster-traffic", daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            k = i % len(self.prompts)
            t = time.monotonic()
            for s in self.server_urls:
                try:  # briefly: a server cut off must not hold the traffic back
                    flush(s, 5.0, 3.0)
                except (OSError, ValueError):
                    pass  # the request below, through the router, shows what a client sees
            try:
                a = generate(self.url, self.prompts[k], self.new_tokens, self.timeout_s)
                c = self.cold[k]
                same_ids = a.output_ids == c.output_ids
                self.samples.append(Sample(t, k, "", same_ids and a.logprobs == c.logprobs,
                                           a.storage_tokens, same_ids))
            except (OSError, ValueError, KeyError) as e:
                self.samples.append(Sample(t, k, f"{type(e).__name__}: {e}", False, 0))
            i += 1

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 60)

    def wait_for(self, n: int, timeout_s: float) -> None:
        """Until ``n`` more requests have been answered (or failed)."""
        want = len(self.samples) + n
        deadline = time.monotonic() + timeout_s
        while len(self.samples) < want:
            if time.monotonic() > deadline:
                raise TimeoutError(f"traffic: {len(self.samples)} of {want} requests after {timeout_s:.0f}s")
            time.sleep(0.1)


@dataclass
class FaultReport:
    fault: str
    requests: int = 0
    failed: int = 0
    differing: int = 0  # answers whose ids or logprobs differ from the cold answer's
    differing_ids: int = 0  # of those, answers whose greedy ids differ
    # from the fault's start to the first storage hit sent after it was healed, and from its heal
    hits_resume_s: float | None = None
    hits_resume_after_heal_s: float | None = None
    fault_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    # per tier, our /metrics over the servers, from the injection to the heal ("during") and from
    # the heal to the end ("after"): hits, written_bytes, puts_refused, evictions (counts in the
    # window) and holdable_bytes (what the tier could hold at the window's end)
    tiers: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# When a held fault has shown: from the answers sent since the injection, and our metrics at the
# injection and now (``None`` where a scrape failed).
HoldUntil = Callable[[list[Sample], "Snapshot | None", "Snapshot | None"], bool]


def run_fault(name: str, traffic: Traffic, inject: Callable[[], None], heal: Callable[[], None],
              hold_s: float, settle_requests: int = 4, timeout_s: float = 600.0,
              scrape: Callable[[], Snapshot] | None = None, hold_until: HoldUntil | None = None,
              scrape_held: bool = True, settle_until: HoldUntil | None = None) -> FaultReport:
    """``inject``, wait ``hold_s`` under traffic (and until ``hold_until`` says the fault showed,
    polled about once a second, or ``timeout_s``), ``heal``, then wait for
    ``settle_requests`` answers with storage hits and, with ``settle_until``, until it says the
    heal shows in our metrics (its ``start`` is the scrape at the heal), or ``timeout_s``; counts
    the requests sent from the injection on. ``scrape``: our metrics over the servers, read at the
    injection, just before the heal (unless not ``scrape_held``: a fault that cuts a server off
    would hold the scrape, and so itself, for the scrape's timeouts) and at the end."""
    first = len(traffic.samples)
    snaps = [_safe(scrape)]
    t0 = time.monotonic()
    inject()
    t_injected = time.monotonic()
    time.sleep(hold_s)
    deadline = time.monotonic() + timeout_s
    held = _safe(scrape) if scrape_held else None
    while hold_until is not None and time.monotonic() < deadline and not hold_until(
            [s for s in traffic.samples[first:] if s.t >= t_injected], snaps[0], held):
        time.sleep(1.0)
        held = _safe(scrape) if scrape_held else None
    snaps.append(held)
    heal()
    t_heal = time.monotonic()
    healed = snaps[1] if scrape_held else _safe(scrape)
    report = FaultReport(name, fault_s=t_heal - t0)
    deadline = t_heal + timeout_s
    end: Snapshot | None = None
    while time.monotonic() < deadline:
        after = [s for s in traffic.samples[first:] if s.t >= t_heal]
        if sum(1 for s in after if s.storage_tokens > 0) >= settle_requests:
            if settle_until is None:
                break
            # Our gauges are published about once a second, off the request path: an answer with
            # hits can come before the heal shows in them.
            shown = _safe(scrape)
            if settle_until(after, healed, shown):
                end = shown
                break
            time.sleep(0.8)
        time.sleep(0.2)
    window = traffic.samples[first:]
    report.requests = len(window)
    report.failed = sum(1 for s in window if s.error)
    report.differing = sum(1 for s in window if not s.error and not s.same)
    report.differing_ids = sum(1 for s in window if not s.error and not s.same_ids)
    report.errors = sorted({s.error[:200] for s in window if s.error})
    hit = next((s for s in window if s.t >= t_heal and s.storage_tokens > 0), None)
    if hit is not None:
        report.hits_resume_s = hit.t - t0
        report.hits_resume_after_heal_s = hit.t - t_heal
    end = end or _safe(scrape)
    for label, a, b in (("during", snaps[0], snaps[1]), ("after", healed, end)):
        if a is not None and b is not None:
            report.tiers[label] = {tier: {"hits": t.hits, "written_bytes": t.written_bytes,
                                          "puts_refused": t.puts_refused, "evictions": t.evictions,
                                          "holdable_bytes": t.holdable_bytes}
                                   for tier, t in diff(a, b).by_tier().items()}
    return report


def ssd_refused_and_hits_returned(samples: list[Sample], start: Snapshot | None,
                                  now: Snapshot | None) -> bool:
    """The full disk has shown: since the injection the SSD tier refused pages (or evicted its own
    to take them), and an answer sent since had storage hits, which our counters show from the
    other tiers. SGLang writes pages back after the answer, and our counters are published each
    second, so on a loaded machine seconds can pass before either shows."""
    if start is None or now is None or not any(s.storage_tokens > 0 for s in samples):
        return False
    tiers = diff(start, now).by_tier()
    lmdb = tiers.get("lmdb")
    others = sum(t.hits for name, t in tiers.items() if name != "lmdb")
    return lmdb is not None and lmdb.puts_refused + lmdb.evictions > 0 and others > 0


def ssd_has_room_again(samples: list[Sample], start: Snapshot | None, now: Snapshot | None) -> bool:
    """The freed disk has shown: the SSD tier can hold more than it could at the heal."""
    if start is None or now is None:
        return False
    before, after = start.by_tier().get("lmdb"), now.by_tier().get("lmdb")
    return before is not None and after is not None and after.holdable_bytes > before.holdable_bytes


def _safe(scrape: Callable[[], Snapshot] | None) -> Snapshot | None:
    try:
        return scrape() if scrape is not None else None
    except OSError:  # a server cut off: that window's tier counts are left out, the fault goes on
        return None


def scraper(server_urls: Sequence[str]) -> Callable[[], Snapshot]:
    """Our metrics summed over ``server_urls`` (``run_fault``'s ``scrape``)."""
    from mooncake_sgl.metrics.scrape import scrape

    def once(url: str) -> Snapshot:
        for attempt in range(3):  # a loaded server can miss one deadline; a cut-off one misses all
            try:
                return scrape(url, timeout=10.0)
            except OSError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    return lambda: side_by_side([once(u) for u in server_urls])


def side_by_side(snapshots: Sequence[Snapshot]) -> Snapshot:
    """One snapshot of several servers' metrics, each server's ranks kept apart (``merge`` keys by
    rank, and every single-GPU server's rank is the same ``tp0``: it kept the last server's only)."""
    return merge(Snapshot({(f"server{i}/{rank}", tier): t for (rank, tier), t in snap.tiers.items()},
                          snap.taken_at, {f"server{i}/{rank}": c for rank, c in snap.store.items()})
                 for i, snap in enumerate(snapshots))


# ------------------------------------------------------------------------------------ the faults

def cut_host(cluster: Cluster, host: Host) -> tuple[Callable[[], None], Callable[[], None]]:
    return (lambda: cluster.cut(host)), (lambda: cluster.reconnect(host))


def restart_host(cluster: Cluster, host: Host, restart: Callable[[], None],
                 masters: Sequence[Any] = ()) -> tuple[Callable[[], None], Callable[[], None]]:
    """Everything in ``host`` SIGKILLed; ``restart`` starts its components again (same ports).
    Healed once they run and, when ``masters`` are given, one of them leads again (the host's
    etcd went down with it: no leader can be elected until it is back)."""
    def heal() -> None:
        restart()
        if masters:
            wait_for_leader(masters, LEADER_TIMEOUT_S)
    return (lambda: cluster.kill_host(host)), heal


# An election needs the old leader's etcd lease to expire (Mooncake's default TTL is seconds),
# then the standby's next campaign; generous for a loaded machine.
LEADER_TIMEOUT_S = 120.0


def wait_for_leader(masters: Sequence[Any], timeout_s: float) -> Any:
    """The master of ``masters`` that leads, once one does; ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (leader := next((m for m in masters if master_role(m) == "leader"), None)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no master was leader within {timeout_s:.0f} s: "
                               f"{[master_role(m) for m in masters]}")
        time.sleep(0.2)
    return leader


def kill_leader(masters: Sequence[Any]) -> tuple[Callable[[], None], Callable[[], None]]:
    """The master that leads SIGKILLed (waiting for one to lead, should an earlier fault have left
    them electing); healed once another leads."""
    killed: list[Any] = []

    def inject() -> None:
        leader = wait_for_leader(masters, LEADER_TIMEOUT_S)
        leader.kill()
        killed.append(leader)

    def heal() -> None:
        wait_for_leader([m for m in masters if m not in killed], LEADER_TIMEOUT_S)
    return inject, heal


def master_role(m: Any) -> str:
    try:
        with urllib.request.urlopen(f"{m.metrics_url}/role", timeout=2) as r:
            return r.read().decode().strip()
    except (OSError, urllib.error.URLError):
        return "down"


FILLER = "filler.bin"


def fill(path: Path, leave_bytes: int) -> int:
    """The file system holding ``path`` filled by one file until ``leave_bytes`` or fewer are free;
    the bytes left free. Done before the tier there opens, it never has room to take."""
    def free() -> int:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    with open(path / FILLER, "ab", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            try:
                while free() - chunk >= leave_bytes:
                    f.write(b"\0" * chunk)
            except OSError:  # full before the target: fine, fuller than asked
                break
    return free()


def disk_full(path: Path, clear: Callable[[], None]) -> tuple[Callable[[], None], Callable[[], None]]:
    """The SSD tier's disk, ``fill``ed before the tier opened: checked still full at the injection,
    where ``clear`` empties storage so every tier must take the pages again (the full one cannot);
    emptied of the filler at the heal."""
    def inject() -> None:
        if not (path / FILLER).exists():
            raise RuntimeError(f"{path} was not filled before the tier opened (fill() it first)")
        clear()

    def heal() -> None:
        try:
            os.unlink(path / FILLER)
        except FileNotFoundError:
            pass
    return inject, heal


@dataclass
class Rig:
    """What ``schedule`` works on: the cluster, a host that runs a server, the pool's host (with
    etcd and the leading master on it) and how its components start again, the HA masters (the
    standby in another host), the filled disk of one server's SSD tier, and the servers' URLs."""
    cluster: Cluster
    server_host: Host
    pool_host: Host
    restart_pool_host: Callable[[], None]
    masters: Sequence[Any]
    disk: Path
    server_urls: Sequence[str]

    def clear_storage(self) -> None:
        for url in self.server_urls:
            post(url, "/hicache/storage-backend/clear", 120.0)


CUT_S = 10.0


@dataclass(frozen=True)
class Step:
    """One fault of ``schedule``: how it is injected and healed, and ``run_fault``'s waits for it."""
    name: str
    actions: tuple[Callable[[], None], Callable[[], None]]  # (inject, heal)
    hold_s: float
    hold_until: HoldUntil | None = None
    scrape_held: bool = True
    settle_until: HoldUntil | None = None


def steps(rig: Rig) -> list[Step]:
    """The four faults in ``schedule``'s order: the disk fault first, since its disk was full from
    the start. The full disk shows only once pages were written to it, and its end only once our
    gauges say so; a server cut off is not scraped while it is cut."""
    return [
        Step("SSD tier's disk full from the start", disk_full(rig.disk, rig.clear_storage), 5.0,
             hold_until=ssd_refused_and_hits_returned, settle_until=ssd_has_room_again),
        Step(f"server host cut off {CUT_S:.0f} s", cut_host(rig.cluster, rig.server_host), CUT_S,
             scrape_held=False),
        Step("pool host killed, restarted",
             restart_host(rig.cluster, rig.pool_host, rig.restart_pool_host, rig.masters), 2.0),
        Step("active master killed", kill_leader(rig.masters), 2.0),
    ]


def schedule(rig: Rig, traffic: Traffic, scrape: Callable[[], Snapshot] | None = None,
             log: Callable[[str], None] = lambda _: None) -> list[FaultReport]:
    """The four faults of ``steps``, one after another, each healed and its hits resumed (and its
    end shown) before the next."""
    reports = []
    for step in steps(rig):
        log(f"fault: {step.name}")
        reports.append(run_fault(step.name, traffic, *step.actions, step.hold_s, scrape=scrape,
                                 hold_until=step.hold_until, scrape_held=step.scrape_held,
                                 settle_until=step.settle_until))
        log(f"  {reports[-1].failed} failed, {reports[-1].differing} differing of "
            f"{reports[-1].requests}; hits resume {reports[-1].hits_resume_s}")
    return reports
