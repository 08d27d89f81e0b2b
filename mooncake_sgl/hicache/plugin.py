"""The ``sglang.srt.plugins`` entry point: makes ``--hicache-storage-backend mooncake`` ours.

SGLang runs every entry point of that group once per process (``load_plugins()`` at the top of the
scheduler, the engine, the detokenizer), and schedulers are spawned, so registering from the parent
process alone would not reach them. ``pyproject.toml`` declares this one entry point and nothing
else (no ``sglang.srt.platforms`` entry: when ``SGLANG_PLATFORM`` selects a platform, SGLang skips
the general plug-ins of every distribution that offers another one)::

    [project.entry-points."sglang.srt.plugins"]
    mooncake_sgl = "mooncake_sgl.hicache.plugin:register"

If ``SGLANG_PLUGINS`` whitelists plugins, it must include ``mooncake_sgl``. What the call changes in
SGLang is ``touch_points.POINTS`` of ``Phase.PLUGINS``, and nothing else.
"""

from __future__ import annotations

import logging

from .. import envs
from . import touch_points
from .touch_points import TouchPoint

logger = logging.getLogger(__name__)

BACKEND_NAME = "mooncake"
BACKEND_MODULE = "mooncake_sgl.hicache.backend"
BACKEND_CLASS = "MooncakeSglStorage"

REUSE_TE_ENV = envs.SGLANG_HICACHE_MOONCAKE_REUSE_TE.name


def register() -> None:
    """Apply this package's touch points of ``load_plugins()`` in this process. Idempotent.

    Other effects of the backend's name, handled or harmless:

    - the host pool allocator becomes ``MooncakeHostTensorAllocator``, which falls back to SGLang's
      default mmap allocator when ``mooncake.store`` cannot be imported;
    - the zero-copy ``batch_get_v1``/``batch_set_v1`` path is used (implemented);
    - ``layer_first`` is rewritten to ``page_first``/``page_first_direct`` (all are supported).
    """
    touch_points.apply(touch_points.POINTS, touch_points.Phase.PLUGINS)


def register_backend(_point: TouchPoint) -> bool:
    """``MooncakeSglStorage`` under the backend name ``mooncake``; the class is loaded lazily by
    SGLang's factory when a backend is created. True if registered now."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    # ``_registry`` is the factory's private table, no declared field: without it, register anew.
    entry = getattr(StorageBackendFactory, "_registry", {}).get(BACKEND_NAME, {})
    if (entry.get("module_path"), entry.get("class_name")) == (BACKEND_MODULE, BACKEND_CLASS):
        return False
    StorageBackendFactory.register_backend(BACKEND_NAME, BACKEND_MODULE, BACKEND_CLASS)
    logger.info("mooncake_sgl: HiCache storage backend '%s' is %s.%s", BACKEND_NAME,
                BACKEND_MODULE, BACKEND_CLASS)
    return True


def no_shared_transfer_engine(_point: TouchPoint) -> bool:
    """``SGLANG_HICACHE_MOONCAKE_REUSE_TE=0`` unless the operator set it. True if set now."""
    if envs.SGLANG_HICACHE_MOONCAKE_REUSE_TE.is_set():
        return False
    envs.SGLANG_HICACHE_MOONCAKE_REUSE_TE.set_default(0)
    return True
