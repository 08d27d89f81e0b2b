"""mooncake_sgl: a tiered KV-cache store for SGLang HiCache (``--hicache-storage-backend mooncake``).

Folders: ``hicache/`` the SGLang plug-in (the only code importing sglang); ``store/`` the tiered
page store; ``tiers/`` one module per storage medium, and ``tiers/ssd/`` the SSD tier's package;
``transfer/`` the pool's wire protocol, transports and client; ``pool/`` the pool server;
``policy/`` placement policies and capacity curves; ``metrics/`` Prometheus export, counters on
disk and ``mooncake-sgl stats``; ``doctor/`` ``mooncake-sgl doctor`` (why a storage hit did not
happen); ``sim/`` the trace simulator.

Modules: ``api`` the contracts (``Tier``, ``PlacementPolicy``); ``config`` the typed config,
``config_text`` its YAML/JSON read and written, ``builtin_config`` SGLang's built-in Mooncake
config read as the built-in reads it and ``builtin_translate`` that config translated into ours;
``config_sources`` which source a process's config comes from; ``keys`` the one key function;
``buffers`` views and copies over host memory; ``envs`` every environment variable; ``units``
sizes and durations; ``tally`` thread-safe typed counts; ``errors`` our exceptions;
``failure_log`` the one way a failure that became a miss is logged; ``memory`` the host's and the
container's memory headroom; ``cli`` the ``mooncake-sgl`` command.

Benchmarks, the end-to-end rig and test helpers are not in the package: ``devtools/`` of the
repository holds them.
"""

__version__ = "0.1.0"
