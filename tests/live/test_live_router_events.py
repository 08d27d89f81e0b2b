"""A live CPU server with ``router_events: local`` and SGLang's ``--kv-events-config``, watched by
Dynamo's real KV indexer: a prompt that leaves the device and host pool stays visible as ``disk``
(our SSD tier holds it), and our tiers evicting it removes it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from devtools.bench.server import free_port
from mooncake_sgl.metrics.scrape import scrape

from ..hicache.test_router_indexer import DYNAMO, call
from .conftest import Servers, wait_for, write_tiers
from .probe import LiveClient, prompt, reusable

PAGE_TOKENS = 64
PROMPT_TOKENS = 640


def indexed(port: int, tokens: list[int], check: Callable[[dict[str, int]], bool]) -> dict[str, int] | None:
    """The indexer's answer for worker 1 when ``check`` holds for it, else ``None``."""
    nothing = {"longest_matched": 0, "gpu": 0, "cpu": 0, "disk": 0}  # an instance matching no token
    got = call(port, "/query", {"token_ids": tokens, "model_name": "m"})["instances"].get("1", nothing)
    return got if check(got) else None


def test_a_prompt_in_our_ssd_tier_is_seen_as_disk_and_its_eviction_removes_it(servers: Servers,
                                                                                tmp_path: Path) -> None:
    assert DYNAMO.exists(), f"{DYNAMO} is missing: scripts/bootstrap.sh installs Dynamo's indexer there"
    events, replay, index_port = free_port(), free_port(), free_port()
    # LRU over a 1 MiB host tier and an 8 MiB SSD tier (128 pages of 64 KiB): the filler prompts
    # below evict the first prompt's pages from both.
    tiers = write_tiers(tmp_path / "tiers.yaml", (
        "router_events: local\npolicy: {name: lru}\ntiers:\n"
        "  - {kind: host, capacity: 1MiB, pin_memory: false}\n"
        f"  - {{kind: lmdb, path: {tmp_path / 'ssd'}, capacity: 8MiB}}\n"))
    config = ('{"publisher": "zmq", "bind": true, '
              f'"endpoint": "tcp://127.0.0.1:{events}", "replay_endpoint": "tcp://127.0.0.1:{replay}"}}')
    log = (tmp_path / "indexer.log").open("wb")
    indexer = subprocess.Popen([str(DYNAMO), "-m", "dynamo.indexer", "--port", str(index_port),
                                "--block-size", str(PAGE_TOKENS), "--threads", "1"],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        server = servers.start("router", tiers, ("--enable-metrics", "--kv-events-config", config))
        wait_for(lambda: _up(index_port), 30, "the indexer to answer")
        call(index_port, "/register", {"instance_id": 1, "endpoint": f"tcp://127.0.0.1:{events}",
                                       "replay_endpoint": f"tcp://127.0.0.1:{replay}", "model_name": "m",
                                       "block_size": PAGE_TOKENS})
        client = LiveClient(server.url)
        first = prompt(PROMPT_TOKENS, seed=41)
        stored = reusable(PROMPT_TOKENS)
        client.generate(first)
        seen = wait_for(lambda: indexed(index_port, first, lambda q: q.get("disk", 0) >= stored),
                        60, f"the indexer to credit {stored} tokens on disk")
        assert seen["gpu"] >= stored, seen  # SGLang's own events: still on the device too

        client.flush()  # out of the device and the host pool: SGLang tells AllBlocksCleared
        after_flush = wait_for(lambda: indexed(index_port, first,
                                               lambda q: q.get("disk", 0) >= stored and q.get("gpu") == 0),
                               30, "the prompt to stay visible as disk after SGLang's flush")
        for seed in range(100, 106):  # 6 x 25 pages: more than both our tiers hold
            client.generate(prompt(1600, seed=seed))
        wait_for(lambda: scrape(server.url).store_total("router_removed_pages") >= stored // PAGE_TOKENS,
                 120, "our tiers to evict the first prompt")
        t0 = time.monotonic()
        try:
            gone = wait_for(lambda: indexed(index_port, first, lambda q: q.get("disk", 0) < stored),
                            5, "the indexer to drop the evicted pages")
        except AssertionError:
            snap = scrape(server.url)
            raise AssertionError(
                f"indexer: {indexed(index_port, first, lambda q: True)}; ours: "
                f"{ {f: snap.store_total(f'router_{f}') for f in ('announced_pages', 'removed_pages')} }; "
                f"tiers: {snap.by_tier()}") from None
        print(f"indexer /query for the prompt: stored {seen}; after SGLang's flush {after_flush}; "
              f"after our eviction {gone} ({time.monotonic() - t0:.2f} s after the removal was counted)")
        snap = scrape(server.url)
        assert snap.store_total("router_announced_pages") >= stored // PAGE_TOKENS
    finally:
        indexer.terminate()
        indexer.wait(10)
        log.close()


def _up(port: int) -> bool:
    try:
        call(port, "/workers")
        return True
    except OSError:
        return False
