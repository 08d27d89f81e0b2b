"""This scheduler's prefill speed, as SGLang measures it, for the load gate (``policy/load_gate.py``).

SGLang 0.5.23's scheduler keeps two running totals for its load reports
(``Scheduler._record_step_counters``): ``total_prefill_busy_us``, the time from a prefill batch's
launch to its result (overlapping batches and pauses taken out), and
``total_prefill_uncached_tokens``, the tokens those batches computed. On a GPU that span ends when
the result is on the host, so it is the device's time, not the launch's. The backend is built inside
``Scheduler.__init__``, before the scheduler object is complete, so the touch point (an AFTER hook on
``Scheduler.__init__``) hands the finished scheduler to this module, held by a weak reference; every
backend of the process reads it here. Where no scheduler announced itself (SGLang's other
processes, the tests' bare host pools), or its counters are missing, ``reading`` answers ``None`` and
the gate admits every hit, as SGLang would without it.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..policy.load_gate import PrefillReading
from .touch_points import TouchPoint, register_hook

_scheduler: weakref.ref[Any] | None = None


def reading() -> PrefillReading | None:
    """The scheduler's totals now; ``None`` without a scheduler in this process."""
    scheduler = _scheduler() if _scheduler is not None else None
    if scheduler is None:
        return None
    try:
        return PrefillReading(int(scheduler.total_prefill_uncached_tokens),
                              scheduler.total_prefill_busy_us / 1e6)
    except (AttributeError, TypeError, ValueError):  # a scheduler of another shape: no evidence
        return None


def _remember(result: None, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    global _scheduler
    _scheduler = weakref.ref(scheduler)


def install_hook(point: TouchPoint) -> bool:
    """Register ``point``'s AFTER hook on ``Scheduler.__init__``; True if registered now."""
    return register_hook(point, _remember)
