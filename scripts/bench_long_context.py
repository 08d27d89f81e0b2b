#!/usr/bin/env python3
"""Long-context benchmark against live SGLang: shared long documents, many questions each.

Runs on any host: with --launch it starts one live server per variant (on a host without a GPU,
CPU servers with a tiny random-weight Llama). Examples:
  python scripts/bench_long_context.py --launch                  # CPU or GPU host, embedded default tiers
  python scripts/bench_long_context.py --launch --tiers configs/full-stack.yaml --docs 4
  python scripts/bench_long_context.py --url http://127.0.0.1:30000  # a server already running
See ``--help`` and devtools/bench/runner.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.runner import long_context_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(long_context_main())
