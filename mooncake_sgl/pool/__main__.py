"""``python -m mooncake_sgl.pool``: the same as ``mooncake-sgl pool``."""

import sys

from .cli import main

sys.exit(main())
