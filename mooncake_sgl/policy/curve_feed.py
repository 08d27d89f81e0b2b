"""``CurveFeed``: a store's capacity curves, kept by observing it (``api.StoreObserver``).

The store knows nothing of curves: it hands its observers the lookups its policy learns from
(``PagesLookedUp``) and the pages it stores (``PagesStored``, whose first footprint sizes the
miniatures). The feed passes them to the curves, in this process (``TierCurves``: deterministic,
the simulator's) or in a process of their own (``CurveProcess``: a server's), and reports them as
the ``curves`` section of the store's ``stats()``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any, Literal

from ..api import PagesLookedUp, PagesStored, PlacementPolicy, StoreEvent, Tier
from .curve import TierCurves
from .curve_process import CurveProcess

CurveMode = Literal["process", "inline"]
MODES: dict[str, type[TierCurves] | type[CurveProcess]] = {"process": CurveProcess, "inline": TierCurves}


class CurveFeed:
    """Capacity curves of the bounded tiers among ``tiers`` (named ``names``) under ``policy``."""

    section = "curves"

    def __init__(self, tiers: Sequence[Tier], names: Sequence[str], policy: PlacementPolicy,
                 mode: CurveMode) -> None:
        if mode not in MODES:
            raise ValueError(f"capacity curves run 'process' or 'inline', got {mode!r}")
        bounded = [None if t.capabilities.self_evicting else t.usage().capacity_bytes for t in tiers]
        # The miniatures run the policy as configured (heat's and adaptive's keep their config).
        self._curves = MODES[mode](bounded, policy.name, getattr(policy, "config", None))
        self._names = list(names)
        # Inline curves are read (``stats``) on other threads than the one feeding them.
        self._lock = threading.Lock()

    def on_events(self, events: Sequence[StoreEvent]) -> None:
        curves = self._curves
        with self._lock:
            for e in events:
                if isinstance(e, PagesLookedUp):
                    curves.on_lookup(e.keys)
                elif isinstance(e, PagesStored) and e.footprints:
                    curves.start(max(e.footprints))

    def stats(self) -> dict[str, Any]:
        """``points``: per tier name, its curve (tiers without one left out); ``costs``: seconds the
        feeding threads spent (``busy_seconds``), the curve process's CPU (``process_seconds``) and
        pages left out while that process was behind (``dropped_pages``)."""
        curves = self._curves
        if isinstance(curves, CurveProcess):
            points = curves.points()  # what its process last reported: no lock, no wait
            costs = {"busy_seconds": curves.busy_seconds, "process_seconds": curves.process_seconds,
                     "dropped_pages": float(curves.dropped_pages)}
        else:
            with self._lock:
                points = curves.points()
                costs = {"busy_seconds": curves.busy_seconds, "process_seconds": 0.0, "dropped_pages": 0.0}
        return {"points": {self._names[t]: [dataclasses.asdict(p) for p in tier_points]
                           for t, tier_points in enumerate(points) if tier_points},
                "costs": costs}

    def sync(self, timeout: float) -> bool:
        """Wait until the curves have counted every lookup handed to them (their process reports
        within half a second on its own); ``False`` if that took longer than ``timeout``."""
        curves = self._curves
        return curves.sync(timeout) if isinstance(curves, CurveProcess) else True

    def close(self) -> None:
        """Stop the curves' process, if they have one."""
        if isinstance(self._curves, CurveProcess):
            self._curves.close()
