"""The ``sglang.srt.plugins`` entry point: makes ``--hicache-storage-backend mooncake`` ours.

SGLang runs every entry point of that group once per process (``load_plugins()`` at the top of the
scheduler, the engine, the detokenizer), and schedulers are spawned, so registering from the parent
process alone would not reach them. ``pyproject.toml`` declares::

    [project.entry-points."sglang.srt.plugins"]
    mooncake_sgl = "mooncake_sgl.hicache.plugin:register"

If ``SGLANG_PLUGINS`` whitelists plugins, it must include ``mooncake_sgl``. Where the operator asks
for them (``MOONCAKE_SGL_CPU_ADAPTATIONS=1``, on a host without an accelerator), the same call applies
the adaptations of ``cpu.adaptations`` that a live CPU server needs; otherwise it changes nothing in
SGLang but the backend's name.
"""

from __future__ import annotations

import logging

from .. import envs
from . import weight_updates
from .cpu import adaptations as cpu_adaptations

logger = logging.getLogger(__name__)

BACKEND_NAME = "mooncake"
BACKEND_MODULE = "mooncake_sgl.hicache.backend"
BACKEND_CLASS = "MooncakeSglStorage"

# sglang 0.5.23 creates a shared Mooncake TransferEngine at bootstrap when the backend is named
# ``mooncake`` (``maybe_init_shared_mooncake_transfer_engine``) so that its built-in MooncakeStore
# can reuse it. Nothing of ours uses that engine, so it is turned off whether or not ``mooncake``
# is importable: without the package the bootstrap raises ImportError, and with it the engine
# initialises with MOONCAKE_PROTOCOL (default ``rdma``) and fails the start on hosts without RDMA.
# An explicit value set by the user still wins.
REUSE_TE_ENV = envs.SGLANG_HICACHE_MOONCAKE_REUSE_TE.name


def register() -> None:
    """Register ``MooncakeSglStorage`` under the backend name ``mooncake`` in this process.

    Idempotent. The class is loaded lazily by SGLang's factory when a backend is created.
    Other effects of the name, handled or harmless:

    - the host pool allocator becomes ``MooncakeHostTensorAllocator``, which falls back to SGLang's
      default mmap allocator when ``mooncake.store`` cannot be imported;
    - the zero-copy ``batch_get_v1``/``batch_set_v1`` path is used (implemented);
    - ``layer_first`` is rewritten to ``page_first``/``page_first_direct`` (all are supported);
    - SGLang's weight updates do not tell the storage backend; ``weight_updates`` hooks them
      (through SGLang's own plug-in hook registry) so that the key namespace follows the weights;
    - SGLang asks only instances of its ``MooncakeStore`` for ``describe_l3_object_layout``
      (``GET /get_hicache_l3_cache_layout``); ``backend.py`` registers our class as a virtual
      subclass so that our own answer is given.
    """
    envs.SGLANG_HICACHE_MOONCAKE_REUSE_TE.set_default(0)
    cpu_adaptations.apply()
    weight_updates.install()
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    entry = getattr(StorageBackendFactory, "_registry", {}).get(BACKEND_NAME, {})
    if (entry.get("module_path"), entry.get("class_name")) == (BACKEND_MODULE, BACKEND_CLASS):
        return
    StorageBackendFactory.register_backend(BACKEND_NAME, BACKEND_MODULE, BACKEND_CLASS)
    logger.info("mooncake_sgl: HiCache storage backend '%s' is %s.%s", BACKEND_NAME,
                BACKEND_MODULE, BACKEND_CLASS)
