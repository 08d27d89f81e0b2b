"""What the tests, benchmarks and scripts need and a serving host does not: kept out of the wheel.

- ``bench/``              live-server benchmarks: workloads, the SGLang client, server variants
                          and ``sglang.launch_server``, results tables, the benchmark CLIs.
- ``e2e/``                the CPU end-to-end rig: SGLang's real ``HiCacheController`` and pools
                          driving our backend without a GPU (``scripts/run_e2e_cpu.py``).
- ``testing/``            helpers that start real services: ``MooncakeMaster``, ``PoolProcess``, the
                          network-namespace ``Cluster`` and its faults, PD deployments, the ports
                          and life cycle they share (``procs``), and ``hybrid_pools`` (SGLang's
                          hybrid host pools, a test fixture); it launches servers through ``bench``.
- ``tiny_model``          the tiny seeded Llama every live test and benchmark serves (``bench`` and
                          ``testing`` both use it, so it belongs to neither).
- ``dashcheck``           the Grafana dashboard against a real Prometheus scraping a live store.
- ``metrics_overhead``    the store's put/get with metrics off vs on, in a child process.

Imported from a checkout: pytest puts the repository root on ``sys.path`` (``pythonpath`` in
pyproject.toml), every script in ``scripts/`` inserts it first, and processes the tests spawn get it
in ``PYTHONPATH``. Nothing in ``mooncake_sgl`` imports from here.
"""
