#!/usr/bin/env python3
"""Two live SGLang servers, requests alternating between them: one shared pool vs isolated tiers.

  python scripts/bench_two_instances.py --json two.json          # both scenarios, CPU or GPU host
  python scripts/bench_two_instances.py --scenario shared --conversations 16

See ``--help`` and devtools/bench/two_instances.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.two_instances import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
