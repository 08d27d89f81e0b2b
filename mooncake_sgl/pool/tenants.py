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

import hmac
import logging
import os
from dataclasses import dataclass

from ..errors import AuthError
from ..transfer import protocol as P
from ..transfer.shm import Segment
from .config import PoolServerConfig
from .index import PoolIndex

log = logging.getLogger(__name__)

# The one answer to every failed handshake (see ``authenticate``). It names every cause, so an
# operator knows where to look, and keeps the words clients and scripts have matched on.
REFUSED = ("authentication failed: this pool requires a shared secret and the client presented "
           "none, a wrong shared secret, or an unknown tenant")
# What an unknown tenant's MAC is checked against: random, so no client can ever prove it.
_DUMMY_SECRET = os.urandom(32).hex()

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
    """The tenant whose secret ``hello`` proves, else ``AuthError``.

    Every refusal says ``REFUSED``, whether the tenant is unknown, the MAC wrong or none was
    presented, and costs the same work: a MAC is computed and compared in constant time for each,
    against a dummy secret for an unknown tenant. So neither the answer nor its timing tells which
    tenant names exist. Only the server's log says which it was."""
    tenant = tenants.get(hello.tenant)
    if tenant is None and len(tenants) == 1 and "" in tenants and not tenants[""].secret:
        # A pool without a secret lets anyone in as its one tenant, so naming it hides nothing.
        raise AuthError(f"this pool has no tenant {hello.tenant!r} (it serves one, unnamed)")
    if tenant is not None and not tenant.secret:
        return tenant
    secret = tenant.secret if tenant is not None else _DUMMY_SECRET
    if hmac.compare_digest(P.auth_mac(secret, nonce, hello.tenant), hello.mac) and tenant is not None:
        return tenant
    why = "unknown tenant" if tenant is None else "wrong MAC" if hello.mac else "no MAC presented"
    log.info("handshake for tenant %r refused: %s", hello.tenant, why)
    raise AuthError(REFUSED)
