"""The parts of ``scripts/bench_regimes.py``: where the choice of HiCache storage backend decides.

- ``budget``    the working set of a workload in KV bytes, and the DRAM and disk each backend gets.
- ``schedule``  the runs, interleaved A B C C B A per regime and shape, and their seeds.
- ``workload``  the chat and long-document shapes, and the round-robin client that drives them.
- ``backends``  each backend's flags, environment and config files for a budget; Lifeboat's install.
- ``metrics``   SGLang's found / loaded / served counters from ``/metrics``.
- ``rig``       one run: its processes (master, pool, servers, router), phases and restart.
- ``report``    per-run records, greedy outputs compared across runs, the tables and the plot.

Nothing here imports sglang: servers run in their own processes.
"""
