"""Helpers that start real services for tests and benchmarks (``MooncakeMaster``)."""

from .mooncake_master import MasterStartError, MooncakeMaster, find_master_binary, free_port, ha_masters

__all__ = ["MasterStartError", "MooncakeMaster", "find_master_binary", "free_port", "ha_masters"]
