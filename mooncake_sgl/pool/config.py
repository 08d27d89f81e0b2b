"""``PoolServerConfig``: what ``mooncake-sgl pool --config FILE`` reads (YAML or JSON).

Example::

    host: 127.0.0.1        # bind address; 0.0.0.0 only with a secret on a trusted network
    port: 7480             # 0 picks a free port (printed in the READY line)
    capacity: 16GiB
    secret: "change-me"    # clients must prove it (HMAC) before any page moves

or, several tenants kept apart (each its own segment, credentials and key space)::

    capacity: 24GiB        # the most all tenants' segments together may take
    tenants:
      - {name: team-a, secret: "...", capacity: 16GiB}
      - {name: team-b, secret: "...", capacity: 8GiB}
"""

from __future__ import annotations

import logging
from typing import Union

import msgspec

from ..config import _Section, parse_duration, parse_size
from ..config_text import load_config_file, parse_config
from ..transfer import protocol as P
from .allocator import ALIGN

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class TenantConfig(_Section):
    """One tenant: its name (what its clients send), its secret and its segment's size."""
    name: str
    secret: str
    capacity: Union[int, str]

    def __post_init__(self) -> None:
        self._normalise(capacity=parse_size)
        if not self.name or len(self.name) > 128 or not self.name.isprintable():
            raise ValueError("`name`: a tenant needs a printable name of 1 to 128 characters")
        if not self.secret:
            raise ValueError("`secret`: every tenant needs its own non-empty secret")


class PoolServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 7480
    # DRAM segment size; rounded down to whole slabs. With ``tenants``: the most their segments may
    # take together.
    capacity: Union[int, str] = "4GiB"
    # Slabs are carved into equal slots per page size; the largest page the pool takes.
    slab_size: Union[int, str] = "32MiB"
    # Background eviction starts above ``high_watermark`` of capacity and stops at ``low_watermark``.
    high_watermark: float = 0.95
    low_watermark: float = 0.90
    # How long a put waits for room when every page is leased or being written, before its pages
    # are reported not stored.
    put_wait: Union[float, str] = "2s"
    # The single tenant's secret; empty = no authentication. Exclusive with ``tenants``.
    secret: str = ""
    # Tenants kept apart: each gets its own segment, secret and key space (see docs/pool.md).
    tenants: list[TenantConfig] = msgspec.field(default_factory=list)
    # Same-host clients get the segment over an abstract Unix socket (shared-memory transport).
    shared_memory: bool = True
    # Offer RDMA (pyverbs) on this device when present; "" = first device found, "off" = never.
    rdma_device: str = "off"
    # Pre-fault the segment at start (seconds per GiB at start; no page faults afterwards).
    populate: bool = True
    max_frame_bytes: Union[int, str] = P.DEFAULT_MAX_DATA_BYTES
    max_meta_bytes: Union[int, str] = P.DEFAULT_MAX_META_BYTES
    max_batch: int = P.DEFAULT_MAX_BATCH
    max_connections: int = 1024
    # Connections still in their handshake at once; past it the oldest one is dropped, so
    # clients that never authenticate cannot crowd out those that do.
    max_handshakes: int = 64
    # The whole handshake (hello to HELLO_OK) must finish within this.
    handshake_timeout: Union[float, str] = "5s"
    # A request, once its first byte arrived, must arrive completely (and its reply be taken)
    # within this, plus the time its data needs at 16 MiB/s.
    request_timeout: Union[float, str] = "30s"
    # An authenticated connection that sends nothing for this long is closed (clients reconnect).
    idle_timeout: Union[float, str] = "10m"
    # A reservation (RESERVE without COMMIT) or lease (LEASE without RELEASE) older than this is
    # void and its connection closed, so a stalled client cannot pin pages.
    hold_timeout: Union[float, str] = "30s"
    log_level: str = "INFO"
    # Serve Prometheus ``/metrics`` on this port of ``host`` (0 picks a free one); unset = off.
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        self._normalise(capacity=parse_size, slab_size=parse_size, put_wait=parse_duration,
                        max_frame_bytes=parse_size, max_meta_bytes=parse_size,
                        handshake_timeout=parse_duration, request_timeout=parse_duration,
                        idle_timeout=parse_duration, hold_timeout=parse_duration)
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"`metrics_port`: must be 0..65535, got {self.metrics_port}")
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"`metrics_port`: {self.metrics_port} is also `port`; give /metrics a "
                             "port of its own")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"`port`: must be 0..65535, got {self.port}")
        if self.slab_size < ALIGN or self.slab_size % ALIGN:
            raise ValueError(f"`slab_size`: must be a positive multiple of {ALIGN} (4KiB), "
                             f"got {self.slab_size}")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise ValueError("`low_watermark`: watermarks need 0 < low_watermark <= high_watermark <= 1")
        for t in self.tenants or [self]:
            if t.capacity < self.slab_size:
                where = f"tenant {t.name!r}: " if t is not self else ""
                raise ValueError(f"`capacity`: {where}{t.capacity} bytes must hold at least one "
                                 f"slab ({self.slab_size})")
        if self.tenants:
            if self.secret:
                raise ValueError("`secret`: with tenants, each tenant has its own secret; "
                                 "leave the top-level secret empty")
            names = [t.name for t in self.tenants]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"`tenants`: tenant name {dup[0]!r} is given more than once")
            total = sum(t.capacity for t in self.tenants)
            if total > self.capacity:
                raise ValueError(f"`capacity`: the tenants' capacities add up to {total} bytes, "
                                 f"more than capacity ({self.capacity})")
        if self.max_frame_bytes < self.slab_size:
            raise ValueError(f"`max_frame_bytes`: must be at least slab_size ({self.slab_size}), "
                             "or a page the pool takes could never be sent over TCP")
        if self.put_wait >= self.request_timeout:
            raise ValueError(f"`put_wait`: must be shorter than request_timeout "
                             f"({self.request_timeout}s): a PUT waiting for room is a request too")
        if self.max_meta_bytes < P.HANDSHAKE_MAX_META:
            raise ValueError(f"`max_meta_bytes`: must be at least {P.HANDSHAKE_MAX_META}")
        for name in ("max_batch", "max_connections", "max_handshakes"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}`: must be at least 1, got {getattr(self, name)}")
        for name in ("handshake_timeout", "request_timeout", "idle_timeout", "hold_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}`: must be longer than 0 (a server that times out at "
                                 "once serves no one)")
        if self.log_level.upper() not in LOG_LEVELS or not isinstance(
                logging.getLevelName(self.log_level.upper()), int):
            raise ValueError(f"`log_level`: must be one of {', '.join(LOG_LEVELS)}, got "
                             f"{self.log_level!r}")


def load_pool_config(path: str | None = None, overrides: dict | None = None) -> PoolServerConfig:
    """The file's config (or defaults) with command-line ``overrides`` applied on top."""
    base = load_config_file(path, PoolServerConfig) if path else PoolServerConfig()
    if not overrides:
        return base
    data = msgspec.to_builtins(base)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return parse_config(data, path or "<command line>", PoolServerConfig)
