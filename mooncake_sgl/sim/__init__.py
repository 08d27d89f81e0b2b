"""Trace-driven simulation of placement policies (no bytes moved, no tiers): trace readers, a second
synthetic workload, reference policies (ARC, Belady) and the simulator that drives a ``PlacementPolicy``
exactly as ``TieredStore`` does."""
