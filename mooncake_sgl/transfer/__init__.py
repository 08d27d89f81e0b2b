"""Moving pages between a client and a pool server: the wire protocol (``protocol``), stream
sockets (``tcp``), the shared segment (``shm``), RDMA through pyverbs (``rdma``, never run on
hardware) and the batch client over all three (``client.PoolClient``)."""
