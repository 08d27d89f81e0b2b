#!/usr/bin/env python3
"""Long-context benchmark against live SGLang: shared 8k-128k-token documents, many questions each.

Needs a GPU host with SGLang (not run in this repository's CI, which has no GPU). Example:
  python scripts/bench_long_context.py --launch --tiers configs/host_lmdb.yaml --docs 4 --max-doc-tokens 65536
See ``--help`` and mooncake_sgl/bench/runner.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mooncake_sgl.bench.runner import long_context_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(long_context_main())
