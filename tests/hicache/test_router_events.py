"""Router events (``hicache/router_events.py``) against SGLang's own parts: its
``KVCacheEventRecorder`` gives the hashes and parents we announce for the same pages, and a real
``ZmqEventPublisher`` wrapped by ours carries SGLang's batches and our DISK events in one stream
(consecutive sequence numbers, replay, idle flush), decoded with SGLang's ``KVEventBatch``. The
real consumer (Dynamo's indexer) is ``test_router_indexer.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from mooncake_sgl.hicache import router_events as re
from mooncake_sgl.keys import event_hash, page_key
from mooncake_sgl.store import TieredStore

from .kv_stream import NS, PS, Sub, chain, flat, open_stream, ours, put, recorded


def test_sglangs_recorder_and_our_keys_give_the_same_hashes_and_parents() -> None:
    nodes = chain(list(range(100, 112)), [8])  # 3 pages in 2 nodes
    ours, parent = [], None
    for node in nodes:
        for h in node.hash_value:
            e = event_hash(page_key(NS, h))
            ours.append((e, parent))
            parent = e
    assert flat(recorded(nodes)) == ours
    assert flat(recorded(nodes, dynamo=True)) == ours  # the dynamo format alike, without a namespace


@pytest.mark.parametrize("namespace", [{"cache_salt": "tenant-a"}, {"extra_key": "lora-7"}])
def test_a_namespaced_pages_event_hash_is_not_its_keys(namespace: dict[str, str]) -> None:
    nodes = chain(list(range(100, 108)), [], **namespace)
    published = {h for h, _ in flat(recorded(nodes, dynamo=True))}
    assert not published & {event_hash(page_key(NS, h)) for h in nodes[0].hash_value}


@pytest.fixture
def stream(tmp_path: Path) -> Iterator[tuple[Any, re.Announcer, TieredStore, Sub]]:
    with open_stream(tmp_path) as opened:
        yield opened


def test_our_disk_events_ride_sglangs_stream_with_learned_tokens_and_parents(stream) -> None:
    publisher, announcer, store, sub = stream
    nodes = chain(list(range(200, 212)), [8])  # pages A B | C
    a, b, c = (h for n in nodes for h in n.hash_value)
    gpu = recorded(nodes[:1])
    publisher.publish(KVEventBatch(ts=time.time(), events=gpu))  # SGLang's own: A, B on GPU
    put(store, [a, b, c])  # all three reach our tiers; SGLang has published only A and B
    first = sub.batches(0.5)
    stored = ours(first)
    assert [(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size) for e in stored] == [
        ([event_hash(page_key(NS, a))], None, list(range(200, 204)), PS),
        ([event_hash(page_key(NS, b))], event_hash(page_key(NS, a)), list(range(204, 208)), PS)]
    assert announcer.stats().waiting_pages == 1  # C: tokens not yet published by SGLang

    publisher.publish(KVEventBatch(ts=time.time(), events=recorded(nodes[1:])))  # C on GPU
    (seq, batch), = sub.batches(0.5)
    assert [type(e) for e in batch.events] == [BlockStored, BlockStored]
    assert batch.events[0].medium == "GPU" and batch.events[1].medium == re.MEDIUM  # ours after SGLang's
    assert batch.events[1].block_hashes == [event_hash(page_key(NS, c))]

    store.remove([page_key(NS, a)])
    removed = ours(sub.batches(0.5))
    assert [(type(e), e.block_hashes) for e in removed] == [(BlockRemoved, [event_hash(page_key(NS, a))])]
    seqs = [s for s, _ in first] + [seq]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    replayed = sub.replay(0)
    assert [s for s, _ in replayed] == list(range(len(replayed))) and len(replayed) >= 4
    assert announcer.stats().stored == 3 and announcer.stats().removed == 1


def test_a_namespaced_page_is_counted_waiting_and_never_announced(stream) -> None:
    publisher, announcer, store, sub = stream
    salted = chain(list(range(300, 304)), [], cache_salt="tenant-a")
    publisher.publish(KVEventBatch(ts=time.time(), events=recorded(salted, dynamo=True)))
    put(store, salted[0].hash_value)  # its storage hash, as SGLang hands it to batch_set_v1
    assert ours(sub.batches(0.5)) == []
    assert announcer.stats().waiting_pages == 1 and announcer.stats().stored == 0


def test_after_sglang_clears_every_tier_our_pages_are_announced_again(stream) -> None:
    publisher, announcer, store, sub = stream
    nodes = chain(list(range(400, 408)), [])
    publisher.publish(KVEventBatch(ts=time.time(), events=recorded(nodes)))
    put(store, nodes[0].hash_value)
    assert len(sub.ours_until(2)) == 2
    publisher.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))
    (_, batch), = sub.batches(0.5)
    assert isinstance(batch.events[0], AllBlocksCleared)
    assert [e.block_hashes for e in batch.events[1:]] == [[event_hash(page_key(NS, h))]
                                                          for h in nodes[0].hash_value]


def test_a_retired_namespace_removes_what_it_announced(stream) -> None:
    publisher, announcer, store, sub = stream
    nodes = chain(list(range(500, 508)), [])
    publisher.publish(KVEventBatch(ts=time.time(), events=recorded(nodes)))
    put(store, nodes[0].hash_value)
    assert [type(e) for e in sub.ours_until(2)] == [BlockStored, BlockStored]
    announcer.set_namespaces([b"\x01" * 16])  # a weight update keys by new weights
    removed = sub.ours_until(2) + ours(sub.batches(0.3))  # and nothing more after them
    assert all(isinstance(e, BlockRemoved) for e in removed)
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(
        event_hash(page_key(NS, h)) for h in nodes[0].hash_value)


def test_without_an_announcer_sglangs_batches_pass_through_and_nothing_is_learned() -> None:
    class Recording:
        def __init__(self) -> None:
            self.batches: list[Any] = []

        def publish(self, batch: Any) -> None:
            self.batches.append(batch)

        def shutdown(self) -> None:
            pass

    hub = re._Hub()
    inner = Recording()
    publisher = hub.wrap(inner)
    batch = KVEventBatch(ts=time.time(), events=recorded(chain(list(range(700, 708)), [])))
    publisher.publish(batch)
    assert inner.batches == [batch] and len(batch.events) == 1
    assert hub.learned(batch.events[0].block_hashes[0]) is None
