"""Our tiers in SGLang's own ``/metrics`` (``--enable-metrics``).

How it fits SGLang's multiprocess mode: SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts
its scheduler processes (one per TP/PP/DP rank) and its HTTP process serves ``/metrics`` through
``MultiProcessCollector``, which reads every process's value files. Each scheduler process here
creates our metric objects once, in prometheus_client's default registry, so their values land in
those files, labelled by the ``tp_rank``/``pp_rank``/``dp_rank``/``attn_cp_rank`` labels SGLang's
own storage collector uses. Counters and histograms are summed per label set by the collector, and every rank
has its own label set, so nothing is counted twice; gauges use ``mostrecent`` (a restarted rank's
value replaces the dead one's). A tier several ranks see (a pool, the Mooncake Store, an MLA model's
LMDB shared by its TP ranks) reports the same usage to each, so only one of them exports its gauges
(``observe_store`` decides which); the pool's own ``/metrics`` is the authority on its fill.

Cost: nothing exists unless SGLang passes ``enable_storage_metrics`` (its ``--enable-metrics``).
Then a daemon thread turns the store's cumulative counters into counter increments every
``interval`` seconds, off SGLang's threads (a remote tier's usage may be a network round trip), and
the store times each tier call for the latency histograms. A timing is only appended to a list on
the request path; the sync thread feeds the histograms (a histogram observation in multiprocess
mode writes mmap'd files under a lock: microseconds SGLang's I/O threads need not spend).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from ..store.stats import StoreReport
from .model import (
    COUNTERS,
    CURVE_COUNTERS,
    CURVE_GAUGES,
    GAUGES,
    LATENCY,
    LATENCY_BUCKETS,
    NAMESPACE_INFO,
    NAMESPACE_LABELS,
    POLICY_COUNTERS,
    POLICY_GAUGES,
    RANK_LABELS,
    STORE_COUNTERS,
    Snapshot,
    TierSample,
)
from .source import policy_series, snapshot_of

logger = logging.getLogger(__name__)

# Arbitrary: counters reach /metrics within a second, and a sync costs one store.stats().
DEFAULT_INTERVAL_S = 1.0
_LABELS = ("tier", *RANK_LABELS)
# Arbitrary: timings kept per (tier, op) between two syncs; past it (a stalled sync thread) they
# are dropped rather than grow without bound.
_MAX_PENDING_TIMINGS = 1 << 16
# Counters that are the placement policy's decisions carry its name too.
_PER_POLICY = frozenset({"admission_refusals"})


class _Families:
    """The prometheus_client objects of one registry, created once (a registry refuses twice)."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.counters = {f: Counter(name, _help(f), (*_LABELS, "policy") if f in _PER_POLICY else _LABELS,
                                    registry=registry)
                         for f, name in COUNTERS.items()}
        self.store = {f: Counter(name, _help(f), RANK_LABELS, registry=registry)
                      for f, name in STORE_COUNTERS.items()}
        self.gauges = {f: Gauge(name, _help(f), _LABELS, registry=registry,
                                multiprocess_mode="mostrecent") for f, name in GAUGES.items()}
        self.latency = {op: Histogram(name, f"seconds per tier {op} batch", _LABELS,
                                      registry=registry, buckets=LATENCY_BUCKETS)
                        for op, name in LATENCY.items()}
        self.policy_gauges = {f: Gauge(name, _help(f), (*_LABELS, "expert"), registry=registry,
                                       multiprocess_mode="mostrecent")
                              for f, name in POLICY_GAUGES.items()}
        self.policy_counters = {f: Counter(name, _help(f), _LABELS, registry=registry)
                                for f, name in POLICY_COUNTERS.items()}
        self.curve_counters = {f: Counter(name, _help(f"curve {f}"), (*_LABELS, "size"),
                                          registry=registry) for f, name in CURVE_COUNTERS.items()}
        self.curve_gauges = {f: Gauge(name, _help(f"curve {f}"), (*_LABELS, "size"), registry=registry,
                                      multiprocess_mode="mostrecent") for f, name in CURVE_GAUGES.items()}
        self.namespace = Gauge(NAMESPACE_INFO, "mooncake_sgl key namespace of this rank (1: current)",
                               (*RANK_LABELS, *NAMESPACE_LABELS), registry=registry,
                               multiprocess_mode="mostrecent")


def _help(field: str) -> str:
    return f"mooncake_sgl per-tier {field.replace('_', ' ')} (see docs/observability.md)"


# Per registry, for as long as it lives (a re-attached backend reuses the process's families).
_FAMILIES: weakref.WeakKeyDictionary[Any, _Families] = weakref.WeakKeyDictionary()
_FAMILIES_LOCK = threading.Lock()


def _families(registry: Any) -> _Families:
    with _FAMILIES_LOCK:
        fam = _FAMILIES.get(registry)
        if fam is None:
            fam = _FAMILIES[registry] = _Families(registry)
        return fam


class StoreExporter:
    """Exports one ``TieredStore``'s counters under one rank's labels.

    Args:
        stats: returns the store's ``stats()`` report (called on the exporter's thread only).
        labels: SGLang's rank labels, ``{"tp_rank": 0, "pp_rank": 0, "dp_rank": 0, "attn_cp_rank": 0}``
            (a missing one is 0).
        skip_gauges: tiers whose usage another rank exports (their counters are still this rank's).
        registry: prometheus_client registry; default: the process's global one, which is what
            SGLang's multiprocess collector reads.
        policy: the placement policy's name, a label of its decisions' counters.

    Thread-safety: ``sync`` and ``observe`` may be called from any thread.
    """

    def __init__(self, stats: Callable[[], StoreReport], labels: Mapping[str, object],
                 skip_gauges: frozenset[str] = frozenset(), registry: Any = None,
                 policy: str = "") -> None:
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        self._stats = stats
        self._labels = {k: str(labels.get(k, 0)) for k in RANK_LABELS}
        self._skip_gauges = skip_gauges
        self._policy = policy
        self._fam = _families(registry)
        self._last: Snapshot = Snapshot()
        self._switches: dict[str, float] = {}  # the policy's leader changes per tier, at the last sync
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._latency_children: dict[tuple[str, str], Any] = {}
        self._timings: dict[tuple[str, str], list[float]] = {}  # observed since the last sync
        self._timings_lock = threading.Lock()
        self._namespace: dict[str, str] | None = None

    def namespace(self, fields: Mapping[str, object]) -> None:
        """This rank's namespace now (``NAMESPACE_LABELS``); the one before drops to 0 (multiprocess
        files cannot remove a series)."""
        labels = {k: str(fields.get(k, "")) for k in NAMESPACE_LABELS}
        with self._lock:
            if self._namespace == labels:
                return
            if self._namespace is not None:
                self._fam.namespace.labels(**self._labels, **self._namespace).set(0)
            self._fam.namespace.labels(**self._labels, **labels).set(1)
            self._namespace = labels

    def start(self, interval_s: float = DEFAULT_INTERVAL_S) -> StoreExporter:
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True,
                                        name="mooncake-sgl-metrics")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread after one last sync; idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self.sync()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.sync()
            except Exception:  # keep exporting: one bad sync must not end the thread
                logger.exception("mooncake_sgl metrics: sync failed")

    def sync(self) -> None:
        """Push what changed since the last sync (and the timings observed since)."""
        with self._lock:
            self._flush_timings()
        try:
            stats = self._stats()
            now = snapshot_of(stats)
            experts, switches = policy_series(stats)
        except Exception as e:  # a store being closed under us; the next sync retries
            logger.debug("mooncake_sgl metrics: stats failed: %s", e)
            return
        with self._lock:
            self._push_policy(experts, switches)
            self._push_curves(self._last, now)
            before, self._last = self._last, now
            for key, sample in now.tiers.items():
                self._push(key[1], before.tiers.get(key, TierSample()), sample)
            for rank, counters in now.store.items():
                then = before.store.get(rank, {})
                for f, counter in self._fam.store.items():
                    child = counter.labels(**self._labels)
                    delta = counters.get(f, 0.0) - then.get(f, 0.0)
                    if delta > 0:
                        child.inc(delta)

    def _push(self, tier: str, before: TierSample, now: TierSample) -> None:
        labels = {"tier": tier, **self._labels}
        for f, counter in self._fam.counters.items():
            # Exists at 0 from the first sync, so rate() works from the start.
            child = (counter.labels(**labels, policy=self._policy) if f in _PER_POLICY
                else counter.labels(**labels))
            delta = getattr(now, f) - getattr(before, f)
            if delta > 0:  # a cleared store counts from zero again: nothing to add
                child.inc(delta)
        if tier in self._skip_gauges:
            return
        for f, gauge in self._fam.gauges.items():
            gauge.labels(**labels).set(getattr(now, f))

    def _push_policy(self, experts: Mapping[tuple[str, str, str], float],
                     switches: Mapping[str, float]) -> None:
        """The adaptive policy's leader and shadow hit ratios per tier, and its changes of leader."""
        for (f, tier, expert), value in experts.items():
            if tier not in self._skip_gauges:
                self._fam.policy_gauges[f].labels(tier=tier, expert=expert, **self._labels).set(value)
        for tier, total in switches.items():
            child = self._fam.policy_counters["leader_switches"].labels(tier=tier, **self._labels)
            delta = total - self._switches.get(tier, 0.0)
            if delta > 0:
                child.inc(delta)
            self._switches[tier] = total

    def _push_curves(self, before: Snapshot, now: Snapshot) -> None:
        """Each tier's capacity curve: estimated lookups and hits per size, and the size's bytes."""
        for (_, tier, size), vals in now.curves.items():
            labels = {"tier": tier, "size": size, **self._labels}
            then = before.curves.get(("", tier, size), {})
            for f, counter in self._fam.curve_counters.items():
                delta = vals.get(f, 0.0) - then.get(f, 0.0)
                child = counter.labels(**labels)
                if delta > 0:
                    child.inc(delta)
            if tier not in self._skip_gauges:
                for f, gauge in self._fam.curve_gauges.items():
                    gauge.labels(**labels).set(vals.get(f, 0.0))

    def observe_tier(self, store: Any) -> Callable[[Any, str, float], None]:
        """The store's latency hook: ``(tier object, op, seconds)`` under the tier's unique name
        in ``store.names`` (a second host tier is ``host.1``)."""
        names = {id(t): n for t, n in zip(store.tiers, store.names)}

        def observe(tier: Any, op: str, seconds: float) -> None:
            try:
                self.observe(names.get(id(tier), tier.name), op, seconds)
            except Exception as e:  # runs on SGLang's I/O paths: metrics never fail a call
                logger.debug("mooncake_sgl metrics: observe failed: %s", e)
        return observe

    def observe(self, tier: str, op: str, seconds: float) -> None:
        """One tier call took ``seconds``; only ``get`` and ``put`` are kept, until the next sync."""
        if op in self._fam.latency:
            with self._timings_lock:
                pending = self._timings.setdefault((tier, op), [])
                if len(pending) < _MAX_PENDING_TIMINGS:
                    pending.append(seconds)

    def _flush_timings(self) -> None:
        with self._timings_lock:
            timings, self._timings = self._timings, {}
        for (tier, op), values in timings.items():
            child = self._latency_children.get((tier, op))
            if child is None:
                child = self._fam.latency[op].labels(tier=tier, **self._labels)
                self._latency_children[(tier, op)] = child
            for v in values:
                child.observe(v)
