"""``PoolServerConfig``: what ``mooncake-sgl pool --config FILE`` reads (YAML or JSON).

Example::

    host: 127.0.0.1        # bind address; 0.0.0.0 only with a secret on a trusted network
    port: 7480             # 0 picks a free port (printed in the READY line)
    capacity: 16GiB
    secret: "change-me"    # clients must prove it (HMAC) before any page moves
"""

from __future__ import annotations

from typing import Union

from ..config import _Section, load_config_file, parse_config, parse_duration, parse_size
from ..transfer import protocol as P


class PoolServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = 7480
    # DRAM segment size; rounded down to whole slabs.
    capacity: Union[int, str] = "4GiB"
    # Slabs are carved into equal slots per page size; the largest page the pool takes.
    slab_size: Union[int, str] = "32MiB"
    # Background eviction starts above ``high_watermark`` of capacity and stops at ``low_watermark``.
    high_watermark: float = 0.95
    low_watermark: float = 0.90
    # How long a put waits for room when every page is leased or being written, before its pages
    # are reported not stored.
    put_wait: Union[float, str] = "2s"
    secret: str = ""
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
    # A connection that does not finish its handshake within this is dropped.
    handshake_timeout: Union[float, str] = "5s"
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        self._normalise(capacity=parse_size, slab_size=parse_size, put_wait=parse_duration,
                        max_frame_bytes=parse_size, max_meta_bytes=parse_size,
                        handshake_timeout=parse_duration)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise ValueError("watermarks need 0 < low_watermark <= high_watermark <= 1")
        if self.capacity < self.slab_size:
            raise ValueError(f"capacity ({self.capacity}) must hold at least one slab ({self.slab_size})")
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")


def load_pool_config(path: str | None = None, overrides: dict | None = None) -> PoolServerConfig:
    """The file's config (or defaults) with command-line ``overrides`` applied on top."""
    import msgspec

    base = load_config_file(path, PoolServerConfig) if path else PoolServerConfig()
    if not overrides:
        return base
    data = msgspec.to_builtins(base)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return parse_config(data, path or "<command line>", PoolServerConfig)
