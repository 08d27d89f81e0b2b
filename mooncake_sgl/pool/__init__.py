"""The pool server behind ``mooncake-sgl pool``: config, slab allocator, index with leases and
eviction (``store``), the server (``server``), its command line (``cli``) and a subprocess
helper for tests and benchmarks (``process``)."""
