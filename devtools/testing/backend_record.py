"""The tiered store's counters behind a live ``MooncakeSglStorage``, for tests and the CPU
end-to-end driver: the backend answers SGLang's calls and exports ``/metrics``; its store is
private to it, so only tools read it, through here."""

from __future__ import annotations

from typing import Any


def store_stats(backend: Any) -> dict[str, Any]:
    """``TieredStore.stats().as_dict()`` of ``backend`` (a ``MooncakeSglStorage``): the nested
    JSON a worker prints, or ``{}`` before its store exists."""
    store = backend._store
    return store.stats().as_dict() if store is not None else {}
