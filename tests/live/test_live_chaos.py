"""Chaos under a live server: ``mooncake_master`` stopped then killed under traffic (alone, and as
the leader of an HA pair), and the SGLang server SIGKILLed during its backups, then restarted on
the same tiers.

What must hold: no request fails, and every output equals the cold run's (greedy ids and
bit-identical logprobs); a tier that is gone is a miss, recomputed. Each test prints its figures
(requests, failed, wrong, storage hits per phase, slowest request, time until hits resume), so
``pytest -s`` shows them.

Opt-in (marker ``chaos``: ``bash scripts/test.sh -m chaos``; the whole suite leaves them out): on
two shared cores each test takes 5-7 minutes (server starts of a minute or more, then a minute or
two of traffic). The HA one also needs etcd.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devtools.bench.server import LaunchedServer
from devtools.testing import MooncakeMaster, ha_masters

from .conftest import Servers, wait_for, write_tiers
from .probe import LiveClient, Output, prompt, reusable

pytestmark = pytest.mark.chaos

PROMPT_TOKENS = 1024
PROMPTS = 3
PAGES = PROMPTS * (reusable(PROMPT_TOKENS) // 64)
# SGLang sizes its host pool from the RAM free at start and refuses to start when a shared host
# has little left; an explicit ratio does not depend on what other processes hold.
HOST_POOL = ("--hicache-ratio", "2")


@dataclass
class Sample:
    at: float
    phase: str
    seconds: float
    storage_tokens: int = 0
    failed: str = ""
    wrong: bool = False


@dataclass
class Traffic:
    """Rounds of: flush SGLang's caches, then each prompt once, checked against its cold output.
    Runs in a thread until ``stop()``; ``phase`` labels what the test is doing to the tiers."""

    client: LiveClient
    prompts: list[list[int]]
    cold: list[Output]
    phase: str = "healthy"
    samples: list[Sample] = field(default_factory=list)
    flush_refusals: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.client.flush(wait=30)
            except (AssertionError, OSError):
                self.flush_refusals += 1
            for ids, cold in zip(self.prompts, self.cold):
                if self._stop.is_set():
                    return
                t0 = time.monotonic()
                phase = self.phase
                try:
                    out = self.client.generate(ids)
                except Exception as e:  # any failure a user would see
                    self.samples.append(Sample(t0, phase, time.monotonic() - t0, failed=repr(e)[:200]))
                    continue
                self.samples.append(Sample(t0, phase, time.monotonic() - t0, out.storage_tokens,
                                           wrong=not out.same_as(cold)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(600)

    def first_hit_after(self, t: float) -> float | None:
        return next((s.at - t for s in self.samples if s.at >= t and s.storage_tokens > 0), None)

    def report(self, title: str, **extra: object) -> dict[str, object]:
        phases: dict[str, dict[str, float]] = {}
        for s in self.samples:
            p = phases.setdefault(s.phase, {"requests": 0, "failed": 0, "wrong": 0, "storage_hits": 0,
                                            "slowest_s": 0.0})
            p["requests"] += 1
            p["failed"] += bool(s.failed)
            p["wrong"] += s.wrong
            p["storage_hits"] += s.storage_tokens > 0
            p["slowest_s"] = round(max(p["slowest_s"], s.seconds), 2)
        doc = {"test": title, "requests": len(self.samples),
               "failed": sum(bool(s.failed) for s in self.samples),
               "wrong": sum(s.wrong for s in self.samples), "flush_refusals": self.flush_refusals,
               "phases": phases, **extra,
               "failures": sorted({s.failed for s in self.samples if s.failed})[:5]}
        print(f"\nCHAOS {json.dumps(doc)}")
        return doc


def cold_outputs(client: LiveClient) -> tuple[list[list[int]], list[Output]]:
    prompts = [prompt(PROMPT_TOKENS, seed=40 + i) for i in range(PROMPTS)]
    cold = [client.generate(ids) for ids in prompts]
    assert all(c.storage_tokens == 0 for c in cold), cold
    return prompts, cold


# ------------------------------------------------------------------------------ mooncake_master


STOPPED_S = 15.0  # longer than reconnect_after (10 s): the watcher's setup must not run against it
DOWN_S = 8.0


def _master_chaos(servers: Servers, tmp_path: Path, section: str, leader: MooncakeMaster,
                  landed: Callable[[], bool], restart: bool, title: str) -> None:
    tiers = write_tiers(tmp_path / "tiers.yaml", f"tiers:\n  - {section}\n")
    server = servers.start("server", tiers, HOST_POOL)
    client = LiveClient(server.url)
    prompts, cold = cold_outputs(client)
    wait_for(landed, 120, f"the backup of {PAGES} pages in the Mooncake Store")
    traffic = Traffic(client, prompts, cold).start()
    try:
        time.sleep(10)
        traffic.phase = "stopped"
        leader.freeze()
        stopped_at = time.monotonic()
        time.sleep(STOPPED_S)
        traffic.phase = "killed"
        leader.kill()
        killed_at = time.monotonic()
        time.sleep(DOWN_S)
        restarted_at = None
        if restart:
            traffic.phase = "restarted"
            leader.start()
            restarted_at = time.monotonic()
        else:
            traffic.phase = "after fail-over"
        since = restarted_at or stopped_at
        wait_for(lambda: traffic.first_hit_after(since) is not None, 180, "storage hits again")
        time.sleep(10)
    finally:
        traffic.stop()
    doc = traffic.report(title, stopped_s=STOPPED_S,
                         hits_resume_after_stop_s=_round(traffic.first_hit_after(stopped_at)),
                         hits_resume_after_kill_s=_round(traffic.first_hit_after(killed_at)),
                         hits_resume_after_restart_s=_round(traffic.first_hit_after(restarted_at))
                         if restarted_at else None)
    assert doc["failed"] == 0 and doc["wrong"] == 0, doc
    assert doc["phases"]["healthy"]["storage_hits"] > 0, doc
    # A call in flight when the master stops waits out the client's RPC timeout (3 s), once.
    assert doc["phases"]["stopped"]["slowest_s"] < 30, doc


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def test_a_master_stopped_then_killed_under_traffic_fails_no_request(servers: Servers,
                                                                      tmp_path: Path) -> None:
    with MooncakeMaster() as master:
        section = (f'{{kind: mooncake_store, master: "{master.rpc_address}", metadata_server: '
                   f'"{master.metadata_url}", segment_size: 128MiB, buffer_size: 32MiB}}')
        _master_chaos(servers, tmp_path, section, master,
                      lambda: master.metrics().get("master_key_count", 0) >= PAGES, restart=True,
                      title="master SIGSTOP, SIGKILL, restart")


@pytest.mark.ha
def test_an_ha_leader_stopped_then_killed_under_traffic_fails_no_request(servers: Servers,
                                                                          tmp_path: Path) -> None:
    with ha_masters(tmp_path) as (master, masters):
        wait_for(lambda: any(m.role() == "leader" for m in masters), 30, "an elected leader")
        leader = next(m for m in masters if m.role() == "leader")
        section = (f'{{kind: mooncake_store, master: "{master}", segment_size: 128MiB, '
                   'buffer_size: 32MiB}')
        _master_chaos(servers, tmp_path, section, leader,
                      lambda: leader.metrics().get("master_key_count", 0) >= PAGES, restart=False,
                      title="HA leader SIGSTOP, SIGKILL (standby takes over)")


# ------------------------------------------------------------------------ SGLang server killed


def _kill_group(server: LaunchedServer) -> None:
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(30)


@pytest.mark.parametrize("kind", ["lmdb", "mooncake_store"])
def test_a_server_killed_during_backups_then_restarted_serves_only_cold_outputs(
        servers: Servers, tmp_path: Path, kind: str) -> None:
    with contextlib.nullcontext() if kind == "lmdb" else MooncakeMaster() as master:
        if kind == "lmdb":
            section = f'{{kind: lmdb, path: "{tmp_path / "lmdb"}", capacity: 1GiB}}'
        else:
            section = (f'{{kind: mooncake_store, master: "{master.rpc_address}", metadata_server: '
                       f'"{master.metadata_url}", segment_size: 128MiB, buffer_size: 32MiB}}')
        tiers = write_tiers(tmp_path / "tiers.yaml",
                            f"tiers:\n  - {{kind: host, capacity: 16MiB}}\n  - {section}\n")
        first = servers.start("first", tiers, HOST_POOL)
        client = LiveClient(first.url)
        # One at a time (a batch could round differently from the single requests later); the
        # last is the longest (127 pages), and the kill follows its answer at once, while its
        # backup, queued as it finished, is being written.
        prompts = [prompt(PROMPT_TOKENS * 2, seed=60 + i) for i in range(PROMPTS)]
        prompts.append(prompt(PROMPT_TOKENS * 8, seed=70))
        cold = [client.generate(ids) for ids in prompts]
        _kill_group(first)
        killed_at = time.monotonic()
        again = LiveClient(servers.start("restarted", tiers, HOST_POOL).url)
        traffic = Traffic(again, prompts, cold, phase="restarted").start()
        try:
            restarted_at = time.monotonic()
            wait_for(lambda: len(traffic.samples) >= 3 * len(prompts), 600, "three rounds")
        finally:
            traffic.stop()
        first_round = traffic.samples[:len(prompts)]
        doc = traffic.report(f"server SIGKILL during backups, restart ({kind})",
                             restart_s=round(restarted_at - killed_at, 1),
                             first_round_storage_tokens=[s.storage_tokens for s in first_round],
                             hits_resume_after_restart_s=_round(traffic.first_hit_after(restarted_at)))
    assert doc["failed"] == 0 and doc["wrong"] == 0, doc
    assert traffic.first_hit_after(restarted_at) is not None, doc
