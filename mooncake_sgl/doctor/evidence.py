"""What ``doctor`` reads from a server: its arguments and two looks at its ``/metrics``.

Every endpoint is treated as hostile: all reads of one server share one time budget and each is
capped in size (``metrics.scrape.fetch``), a page is parsed only under a sample bound, and what the
server serves is checked before a rule uses it (``ServerEvidence.oddities`` names what was left
out). A server that cannot be read is evidence too (``ServerEvidence.error``), never an exception
out of ``gather``, so one bad URL never takes the other servers' reports with it.
"""

from __future__ import annotations

import json
import reprlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..hicache.namespace_board import NamespaceRecord
from ..metrics.model import CURVE_COUNTERS, CURVE_GAUGES, NAMESPACE_INFO, NAMESPACE_LABELS, Snapshot
from ..metrics.scrape import ScrapeError, by_name, curve_size, fetch, samples, server_url, snapshot

# /get_server_info is SGLang's server arguments and a few scheduler figures: kilobytes.
MAX_INFO_BYTES = 4 << 20
# A real SGLang /metrics page is well under 1 MiB (histograms per rank); the 64 MiB that ``stats``
# accepts held the doctor a minute and 1.5 GiB per URL, and it reads up to eight at once.
MAX_METRICS_BYTES = 4 << 20
# Samples parsed from one page: a real page has a few thousand; 50,000 parse in about a second.
MAX_SAMPLES = 50_000
# Oddities listed per server; a page may repeat one on every sample.
MAX_ODDITIES = 10
# SGLang's defaults for what it reads from the extra config (mem_cache; see docs/doctor.md).
SGLANG_PREFETCH_THRESHOLD = 256
SGLANG_TIMEOUT_BASE_S = 1.0
SGLANG_TIMEOUT_PER_KI_TOKEN_S = 0.25
# SGLang's page size when none is given.
SGLANG_PAGE_SIZE = 1
# The namespace fields that are numbers on the board.
_NAMESPACE_INTS = ("page_size", "pp_size", "cp_size")
_CURVE_SERIES = frozenset({*(n + "_total" for n in CURVE_COUNTERS.values()), *CURVE_GAUGES.values()})

# A series: (labels, value) per sample.
Samples = list[tuple[dict[str, str], float]]


def shown(value: Any, limit: int = 60) -> str:
    """A value a server chose, as evidence shows it: bounded in length and in depth (a plain repr
    of a deeply nested JSON value would itself raise RecursionError)."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = limit
    short.maxlevel = 3
    return short.repr(value)


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
class ExtraConfig:
    """The server's ``--hicache-storage-backend-extra-config`` as far as it is known from here."""

    values: Mapping[str, Any] = field(default_factory=dict)
    unknown: str = ""  # why its values are not known here ("" when they are)

    def setting(self, key: str, default: Any, kind: type | tuple[type, ...]) -> tuple[Any, str]:
        """``key``'s value, and ``""`` when it is the config's own; else ``default`` (SGLang's) and
        why it was taken."""
        value = self.values.get(key)
        if isinstance(value, kind) and not isinstance(value, bool):
            return value, ""
        if self.unknown:
            return default, f"assumed SGLang's default: {self.unknown}"
        if key in self.values:
            return default, f"assumed SGLang's default: the extra config's {key}={shown(value)} is not usable"
        return default, "SGLang's default, not in the extra config"


def namespace_record(labels: Mapping[str, str]) -> NamespaceRecord | None:
    """The namespace a ``mooncake_sgl_namespace_info`` sample describes; ``None`` when a number
    field is not a whole number (such a page is not ours: it cannot be compared)."""
    ns = {k: labels.get(k, "") for k in NAMESPACE_LABELS}
    try:
        ints = {k: int(ns[k] or 0) for k in _NAMESPACE_INTS}
    except ValueError:
        return None
    return NamespaceRecord(role=ns["role"] or "colocated", model=ns["model"], weights=ns["weights"],
                           dtype=ns["dtype"], layout=ns["layout"], key_tp=ns["key_tp"], tag=ns["tag"],
                           **ints)


@dataclass(frozen=True)
class ServerEvidence:
    """One SGLang server as ``doctor`` saw it; ``error`` says why something could not be read."""

    url: str
    args: Mapping[str, Any] = field(default_factory=dict)
    first: Look | None = None
    last: Look | None = None
    error: str = ""
    args_error: str = ""  # why ``args`` is empty: its arguments could not be read

    @property
    def name(self) -> str:
        return self.url.split("://", 1)[-1].rstrip("/")

    def arg(self, key: str, default: Any = None) -> Any:
        value = self.args.get(key)
        return default if value is None else value

    def page_size(self) -> int | None:
        """SGLang's page size in tokens (its default when not given); ``None`` when the server
        reports something other than a positive whole number."""
        value = self.arg("page_size", SGLANG_PAGE_SIZE)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return None

    def extra_config(self) -> ExtraConfig:
        """The extra config SGLang was given: its inline JSON. The ``@FILE`` form names a file on
        the server's host, never opened here: a path on this host may be another file, or one that
        never ends (``@/dev/stdin`` once hung the doctor)."""
        raw = self.args.get("hicache_storage_backend_extra_config")
        if not isinstance(raw, str) or not raw.strip():
            return ExtraConfig()
        if raw.startswith("@"):
            return ExtraConfig(unknown=f"its extra config is the file {shown(raw[1:], 300)} on that server, "
                                       "which the doctor does not open")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:
            return ExtraConfig(unknown=f"its extra config is not JSON ({type(e).__name__})")
        if not isinstance(data, dict):
            return ExtraConfig(unknown=f"its extra config is a JSON {type(data).__name__}, not an object")
        return ExtraConfig(data)

    def namespaces(self) -> list[dict[str, str]]:
        """The current namespace of each rank (``metrics.model.NAMESPACE_INFO`` at 1), those that
        can be compared (``namespace_record``; ``oddities`` names the others)."""
        if self.last is None:
            return []
        seen: list[dict[str, str]] = []
        for labels, value in self.last.series.get(NAMESPACE_INFO, ()):
            if value >= 1 and namespace_record(labels) is not None:
                ns = {k: labels.get(k, "") for k in NAMESPACE_LABELS}
                if ns not in seen:
                    seen.append(ns)
        return seen

    def oddities(self) -> list[str]:
        """What the server served that SGLang and mooncake_sgl never serve, each left out of the
        diagnoses: said, so that a rule's silence is not taken for health."""
        out = []
        if self.page_size() is None:
            out.append(f"/get_server_info page_size={shown(self.args.get('page_size'))}: not a "
                       "positive whole number, so the rules that count tokens by the page were skipped")
        if self.last is None:
            return out
        for labels, _ in self.last.series.get(NAMESPACE_INFO, ()):
            if namespace_record(labels) is None:
                bad = ", ".join(f"{k}={shown(labels.get(k, ''))}" for k in _NAMESPACE_INTS)
                out.append(f"{NAMESPACE_INFO} with {bad}: not whole numbers, so this namespace was "
                           "not compared with others")
        for name in sorted(_CURVE_SERIES & set(self.last.series)):
            for labels, _ in self.last.series[name]:
                if "size" in labels and curve_size(labels["size"]) is None:
                    out.append(f"{name} with size={shown(labels['size'])}: not a curve size such as "
                               "0.5x, so this point was left out of its tier's curve")
        out = list(dict.fromkeys(out))  # one line for the same oddity on every rank
        if len(out) > MAX_ODDITIES:
            out[MAX_ODDITIES:] = [f"and {len(out) - MAX_ODDITIES} more"]
        return out


def _look(base: str, timeout: float, deadline: float) -> Look:
    url = base + "/metrics"
    text = fetch(url, timeout, MAX_METRICS_BYTES, deadline=deadline)
    try:
        found = samples(text, MAX_SAMPLES)
    except ValueError as e:
        raise ScrapeError(f"cannot read {url}: {e}") from None
    return Look(time.time(), by_name(found), snapshot(found))


def _server_args(base: str, timeout: float, deadline: float) -> tuple[dict[str, Any], str]:
    """The server's arguments, or ``{}`` and why they could not be read (SGLang's own path's
    reason: ``/server_info`` is its older name, tried second)."""
    why = []
    for path in ("/get_server_info", "/server_info"):
        try:
            data = json.loads(fetch(base + path, timeout, MAX_INFO_BYTES, deadline=deadline))
        except ScrapeError as e:
            why.append(str(e))
            continue
        except (ValueError, RecursionError) as e:  # RecursionError: JSON nested past the parser
            why.append(f"{base + path} is not JSON ({type(e).__name__})")
            continue
        if isinstance(data, dict):
            return data, ""
        why.append(f"{base + path} is a JSON {type(data).__name__}, not an object")
    return {}, why[0]


def gather(target: str, timeout: float = 5.0, window: float = 2.0) -> ServerEvidence:
    """``target``'s arguments and two looks at its ``/metrics`` ``window`` seconds apart (rates
    need two; ``window`` 0 takes one). All reads together take at most ``timeout`` seconds (the
    window's wait is not counted). Never raises: what one server serves is evidence about it."""
    try:
        return _gather(target, timeout, window)
    except Exception as e:  # noqa: BLE001 - an answer no check foresaw is still only this URL's finding
        return ServerEvidence(target, error=f"cannot read {target}: {type(e).__name__}: {e}")


def _gather(target: str, timeout: float, window: float) -> ServerEvidence:
    try:
        base = server_url(target)
    except ValueError as e:
        return ServerEvidence(target, error=f"cannot read {target}: {e}")
    deadline = time.monotonic() + timeout
    try:
        first = _look(base, timeout, deadline)
    except ScrapeError as e:
        return ServerEvidence(base, error=str(e))
    args, args_error = _server_args(base, timeout, deadline)
    last = first
    if window > 0:
        time.sleep(window)
        try:
            last = _look(base, timeout, deadline + window)
        except ScrapeError as e:
            return ServerEvidence(base, args, first, first, error=str(e), args_error=args_error)
    return ServerEvidence(base, args, first, last, args_error=args_error)
