"""The remote tier: pages in one or more ``mooncake-sgl pool`` servers.

Placement. Each key goes to the endpoint with the highest rendezvous score
``xxh64(key, seed=endpoint)`` among the endpoints believed alive. Adding or losing an endpoint
moves only that endpoint's share of keys; no table is kept or exchanged.

Failure. A call that fails against an endpoint (refused, reset, timed out, bad frame) turns into
misses / not-stored for that endpoint's keys, and the endpoint is skipped for ``retry_after``;
afterwards the next call tries it again, so a restarted server is used again without any action.
While an endpoint is skipped, its keys go to the next-ranked live endpoint (better hit rate during
an outage; those copies are orphaned when it returns and age out by eviction). Nothing here raises
for an unreachable pool — SGLang sees misses — except ``TierClosed`` after ``close()``. A stopped
server (it accepts, never answers) is found out within ``connect_timeout`` / ``first_byte_timeout``
rather than the full ``timeout``, once, and then skipped like a dead one.

Tenancy: ``tenant`` and ``secret`` name this deployment's tenant on a multi-tenant pool; the
server then shows it only that tenant's pages (docs/pool.md, "Tenants and trust").

Replication and high availability are out of scope (the Mooncake Store tier covers them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import xxhash

from ..api import PageKey, PageView, PutResult, Tier, TierCapabilities, TierKind, TierReport, TierUsage
from ..config import PoolTierConfig
from ..errors import MooncakeSglError, TierClosed
from ..tally import Tally
from ..transfer.client import PoolClient

log = logging.getLogger("mooncake_sgl.tiers.pool")
T = TypeVar("T")
_USAGE_TTL = 0.5  # seconds a usage() answer is reused; arbitrary, keeps it off the hot path


@dataclass(frozen=True)
class PoolTierStats:
    """The pool tier's own counts (its ``stats()``), owned by the client side: the pool server
    counts its own under its own names (``pool/``)."""

    gets: int = 0  # pages asked to be read
    get_hits: int = 0  # of those, read
    puts: int = 0  # pages offered
    put_ok: int = 0  # of those, stored (or already there)
    put_already_present: int = 0  # of those, already there
    endpoint_failures: int = 0  # calls to a pool server that failed (it is skipped a while)
    skipped_keys: int = 0  # pages whose pool server was skipped as down


@dataclass(frozen=True)
class PoolTierReport(TierReport):
    """The pool tier's ``stats()``: its counts and its pool servers now."""

    counts: PoolTierStats
    endpoints: int  # pool servers configured
    endpoints_live: int  # of those, not skipped as down
    shm_endpoints: int  # of those, reached through shared memory (same host)


class PoolTier(Tier):
    name = "pool"
    kind = TierKind.REMOTE
    capabilities = TierCapabilities(shared=True, self_evicting=True)

    def __init__(self, config: PoolTierConfig):
        self._config = config
        self._clients = [PoolClient(ep, transport=config.transport, secret=config.secret,
                                    tenant=config.tenant, connections=config.connections,
                                    timeout=config.timeout, connect_timeout=config.connect_timeout,
                                    first_byte_timeout=config.first_byte_timeout)
                         for ep in config.endpoints]
        self._seeds = [xxhash.xxh64_intdigest(ep.encode()) for ep in config.endpoints]
        self._dead_until = [0.0] * len(self._clients)
        self._lock = threading.Lock()
        self._closed = False
        self._usage: tuple[float, TierUsage] | None = None
        self._pool = ThreadPoolExecutor(len(self._clients), "pool-tier") if len(self._clients) > 1 else None
        self._counters = Tally(PoolTierStats)

    def reachable(self) -> bool:
        return bool(self._live())

    # ---------------------------------------------------------------------------------- routing

    def _live(self) -> list[int]:
        now = time.monotonic()
        return [i for i, t in enumerate(self._dead_until) if t <= now]

    def _route(self, keys: Sequence[PageKey]) -> dict[int, list[int]]:
        """Endpoint index -> positions of the keys it owns now; keys with no live endpoint are
        left out (they read as misses)."""
        if self._closed:
            raise TierClosed("pool tier is closed")
        live = self._live()
        groups: dict[int, list[int]] = {}
        if not live:
            self._counters.add(skipped_keys=len(keys))
            return groups
        if len(live) == 1:
            groups[live[0]] = list(range(len(keys)))
            return groups
        seeds = [(self._seeds[i], i) for i in live]
        h = xxhash.xxh64_intdigest
        for pos, key in enumerate(keys):
            best = max(seeds, key=lambda s: h(key, seed=s[0]))[1]
            groups.setdefault(best, []).append(pos)
        return groups

    def _failed(self, i: int, e: Exception) -> None:
        with self._lock:
            was_live = self._dead_until[i] <= time.monotonic()
            self._dead_until[i] = time.monotonic() + self._config.retry_after
            self._counters.add(endpoint_failures=1)
        if was_live:
            log.warning("pool endpoint %s failed, treating its pages as misses for %.1fs: %s",
                        self._clients[i].endpoint, self._config.retry_after, e)

    def _fan_out(self, keys: Sequence[PageKey], miss: T,
                 call: Callable[[PoolClient, list[int]], list[T]]) -> list[T]:
        """Run ``call`` per endpoint on its keys; an endpoint's failure is ``miss`` for its keys."""
        out: list[T] = [miss] * len(keys)
        groups = self._route(keys)

        def one(i: int, positions: list[int]) -> None:
            try:
                res = call(self._clients[i], positions)
            except TierClosed:
                raise
            except MooncakeSglError as e:
                self._failed(i, e)
                return
            except Exception as e:  # a bug, not the network: still a miss for SGLang, but loud
                log.exception("pool endpoint %s: unexpected error", self._clients[i].endpoint)
                self._failed(i, e)
                return
            for pos, r in zip(positions, res):
                out[pos] = r

        if self._pool is None or len(groups) == 1:
            for i, positions in groups.items():
                one(i, positions)
        else:
            for f in [self._pool.submit(one, i, p) for i, p in groups.items()]:
                f.result()
        return out

    # ------------------------------------------------------------------------------------- Tier

    def contains(self, keys: Sequence[PageKey]) -> list[bool]:
        return self._fan_out(keys, False, lambda c, ps: c.exists_batch([keys[p] for p in ps]))

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        out = self._fan_out(keys, False, lambda c, ps: c.get_batch([keys[p] for p in ps],
                                                                   [pages[p] for p in ps]))
        self._counters.add(gets=len(keys), get_hits=sum(out))
        return out

    def put_from(self, keys: Sequence[PageKey], pages: Sequence[PageView], *,
                 soft_pin: Sequence[bool] | None = None) -> PutResult:
        def put(c: PoolClient, ps: list[int]) -> list[tuple[bool, bool]]:
            res = c.put_batch([keys[p] for p in ps], [pages[p] for p in ps])
            return list(zip(res.ok, res.present))

        answers = self._fan_out(keys, (False, False), put)
        out = PutResult(tuple(a[0] for a in answers), tuple(a[1] for a in answers))
        self._counters.add(puts=len(keys), put_ok=sum(out.ok), put_already_present=sum(out.present))
        self._usage = None
        return out

    def remove(self, keys: Sequence[PageKey]) -> int:
        counts = self._fan_out(keys, 0, lambda c, ps: self._remove_one(c, [keys[p] for p in ps]))
        self._usage = None
        return sum(counts)

    @staticmethod
    def _remove_one(client: PoolClient, keys: list[PageKey]) -> list[int]:
        # Per-key counts are not on the wire; report the endpoint's total on its first key.
        n = client.remove(keys)
        return [n] + [0] * (len(keys) - 1)

    def _each_live(self, fn: Callable[[PoolClient], T]) -> list[T]:
        if self._closed:
            raise TierClosed("pool tier is closed")
        out = []
        for i in self._live():
            try:
                out.append(fn(self._clients[i]))
            except MooncakeSglError as e:
                self._failed(i, e)
        return out

    def usage(self) -> TierUsage:
        cached = self._usage
        now = time.monotonic()
        if cached is not None and now - cached[0] < _USAGE_TTL:
            return cached[1]
        stats = self._each_live(lambda c: c.stats())
        u = TierUsage(int(sum(s["capacity_bytes"] for s in stats)),
                      int(sum(s["used_bytes"] for s in stats)), int(sum(s["pages"] for s in stats)))
        self._usage = (now, u)
        return u

    def clear(self) -> None:
        self._each_live(lambda c: c.clear())
        self._usage = None

    def stats(self) -> PoolTierReport:
        return PoolTierReport(self._counters.snapshot(), len(self._clients), len(self._live()),
                              sum(c.mode == "shm" for c in self._clients))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for c in self._clients:
            c.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
