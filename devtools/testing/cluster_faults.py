"""Faults under live traffic in a test cluster (``devtools.testing.cluster``), and what they cost.

``Traffic`` sends a fixed list of greedy requests in a loop, one at a time, through a URL (the
router), flushing SGLang's own caches before each so every reused prefix comes from our tiers. Each
answer is compared with the same request's cold answer (``cold_outputs``: computed with nothing
cached); one at a time, so batching cannot differ, and outputs must then be identical: greedy ids
and bit-identical logprobs. ``run_fault`` injects one fault while the traffic runs, heals it, and
reports the failed requests, the outputs that differ, and how long until storage hits resumed.

The faults: ``cut_host`` (a host off the bridge for a while), ``restart_host`` (SIGKILL of every
process of a host, then its components start again), ``kill_leader`` (the active Mooncake master,
while a standby takes over), ``fill_disk`` (the SSD tier's file system filled up, then freed).
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

from .cluster import Cluster, Host


@dataclass(frozen=True)
class Answer:
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    cached_tokens: int
    storage_tokens: int


def generate(url: str, input_ids: Sequence[int], new_tokens: int, timeout_s: float = 120.0) -> Answer:
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
    same: bool
    storage_tokens: int


class Traffic:
    """The prompts in a loop through ``url``, one at a time, each after a flush of ``server_urls``."""

    def __init__(self, url: str, server_urls: Sequence[str], prompts: Sequence[Sequence[int]],
                 cold: Sequence[Answer], new_tokens: int, timeout_s: float = 60.0) -> None:
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
                same = a.output_ids == c.output_ids and a.logprobs == c.logprobs
                self.samples.append(Sample(t, k, "", same, a.storage_tokens))
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
    differing: int = 0
    # from the fault's start to the first storage hit sent after it was healed, and from its heal
    hits_resume_s: float | None = None
    hits_resume_after_heal_s: float | None = None
    fault_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_fault(name: str, traffic: Traffic, inject: Callable[[], None], heal: Callable[[], None],
              hold_s: float, settle_requests: int = 4, timeout_s: float = 600.0) -> FaultReport:
    """``inject``, wait ``hold_s`` under traffic, ``heal``, then wait for ``settle_requests`` answers
    with storage hits (or ``timeout_s``); counts the requests sent from the injection on."""
    first = len(traffic.samples)
    t0 = time.monotonic()
    inject()
    time.sleep(hold_s)
    heal()
    t_heal = time.monotonic()
    report = FaultReport(name, fault_s=t_heal - t0)
    deadline = t_heal + timeout_s
    while time.monotonic() < deadline:
        after = [s for s in traffic.samples[first:] if s.t >= t_heal]
        if sum(1 for s in after if s.storage_tokens > 0) >= settle_requests:
            break
        time.sleep(0.2)
    window = traffic.samples[first:]
    report.requests = len(window)
    report.failed = sum(1 for s in window if s.error)
    report.differing = sum(1 for s in window if not s.error and not s.same)
    report.errors = sorted({s.error[:200] for s in window if s.error})
    hit = next((s for s in window if s.t >= t_heal and s.storage_tokens > 0), None)
    if hit is not None:
        report.hits_resume_s = hit.t - t0
        report.hits_resume_after_heal_s = hit.t - t_heal
    return report


# ------------------------------------------------------------------------------------ the faults

def cut_host(cluster: Cluster, host: Host) -> tuple[Callable[[], None], Callable[[], None]]:
    return (lambda: cluster.cut(host)), (lambda: cluster.reconnect(host))


def restart_host(cluster: Cluster, host: Host,
                 restart: Callable[[], None]) -> tuple[Callable[[], None], Callable[[], None]]:
    """Everything in ``host`` SIGKILLed; ``restart`` starts its components again (same ports)."""
    return (lambda: cluster.kill_host(host)), restart


def kill_leader(masters: Sequence[Any], role: Callable[[Any], str]) -> tuple[Callable[[], None],
                                                                           Callable[[], None]]:
    """The master whose ``role()`` is ``leader`` SIGKILLed; healing waits for a new leader."""
    def inject() -> None:
        # After an earlier fault the masters may still be electing: wait for the leader to kill.
        deadline = time.monotonic() + 60
        while (leader := next((m for m in masters if role(m) == "leader"), None)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no master was leader within 60 s, nothing to kill")
            time.sleep(0.2)
        leader.kill()

    def heal() -> None:
        deadline = time.monotonic() + 60
        while not any(role(m) == "leader" for m in masters):
            if time.monotonic() > deadline:
                raise TimeoutError("no master became leader within 60 s")
            time.sleep(0.2)
    return inject, heal


def master_role(m: Any) -> str:
    try:
        with urllib.request.urlopen(f"{m.metrics_url}/role", timeout=2) as r:
            return r.read().decode().strip()
    except (OSError, urllib.error.URLError):
        return "down"


def fill_disk(path: Path) -> tuple[Callable[[], None], Callable[[], None]]:
    """The file system holding ``path`` filled to its last byte by one file, then the file removed."""
    filler = path / "filler.bin"

    def inject() -> None:
        with open(filler, "wb", buffering=0) as f:
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(chunk)
            except OSError:
                pass
            try:  # the last partial megabyte too
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass

    def heal() -> None:
        try:
            os.unlink(filler)
        except FileNotFoundError:
            pass
    return inject, heal
