"""SGLang's per-call storage metrics (``get_stats``): pages and GB/s of each prefetch and backup.

SGLang calls ``get_stats`` each scheduler tick with ``--enable-metrics`` and turns what it gets
into its ``sglang:prefetch_pgs``/``backup_pgs``/``*_bandwidth`` histograms; what was recorded
since the previous call is handed over and forgotten. Recorded from SGLang's I/O threads, drained
from its scheduler thread: one lock, held for an append or a swap.
"""

from __future__ import annotations

import threading
import time

try:
    from sglang.srt.observability.metrics_collector import StorageMetrics
except ImportError:  # sglang <= 0.5.5
    from sglang.srt.metrics.collector import StorageMetrics  # type: ignore[no-redef]


class CallMetrics:
    """Pages and GB/s per call, kept only when ``enabled`` (SGLang's ``enable_storage_metrics``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._pgs: dict[str, list[int]] = {"prefetch": [], "backup": []}
        self._bw: dict[str, list[float]] = {"prefetch": [], "backup": []}

    def record(self, kind: str, pages: int, page_nbytes: int, started: float) -> None:
        """One ``kind`` (``prefetch`` or ``backup``) call moved ``pages`` since ``started``
        (a ``time.perf_counter()``)."""
        if not self.enabled or pages <= 0:
            return
        gbps = pages * page_nbytes / max(time.perf_counter() - started, 1e-9) / 1e9
        with self._lock:
            self._pgs[kind].append(pages)
            self._bw[kind].append(gbps)

    def drain(self) -> StorageMetrics:
        """What was recorded since the previous drain."""
        out = StorageMetrics()
        with self._lock:
            pgs, self._pgs = self._pgs, {"prefetch": [], "backup": []}
            bw, self._bw = self._bw, {"prefetch": [], "backup": []}
        out.prefetch_pgs.extend(pgs["prefetch"])
        out.backup_pgs.extend(pgs["backup"])
        out.prefetch_bandwidth.extend(bw["prefetch"])
        out.backup_bandwidth.extend(bw["backup"])
        return out
