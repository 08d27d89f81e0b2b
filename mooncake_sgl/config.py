"""The typed configuration: parsed once, frozen, validated with the key path and source in every error.

This module is the schema. It opens no file and reads of the environment only where the home and
cache directories are (``~`` in paths, ``default_cache_dir``). Reading config text into it, and
writing it back, is ``config_text``'s; which source a process's config comes from is
``config_sources``'s.

Sizes are bytes or strings like ``64GiB``/``512MB``; durations are seconds or ``250ms``/``5s``/``2m``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Union

import msgspec

from . import envs
from .units import parse_duration, parse_size

# Tier kinds by speed, fastest first; kinds of one speed share a number. The one statement of the
# order: a store config must list its tiers in it, and the stats views sort by it.
TIER_SPEED = {"hbm": 0, "host": 1, "pool": 2, "mooncake_store": 2, "lmdb": 3}


def _speed_order() -> str:
    return ", ".join("/".join(k for k, s in TIER_SPEED.items() if s == speed)
                     for speed in sorted(set(TIER_SPEED.values())))


# A value the config prints in place of a secret (``config show``, logs).
REDACTED = "<redacted>"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``"10.0.0.5:7480"`` → ``("10.0.0.5", 7480)``; ``[::1]:7480`` for IPv6. ``ValueError``
    names what is missing."""
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"endpoint port must be 1..65535, got {endpoint!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def default_cache_dir() -> Path:
    base = envs.XDG_CACHE_HOME.get() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mooncake_sgl"


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: frozen, unknown keys rejected, secrets kept out of reprs
    (a config that lands in a log or a traceback never shows one)."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={REDACTED if name == 'secret' and value else value!r}"
                           for name in self.__struct_fields__
                           for value in (getattr(self, name),))
        return f"{type(self).__name__}({fields})"

    def _normalise(self, **converters: Any) -> None:
        # Sizes and durations arrive as int-or-str; store them as numbers once.
        for name, conv in converters.items():
            try:
                value = conv(getattr(self, name))
            except ValueError as e:
                raise ValueError(f"`{name}`: {e}") from None
            msgspec.structs.force_setattr(self, name, value)


# ---------------------------------------------------------------------------------------- tiers

class HostTierConfig(_Section, tag="host", tag_field="kind"):
    """Host DRAM: one preallocated buffer carved into fixed-size slots."""
    capacity: Union[int, str] = "4GiB"
    # Largest page the tier takes; slots are this size. ``auto``: the first page written sets it.
    slot_size: Union[int, str] = "auto"
    # Pin (page-lock) the buffer when CUDA is present, for fast H2D/D2H copies.
    pin_memory: bool = True

    def __post_init__(self) -> None:
        self._normalise(capacity=parse_size)
        if self.slot_size != "auto":
            self._normalise(slot_size=parse_size)
        if self.capacity <= 0:
            raise ValueError("`capacity`: the host tier needs a positive capacity")
        if self.slot_size != "auto" and self.slot_size <= 0:
            raise ValueError("`slot_size`: must be positive")


class HbmTierConfig(_Section, tag="hbm", tag_field="kind"):
    """Spare GPU memory. Give ``capacity`` or ``fraction_of_free`` (of free HBM at start)."""
    capacity: Union[int, str] = 0
    fraction_of_free: float = 0.0
    device: str = "cuda"
    slot_size: Union[int, str] = "auto"

    def __post_init__(self) -> None:
        self._normalise(capacity=parse_size)
        if self.slot_size != "auto":
            self._normalise(slot_size=parse_size)
        if self.slot_size != "auto" and self.slot_size <= 0:
            raise ValueError("`slot_size`: must be positive")
        if not 0.0 <= self.fraction_of_free <= 0.95:
            raise ValueError("`fraction_of_free`: must be between 0 and 0.95")
        if not self.capacity and not self.fraction_of_free:
            raise ValueError("`capacity`: the hbm tier needs capacity or fraction_of_free")


class LmdbTierConfig(_Section, tag="lmdb", tag_field="kind"):
    """LMDB on local SSD: checksummed pages that survive restarts."""
    path: str = ""  # default: <cache dir>/lmdb
    # Budget for page bytes in the extent file (rounded up to 4 KiB each; preallocated as it fills).
    capacity: Union[int, str] = "64GiB"
    # fsync the page bytes, then the index, at every batch commit. Off (the default, as SGLang's own
    # file backend never fsyncs): a killed process loses nothing; a machine crash may lose recent
    # pages (they fail their checksum) or damage the index, which the tier then moves aside and
    # starts empty (it is a cache).
    sync: bool = False
    # LMDB ``writemap`` for the index (key -> extent, size, checksum); page bytes never pass
    # through LMDB's map. Damage either way is caught by the checksums and the open-time probe.
    writemap: bool = True
    # How page bytes reach the disk: "auto" writes through the page cache while the kernel takes
    # them faster than the disk would (the put returns at memory speed, reads of them are warm)
    # and with O_DIRECT once the kernel throttles the writer, as measured per batch
    # (``tiers/ssd/write_route``: the disk's own speed, no writeback in between);
    # "direct" always uses O_DIRECT, "buffered" never. O_DIRECT needs 4 KiB-aligned segments
    # (SGLang's host pool has them) and a file system that has it (tmpfs does not); other pages are
    # written through the page cache whatever this says.
    direct_io: Literal["auto", "direct", "buffered"] = "auto"
    max_readers: int = 256

    def __post_init__(self) -> None:
        # Expanded here, the one place the path is parsed: the tier, ``config check`` and the
        # built-in's ``ssd_offload_path`` all see the directory the tier will write, not ``./~``.
        self._normalise(capacity=parse_size, path=os.path.expanduser)
        if self.capacity < (1 << 20):
            raise ValueError("`capacity`: must be at least 1MiB")
        if not 1 <= self.max_readers <= 65536:  # LMDB's lock file has a slot per reader
            raise ValueError(f"`max_readers`: must be between 1 and 65536, got {self.max_readers}")


class PoolTierConfig(_Section, tag="pool", tag_field="kind"):
    """Our pooled DRAM store (``mooncake-sgl pool``), one or more endpoints."""
    endpoints: list[str] = msgspec.field(default_factory=lambda: ["127.0.0.1:7480"])
    transport: Literal["auto", "shm", "tcp", "rdma"] = "auto"
    # The tenant this deployment is on a multi-tenant pool ("" = the pool's single tenant), and
    # that tenant's secret.
    tenant: str = ""
    secret: str = ""
    connections: int = 4
    timeout: Union[float, str] = "5s"
    # A stopped (not dead) pool accepts connections but never answers, and a resolver whose DNS
    # is down takes its own time: resolving, connecting and the handshake must finish within
    # ``connect_timeout``, and a read's reply must start within ``first_byte_timeout``, or the
    # endpoint is skipped for ``retry_after``.
    connect_timeout: Union[float, str] = "1s"
    first_byte_timeout: Union[float, str] = "1s"
    retry_after: Union[float, str] = "2s"  # how long a dead endpoint is skipped before a retry

    def __post_init__(self) -> None:
        self._normalise(timeout=parse_duration, retry_after=parse_duration,
                        connect_timeout=parse_duration, first_byte_timeout=parse_duration)
        if not self.endpoints:
            raise ValueError("`endpoints`: the pool tier needs at least one endpoint")
        for ep in self.endpoints:
            try:
                parse_endpoint(ep)
            except ValueError as e:
                raise ValueError(f"`endpoints`: {e}") from None
        if not 1 <= self.connections <= 64:
            raise ValueError("`connections`: must be between 1 and 64")
        for name in ("timeout", "connect_timeout", "first_byte_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}`: must be longer than 0")


class MooncakeStoreTierConfig(_Section, tag="mooncake_store", tag_field="kind"):
    """The real Mooncake Store (master + transfer engine) as the remote tier."""
    # ``host:port`` of the master, or ``etcd://h1:2379;h2:2379`` to follow the leader of an HA set.
    master: str = "127.0.0.1:50051"
    # Transfer-engine metadata: P2PHANDSHAKE, http://master:8080/metadata, etcd://..., redis://...
    metadata_server: str = "P2PHANDSHAKE"
    protocol: Literal["tcp", "rdma"] = "tcp"
    device: str = ""  # RDMA NICs, e.g. "mlx5_0,mlx5_1"; empty: auto-discover
    local_hostname: str = "127.0.0.1"  # this node's address as the other nodes reach it
    # What this process contributes to the cluster's pool: 0 (a pure client) or at least 16MiB.
    segment_size: Union[int, str] = "4GiB"
    # Registered staging buffer for pages outside registered memory; also the largest such page.
    buffer_size: Union[int, str] = "256MiB"
    replicas: int = 1
    # Mooncake tenant (``setup(tenant_id=...)``): on a master with ``--enable_multi_tenants`` each
    # tenant sees only its own objects and has its own quota.
    tenant_id: str = "default"
    soft_pin_ttl: Union[float, str] = 0.0  # for pinned prefixes; 0 = never soft pin
    put_retry_window: Union[float, str] = "2s"  # back-off window on "no space" before giving up
    # Once the master's endpoint answers again: how long the client may take to recover by itself
    # before a fresh setup (which freezes the process for Mooncake's 2-7 s close; see the guide).
    reconnect_after: Union[float, str] = "10s"

    def __post_init__(self) -> None:
        self._normalise(segment_size=parse_size, buffer_size=parse_size,
                        soft_pin_ttl=parse_duration, put_retry_window=parse_duration,
                        reconnect_after=parse_duration)
        if self.replicas < 1:
            raise ValueError("`replicas`: must be at least 1")
        if not self.tenant_id.strip():
            raise ValueError("`tenant_id`: must not be empty (Mooncake's own is `default`)")
        if 0 < self.segment_size < (16 << 20):
            raise ValueError("`segment_size`: must be 0 (contribute nothing) or at least 16MiB "
                             "(Mooncake's smallest segment)")
        if self.buffer_size < (1 << 20):
            raise ValueError("`buffer_size`: must be at least 1MiB")


def tier_kind(config: msgspec.Struct) -> str:
    """The ``kind`` a tier section was tagged with in YAML (``host``, ``lmdb``, ...)."""
    return config.__struct_config__.tag


TierConfig = Union[HbmTierConfig, HostTierConfig, PoolTierConfig, MooncakeStoreTierConfig,
                   LmdbTierConfig]


# --------------------------------------------------------------------------------------- policy

class PinConfig(_Section):
    """Keep the pages of a prefix (e.g. a system prompt) in fast tiers for ``ttl``."""
    prefix_hash: str  # SGLang page hash of the first page of the pinned prefix
    ttl: Union[float, str] = "1h"

    def __post_init__(self) -> None:
        self._normalise(ttl=parse_duration)


# Knobs only the heat policy reads: set with another policy they would be silently ignored.
HEAT_ONLY = ("sketch", "half_life", "admission_min_hits", "admission_min_reuse", "demotion_min_hits",
             "promotion_min_hits", "probation_fraction")


class PolicyConfig(_Section):
    """Placement policy: ``adaptive`` (the default: evicts as whichever of LRU/ARC/LIRS/LFU-DA its
    shadow caches rate best, per tier), ``heat`` (decayed frequency, prefix-aware, admission filter
    for slow tiers) or the ``lru`` baseline. docs/replay_hit_ratio.md compares them."""
    name: Literal["adaptive", "heat", "lru"] = "adaptive"
    # Heat estimator: ``count_min`` (count-min sketch of byte counters saturating at 15, halved
    # every 10 accesses per page of capacity, so its memory horizon follows the cache size) or
    # ``decay`` (exponentially decayed counters with ``half_life``). Both are fixed-size;
    # docs/replay_hit_ratio.md compares them.
    sketch: Literal["count_min", "decay"] = "count_min"
    # Half-life of access heat in logical seconds; only the ``decay`` sketch has one (10m when
    # unset), and setting it for ``count_min`` is an error rather than a silently ignored key.
    half_life: Union[float, str, None] = None
    # Heat a page needs before it is written to a slower tier (DRAM pool, SSD); 1 = write-through.
    admission_min_hits: int = 2
    # Colder pages are written to a slower tier anyway while at least this share of them is looked
    # up again within that tier's residence time (measured online); 1.0 = never, 0.0 = always.
    admission_min_reuse: float = 0.1
    # Heat a victim of a tier needs to be moved down a tier instead of dropped.
    demotion_min_hits: int = 2
    # Heat a page found in a slower tier needs to be copied back into tier 0.
    promotion_min_hits: int = 2
    # Starting share of each tier for newcomers not yet reused; it then adapts to the workload.
    probation_fraction: float = 0.1
    pins: list[PinConfig] = msgspec.field(default_factory=list)
    # A capacity curve per bounded tier: the hit ratio it would have had at 1/8x to 8x its size
    # (``policy/curve.py``; ``/metrics``, ``mooncake-sgl stats``). They run in a process of their
    # own per rank (``policy/curve_process.py``): the server pays about a microsecond per lookup,
    # that process tens of MiB and the CPU docs/capacity_curves.md measures. Off by default: a
    # process per rank is the operator's choice.
    capacity_curves: bool = False

    def __post_init__(self) -> None:
        if self.name != "heat":
            defaults = {f.name: f.default for f in msgspec.structs.fields(PolicyConfig)}
            stray = [k for k in HEAT_ONLY if getattr(self, k) != defaults[k]]
            if stray:
                raise ValueError(f"{', '.join(f'`{k}`' for k in stray)}: only the heat policy uses "
                                 f"{'this' if len(stray) == 1 else 'these'}, and the policy is "
                                 f"`{self.name}`; add `name: heat` to the policy section, or remove "
                                 f"{'it' if len(stray) == 1 else 'them'}")
        if self.pins and self.name == "lru":
            raise ValueError("`pins`: the lru policy keeps no pins, so they would be silently ignored; "
                             "use `name: adaptive` or `name: heat`, or remove them")
        if self.half_life is not None and self.sketch != "decay":
            raise ValueError("`half_life`: only the decay sketch has a half-life; remove it or set "
                             "`sketch: decay`")
        if self.sketch == "decay":
            self._normalise(half_life=lambda v: parse_duration("10m" if v is None else v))
            if self.half_life <= 0:
                raise ValueError("`half_life`: must be positive")
        for name in ("admission_min_hits", "demotion_min_hits", "promotion_min_hits"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0.0 <= self.admission_min_reuse <= 1.0:
            raise ValueError("admission_min_reuse must be between 0 and 1")
        if not 0.0 < self.probation_fraction < 1.0:
            raise ValueError("probation_fraction must be between 0 and 1 (exclusive)")


class LoadGateConfig(_Section):
    """Whether a storage hit is reported only as far as loading it beats recomputing it
    (``policy/load_gate.py``, docs/tiers.md#the-load-gate)."""
    enabled: bool = True
    # A hit's pages are reported only while their expected load time times this stays under the
    # time recomputing their tokens takes: at 1.25 a tier must read a quarter faster than the server
    # computes, to cover what the rates' estimates miss.
    margin: float = 1.25

    def __post_init__(self) -> None:
        if not 1.0 <= self.margin <= 100.0:
            raise ValueError(f"`margin`: {self.margin} is not between 1 and 100 (a factor on the "
                             "expected load time)")


# ---------------------------------------------------------------------------------------- store

def _default_tiers() -> list[TierConfig]:
    return [HostTierConfig(), LmdbTierConfig()]


class StoreConfig(_Section):
    """What ``--hicache-storage-backend-extra-config`` holds."""
    tiers: list[TierConfig] = msgspec.field(default_factory=_default_tiers)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    # Tenant tag in every key: deployments with different tags never share pages.
    namespace_tag: str = ""
    # ``local``: pages in this instance's own tiers (host DRAM, SSD) are announced on SGLang's KV
    # event stream (``--kv-events-config``) as medium DISK, for KV-aware routers
    # (``hicache/router_events.py``, docs/routing.md). ``off``: nothing is announced.
    router_events: Literal["off", "local"] = "off"
    load_gate: LoadGateConfig = msgspec.field(default_factory=LoadGateConfig)

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("`tiers`: at least one tier is required")
        kinds = [tier_kind(t) for t in self.tiers]
        for kind in set(kinds):
            if kinds.count(kind) > 1 and kind != "pool":
                raise ValueError(f"tier kind '{kind}' is configured more than once")
        ranks = [TIER_SPEED[k] for k in kinds]
        if ranks != sorted(ranks):
            raise ValueError(f"tiers must be listed fastest first ({_speed_order()}); got {kinds}")
