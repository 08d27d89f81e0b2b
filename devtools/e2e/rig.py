"""SGLang's real HiCache pieces, built on a CPU-only machine, with our backend attached.

What is real here (sglang 0.5.23 classes, unmodified):

- ``MHATokenToKVPool`` (the "device" KV pool, on ``device="cpu"``) and ``PagedTokenToKVPoolAllocator``;
- ``MHATokenToKVPoolHost``, the host (L2) pool, ``page_first`` layout, built from the device pool's
  ``MHABufferInfo`` with the allocator SGLang picks for the backend name ``mooncake``;
- ``HiCacheController`` with ``storage_backend="mooncake"``: it creates our backend through
  ``StorageBackendFactory`` (registered by ``load_plugins()`` from our entry point), registers the
  host pool, selects the zero-copy ``batch_get_v1``/``batch_set_v1`` path by name, and runs its own
  four storage threads (hit query over ``get_storage_hash_str`` in chunks of 128, prefetch IO in
  batches of 128, prefetch ack sync, backup).

Single rank: the parallel widths SGLang's scheduler would publish are stated with
``get_parallel().override_permanently`` (tp=pp=dcp=1), so no process group is needed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch

from .workload import KvShape

logger = logging.getLogger(__name__)

BACKEND_NAME = "mooncake"


def _publish_single_rank() -> None:
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                        attn_dcp_rank=0, attn_dcp_size=1)


def ensure_backend_registered() -> str:
    """Run SGLang's ``load_plugins()`` and return the class registered as ``mooncake``.

    Raises ``RuntimeError`` when our entry point did not take the name (package not installed).
    The rig drives SGLang's pools on this CPU, so it asks for the CPU adaptations (an operator's
    own setting of the switch wins), before sglang is first imported.
    """
    from mooncake_sgl import envs

    envs.MOONCAKE_SGL_CPU_ADAPTATIONS.set_default(1)
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.plugins import load_plugins

    load_plugins()
    entry = StorageBackendFactory._registry.get(BACKEND_NAME, {})
    target = f"{entry.get('module_path')}.{entry.get('class_name')}"
    if not target.startswith("mooncake_sgl."):
        raise RuntimeError(f"backend '{BACKEND_NAME}' is {target} after load_plugins(); install this "
                           "package (pip install -e .) so its sglang.srt.plugins entry point runs")
    return target


@dataclass
class Rig:
    """The SGLang objects of one run. ``close()`` detaches (and so closes) our backend."""
    shape: KvShape
    device_pool: Any
    allocator: Any
    host_pool: Any
    controller: Any
    backend_class: str

    @property
    def backend(self) -> Any:
        return self.controller.storage_backend

    @property
    def host_capacity_pages(self) -> int:
        return int(self.host_pool.size) // self.shape.page_size

    def page_regions(self, first_slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V regions of the host page starting at slot ``first_slot`` (page_first)."""
        ps = self.shape.page_size
        kv = self.host_pool.kv_buffer
        return kv[0, first_slot:first_slot + ps], kv[1, first_slot:first_slot + ps]

    def close(self) -> None:
        # SGLang's own teardown: stops the four storage threads, then closes our backend.
        self.controller.detach_storage_backend()


def build_rig(shape: KvShape, host_pool_pages: int, extra_config: dict[str, Any],
              prefetch_threshold: int = 256, model_name: str = "e2e/llama-3-8b-shape") -> Rig:
    """Build pools and the controller; our backend is created inside the controller's attach.

    ``host_pool_pages`` sizes SGLang's host (L2) pool; the device pool is one page, as L1 plays no
    part (the run models a flushed device cache).
    """
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    from mooncake_sgl.hicache.page_hash import load_page_hash

    backend_class = ensure_backend_registered()
    load_page_hash()  # a missing toolchain fails here, with what to install, not as a warning
    _publish_single_rank()
    ps = shape.page_size
    device_tokens = ps
    device_pool = MHATokenToKVPool(size=device_tokens, page_size=ps, dtype=shape.dtype,
                                   head_num=shape.kv_heads, head_dim=shape.head_dim,
                                   layer_num=shape.layers, device="cpu", enable_memory_saver=False)
    allocator = PagedTokenToKVPoolAllocator(size=device_tokens, page_size=ps, dtype=shape.dtype,
                                            device="cpu", kvcache=device_pool, need_sort=False)
    host_tokens = host_pool_pages * ps
    # SGLang sizes the host pool as device tokens x ratio (plus one padding page); state it that
    # way. The budget scope replaces SGLang's "free RAM minus 10 GiB" check, meant for servers.
    with host_memory_budget_scope(host_tokens * shape.token_bytes + (1 << 30)):
        host_pool = MHATokenToKVPoolHost(
            device_pool._mha_buffer_info(), host_to_device_ratio=host_tokens / device_tokens,
            host_size=0, page_size=ps, layout="page_first", pin_memory=False, device="cpu",
            allocator_type=BACKEND_NAME, device_capacity_tokens=device_tokens, start_layer=0,
            end_layer=shape.layers)
    controller = HiCacheController(
        allocator, host_pool, ps, tp_group=None, load_cache_event=threading.Event(),
        write_policy="write_through", io_backend="direct", storage_backend=BACKEND_NAME,
        prefetch_threshold=prefetch_threshold, model_name=model_name,
        storage_backend_extra_config=dict(extra_config), enable_storage_metrics=True)
    if controller.page_get_func != controller._page_get_zero_copy:
        raise RuntimeError("SGLang did not select the zero-copy v1 path for backend 'mooncake'")
    logger.info("rig: backend %s, host pool %d pages of %d bytes", backend_class,
                int(host_pool.size) // ps, shape.page_bytes)
    return Rig(shape=shape, device_pool=device_pool, allocator=allocator, host_pool=host_pool,
               controller=controller, backend_class=backend_class)
