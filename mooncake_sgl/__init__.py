"""mooncake_sgl: a tiered KV-cache store for SGLang HiCache (``--hicache-storage-backend mooncake``).

Folders: ``hicache/`` the SGLang plug-in (the only code importing sglang); ``tiers/`` one module per
storage medium; ``transfer/`` wire protocol and transports to the pool; ``pool/`` the pool server;
``policy/`` placement policies; ``sim/`` the trace simulator. Contracts live in ``api.py``.
"""

__version__ = "0.1.0"
