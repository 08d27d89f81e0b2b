"""``AnnouncerReport``: what the router announcer (``hicache.router_events.Announcer``) reports as
the ``router_events`` section of the store's ``stats()``. Here, beside its readers (the exporter and
the counter-file readers), rather than beside the announcer: ``hicache`` imports SGLang and sits
above ``metrics``, which must not import it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..tally import plain_number


@dataclass(frozen=True)
class AnnouncerReport:
    """``stats()["router_events"]``: the announcer's counts (``router_events.AnnouncerStats``, as
    floats, as the stats JSON has always had them), then its gauges. ``dataclasses.asdict`` of it
    is its JSON."""

    stored: float
    removed: float
    unannounced: float
    skipped_other_namespace: float
    skipped_not_sglang_hash: float
    announced_pages: float  # pages announced and still in a local tier
    waiting_pages: float  # local pages not announced yet (SGLang has not published their tokens)
    publisher: float  # 1 once SGLang's publisher is attached, else 0

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> AnnouncerReport:
        """Back from its JSON form (the counter file); a field missing there reads 0."""
        return cls(*(plain_number(d, f.name) for f in dataclasses.fields(cls)))
