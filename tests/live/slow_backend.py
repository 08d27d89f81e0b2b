"""A backend for the doctor's prefetch-deadline scenario: ours, with every load taking a second
(a storage tier slower than the deadline SGLang gives a prefetch), so the deadline always wins.

Loaded by a live server through SGLang's ``dynamic`` backend (``tests/live/test_live_doctor.py``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mooncake_sgl.hicache.backend import MooncakeSglStorage

LOAD_SECONDS = 1.0


class SlowStorage(MooncakeSglStorage):
    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        time.sleep(LOAD_SECONDS)
        return super().batch_get_v1(keys, host_indices, extra_info)
