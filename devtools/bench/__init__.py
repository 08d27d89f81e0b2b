"""Live-server benchmarks against SGLang with and without our backend.

- ``workloads`` token-id long-context and multi-turn workloads, as rounds of requests.
- ``client``    streamed ``/generate`` with TTFT, ``/flush_cache``, storage clear, ``/health``.
- ``server``    variants (no HiCache, HiCache L2, ours on a tier set) and ``sglang.launch_server``.
- ``results``   per-round aggregation, the side-by-side table, text tables, the PNG plot.
- ``options``   command-line options several benchmark scripts share, the pass order, ``--json``.
- ``plot``      the two-panel bar plot of the cluster, PD and prefetch benchmarks.
- ``prefetch_report`` ``scripts/bench_prefetch.py``'s metrics reading, summaries and tables.
- ``round_robin`` conversations taking turns, each resending its history (the prefetch benchmark).
- ``transfer_contenders`` what ``scripts/bench_transfer.py`` times: pool, Mooncake Store, raw I/O.
- ``console``   progress lines and size formatting shared by every benchmark script.
- ``runner``    the long-context and multi-turn CLIs (``python -m devtools.bench``).
- ``two_instances`` two servers, one shared pool vs isolated tiers.
- ``ssd/``      the SSD tier's modes of ``scripts/bench_tiers.py``.

Nothing here imports sglang: the client only needs a server's URL.
"""
