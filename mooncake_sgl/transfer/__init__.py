"""Moving pages between a client and a pool server, both ends of the wire.

- ``protocol``  the frames and messages (the pool server in ``pool`` speaks it too).
- ``tcp``       stream sockets (TCP and Unix): exact receives into page memory, scatter-gather sends.
- ``shm``       the server's shared segment, mapped by a client on the same host.
- ``rdma``      RDMA through pyverbs (never run on hardware).
- ``client``    ``PoolClient``: batch put/get/exists against one endpoint over the best transport.

The store's tier over ``PoolClient`` is ``tiers.pool.PoolTier``; the server is the ``pool`` package
(its docstring says why the three are apart).
"""
