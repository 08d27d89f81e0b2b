"""``MooncakeStoreTier``: the real Mooncake Store (``mooncake.store.MooncakeDistributedStore``) as a
remote tier, shared by every node of a cluster and evicting on its own (in the master).

What lives here: the tier, the zero-copy path over registered memory with a registered staging
buffer for pages outside it, and the mapping of Mooncake's return codes to our semantics. The link to
the master (up/down, the watcher thread that notices a lost master and reconnects) is
``mooncake_link.MasterLink``. Return codes:

    0                         put acknowledged. Values are immutable and the client answers 0 for
                              a re-put too (keeping the first), so ``put_from`` asks
                              ``batch_is_exist`` first, as SGLang's own backend does: a page the
                              cluster holds is acknowledged without a put and not counted as written
    -705 ALREADY_EXISTS       acknowledged, not counted as written (another node won the race)
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
import threading
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import envs
from ..api import (
    PageKey,
    PageView,
    PutResult,
    Tier,
    TierCapabilities,
    TierKind,
    TierReport,
    TierUsage,
    page_nbytes,
)
from ..buffers import gather, scatter
from ..config import MooncakeStoreTierConfig
from ..errors import TierError
from ..tally import Tally
from .mooncake_link import OK, RPC_TIMEOUT_MS, MasterLink, MasterLinkReport

logger = logging.getLogger(__name__)

KEY_PREFIX = "msgl/"  # every object this package writes; ``clear`` drops exactly these
NO_SPACE, INVALID_PARAMS = -200, -600
REPLICA_NOT_READY, NOT_FOUND, ALREADY_EXISTS, LEASE_EXPIRED = -703, -704, -705, -707
_TOO_LARGE = -10_000  # ours: a page outside registered memory larger than the staging buffer
_PROBE_KEY = KEY_PREFIX + "probe"


@dataclass(frozen=True)
class MooncakeStoreTierStats:
    """The Mooncake Store tier's own counts (``stats()``, beside its link's): pages unless named
    bytes."""

    puts: int = 0  # written by this client
    put_bytes: int = 0
    put_already_present: int = 0  # the cluster held them already: acknowledged, not written
    put_no_space_retries: int = 0  # retried after the master found no space
    put_failed_no_space: int = 0  # still no space when the retry window closed
    put_failed: int = 0  # any other error code
    put_skipped_down: int = 0  # offered while the master was down
    get_hits: int = 0
    get_bytes: int = 0
    get_misses: int = 0
    get_failed: int = 0  # neither read nor a plain miss
    get_skipped_down: int = 0  # asked while the master was down
    zero_copy_pages: int = 0  # moved straight from or into registered memory
    staged_pages: int = 0  # copied through the staging buffer
    too_large: int = 0  # outside registered memory and larger than the staging buffer


@dataclass(frozen=True)
class MooncakeStoreTierReport(TierReport):
    """The Mooncake Store tier's ``stats()``: its counts, its link's report, its registered memory."""

    counts: MooncakeStoreTierStats
    link: MasterLinkReport
    registered_bytes: int  # host memory registered with the transfer engine (zero-copy reach)


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
        envs.MC_STORE_CLIENT_SETUP_RETRIES.set_default(1)
        # A call to a stopped (not dead) master waits out the client's RPC timeout, 30 s by
        # default, on a storage thread of SGLang; the GIL is released meanwhile. 3 s is far above
        # any answer of a live master (milliseconds) and bounds the calls already in flight when
        # it stops; the watcher's probe marks it down within about a second for every later one.
        envs.MC_RPC_TIMEOUT_MS.set_default(RPC_TIMEOUT_MS)
        self._lock = threading.Lock()
        self._ranges: list[tuple[int, int]] = []  # registered (start, end), sorted by start
        self._staging: mmap.mmap | None = None
        self._staging_ptr = 0
        self._staging_lock = threading.Lock()
        self._written_bytes = 0
        self._written_pages = 0
        self._counters = Tally(MooncakeStoreTierStats)
        self._plain_cfg = self._replicate_config(pin=False)
        self._pin_cfg = self._replicate_config(pin=True)
        self._link = MasterLink(name, config, self._ms, self._replay_registrations, _PROBE_KEY)
        if self._link.start() == INVALID_PARAMS:
            self._link.close()
            raise TierError(f"{name}: Mooncake rejected the setup parameters (segment_size "
                            f"{config.segment_size}, protocol {config.protocol!r}, device "
                            f"{config.device!r}, local_hostname {config.local_hostname!r}); see its log")

    # ---------------------------------------------------------------------------------- Tier API

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        if not keys:
            return []
        with self._link.session() as client:
            if client is None:
                return [False] * len(keys)
            codes = client.batch_is_exist(object_names(keys))
            self._link.check(codes)
            return [c == 1 for c in codes]

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} destination pages")
        ok = [False] * len(keys)
        if not keys:
            return ok
        with self._link.session() as client:
            if client is None:
                self._counters.add(get_skipped_down=len(keys))
                return ok
            sizes = [page_nbytes(p) for p in pages]
            codes = self._transfer(client, "get", keys, pages, sizes, None)
            retry = [i for i, c in enumerate(codes) if c == LEASE_EXPIRED]
            if retry and self._link.up:
                again = self._transfer(client, "get", [keys[i] for i in retry],
                                       [pages[i] for i in retry], [sizes[i] for i in retry], None)
                for i, c in zip(retry, again):
                    codes[i] = c
            got = 0
            for i, c in enumerate(codes):
                ok[i] = c == sizes[i]
                got += sizes[i] if ok[i] else 0
            self._counters.add(
                get_hits=sum(ok), get_bytes=got,
                get_misses=sum(c in (NOT_FOUND, REPLICA_NOT_READY) for c in codes),
                get_failed=sum(not good and c not in (NOT_FOUND, REPLICA_NOT_READY)
                               for good, c in zip(ok, codes)))
            return ok

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *,
                 soft_pin: Sequence[bool] | None = None) -> PutResult:
        """Store pages; ``soft_pin[i]`` writes page ``i`` soft-pinned for ``soft_pin_ttl`` (pages of
        pinned prefixes: the master evicts them last). Pin state is fixed when a page is first
        written, as Mooncake objects are immutable. Pages the cluster already holds are
        acknowledged without a put (``PutResult.present``; counted as ``put_already_present``)."""
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys but {len(pages)} source pages")
        ok, present = [False] * len(keys), [False] * len(keys)
        if not keys:
            return PutResult(tuple(ok), tuple(present))
        with self._link.session() as client:
            if client is None:
                self._counters.add(put_skipped_down=len(keys))
                return PutResult(tuple(ok), tuple(present))
            # SGLang hands back pages it backed up before: about half the puts of a serving run.
            codes = client.batch_is_exist(object_names(keys))
            self._link.check(codes)
            if not self._link.up:
                self._counters.add(put_skipped_down=len(keys))
                return PutResult(tuple(ok), tuple(present))
            for i, c in enumerate(codes):
                ok[i] = present[i] = c == 1
            self._counters.add(put_already_present=sum(present))
            pin = ([bool(p) and self.config.soft_pin_ttl > 0 for p in soft_pin] if soft_pin
                else [False] * len(keys))
            for pinned, cfg in ((False, self._plain_cfg), (True, self._pin_cfg)):
                idx = [i for i in range(len(keys)) if pin[i] == pinned and not present[i]]
                if idx:
                    self._put_with_backoff(client, keys, pages, idx, cfg, ok, present)
            return PutResult(tuple(ok), tuple(present))

    def remove(self, keys: Sequence[PageKey]) -> int:
        if not keys:
            return 0
        with self._link.session() as client:
            if client is None:
                return 0
            codes = client.batch_remove(object_names(keys), True)
            self._link.check(codes)
            removed = sum(c == OK for c in codes)
            sizes = self._removed_sizes(removed)
            with self._lock:
                self._written_pages = max(0, self._written_pages - removed)
                self._written_bytes = max(0, self._written_bytes - sizes)
            return removed

    def usage(self) -> TierUsage:
        """Capacity is the segment this process contributes; used/pages count what this client
        wrote minus what it removed (the master's own evictions are not visible to a client)."""
        with self._link.locked_client(), self._lock:
            cap = self.config.segment_size
            return TierUsage(cap, min(cap, self._written_bytes), self._written_pages)

    def page_size_of(self, key: PageKey) -> int | None:
        with self._link.session() as client:
            if client is None:
                return None
            n = client.get_size(object_name(key))
            self._link.check([n])
            return n if n > 0 else None

    def reachable(self) -> bool:
        return self._link.up

    def register_memory(self, ptr: int, nbytes: int) -> None:
        """Register host memory (SGLang's host KV pool) with the transfer engine once, so pages in
        it move without a copy. Registration survives reconnects (it is replayed)."""
        with self._link.locked_client() as client:
            if any(s <= ptr and ptr + nbytes <= e for s, e in self._ranges):
                return
            if client is not None:
                rc = client.register_buffer(ptr, nbytes)
                if rc != OK:
                    logger.warning("%s: register_buffer(%#x, %d) failed with %d; pages there are "
                                   "staged", self.name, ptr, nbytes, rc)
                    return
            # Copy on write: readers bisect the list without the lock.
            self._ranges = sorted([*self._ranges, (ptr, ptr + nbytes)])

    def stats(self) -> MooncakeStoreTierReport:
        return MooncakeStoreTierReport(self._counters.snapshot(), self._link.stats(),
                                       sum(e - s for s, e in self._ranges))

    def clear(self) -> None:
        """Drop every page this package wrote to the cluster (keys under ``msgl/``), from every
        node: the tier is shared, as SGLang's own Mooncake backend's ``clear`` is."""
        with self._link.session() as client:
            if client is not None:
                self._link.check([client.remove_by_regex(f"^{KEY_PREFIX}", True)])
        with self._lock:
            self._written_pages = self._written_bytes = 0

    def close(self) -> None:
        self._link.close()
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    # ------------------------------------------------------------------------------- transfers

    def _put_with_backoff(self, client: Any, keys: Sequence[PageKey], pages: Sequence[PageView],
                          idx: list[int], cfg: Any, ok: list[bool], present: list[bool]) -> None:
        sizes = {i: page_nbytes(pages[i]) for i in idx}
        deadline = time.monotonic() + self.config.put_retry_window
        delay = 0.005
        while True:
            codes = self._transfer(client, "put", [keys[i] for i in idx], [pages[i] for i in idx],
                                   [sizes[i] for i in idx], cfg)
            full, written = [], []
            for i, c in zip(idx, codes):
                if c == OK:
                    ok[i] = True
                    written.append(i)
                elif c == ALREADY_EXISTS:  # written meanwhile by another node: not ours to count
                    ok[i] = present[i] = True
                elif c == NO_SPACE:
                    full.append(i)
            nwritten = sum(sizes[i] for i in written)
            self._counters.add(puts=len(written), put_bytes=nwritten,
                               put_already_present=sum(c == ALREADY_EXISTS for c in codes),
                               put_failed=sum(c not in (OK, ALREADY_EXISTS, NO_SPACE) for c in codes))
            with self._lock:
                self._written_pages += len(written)
                self._written_bytes += nwritten
            # Eviction runs in the master every 10 ms once a put found no space; give it time.
            if not full or not self._link.up or time.monotonic() + delay > deadline:
                self._counters.add(put_failed_no_space=len(full))
                return
            self._counters.add(put_no_space_retries=len(full))
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
            self._counters.add(zero_copy_pages=len(direct))
        if staged:
            self._counters.add(staged_pages=len(staged))
            with self._staging_lock:
                for i, c in self._staged(client, op, keys, pages, sizes, [i for i, _ in staged], cfg):
                    codes[i] = c
        self._link.check(codes)
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
                    self._counters.add(too_large=1)
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

    def _replay_registrations(self, client: Any) -> None:
        """A fresh client (the link calls this under its lock): register what the old one had."""
        for start, end in self._ranges:
            client.register_buffer(start, end - start)
        if self._staging is not None:
            client.register_buffer(self._staging_ptr, self.config.buffer_size)

    # --------------------------------------------------------------------------------- helpers

    def _removed_sizes(self, removed: int) -> int:
        # Sizes of removed pages are unknown without an extra RPC; assume the mean written size.
        with self._lock:
            mean = self._written_bytes // self._written_pages if self._written_pages else 0
        return removed * mean
