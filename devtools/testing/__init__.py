"""Helpers that start real services for tests and benchmarks (``MooncakeMaster``; also
``pool_process.PoolProcess`` and ``procs``: the ports and life cycle of the servers we start;
``backend_record.store_stats``: the store's counters behind a backend)."""

from .mooncake_master import MasterStartError, MooncakeMaster, find_master_binary, free_port, ha_masters

__all__ = ["MasterStartError", "MooncakeMaster", "find_master_binary", "free_port", "ha_masters"]
