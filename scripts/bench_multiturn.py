#!/usr/bin/env python3
"""Multi-turn benchmark against live SGLang: growing conversations, caches flushed between turns.

Runs on any host: with --launch it starts one live server per variant (on a host without a GPU,
CPU servers with a tiny random-weight Llama). Examples:
  python scripts/bench_multiturn.py --launch --conversations 8 --turns 4
  python scripts/bench_multiturn.py --url http://127.0.0.1:30000 --conversations 16 --turns 5
See ``--help`` and devtools/bench/runner.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.runner import multiturn_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(multiturn_main())
