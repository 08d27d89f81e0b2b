"""Tenants of a pool server: each one a segment, an index and a secret of its own.

Isolation is by construction, not by key prefixes: a connection is bound at its handshake to the
tenant whose secret it proved, and every request it makes reaches only that tenant's ``PoolIndex``
(so it can read, overwrite, remove or clear only that tenant's pages, and its stats count only
them) and, over shared memory or RDMA, only that tenant's segment (the memfd a same-host client
maps, the memory region a remote client's queue pair may touch). A single-tenant server (no
``tenants`` in its config) has one tenant named ``""`` with the top-level ``secret`` and
``capacity``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import AuthError
from ..transfer import protocol as P
from ..transfer.shm import Segment
from .config import PoolServerConfig
from .index import PoolIndex

# Share of a tenant's capacity one client process may hold reserved or leased at once, so a
# stalled client leaves the other half to everyone else. Arbitrary.
HOLD_SHARE = 0.5


@dataclass(frozen=True)
class Tenant:
    name: str
    secret: str
    segment: Segment
    index: PoolIndex

    @property
    def max_hold_bytes(self) -> int:
        # At least one slab: the largest page the pool takes must fit a one-sided put too.
        return max(int(self.segment.size * HOLD_SHARE), self.index.alloc.slab_size)


def build_tenants(cfg: PoolServerConfig) -> dict[str, Tenant]:
    """Allocate (and pre-fault) every tenant's segment; on failure free what was allocated."""
    specs = [(t.name, t.secret, t.capacity) for t in cfg.tenants] or [("", cfg.secret, cfg.capacity)]
    out: dict[str, Tenant] = {}
    try:
        for name, secret, capacity in specs:
            size = capacity // cfg.slab_size * cfg.slab_size
            segment = Segment(size, name=f"mooncake-sgl-pool-{name or 'default'}",
                              populate=cfg.populate)
            index = PoolIndex(size, cfg.slab_size, high_watermark=cfg.high_watermark,
                              low_watermark=cfg.low_watermark, put_wait=cfg.put_wait)
            out[name] = Tenant(name, secret, segment, index)
    except BaseException:
        for t in out.values():
            t.segment.close()
        raise
    return out


def authenticate(tenants: dict[str, Tenant], hello: P.ClientHello, nonce: bytes) -> Tenant:
    """The tenant whose secret ``hello`` proves, else ``AuthError``. An unknown tenant name gets
    the same answer as a wrong secret, so names cannot be probed without a secret."""
    tenant = tenants.get(hello.tenant)
    if tenant is None:
        if len(tenants) == 1 and "" in tenants and not tenants[""].secret:
            raise AuthError(f"this pool has no tenant {hello.tenant!r} (it serves one, unnamed)")
        raise AuthError("wrong shared secret (or unknown tenant)")
    P.check_auth(tenant.secret, nonce, hello.mac, hello.tenant)
    return tenant
