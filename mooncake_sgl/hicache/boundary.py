"""The adapter's error boundary: whatever a storage call raises, SGLang sees a miss.

SGLang's storage threads die on an exception and on a ``None`` where a list is expected, so every
public method of ``MooncakeSglStorage`` is wrapped in ``boundary(miss)``: an exception becomes
``miss(*args)`` of the method's own shape plus one rate-limited log line (``FailureLog``), and a
weight update in progress (``WeightsChanging``) becomes a miss without a log line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from sglang.srt.mem_cache.hicache_storage import PoolTransferResult


def count(keys: Any) -> int:
    try:
        return len(keys)
    except Exception:
        return 0


class WeightsChanging(RuntimeError):
    """The weights are being replaced: every call is a miss, and not a failure to log."""


def boundary(miss: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn any exception of the wrapped method into ``miss(*args)`` plus a rate-limited log line."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, *args, **kwargs)
            except WeightsChanging:
                return miss(*args, **kwargs)
            except Exception as e:
                self._errors.report(fn.__name__, e)
                return miss(*args, **kwargs)
        return guarded
    return wrap


def all_false(keys: Any, *_: Any, **__: Any) -> list[bool]:
    return [False] * count(keys)


def none_each(keys: Any, *_: Any, **__: Any) -> list[None]:
    return [None] * count(keys)


def no_restorable_prefix(*_: Any, **__: Any) -> PoolTransferResult:
    return PoolTransferResult(0, {}, [])


def each_pool_false(transfers: Any, *_: Any, **__: Any) -> dict[Any, list[bool]]:
    try:
        return {t.name: [False] * count(t.keys or ()) for t in transfers}
    except Exception:
        return {}
