"""``TierCalls``: every call the store makes into a tier, and the store's one error boundary.

A tier that fails a call as a whole (it raises: a lost master, a closed connection, a broken disk)
yields misses here, each in its call's own shape: ``False`` per key for ``get`` and ``contains``,
``PutResult.missed`` for ``put``, ``None`` for the rest. The failure is logged
through one ``FailureLog`` per store, keyed by tier and operation, so a dead tier writes one line
per half minute to SGLang's log, not one per call. Nothing above this object sees a tier's
exception; the SGLang adapter's own boundary (``hicache/backend.py``) only catches what the store
itself raises (bad arguments, bugs) and logs it through the same kind of log.

The metrics hook ``observe_latency(tier, what, seconds)`` (``metrics.attach``, only under SGLang's
``--enable-metrics``) is called after every tier call; ``None`` costs nothing.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..api import PageKey, PageView, PutResult, Tier
from ..failure_log import FailureLog

logger = logging.getLogger(__name__)

# Calls answered per key: a failed one is a miss for every key of the batch, in the call's shape.
_BATCH_MISSES: dict[str, Callable[[int], Any]] = {
    "get": lambda n: [False] * n,
    "get_cached": lambda n: [False] * n,
    "contains": lambda n: [False] * n,
    "put": PutResult.missed,
}


def _unique_names(tiers: Sequence[Tier]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for tier in tiers:
        n = seen.get(tier.name, 0)
        seen[tier.name] = n + 1
        out.append(tier.name if n == 0 else f"{tier.name}.{n}")
    return out


class TierCalls:
    """The store's tiers (fastest first), called only through ``call``.

    Args:
        tiers: the tiers; ``close`` closes them.
        failures: where failed calls are reported (a rate-limited log).
    """

    def __init__(self, tiers: Sequence[Tier], failures: FailureLog | None = None) -> None:
        self.tiers = list(tiers)
        self.names = _unique_names(self.tiers)
        # Managed: the store tracks residency and makes room; a self-evicting tier does both itself.
        self.managed = [not t.capabilities.self_evicting for t in self.tiers]
        self.failures = failures or FailureLog(logger)
        self.observe_latency: Callable[[Tier, str, float], None] | None = None

    def __len__(self) -> int:
        return len(self.tiers)

    def call(self, t: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)``, a call into tier ``t``; a failure is a miss (see the module docstring)."""
        observe = self.observe_latency
        start = time.perf_counter() if observe is not None else 0.0
        try:
            return fn(*args)
        except Exception as e:
            self.failures.report(f"tier {self.names[t]}: {what}", e)
            miss = _BATCH_MISSES.get(what)
            return None if miss is None else miss(len(args[0]))
        finally:
            if observe is not None:
                observe(self.tiers[t], what, time.perf_counter() - start)

    def contains(self, t: int, keys: Sequence[PageKey]) -> list[bool]:
        return self.call(t, "contains", self.tiers[t].contains, keys)

    def put(self, t: int, keys: Sequence[PageKey], pages: Sequence[PageView],
            soft_pin: Sequence[bool] | None = None) -> PutResult:
        """``put_from`` into tier ``t`` with the hints every tier takes; a failed call is
        ``PutResult.missed`` (nothing written, nothing present)."""
        put = functools.partial(self.tiers[t].put_from, soft_pin=soft_pin)
        return self.call(t, "put", put, keys, pages)

    def sizes(self, t: int, keys: Sequence[PageKey]) -> list[int | None]:
        """Stored size of each page in tier ``t``; ``None`` where absent or the tier failed."""
        sizes = self.call(t, "sizes", self.tiers[t].page_sizes, keys)
        return [None] * len(keys) if sizes is None else sizes

    def remove(self, t: int, keys: Sequence[PageKey]) -> int | None:
        """Pages removed, or ``None`` when the removal failed."""
        return self.call(t, "remove", self.tiers[t].remove, keys)

    def free(self, t: int) -> int:
        """Bytes tier ``t`` can take now; ``-1`` when it cannot say."""
        try:
            return self.tiers[t].usage().free_bytes
        except Exception as e:
            self.failures.report(f"tier {self.names[t]}: usage", e)
            return -1

    def gone(self, t: int, keys: list[PageKey], removed: bool) -> list[PageKey]:
        """Which ``keys`` are no longer in tier ``t``: all of them after a removal that worked;
        after one that failed, those the tier says it lacks (none if it cannot say)."""
        if removed or not keys:
            return keys
        try:
            still = self.tiers[t].contains(keys)
        except Exception as e:
            self.failures.report(f"tier {self.names[t]}: contains after a failed remove", e)
            return []
        return [k for k, s in zip(keys, still) if not s]

    def locate(self, keys: Sequence[PageKey]) -> list[int | None]:
        """Per key, the fastest tier holding it now, or ``None``."""
        where: list[int | None] = [None] * len(keys)
        pending = list(range(len(keys)))
        for t in range(len(self.tiers)):
            if not pending:
                break
            found = self.contains(t, [keys[i] for i in pending])
            still = []
            for i, hit in zip(pending, found):
                if hit:
                    where[i] = t
                else:
                    still.append(i)
            pending = still
        return where

    def close(self) -> None:
        """Close every tier; a failing close is logged, and the others still close."""
        for tier in self.tiers:
            try:
                tier.close()
            except Exception:
                logger.exception("closing tier %s failed", tier.name)
