"""The pool server behind ``mooncake-sgl pool``: one node's pooled DRAM, served to SGLang hosts.

- ``config``     ``PoolServerConfig``: the server's YAML, tenants, limits and timeouts.
- ``allocator``  the slab allocator over the shared segment.
- ``index``      ``PoolIndex``: which key lives at which offset, leases, eviction to a watermark.
- ``tenants``    each tenant's own segment, index and secret.
- ``conn``       one client connection and the holds it keeps (quarantined when it dies).
- ``onesided``   the shared-memory / RDMA path: reservations and leases the client copies through.
- ``refuse``     turning away connections over the limit, with a reason on the wire.
- ``accept``     who is let in (connection limits) and an accept loop that outlives failures.
- ``server``     ``PoolServer``: sockets, threads, the accept loop, each connection's handshake
                 and its wait between requests.
- ``requests``   one request of a connection: batch limits, the operation, the reply.
- ``metrics``    the server's Prometheus ``/metrics``.
- ``cli``        ``mooncake-sgl pool`` (serve, stats, health); ``__main__`` runs it as a module.

The pool's three parts live in three packages on purpose, split by which side of the wire runs
them: this package is the server; ``transfer`` is the wire both sides share (the protocol the
server also imports) and the client, ``transfer.client.PoolClient``; and ``tiers.pool.PoolTier``
is the store's tier over that client (rendezvous placement across servers, failure to misses),
beside every other tier. A serving host without a pool server runs no code of this package.
"""
