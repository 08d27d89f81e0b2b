"""``CurveFeed``: a store's capacity curves, kept by observing it (``api.StoreObserver``).

The store knows nothing of curves: it hands its observers the lookups its policy learns from
(``PagesLookedUp``) and the pages it stores (``PagesStored``, whose first footprint sizes the
miniatures). The feed passes them to the curves, in this process (``TierCurves``: deterministic,
the simulator's) or in a process of their own (``CurveProcess``: a server's), and reports them as
the ``curves`` section of the store's ``stats()``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..api import PagesLookedUp, PagesStored, PlacementPolicy, StoreEvent, Tier
from ..tally import plain_number
from .curve import CurvePoint, TierCurves
from .curve_process import CurveProcess

CurveMode = Literal["process", "inline"]
MODES: dict[str, type[TierCurves] | type[CurveProcess]] = {"process": CurveProcess, "inline": TierCurves}


@dataclass(frozen=True)
class CurveCosts:
    """What keeping the curves cost (floats, as the stats JSON has always had them)."""

    busy_seconds: float  # the feeding threads' time (queueing keys, or running the miniatures inline)
    process_seconds: float  # the curve process's CPU; 0 inline
    dropped_pages: float  # pages left out while the curve process was behind; 0 inline


@dataclass(frozen=True)
class CurvesReport:
    """``stats()["curves"]``: each tier's curve and what keeping them cost. ``dataclasses.asdict``
    of it is its JSON (the counter file)."""

    points: dict[str, list[CurvePoint]]  # by tier name; a tier without a curve is left out
    costs: CurveCosts

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> CurvesReport:
        """Back from its JSON form (the counter file); a field missing there reads 0, a point
        without its multiplier is skipped (it names no size)."""
        num = plain_number
        points = d.get("points")
        costs = d.get("costs")
        costs = costs if isinstance(costs, Mapping) else {}
        return cls({str(tier): [CurvePoint(num(p, "multiplier"), int(num(p, "capacity_pages")),
                                           int(num(p, "capacity_bytes")), num(p, "lookups"), num(p, "hits"))
                                for p in tier_points if isinstance(p, Mapping) and "multiplier" in p]
                    for tier, tier_points in (points.items() if isinstance(points, Mapping) else ())
                    if isinstance(tier_points, list)},
                   CurveCosts(num(costs, "busy_seconds"), num(costs, "process_seconds"),
                              num(costs, "dropped_pages")))


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

    def stats(self) -> CurvesReport:
        curves = self._curves
        if isinstance(curves, CurveProcess):
            points = curves.points()  # what its process last reported: no lock, no wait
            costs = CurveCosts(curves.busy_seconds, curves.process_seconds, float(curves.dropped_pages))
        else:
            with self._lock:
                points = curves.points()
                costs = CurveCosts(curves.busy_seconds, 0.0, 0.0)
        return CurvesReport({self._names[t]: list(tier_points) for t, tier_points in enumerate(points)
                             if tier_points}, costs)

    def sync(self, timeout: float) -> bool:
        """Wait until the curves have counted every lookup handed to them (their process reports
        within half a second on its own); ``False`` if that took longer than ``timeout``."""
        curves = self._curves
        return curves.sync(timeout) if isinstance(curves, CurveProcess) else True

    def close(self) -> None:
        """Stop the curves' process, if they have one."""
        if isinstance(self._curves, CurveProcess):
            self._curves.close()
