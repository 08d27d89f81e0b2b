"""Routers see our local tiers: pages in our host DRAM and SSD tiers, announced as KV events on
SGLang's own stream (``router_events: local`` in the tiers file; off by default).

SGLang 0.5.23 publishes ``BlockStored`` / ``BlockRemoved`` (``--kv-events-config``: ZMQ, msgpack
``KVEventBatch``) only from its radix tree, for its device (``GPU``) and host pool (``CPU_PINNED``).
A page that left both but sits in our tiers is invisible to a KV-aware router (Dynamo's indexer,
which keeps one index per tier of each worker). So:

- ``MergingPublisher`` wraps the publisher SGLang builds (``EventPublisherFactory.create``, through
  SGLang's hook registry; declared in ``touch_points``). Each of SGLang's batches passes through
  unchanged, with our pending events appended after SGLang's own: the same endpoint, topic, sequence
  numbers and replay buffer, so a consumer sees our pages as a lower tier of this worker. While SGLang
  is idle, a timer publishes ours alone (at most ``FLUSH_S`` late).
- ``Announcer`` observes one backend's store (``api.StoreObserver``): a page is announced
  ``BlockStored(medium="DISK")`` when its first copy lands in a local tier, and ``BlockRemoved`` when
  its last local copy goes (eviction, loss, ``clear``), or when a weight update retires the namespace.
- Hashes and tokens: SGLang's event hash of a page without ``extra_key``/``cache_salt`` is the first
  16 hex digits of its storage hash (``keys.event_hash``), and consumers need the page's token ids,
  which storage calls never carry. Both are learned from SGLang's own ``BlockStored`` events as they
  pass through the wrapper: a page is announced only once SGLang itself published a block of that
  hash (its tokens and parent taken from there), so a namespaced page (LoRA, ``cache_salt``), whose
  event hash differs, is counted as waiting and never announced wrongly. ``CPU_PINNED`` is never
  used: SGLang's own host-pool removals would erase ours at the consumer.
- After SGLang's ``AllBlocksCleared`` (a consumer then forgets every tier of the worker), the pages
  still in our tiers are announced again.

Only the process holding SGLang's publisher (attention TP rank 0, PP stage 0) publishes; MHA's
TP-rank-0 shard stands for the page. Shared tiers (pool, Mooncake Store) are not announced: every
instance can read them, so crediting one worker would be wrong (docs/routing.md).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..api import PagesRemoved, PagesStored, StoreEvent
from ..keys import event_hash, namespace_of
from ..metrics.router_report import AnnouncerReport
from ..tally import Tally
from .touch_points import TouchPoint, register_hook

logger = logging.getLogger(__name__)

MEDIUM = "DISK"
# SGLang publishes device and host-pool blocks under these media (``None``: its default, GPU).
LEARN_FROM = (None, "GPU", "CPU_PINNED")
# Arbitrary: blocks whose tokens are remembered, oldest forgotten first. A 64-token page costs
# about 0.7 KB here; a page forgotten before it reached our tiers waits until SGLang publishes it
# again (it recomputes or loads it).
LEARN_CAPACITY = 65536
FLUSH_S = 0.1  # our events wait at most this long for a batch of SGLang's to ride on


@dataclass(frozen=True, slots=True)
class Learned:
    """What SGLang published of one block: its parent's hash, its tokens, its size in tokens."""

    parent: int | None
    tokens: tuple[Any, ...]
    block_size: int


@dataclass(frozen=True)
class AnnouncerStats:
    """What an announcer counts."""

    stored: int = 0  # pages announced (BlockStored)
    removed: int = 0  # pages whose removal was announced (BlockRemoved)
    unannounced: int = 0  # pages that reached a local tier and could not be announced at once
    skipped_other_namespace: int = 0  # local pages of sidecar pools or other namespaces
    skipped_not_sglang_hash: int = 0  # local pages whose hash is not SGLang's 64 hex digits


class _Hub:
    """This process's publisher (once SGLang builds one), the blocks learned from it, our pending
    events and the announcers feeding them. Lock order: the hub's lock, then an announcer's; an
    announcer never holds its own while it takes the hub's."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._learned: OrderedDict[int, Learned] = OrderedDict()
        self._learn_lock = threading.Lock()  # a leaf: nothing else is taken while it is held
        self._pending: list[Any] = []
        self._publisher: Any = None
        self._announcers: weakref.WeakSet[Announcer] = weakref.WeakSet()
        self._timer: threading.Thread | None = None

    @property
    def publishing(self) -> bool:
        return self._publisher is not None

    def learned(self, h: int) -> Learned | None:
        with self._learn_lock:
            return self._learned.get(h)

    def join(self, announcer: Announcer) -> None:
        with self._lock:
            self._announcers.add(announcer)

    def queue(self, events: Sequence[Any]) -> None:
        if events and self._publisher is not None:
            with self._lock:
                self._pending.extend(events)

    def wrap(self, publisher: Any) -> Any:
        """SGLang's new publisher, wrapped (``NullEventPublisher`` and ours are left alone)."""
        from sglang.srt.disaggregation.kv_events import NullEventPublisher

        if isinstance(publisher, (NullEventPublisher, MergingPublisher)):
            return publisher
        with self._lock:
            self._publisher = publisher
            for a in list(self._announcers):
                self._pending.extend(a.publisher_attached())
        if self._timer is None:
            self._timer = threading.Thread(target=self._flush_loop, name="mooncake_sgl-router-events",
                                           daemon=True)
            self._timer.start()
        return MergingPublisher(publisher, self)

    def publish(self, batch: Any) -> None:
        """SGLang's ``batch``: learn from it, then send it with our pending events after its own."""
        from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockStored

        if not self._announcers:  # router_events off in this process: SGLang's batch as it is
            self._publisher.publish(batch)
            return
        fresh: list[int] = []
        cleared = False
        with self._learn_lock:
            for e in batch.events:
                if isinstance(e, BlockStored) and e.medium in LEARN_FROM:
                    fresh.extend(self._learn(e))
                elif isinstance(e, AllBlocksCleared):
                    cleared = True
        with self._lock:
            ours = list(self._pending)
            self._pending.clear()
            for a in list(self._announcers):
                ours.extend(a.reannounce() if cleared else a.tokens_learned(fresh))
            if ours:
                batch.events = [*batch.events, *ours]
            self._publisher.publish(batch)

    def _learn(self, e: Any) -> list[int]:
        size = int(e.block_size)
        out = []
        parent = e.parent_block_hash
        for i, h in enumerate(e.block_hashes):
            tokens = tuple(e.token_ids[i * size:(i + 1) * size])
            if len(tokens) == size:  # consumers drop a block without all its tokens
                self._learned[h] = Learned(parent, tokens, size)
                self._learned.move_to_end(h)
                out.append(h)
            parent = h
        while len(self._learned) > LEARN_CAPACITY:
            self._learned.popitem(last=False)
        return out

    def _flush_loop(self) -> None:
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        while True:
            time.sleep(FLUSH_S)
            with self._lock:
                if not self._pending or self._publisher is None:
                    continue
                batch = KVEventBatch(ts=time.time(), events=list(self._pending))
                self._pending.clear()
                try:
                    self._publisher.publish(batch)
                except Exception as e:  # noqa: BLE001 - a closed publisher: SGLang is shutting down
                    logger.debug("mooncake_sgl: router events not published: %s", e)
                    return


HUB = _Hub()


def _merging_base() -> type:
    from sglang.srt.disaggregation.kv_events import EventPublisher

    return EventPublisher


class MergingPublisher(_merging_base()):  # type: ignore[misc]
    """SGLang's publisher with our events riding on its batches (see the module docstring)."""

    def __init__(self, inner: Any, hub: _Hub) -> None:
        self.inner = inner
        self._hub = hub

    def publish(self, events: Any) -> None:
        self._hub.publish(events)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def describe_local_source(self, block_size: int) -> dict[str, Any] | None:
        return self.inner.describe_local_source(block_size)


def wrap_publisher(result: Any, *_: Any, **__: Any) -> Any:
    """AFTER hook on ``EventPublisherFactory.create``: the publisher SGLang built, wrapped."""
    try:
        return HUB.wrap(result)
    except Exception:  # noqa: BLE001 - SGLang must get a publisher whatever happens here
        logger.exception("mooncake_sgl: router events are off: SGLang's publisher could not be wrapped")
        return result


def install_hook(point: TouchPoint) -> bool:
    """Register ``point``'s AFTER hook on SGLang's publisher factory; True if registered now."""
    return register_hook(point, wrap_publisher)


class Announcer:
    """One backend's local tiers as DISK events (``api.StoreObserver``, reporting ``router_events``).

    Args:
        local: positions of the store's tiers whose pages count as this worker's (not shared).
        hub: where the events go (this process's ``HUB``).
    """

    section = "router_events"

    def __init__(self, local: Iterable[int], hub: _Hub = HUB) -> None:
        self._local = frozenset(local)
        self._hub = hub
        self._lock = threading.Lock()
        self._namespaces: frozenset[bytes] = frozenset()
        self._copies: dict[int, int] = {}  # event hash -> local copies, of pages of our namespaces
        self._announced: set[int] = set()
        self.counters = Tally(AnnouncerStats)
        self.observing = False  # the backend subscribes it to its store once
        hub.join(self)

    # -------------------------------------------------------------------- from the backend

    def set_namespaces(self, digests: Iterable[bytes]) -> None:
        """The namespaces this backend keys KV pages by now (more than one with split heads). A
        change retires every page announced under the old ones: they are never read again."""
        digests = frozenset(digests)
        with self._lock:
            if digests == self._namespaces:
                return
            gone = sorted(self._announced)
            self._namespaces = digests
            self._copies.clear()
            self._announced.clear()
        self._send(self._removed(gone))

    # -------------------------------------------------------------------- from the store

    def on_events(self, events: Sequence[StoreEvent]) -> None:
        arrived: list[int] = []
        left: list[int] = []
        with self._lock:
            for e in events:
                if isinstance(e, (PagesStored, PagesRemoved)) and e.tier in self._local:
                    for k in e.keys:
                        h = self._hash_of(k)
                        if h is None:
                            continue
                        n = self._copies.get(h, 0)
                        if isinstance(e, PagesStored):
                            self._copies[h] = n + 1
                            if n == 0:
                                arrived.append(h)
                        elif n > 1:
                            self._copies[h] = n - 1
                        elif n == 1:
                            del self._copies[h]
                            left.append(h)
            out = self._announce(arrived)
            self.counters.add(unannounced=len(arrived) - len(out))
            gone = [h for h in left if h in self._announced]
            self._announced.difference_update(gone)
        self._send([*out, *self._removed(gone)])

    def stats(self) -> AnnouncerReport:
        with self._lock:
            waiting = len(self._copies) - len(self._announced)
            announced = len(self._announced)
        c = self.counters.snapshot()
        return AnnouncerReport(float(c.stored), float(c.removed), float(c.unannounced),
                               float(c.skipped_other_namespace), float(c.skipped_not_sglang_hash),
                               float(announced), float(waiting), float(self._hub.publishing))

    # -------------------------------------------------------------------- from the hub

    def publisher_attached(self) -> list[Any]:
        with self._lock:
            return self._announce([h for h in self._copies if h not in self._announced])

    def tokens_learned(self, hashes: Sequence[int]) -> list[Any]:
        with self._lock:
            return self._announce([h for h in hashes if h in self._copies and h not in self._announced])

    def reannounce(self) -> list[Any]:
        with self._lock:
            again = sorted(self._announced)
            self._announced.clear()
            return self._announce(again)

    # -------------------------------------------------------------------- internals

    def _hash_of(self, key: bytes) -> int | None:
        if namespace_of(key) not in self._namespaces:
            self.counters.add(skipped_other_namespace=1)
            return None
        h = event_hash(key)
        if h is None:
            self.counters.add(skipped_not_sglang_hash=1)
        return h

    def _announce(self, hashes: Sequence[int]) -> list[Any]:
        """BlockStored for each of ``hashes`` whose tokens SGLang published (the caller holds the
        lock); the others wait for SGLang to publish them."""
        if not hashes or not self._hub.publishing:
            return []
        from sglang.srt.disaggregation.kv_events import BlockStored

        out = []
        for h in hashes:
            learned = self._hub.learned(h)
            if learned is None:
                continue
            self._announced.add(h)
            out.append(BlockStored(block_hashes=[h], parent_block_hash=learned.parent,
                                   token_ids=list(learned.tokens), block_size=learned.block_size,
                                   lora_id=None, medium=MEDIUM))
        self.counters.add(stored=len(out))
        return out

    def _removed(self, hashes: Sequence[int]) -> list[Any]:
        if not hashes or not self._hub.publishing:
            return []
        from sglang.srt.disaggregation.kv_events import BlockRemoved

        self.counters.add(removed=len(hashes))
        return [BlockRemoved(block_hashes=list(hashes), medium=MEDIUM)]

    def _send(self, events: list[Any]) -> None:
        self._hub.queue(events)
