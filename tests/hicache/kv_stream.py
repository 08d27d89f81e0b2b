"""One SGLang KV event stream for the router-event tests: SGLang's own recorder over radix nodes
hashed as SGLang hashes them, a real ``ZmqEventPublisher`` wrapped by ours, a store over real tiers
whose announcer feeds it, and a subscriber decoding with SGLang's ``KVEventBatch``."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import zmq
from sglang.srt.disaggregation.kv_events import KVEventBatch, ZmqEventPublisher
from sglang.srt.mem_cache.events import KVCacheEventRecorder
from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode
from sglang.srt.mem_cache.utils import compute_node_hash_values

from devtools.testing.procs import pick_port
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig
from mooncake_sgl.hicache import router_events as re
from mooncake_sgl.keys import KeyNamespace, page_key
from mooncake_sgl.policy.lru import LruPolicy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.tiers.ssd import LmdbTier

PS = 4  # tokens per page
NS = KeyNamespace(model="m", dtype="bf16", layout="page_first", page_size=PS)
PAGE = 4096


def chain(tokens: list[int], cuts: list[int], *, cache_salt: str | None = None,
          extra_key: str | None = None) -> list[TreeNode]:
    """Radix nodes of ``tokens`` split at ``cuts`` (page multiples) under a root, hashed as
    SGLang hashes them for storage."""
    root = TreeNode()
    root.key, root.hash_value = RadixKey(array("i")), []
    nodes, parent, start = [], root, 0
    for end in [*cuts, len(tokens)]:
        node = TreeNode()
        node.parent = parent
        node.key = RadixKey(array("i", tokens[start:end]), extra_key=extra_key, cache_salt=cache_salt)
        node.hash_value = compute_node_hash_values(node, PS)
        nodes.append(node)
        parent, start = node, end
    return nodes


def recorded(nodes: list[TreeNode], dynamo: bool = False) -> list[Any]:
    rec = KVCacheEventRecorder(enabled=True, page_size=PS, dynamo_format=dynamo)
    for n in nodes:
        rec.record_store(n)
    return rec.take()


def flat(events: list[Any]) -> list[tuple[int, int | None]]:
    """(hash, parent) per block of BlockStored events."""
    out = []
    for e in events:
        parent = e.parent_block_hash
        for h in e.block_hashes:
            out.append((h, parent))
            parent = h
    return out


class Sub:
    """A subscriber of the real publisher, decoding with SGLang's ``KVEventBatch``."""

    def __init__(self, endpoint: str, replay: str) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.endpoint = endpoint
        self.replay_endpoint = replay
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)

    def batches(self, timeout: float) -> list[tuple[int, KVEventBatch]]:
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(50):
                _, seq, payload = self.sock.recv_multipart()
                out.append((int.from_bytes(seq, "big"), self.decoder.decode(payload)))
        return out

    def ours_until(self, n: int, timeout: float = 10.0) -> list[Any]:
        """Our events as they arrive, until ``n`` of them did (or ``timeout``): a fixed window can
        end before a loaded host delivered, and leave them to the next one."""
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            out += ours(self.batches(0.05))
        return out

    def replay(self, start: int) -> list[tuple[int, KVEventBatch]]:
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while dealer.poll(5000):
            _, _, seq, payload = dealer.recv_multipart()
            if seq == ZmqEventPublisher.END_SEQ:
                break
            out.append((int.from_bytes(seq, "big"), self.decoder.decode(payload)))
        dealer.close(linger=0)
        return out

    def close(self) -> None:
        self.sock.close(linger=0)


def ours(batches: list[tuple[int, KVEventBatch]]) -> list[Any]:
    return [e for _, b in batches for e in b.events if getattr(e, "medium", None) == re.MEDIUM]


@contextmanager
def open_stream(tmp_path: Path) -> Iterator[tuple[Any, re.Announcer, TieredStore, Sub]]:
    """(our publisher around SGLang's, the announcer, its store, a subscriber)."""
    port, rport = pick_port("127.0.0.1"), pick_port("127.0.0.1")
    inner = ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://127.0.0.1:{port}",
                              replay_endpoint=f"tcp://127.0.0.1:{rport}", bind=True)
    hub = re._Hub()
    publisher = hub.wrap(inner)
    store = TieredStore([HostTier(HostTierConfig(capacity=4 * PAGE, slot_size=PAGE, pin_memory=False)),
                         LmdbTier(LmdbTierConfig(path=str(tmp_path / "db"), capacity="16MiB", sync=False))],
                        LruPolicy(2), mover="inline")
    announcer = re.Announcer([0, 1], hub)
    announcer.set_namespaces([NS.digest])
    store.observe(announcer, with_current=True)
    sub = Sub(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}")
    time.sleep(0.3)  # the subscription reaches the publisher
    try:
        yield publisher, announcer, store, sub
    finally:
        sub.close()
        store.close()
        publisher.shutdown()


def put(store: TieredStore, hashes: list[str]) -> None:
    keys = [page_key(NS, h) for h in hashes]
    assert store.put_from(keys, [[memoryview(bytearray(PAGE))] for _ in keys]) == [True] * len(keys)
