"""What ``doctor`` reads from a server: its arguments and two looks at its ``/metrics``.

Every read is bounded in time and size (``metrics.scrape.fetch``); a server that cannot be read
is evidence too (``ServerEvidence.error``), never an exception out of ``gather``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..metrics.model import NAMESPACE_INFO, NAMESPACE_LABELS, Snapshot
from ..metrics.scrape import ScrapeError, fetch, metrics_url, parse, series

# /get_server_info is SGLang's server arguments and a few scheduler figures: kilobytes.
MAX_INFO_BYTES = 4 << 20
# SGLang's defaults for what it reads from the extra config (mem_cache; see docs/doctor.md).
SGLANG_PREFETCH_THRESHOLD = 256
SGLANG_TIMEOUT_BASE_S = 1.0
SGLANG_TIMEOUT_PER_KI_TOKEN_S = 0.25

# A series: (labels, value) per sample.
Samples = list[tuple[dict[str, str], float]]


@dataclass(frozen=True)
class Look:
    """One read of a ``/metrics`` page: SGLang's series by sample name, and ours."""

    at: float
    series: Mapping[str, Samples]
    ours: Snapshot

    def total(self, name: str, **labels: str) -> float:
        """Sum of ``name``'s samples whose labels include ``labels``."""
        return sum(v for lab, v in self.series.get(name, ())
                   if all(lab.get(k) == want for k, want in labels.items()))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for lab, v in self.series.get(name, ()):
            out[lab.get(label, "")] = out.get(lab.get(label, ""), 0.0) + v
        return out


@dataclass(frozen=True)
class ServerEvidence:
    """One SGLang server as ``doctor`` saw it; ``error`` says why something could not be read."""

    url: str
    args: Mapping[str, Any] = field(default_factory=dict)
    first: Look | None = None
    last: Look | None = None
    error: str = ""

    @property
    def name(self) -> str:
        return self.url.split("://", 1)[-1].rstrip("/")

    def arg(self, key: str, default: Any = None) -> Any:
        value = self.args.get(key)
        return default if value is None else value

    def extra_config(self) -> dict[str, Any]:
        """The ``--hicache-storage-backend-extra-config`` SGLang was given: its JSON, or the file
        of its ``@FILE`` form when this host can read it; ``{}`` otherwise."""
        raw = self.args.get("hicache_storage_backend_extra_config")
        if not isinstance(raw, str) or not raw.strip():
            return {}
        try:
            if raw.startswith("@"):
                import yaml  # the file form is YAML (JSON is YAML)

                with open(raw[1:], encoding="utf-8") as f:
                    data = yaml.safe_load(f)
            else:
                data = json.loads(raw)
        except Exception as e:  # noqa: BLE001 - OSError, JSON's and YAML's errors: reported, not raised
            return {"_unreadable": f"{type(e).__name__}: {e}"}
        return data if isinstance(data, dict) else {}

    def namespaces(self) -> list[dict[str, str]]:
        """The current namespace of each rank (``metrics.model.NAMESPACE_INFO`` at 1)."""
        if self.last is None:
            return []
        seen: list[dict[str, str]] = []
        for labels, value in self.last.series.get(NAMESPACE_INFO, ()):
            if value >= 1:
                ns = {k: labels.get(k, "") for k in NAMESPACE_LABELS}
                if ns not in seen:
                    seen.append(ns)
        return seen


def _look(url: str, timeout: float) -> Look:
    text = fetch(url, timeout)
    return Look(time.time(), series(text), parse(text))


def _server_args(base: str, timeout: float) -> dict[str, Any]:
    for path in ("/get_server_info", "/server_info"):
        try:
            data = json.loads(fetch(base + path, timeout, MAX_INFO_BYTES))
        except (ScrapeError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return {}


def gather(target: str, timeout: float = 5.0, window: float = 2.0) -> ServerEvidence:
    """``target``'s arguments and two looks at its ``/metrics`` ``window`` seconds apart (rates
    need two; ``window`` 0 takes one)."""
    base = metrics_url(target).rsplit("/metrics", 1)[0]
    url = base
    try:
        first = _look(base + "/metrics", timeout)
    except ScrapeError as e:
        return ServerEvidence(url, error=str(e))
    args = _server_args(base, timeout)
    last = first
    if window > 0:
        time.sleep(window)
        try:
            last = _look(base + "/metrics", timeout)
        except ScrapeError as e:
            return ServerEvidence(url, args, first, first, error=str(e))
    return ServerEvidence(url, args, first, last)
