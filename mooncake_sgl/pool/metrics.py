"""The pool server's ``/metrics``: Prometheus text on ``metrics_port`` of the pool's bind host.

Values are read from ``PoolServer.stats()`` when Prometheus scrapes, so serving pays nothing for
them; only the per-op latency histograms are fed on the request path (one bucket increment under a
lock per request). The series are built as metric families by a custom collector, not as
prometheus_client value objects, so a ``PROMETHEUS_MULTIPROC_DIR`` inherited from the environment
cannot redirect them into files nobody reads.

    metrics = PoolMetrics(server.stats)         # PoolServer does this when metrics_port is set
    metrics.observe_op(P.Op.GET, seconds)       # per request, from the connection loop
    http = metrics.serve("127.0.0.1", 9480)     # port 0 picks one: http.port
    http.close()
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..metrics.model import LATENCY_BUCKETS, POOL_PREFIX
from ..transfer import protocol as P
from .metrics_http import MetricsHttp

# stats() key -> (series name without the prefix, help). Counters get ``_total`` from the family.
GAUGES: dict[str, tuple[str, str]] = {
    "capacity_bytes": ("capacity_bytes", "bytes of the DRAM segment"),
    "used_bytes": ("used_bytes", "bytes of slots allocated (readable, being written or leased)"),
    "stored_bytes": ("stored_bytes", "bytes of the pages themselves"),
    "leased_bytes": ("leased_bytes", "bytes of pages being read right now"),
    "leased": ("leased_pages", "pages being read right now (not evictable)"),
    "pages": ("pages", "readable pages"),
    "writing": ("writing_pages", "pages reserved and being written"),
    "connections": ("connections", "open client connections"),
    "slabs": ("slabs", "slabs of the segment"),
    "free_slabs": ("free_slabs", "slabs not carved into any size class"),
    "uptime_s": ("uptime_seconds", "seconds since the server started"),
}
COUNTERS: dict[str, tuple[str, str]] = {
    "puts": ("puts", "pages asked to be stored"),
    "put_present": ("puts_present", "puts of pages already stored (no-op successes)"),
    "put_no_room": ("puts_refused", "pages not stored: no room within put_wait"),
    "put_waits": ("puts_waited", "put batches that waited for room"),
    "evictions": ("evictions", "pages evicted"),
    "evicted_bytes": ("evicted_bytes", "bytes of pages evicted"),
    "gets": ("gets", "pages asked to be read"),
    "get_hits": ("get_hits", "pages read"),
    "exists_checks": ("exists_checks", "pages asked about"),
    "removes": ("removes", "pages removed on request"),
    "aborts": ("aborts", "reservations aborted"),
    "connections_total": ("connections_accepted", "connections accepted"),
    "refused_connections": ("connections_refused", "connections refused (max_connections)"),
    "accept_failures": ("accept_failures", "connections lost to a failed accept or thread start "
                        "(out of descriptors, memory or threads)"),
    "auth_failures": ("auth_failures", "handshakes refused: bad or missing secret"),
    "protocol_errors": ("protocol_errors", "connections closed on a malformed request"),
    "bytes_in": ("received_bytes", "page bytes written into the pool"),
    "bytes_out": ("sent_bytes", "page bytes read from the pool over streams"),
}
LATENCY_NAME = "op_latency_seconds"


class OpLatency:
    """A fixed-bucket histogram per op name; thread-safe."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, op: str, seconds: float) -> None:
        i = bisect.bisect_left(self.buckets, seconds)
        with self._lock:
            counts = self._counts.get(op)
            if counts is None:
                counts = self._counts[op] = [0] * (len(self.buckets) + 1)
                self._sums[op] = 0.0
            counts[i] += 1
            self._sums[op] += seconds

    def snapshot(self) -> dict[str, tuple[list[int], float]]:
        with self._lock:
            return {op: (list(c), self._sums[op]) for op, c in self._counts.items()}


class PoolCollector:
    """A prometheus_client collector over ``stats()`` and an ``OpLatency``."""

    def __init__(self, stats: Callable[[], Mapping[str, float]], latency: OpLatency) -> None:
        self._stats = stats
        self._latency = latency

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        stats = self._stats()
        for key, (name, doc) in GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(POOL_PREFIX + name, doc, value=float(stats[key]))
        for key, (name, doc) in COUNTERS.items():
            if key in stats:
                yield CounterMetricFamily(POOL_PREFIX + name, doc, value=float(stats[key]))
        hist = HistogramMetricFamily(POOL_PREFIX + LATENCY_NAME, "seconds per request, by op",
                                     labels=["op"])
        for op, (counts, total) in sorted(self._latency.snapshot().items()):
            cumulative, running = [], 0
            for bound, n in zip((*map(str, self._latency.buckets), "+Inf"), counts):
                running += n
                cumulative.append((bound, running))
            hist.add_metric([op], cumulative, total)
        yield hist


class PoolMetrics:
    """The pool's series; ``observe`` is the request-path hook, ``serve`` the HTTP endpoint."""

    def __init__(self, stats: Callable[[], Mapping[str, float]]) -> None:
        from prometheus_client import CollectorRegistry

        self.latency = OpLatency()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(PoolCollector(stats, self.latency))

    def observe(self, op: str, seconds: float) -> None:
        self.latency.observe(op, seconds)

    def observe_op(self, code: int, seconds: float) -> None:
        """One request of wire op ``code`` took ``seconds`` (receiving it to sending the reply)."""
        try:
            name = P.Op(code).name
        except ValueError:  # the dispatcher refused it already; keep the label set bounded
            name = "UNKNOWN"
        self.latency.observe(name, seconds)

    def serve(self, host: str, port: int) -> MetricsHttp:
        """Serve ``/metrics`` on ``host:port`` (0: a free port) from a daemon thread, bounded in
        connections and time (``metrics_http``).

        Raises:
            OSError: the address cannot be bound.
        """
        from prometheus_client import make_wsgi_app

        return MetricsHttp(host, port, make_wsgi_app(self.registry))
