"""A backend for the negative control only: ours, but every page it loads is zeroed afterwards.

Loaded by a live server through SGLang's ``dynamic`` backend (``tests/live/test_live_serving.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from mooncake_sgl.hicache.backend import MooncakeSglStorage


class CorruptingStorage(MooncakeSglStorage):
    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        ok = super().batch_get_v1(keys, host_indices, extra_info)
        pool = self.mem_pool_host
        for i, loaded in enumerate(ok):
            if loaded:
                start = int(host_indices[i * pool.page_size])
                page = pool.get_data_page(start, flat=True)
                pool.set_from_flat_data_page(start, torch.zeros_like(page))
        return ok
