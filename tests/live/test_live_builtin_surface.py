"""The rest of SGLang's built-in Mooncake backend's surface, on live CPU servers with ours under the
name ``mooncake``: every prefetch and write policy and ``buffer_only`` host memory, each with a
storage hit identical to the cold run; the L3 layout reply; runtime detach, re-attach and clear over
SGLang's admin HTTP API.

Three servers in all: two cover the policies not on by default between them (one prefetch and one
write policy each, ``buffer_only`` on the second), and the runtime test runs the defaults
(``timeout``, ``write_through``; also what ``test_live_serving.py`` runs), set explicitly at re-attach.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from devtools.bench.server import LaunchedServer
from devtools.testing.pool_process import PoolProcess

from .conftest import Servers, write_tiers
from .probe import LiveClient, Output, prompt, reusable, storage_hit
from .test_live_shared import pool_pages

PROMPT_TOKENS = 2048
ADMIN_KEY = "surface-test-admin"
# A device cache of two prompts, so a few other prompts evict one (write_back stores on eviction).
DEVICE_TOKENS = 4096
FILLERS = 3
# How long the request ahead of the prompt decodes while the prompt waits (prefetches) behind it:
# about 4 s at this model's 55-60 tokens/s. With 48 (under 1 s) a quiet run lost the race on its
# first attempt and SGLang then looked up none of the seven retries (one lookup in all).
BLOCKER_TOKENS = 256


class AdminClient(LiveClient):
    """``LiveClient`` for a server started with ``--admin-api-key``: SGLang then wants the key on
    its admin endpoints, ``/flush_cache`` included."""

    def _post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 300.0) -> bytes:
        return self.call("POST", path, body, timeout)[1]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 300.0) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {ADMIN_KEY}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def layout(self) -> dict[str, Any]:
        status, body = self.call("GET", "/get_hicache_l3_cache_layout")
        assert status == 200, body
        return json.loads(body)


def _stored_then_hit(client: LiveClient, ids: list[int]) -> tuple[Output, Output]:
    """The cold run, then the prompt brought into storage whatever the write policy, then a hit.

    A second use backs it up under ``write_through_selective`` (hit count 2); prompts that evict it
    from the device back it up under ``write_back``; ``write_through`` stored it at once."""
    cold = client.generate(ids)
    assert cold.storage_tokens == 0, cold
    assert client.generate(ids).same_as(cold)  # a device hit
    for seed in range(FILLERS):
        client.generate(prompt(PROMPT_TOKENS, seed=1000 + seed))
    return cold, _queued_storage_hit(client, ids)


def _queued_storage_hit(client: LiveClient, ids: list[int], attempts: int = 8) -> Output:
    """``probe.storage_hit``, with the prompt queued behind a running request (the server runs one
    at a time) as it is on a busy server.

    Why: ``best_effort`` stops a prefetch as soon as the request can be scheduled. On an idle server
    that is at once, before the lookup has finished (measured: ``completed=0`` on every attempt
    although every page was in our host tier); behind a decoding request it has that long."""
    want, last = reusable(len(ids)), None
    for attempt in range(attempts):
        client.flush()
        ahead = threading.Thread(target=client.generate, args=(prompt(64, seed=2000 + attempt),
                                                                BLOCKER_TOKENS))
        ahead.start()
        time.sleep(0.5)  # the request ahead is running when the prompt arrives
        last = client.generate(ids)
        ahead.join()
        if last.storage_tokens >= want:
            return last
    raise AssertionError(f"no full storage hit after {attempts} attempts: last {last}")


def _check_layout(layout: dict[str, Any], tier_kinds: list[str]) -> None:
    assert layout["enabled"] is False and layout["backend"] == "mooncake", layout
    assert "mooncake_sgl object keys" in layout["reason"], layout
    ours = layout["hicache_object_layout"]["mooncake_sgl"]
    assert "|layout=page_first_direct|page=64|tp{tp_rank}/1|" in ours["namespace"], ours
    assert ours["page_bytes"] == sum(ours["page_segments"]) > 0
    assert [t["kind"] for t in ours["tiers"]] == tier_kinds


# Each server another of SGLang's prefetch, write and host-memory policies; both start at once.
POLICIES = (("best_effort", "write_back", "cache"),
            ("wait_complete", "write_through_selective", "buffer_only"))


def test_policies_give_a_storage_hit_identical_to_the_cold_run(servers: Servers, tmp_path: Path) -> None:
    specs = []
    for prefetch, write, host_memory in POLICIES:
        name = f"{prefetch}-{write}-{host_memory}"
        tiers = write_tiers(tmp_path / f"{name}.yaml", f"""
tiers:
  - {{kind: host, capacity: 64MiB}}
  - {{kind: lmdb, path: "{tmp_path / name}", capacity: 1GiB}}
""")
        specs.append((name, tiers, ("--hicache-storage-prefetch-policy", prefetch, "--hicache-write-policy",
                                    write, "--hicache-host-memory-mode", host_memory)))
    started = servers.start_many(specs, ("--max-total-tokens", str(DEVICE_TOKENS), "--max-running-requests",
                                         "1", "--admin-api-key", ADMIN_KEY))
    for (prefetch, write, _), server in zip(POLICIES, started, strict=True):
        client = AdminClient(server.url)
        _check_layout(client.layout(), ["host", "lmdb"])
        status, body = client.call("GET", "/hicache/storage-backend")
        config = json.loads(body)
        assert status == 200 and (config["hicache_storage_prefetch_policy"], config["hicache_write_policy"]) \
            == (prefetch, write), config
        cold, hit = _stored_then_hit(client, prompt(PROMPT_TOKENS, seed=21))
        assert hit.storage_backend == "MooncakeSglStorage"
        assert hit.storage_tokens == reusable(PROMPT_TOKENS), (server.url, hit)
        assert hit.same_as(cold), (server.url, hit, cold)


def _scheduler(server: LaunchedServer) -> psutil.Process:
    found = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
             if "scheduler" in " ".join(p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in psutil.Process(server.proc.pid).children(recursive=True)]
    return found[0]


def _held(scheduler: psutil.Process, root: Path, pool_port: int) -> dict[str, int]:
    """What the scheduler holds of our backend: files under ``root`` (fds and maps), connections to
    the pool server, threads."""
    files = {f.path for f in scheduler.open_files()} | {m.path for m in scheduler.memory_maps(grouped=True)}
    return {"files": sum(p.startswith(str(root)) for p in files),
            "pool_connections": sum(bool(c.raddr) and c.raddr.port == pool_port
                                    for c in scheduler.net_connections(kind="tcp")),
            "threads": scheduler.num_threads()}


def test_runtime_detach_reattach_and_clear(servers: Servers, tmp_path: Path) -> None:
    with PoolProcess(capacity="256MiB") as pool:
        pool_port = int(pool.endpoint.rsplit(":", 1)[1])
        tiers = write_tiers(tmp_path / "tiers.yaml", f"""
tiers:
  - {{kind: host, capacity: 64MiB}}
  - {{kind: pool, endpoints: ["{pool.endpoint}"], transport: tcp}}
  - {{kind: lmdb, path: "{tmp_path / 'lmdb'}", capacity: 1GiB}}
""")
        server = servers.start("runtime", tiers, ("--admin-api-key", ADMIN_KEY))
        client = AdminClient(server.url)
        scheduler = _scheduler(server)
        _check_layout(client.layout(), ["host", "pool", "lmdb"])
        ids = prompt(PROMPT_TOKENS, seed=22)
        cold = client.generate(ids)
        assert storage_hit(client, ids).same_as(cold)
        attached = _held(scheduler, tmp_path / "lmdb", pool_port)
        assert attached["files"] > 0 and attached["pool_connections"] > 0, attached

        held_after_detach = []
        attach = {"hicache_storage_backend": "mooncake",
                  "hicache_storage_backend_extra_config_json": f"@{tiers}",
                  "hicache_storage_prefetch_policy": "timeout", "hicache_write_policy": "write_through"}
        for _ in range(2):  # a second cycle shows nothing accumulates
            status, body = client.call("DELETE", "/hicache/storage-backend")
            assert status == 200, body
            held = _held(scheduler, tmp_path / "lmdb", pool_port)
            assert (held["files"], held["pool_connections"]) == (0, 0), held
            held_after_detach.append(held["threads"])
            layout = client.layout()
            assert layout["enabled"] is False and "mooncake_sgl" not in layout["hicache_object_layout"]
            client.flush()
            detached = client.generate(ids)
            assert detached.storage_tokens == 0 and detached.same_as(cold), detached

            status, body = client.call("PUT", "/hicache/storage-backend", attach)
            assert status == 200, body
            again = storage_hit(client, ids)  # from the pool or LMDB: the new host tier is empty
            assert again.storage_tokens == reusable(PROMPT_TOKENS) and again.same_as(cold), again
        assert held_after_detach[0] == held_after_detach[1], held_after_detach

        status, body = client.call("POST", "/hicache/storage-backend/clear")
        assert status == 200, body
        assert pool_pages(pool.endpoint) == 0
        client.flush()
        cleared = client.generate(ids)
        assert cleared.storage_tokens == 0 and cleared.same_as(cold), cleared
        assert storage_hit(client, ids).same_as(cold)  # stored again after the clear
        server.stop()  # before its pool server goes
