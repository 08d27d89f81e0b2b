"""Trace-driven simulation of placement policies: trace readers, seeded workload generators (chat,
agent loops, RAG), reference policies (ARC, LIRS, LFU-DA, Belady) and the simulator, which runs the
real ``TieredStore`` over zero-byte tiers that keep only page sizes (no bytes moved)."""
