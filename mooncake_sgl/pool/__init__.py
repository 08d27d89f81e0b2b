"""The pool server behind ``mooncake-sgl pool``: config, slab allocator, index with leases and
eviction (``store``), tenants with their own segment and index (``tenants``), connections and
their holds (``conn``, ``onesided``), turning away connections over the limit (``refuse``),
thread-safe counters (``counters``), the server (``server``), its command line (``cli``) and a
subprocess helper for tests and benchmarks (``process``)."""
