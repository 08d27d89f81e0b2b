"""``MooncakeStoreTier``: the real Mooncake Store (``mooncake.store.MooncakeDistributedStore``) as a
remote tier, shared by every node of a cluster and evicting on its own (in the master).

What lives here: the tier; its link to the master (up/down, a watcher thread that notices a lost
master and reconnects); the zero-copy path over registered memory with a registered staging buffer
for pages outside it; and the mapping of Mooncake's return codes to our semantics:

    0 / -705 ALREADY_EXISTS   put acknowledged (values are immutable; a re-put keeps the first)
    -200 NO_AVAILABLE_HANDLE  no space: the master evicts asynchronously, so back off and retry
                              within ``put_retry_window``; then ``False`` (never acknowledged)
    -704 NOT_FOUND, -703      a miss
    -707 LEASE_EXPIRED        the read outlived its lease: retried once, then a miss
    -706 HAS_LEASE            a reader holds the page; ``remove`` forces (leases come from every
                              exists check, so an unforced remove would fail for the lease TTL)
    -900/-901 RPC, -601, -1010  the master is gone: this and every later call are misses/False,
                              without touching Mooncake, until the watcher sees it back
    anything else             a per-page ``False``, counted in ``stats()``

Nothing here raises into the store for a master that is down; only ``close()``d use raises.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import threading
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..api import PageKey, PageView, Tier, TierCapabilities, TierKind, TierUsage, page_nbytes
from ..buffers import gather, scatter
from ..config import MooncakeStoreTierConfig
from ..errors import TierClosed, TierError

logger = logging.getLogger(__name__)

KEY_PREFIX = "msgl/"  # every object this package writes; ``clear`` drops exactly these
OK, NO_SPACE, INVALID_PARAMS, ILLEGAL_CLIENT = 0, -200, -600, -601
REPLICA_NOT_READY, NOT_FOUND, ALREADY_EXISTS, LEASE_EXPIRED = -703, -704, -705, -707
RPC_FAIL, RPC_TIMEOUT, UNAVAILABLE = -900, -901, -1010
MASTER_LOST = frozenset({RPC_FAIL, RPC_TIMEOUT, ILLEGAL_CLIENT, UNAVAILABLE})
_TOO_LARGE = -10_000  # ours: a page outside registered memory larger than the staging buffer

# Mooncake's own local buffer only serves its bytes API, which this tier never uses.
_MOONCAKE_LOCAL_BUFFER = 16 << 20
_WATCH_INTERVAL = 0.25  # how often the watcher looks at the link (cheap: no master RPC when up)
# While up, the master's port is also probed: the client's own heartbeat takes seconds to notice
# a dead master, and a call in that window blocks ~4.4 s. Once a second per node is cheap.
_UP_PROBE_INTERVAL = 1.0
_PROBE_KEY = KEY_PREFIX + "probe"
_MAX_SETUP_BACKOFF = 60.0


def _load_mooncake() -> Any:
    try:
        import mooncake.store as ms
    except ImportError as e:
        if "libibverbs" in str(e):
            hint = "the system library libibverbs.so.1 is missing: apt-get install libibverbs1"
        else:
            hint = ("pip install 'mooncake-sgl[mooncake]' (it brings mooncake-transfer-engine; "
                    "-non-cuda on hosts without CUDA) and apt-get install libibverbs1")
        raise TierError(f"the mooncake_store tier needs the Mooncake client: {hint} ({e})") from None
    return ms


def object_name(key: PageKey) -> str:
    """The Mooncake object key of a page (Mooncake keys are strings; ours are bytes)."""
    return KEY_PREFIX + key.hex()


def object_names(keys: Sequence[PageKey]) -> list[str]:
    """``object_name`` of each key (a batch of thousands on every existence check)."""
    return [KEY_PREFIX + k.hex() for k in keys]


def _address(seg: memoryview) -> int:
    return np.frombuffer(seg, dtype=np.uint8).ctypes.data


def _endpoints(master: str) -> list[tuple[str, int]]:
    """TCP endpoints to probe for a master address: the master itself (``host:port``), or the
    etcd/redis endpoints an HA set elects its leader through (``etcd://h1:2379;h2:2379``)."""
    out = []
    for part in master.split("://", 1)[-1].split(";"):
        host, _, port = part.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host, int(port)))
    return out


def _reachable(endpoints: list[tuple[str, int]]) -> bool | None:
    """Does any endpoint accept a TCP connection (``None``: nothing to probe)."""
    if not endpoints:
        return None
    for ep in endpoints:
        try:
            with socket.create_connection(ep, timeout=0.5):
                return True
        except OSError:
            pass
    return False


class MooncakeStoreTier(Tier):
    """Pages in a Mooncake Store cluster; this process also contributes ``segment_size`` to it.

    Zero copy: memory handed to ``register_memory(ptr, nbytes)`` (the store passes SGLang's host KV
    pool) is registered with the transfer engine once; pages whose segments all lie inside it move
    with ``batch_put_from``/``batch_get_into`` (``*_multi_buffers`` for multi-segment pages) and no
    copy in Python. Other pages are copied through a registered staging buffer of ``buffer_size``.
    """

    kind = TierKind.REMOTE
    capabilities = TierCapabilities(persistent=False, shared=True, self_evicting=True, soft_pin=True)

    def __init__(self, config: MooncakeStoreTierConfig, name: str = "mooncake_store"):
        self.name = name
        self.config = config
        self._ms = _load_mooncake()
        # Each setup retry against a dead master blocks ~4.5 s (20 by default); the watcher
        # retries on its own schedule instead. setdefault: an operator's value wins.
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
        self._probe_endpoints = _endpoints(config.master)
        # While up, only a plain master address is probed: an HA set's leader is not at a fixed one.
        self._direct = "://" not in config.master
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._client: Any = None
        self._up = False
        self._closed = False
        self._inflight = 0
        self._reachable_since: float | None = None
        self._ranges: list[tuple[int, int]] = []  # registered (start, end), sorted by start
        self._staging: mmap.mmap | None = None
        self._staging_ptr = 0
        self._staging_lock = threading.Lock()
        self._written_bytes = 0
        self._written_pages = 0
        self._counts: dict[str, int] = dict.fromkeys((
            "puts", "put_bytes", "put_no_space_retries", "put_failed_no_space", "put_failed",
            "put_skipped_down", "gets", "get_bytes", "get_misses", "get_failed", "get_skipped_down",
            "zero_copy_pages", "staged_pages", "too_large", "master_lost", "reconnects", "setups"), 0)
        self._plain_cfg = self._replicate_config(pin=False)
        self._pin_cfg = self._replicate_config(pin=True)
        if _reachable(self._probe_endpoints) is False:
            # Mooncake's setup would block 4.5 s (GIL held) and fail; the watcher connects later.
            logger.warning("%s: master %s unreachable at start; answering misses until it answers",
                           name, config.master)
        elif self._connect() == INVALID_PARAMS:
            raise TierError(f"{name}: Mooncake rejected the setup parameters (segment_size "
                            f"{config.segment_size}, protocol {config.protocol!r}, device "
                            f"{config.device!r}, local_hostname {config.local_hostname!r}); see its log")
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"{name}-watcher", daemon=True)
        self._watcher.start()

    # ---------------------------------------------------------------------------------- Tier API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        if not keys:
            return []
        with self._session() as client:
            if client is None:
                return [False] * len(keys)
            codes = client.batch_is_exist(object_names(keys))
            self._check_master(codes)
            return [c == 1 for c in codes]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        ok = [False] * len(keys)
        if not keys:
            return ok
        with self._session() as client:
            if client is None:
                self._count("get_skipped_down", len(keys))
                return ok
            sizes = [page_nbytes(p) for p in pages]
            codes = self._transfer(client, "get", keys, pages, sizes, None)
            retry = [i for i, c in enumerate(codes) if c == LEASE_EXPIRED]
            if retry and self._up:
                again = self._transfer(client, "get", [keys[i] for i in retry],
                                       [pages[i] for i in retry], [sizes[i] for i in retry], None)
                for i, c in zip(retry, again):
                    codes[i] = c
            got = 0
            for i, c in enumerate(codes):
                ok[i] = c == sizes[i]
                got += sizes[i] if ok[i] else 0
            with self._lock:
                self._counts["gets"] += sum(ok)
                self._counts["get_bytes"] += got
                self._counts["get_misses"] += sum(c in (NOT_FOUND, REPLICA_NOT_READY) for c in codes)
                self._counts["get_failed"] += sum(
                    not good and c not in (NOT_FOUND, REPLICA_NOT_READY) for good, c in zip(ok, codes))
            return ok

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView],
                 soft_pin: Sequence[bool] | None = None) -> list[bool]:
        """Store pages; ``soft_pin[i]`` writes page ``i`` soft-pinned for ``soft_pin_ttl`` (pages of
        pinned prefixes: the master evicts them last). Pin state is fixed when a page is first
        written, as Mooncake objects are immutable."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        ok = [False] * len(keys)
        if not keys:
            return ok
        with self._session() as client:
            if client is None:
                self._count("put_skipped_down", len(keys))
                return ok
            pin = [bool(p) and self.config.soft_pin_ttl > 0 for p in soft_pin] if soft_pin \
                else [False] * len(keys)
            for pinned, cfg in ((False, self._plain_cfg), (True, self._pin_cfg)):
                idx = [i for i in range(len(keys)) if pin[i] == pinned]
                if idx:
                    self._put_with_backoff(client, keys, pages, idx, cfg, ok)
            return ok

    def remove(self, keys: Sequence[PageKey]) -> int:
        if not keys:
            return 0
        with self._session() as client:
            if client is None:
                return 0
            codes = client.batch_remove(object_names(keys), True)
            self._check_master(codes)
            removed = sum(c == OK for c in codes)
            sizes = self._removed_sizes(removed)
            with self._lock:
                self._written_pages = max(0, self._written_pages - removed)
                self._written_bytes = max(0, self._written_bytes - sizes)
            return removed

    def usage(self) -> TierUsage:
        """Capacity is the segment this process contributes; used/pages count what this client
        wrote minus what it removed (the master's own evictions are not visible to a client)."""
        with self._lock:
            self._raise_if_closed()
            cap = self.config.segment_size
            return TierUsage(cap, min(cap, self._written_bytes), self._written_pages)

    def page_size_of(self, key: PageKey) -> int | None:
        with self._session() as client:
            if client is None:
                return None
            n = client.get_size(object_name(key))
            self._check_master([n])
            return n if n > 0 else None

    def register_memory(self, ptr: int, nbytes: int) -> None:
        """Register host memory (SGLang's host KV pool) with the transfer engine once, so pages in
        it move without a copy. Registration survives reconnects (it is replayed)."""
        with self._lock:
            self._raise_if_closed()
            if any(s <= ptr and ptr + nbytes <= e for s, e in self._ranges):
                return
            if self._client is not None:
                rc = self._client.register_buffer(ptr, nbytes)
                if rc != OK:
                    logger.warning("%s: register_buffer(%#x, %d) failed with %d; pages there are "
                                   "staged", self.name, ptr, nbytes, rc)
                    return
            # Copy on write: readers bisect the list without the lock.
            self._ranges = sorted([*self._ranges, (ptr, ptr + nbytes)])

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {**self._counts, "connected": float(self._up),
                    "registered_bytes": float(sum(e - s for s, e in self._ranges))}

    def clear(self) -> None:
        """Drop every page this package wrote to the cluster (keys under ``msgl/``), from every
        node: the tier is shared, as SGLang's own Mooncake backend's ``clear`` is."""
        with self._session() as client:
            if client is not None:
                self._check_master([client.remove_by_regex(f"^{KEY_PREFIX}", True)])
        with self._lock:
            self._written_pages = self._written_bytes = 0

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._up = False
        self._stop.set()
        self._watcher.join()
        with self._lock:
            while self._inflight:
                self._idle.wait()
            client, self._client = self._client, None
        if client is not None:
            client.close()  # unmounts our segment: 2-7 s, holding the GIL
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    # ------------------------------------------------------------------------------- transfers

    def _put_with_backoff(self, client: Any, keys: Sequence[PageKey], pages: Sequence[PageView],
                          idx: list[int], cfg: Any, ok: list[bool]) -> None:
        sizes = {i: page_nbytes(pages[i]) for i in idx}
        deadline = time.monotonic() + self.config.put_retry_window
        delay = 0.005
        while True:
            codes = self._transfer(client, "put", [keys[i] for i in idx], [pages[i] for i in idx],
                                   [sizes[i] for i in idx], cfg)
            full = []
            for i, c in zip(idx, codes):
                if c in (OK, ALREADY_EXISTS):
                    ok[i] = True
                elif c == NO_SPACE:
                    full.append(i)
            written = [i for i, c in zip(idx, codes) if c in (OK, ALREADY_EXISTS)]
            failed = sum(c not in (OK, ALREADY_EXISTS, NO_SPACE) for c in codes)
            with self._lock:
                self._counts["puts"] += len(written)
                self._counts["put_bytes"] += sum(sizes[i] for i in written)
                self._counts["put_failed"] += failed
                self._written_pages += len(written)
                self._written_bytes += sum(sizes[i] for i in written)
            # Eviction runs in the master every 10 ms once a put found no space; give it time.
            if not full or not self._up or time.monotonic() + delay > deadline:
                self._count("put_failed_no_space", len(full))
                return
            self._count("put_no_space_retries", len(full))
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
            idx = full

    def _transfer(self, client: Any, op: str, keys: Sequence[PageKey], pages: Sequence[PageView],
                  sizes: list[int], cfg: Any) -> list[int]:
        """One batched put or get; a code per page (for a get: bytes read, or an error code)."""
        codes = [0] * len(keys)
        direct, staged = [], []
        for i, page in enumerate(pages):
            ptrs = self._registered_ptrs(page)
            (direct if ptrs is not None else staged).append((i, ptrs))
        if direct:
            names = object_names([keys[i] for i, _ in direct])
            ptr_lists = [p for _, p in direct]
            seg_sizes = [[s.nbytes for s in pages[i]] for i, _ in direct]
            res = self._call(client, op, names, ptr_lists, seg_sizes, cfg)
            for (i, _), c in zip(direct, res):
                codes[i] = c
            self._count("zero_copy_pages", len(direct))
        if staged:
            self._count("staged_pages", len(staged))
            with self._staging_lock:
                for i, c in self._staged(client, op, keys, pages, sizes, [i for i, _ in staged], cfg):
                    codes[i] = c
        self._check_master(codes)
        return codes

    def _call(self, client: Any, op: str, names: list[str], ptr_lists: list[list[int]],
              seg_sizes: list[list[int]], cfg: Any) -> list[int]:
        if all(len(p) == 1 for p in ptr_lists):
            ptrs, sizes = [p[0] for p in ptr_lists], [s[0] for s in seg_sizes]
            if op == "put":
                return list(client.batch_put_from(names, ptrs, sizes, cfg))
            return list(client.batch_get_into(names, ptrs, sizes))
        if op == "put":
            return list(client.batch_put_from_multi_buffers(names, ptr_lists, seg_sizes, cfg))
        return list(client.batch_get_into_multi_buffers(names, ptr_lists, seg_sizes))

    def _staged(self, client: Any, op: str, keys: Sequence[PageKey], pages: Sequence[PageView],
                sizes: list[int], idx: list[int], cfg: Any) -> Iterator[tuple[int, int]]:
        """Pages outside registered memory, packed into the staging buffer a buffer-full at a time
        (caller holds ``_staging_lock``)."""
        cap = self.config.buffer_size
        if not self._ensure_staging(client):
            for i in idx:
                yield i, INVALID_PARAMS
            return
        view = memoryview(self._staging)  # type: ignore[arg-type]
        batch: list[tuple[int, int]] = []  # (page index, offset)
        used = 0

        def flush() -> list[tuple[int, int]]:
            names = [object_name(keys[i]) for i, _ in batch]
            ptrs = [[self._staging_ptr + off] for _, off in batch]
            res = self._call(client, op, names, ptrs, [[sizes[i]] for i, _ in batch], cfg)
            out = []
            for (i, off), c in zip(batch, res):
                if op == "get" and c == sizes[i]:
                    scatter(view[off:off + sizes[i]], pages[i])
                out.append((i, c))
            return out

        try:
            for i in idx:
                if sizes[i] > cap:
                    self._count("too_large", 1)
                    yield i, _TOO_LARGE
                    continue
                if used + sizes[i] > cap:
                    yield from flush()
                    batch, used = [], 0
                if op == "put":
                    gather(pages[i], view[used:used + sizes[i]])
                batch.append((i, used))
                used += sizes[i]
            if batch:
                yield from flush()
        finally:
            view.release()

    def _ensure_staging(self, client: Any) -> bool:
        # Allocated on first use: with SGLang's host pool registered it is never needed.
        if self._staging is None:
            buf = mmap.mmap(-1, self.config.buffer_size)
            arr = np.frombuffer(buf, dtype=np.uint8)
            arr[::4096] = 0  # pre-fault: a first touch per 4 KiB page costs ~11 µs on a VM
            self._staging, self._staging_ptr = buf, arr.ctypes.data
            del arr
            if client.register_buffer(self._staging_ptr, self.config.buffer_size) != OK:
                logger.warning("%s: cannot register the %d-byte staging buffer", self.name,
                               self.config.buffer_size)
                self._staging.close()
                self._staging = None
                return False
        return True

    def _registered_ptrs(self, page: PageView) -> list[int] | None:
        ranges = self._ranges
        if not ranges:
            return None
        ptrs = []
        for seg in page:
            p = _address(seg)
            j = bisect_right(ranges, (p, 1 << 64)) - 1
            if j < 0 or p + seg.nbytes > ranges[j][1]:
                return None
            ptrs.append(p)
        return ptrs

    def _replicate_config(self, pin: bool) -> Any:
        cfg = self._ms.ReplicateConfig()
        cfg.replica_num = self.config.replicas
        if pin:
            cfg.soft_pin_action = self._ms.SoftPinAction.ENABLE
            cfg.soft_pin_ttl_ms = int(self.config.soft_pin_ttl * 1000)
        return cfg

    # ---------------------------------------------------------------------- link to the master

    @contextmanager
    def _session(self) -> Iterator[Any]:
        """The client to use, or ``None`` while the master is down (the caller answers misses)."""
        with self._lock:
            self._raise_if_closed()
            client = self._client if self._up else None
            if client is not None:
                self._inflight += 1
        if client is None:
            yield None
            return
        try:
            yield client
        finally:
            with self._lock:
                self._inflight -= 1
                if not self._inflight:
                    self._idle.notify_all()

    def _check_master(self, codes: Sequence[int]) -> None:
        lost = MASTER_LOST.intersection(codes)  # C speed: this runs on every batch
        if lost:
            self._mark_down(f"Mooncake returned {min(lost)}")

    def _mark_down(self, why: str) -> None:
        with self._lock:
            if not self._up:
                return
            self._up = False
            self._reachable_since = None
            self._counts["master_lost"] += 1
        logger.warning("%s: master %s unreachable (%s); answering misses until it is back",
                       self.name, self.config.master, why)

    def _connect(self) -> int:
        """A fresh client: setup (outside the lock: ~4.5 s against a dead master), then replay
        registrations and install it. Returns setup's code (0: connected)."""
        c = self.config
        client = self._ms.MooncakeDistributedStore()
        self._count("setups", 1)
        rc = client.setup(c.local_hostname, c.metadata_server, c.segment_size, _MOONCAKE_LOCAL_BUFFER,
                          c.protocol, c.device, c.master)
        if rc != OK:
            logger.warning("%s: setup against master %s (metadata %s, protocol %s) failed with %d; "
                           "retrying every %.1fs", self.name, c.master, c.metadata_server, c.protocol,
                           rc, c.reconnect_after)
            client.close()
            return rc
        with self._lock:
            if self._closed:
                client.close()
                return OK
            for start, end in self._ranges:
                client.register_buffer(start, end - start)
            if self._staging is not None:
                client.register_buffer(self._staging_ptr, c.buffer_size)
            self._client = client
            self._up = True
        return OK

    def _watch(self) -> None:
        """Notice a lost master before a caller blocks on it (an RPC to a dead master waits
        ~4.4 s), and bring the link back: first give the client's own reconnect a chance, then,
        ``reconnect_after`` after the master's endpoint answers again, a fresh setup (retried with
        doubling back-off; an HA client is left to follow the new leader). Mooncake's ``setup``
        and ``close`` hold the GIL for their whole run (4.5 s against a dead master, 2-7 s),
        freezing every thread of the process, so neither is tried while the endpoint refuses
        connections."""
        last_setup = last_probe = time.monotonic()
        backoff = self.config.reconnect_after
        while not self._stop.wait(_WATCH_INTERVAL):
            now = time.monotonic()
            if self._up:
                backoff = self.config.reconnect_after
                probe = self._direct and now - last_probe >= _UP_PROBE_INTERVAL
                last_probe = now if probe else last_probe
                if self._client.health_check() == 2 or (probe and _reachable(self._probe_endpoints) is False):
                    self._mark_down("health check")
                continue
            if _reachable(self._probe_endpoints) is False:
                self._reachable_since = None
                continue
            if self._reachable_since is None:
                self._reachable_since = now
            client = self._client
            if client is not None and client.health_check() == 0 \
                    and all(c >= 0 for c in client.batch_is_exist([_PROBE_KEY])):
                with self._lock:
                    if not self._closed:
                        self._up = True
                        self._counts["reconnects"] += 1
                logger.warning("%s: master %s is back", self.name, self.config.master)
                continue
            # An HA client follows the new leader by itself (~10 s); closing it after a fail-over
            # was seen to take 40 s with the GIL held, so it is only replaced for a plain master.
            replaceable = client is None or self._direct
            if replaceable and now - max(self._reachable_since, last_setup) >= backoff:
                self._fresh_setup()
                last_setup = time.monotonic()
                backoff = min(backoff * 2, _MAX_SETUP_BACKOFF)

    def _fresh_setup(self) -> None:
        with self._lock:
            while self._inflight:  # calls that started before the master was lost
                self._idle.wait()
            if self._closed:
                return
            old, self._client = self._client, None
        if old is not None:
            old.close()
        if self._connect() == OK and self._up:
            self._count("reconnects", 1)
            logger.warning("%s: reconnected to master %s with a fresh client", self.name,
                           self.config.master)

    # --------------------------------------------------------------------------------- helpers

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise TierClosed(f"tier {self.name} is closed")

    def _count(self, name: str, n: int) -> None:
        if n:
            with self._lock:
                self._counts[name] += n

    def _removed_sizes(self, removed: int) -> int:
        # Sizes of removed pages are unknown without an extra RPC; assume the mean written size.
        with self._lock:
            mean = self._written_bytes // self._written_pages if self._written_pages else 0
        return removed * mean
