"""Router events through the real consumer: NVIDIA Dynamo's standalone KV indexer
(``ai-dynamo-runtime``, ``python -m dynamo.indexer``, in the virtualenv ``scripts/bootstrap.sh``
makes for it: it pins an older pydantic than SGLang's) subscribes to SGLang's ZMQ publisher, which
carries our DISK events, and answers ``/query`` with what it credits each tier of the worker."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, KVEventBatch

from devtools.testing.procs import pick_port
from mooncake_sgl.keys import event_hash, page_key

from .kv_stream import NS, PS, chain, open_stream, put, recorded

ROOT = Path(__file__).resolve().parents[2]
DYNAMO = ROOT / ".venv-dynamo" / "bin" / "python"


def call(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read().decode()
    return json.loads(text) if text.strip() else None


@pytest.fixture
def indexer(tmp_path: Path) -> Iterator[int]:
    assert DYNAMO.exists(), f"{DYNAMO} is missing: scripts/bootstrap.sh installs Dynamo's indexer there"
    port = pick_port("127.0.0.1")
    log = (tmp_path / "indexer.log").open("wb")
    proc = subprocess.Popen([str(DYNAMO), "-m", "dynamo.indexer", "--port", str(port), "--block-size",
                             str(PS), "--threads", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                call(port, "/workers")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, (
                    (tmp_path / "indexer.log").read_text()[-2000:])
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def stream(tmp_path: Path) -> Iterator[Any]:
    with open_stream(tmp_path) as opened:
        yield opened


def query(port: int, tokens: list[int], want: dict[str, int], within: float = 1.0) -> dict[str, Any]:
    """The indexer's answer for worker 1, polled until it shows ``want`` (or ``within`` runs out)."""
    deadline = time.monotonic() + within
    while True:
        got = call(port, "/query", {"token_ids": tokens, "model_name": "m"})["instances"].get("1", {})
        if all(got.get(k) == v for k, v in want.items()) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_the_indexer_credits_our_pages_as_disk_and_drops_them_when_evicted(stream, indexer: int) -> None:
    publisher, announcer, store, sub = stream
    call(indexer, "/register", {"instance_id": 1, "endpoint": sub.endpoint, "model_name": "m",
                                "block_size": PS, "replay_endpoint": sub.replay_endpoint})
    tokens = list(range(800, 816))  # four pages
    nodes = chain(tokens, [8])
    hashes = [h for n in nodes for h in n.hash_value]
    # SGLang computed all four pages on the device, then evicted 2-3 from it (and its host pool).
    publisher.publish(KVEventBatch(ts=time.time(), events=recorded(nodes)))
    evicted = [event_hash(page_key(NS, h)) for h in hashes[2:]]
    publisher.publish(KVEventBatch(ts=time.time(), events=[BlockRemoved(block_hashes=evicted, medium="GPU")]))
    put(store, hashes)  # all four are in our tiers
    before = query(indexer, tokens, {"disk": 16})
    assert before["disk"] == 16 and before["longest_matched"] == 16, before
    t0 = time.monotonic()
    store.remove([page_key(NS, h) for h in hashes[2:]])  # our tiers lose pages 2-3
    after = query(indexer, tokens, {"disk": 8})
    assert after["disk"] == 8, after
    assert time.monotonic() - t0 < 1.0
    print(f"indexer /query before eviction: {before}; after: {after}")


def test_a_disk_only_prefix_is_found_from_the_root_and_external_counts_as_disk(stream, indexer: int) -> None:
    """What Dynamo 1.6.1 does with a chain on no device, and with medium EXTERNAL (recorded: our
    shared tiers are not announced, docs/routing.md)."""
    publisher, _, store, sub = stream
    call(indexer, "/register", {"instance_id": 1, "endpoint": sub.endpoint, "model_name": "m",
                                "block_size": PS, "replay_endpoint": sub.replay_endpoint})
    tokens = list(range(900, 908))
    nodes = chain(tokens, [])
    publisher.publish(KVEventBatch(ts=time.time(), events=recorded(nodes)))
    gpu = [event_hash(page_key(NS, h)) for h in nodes[0].hash_value]
    publisher.publish(KVEventBatch(ts=time.time(), events=[BlockRemoved(block_hashes=gpu, medium="GPU")]))
    put(store, nodes[0].hash_value)
    # The whole state awaited, not its disk part alone: the indexer has answered with our DISK batch
    # applied and the device's removal not yet (gpu 8, disk 8, once, in a fresh clone's run on a
    # loaded machine).
    got = query(indexer, tokens, {"gpu": 0, "disk": 8})
    assert (got["gpu"], got["disk"], got["longest_matched"]) == (0, 8, 8), got
    external = list(range(950, 958))
    ext = chain(external, [])
    hashes = [event_hash(page_key(NS, h)) for h in ext[0].hash_value]
    publisher.publish(KVEventBatch(ts=time.time(), events=[BlockStored(
        block_hashes=hashes, parent_block_hash=None, token_ids=external, block_size=PS, lora_id=None,
        medium="EXTERNAL")]))
    seen = query(indexer, external, {"disk": 8})
    assert seen["disk"] == 8, seen  # Dynamo 1.6.1 folds EXTERNAL into its disk tier
    print(f"EXTERNAL chain in the indexer: {seen}")
