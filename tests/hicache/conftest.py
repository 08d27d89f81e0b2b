"""Fixtures for the SGLang adapter tests: real sglang 0.5.23 host pools on CPU and our backend.

sglang is imported once per session (about 10 s); its page-hash extension is JIT-built on first use
(needs g++, ninja and OpenSSL headers; cached under ~/.cache/torch_extensions afterwards).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

# sglang is a test requirement (scripts/bootstrap.sh installs it): a missing sglang is a failure here,
# never a skip, so CI cannot pass without running the integration tests.
from . import pools


@pytest.fixture(scope="session", autouse=True)
def _sglang_plugins_loaded() -> None:
    """What every SGLang process does first: run the ``sglang.srt.plugins`` entry points."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    pools.page_hashes(1, seed=0)  # builds (or loads) the native hash extension once


@pytest.fixture
def make_backend(tmp_path) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """``make_backend(kind, layout, **storage_config_kwargs) -> (backend, pool)`` through SGLang's
    factory under the name ``mooncake``; every backend is closed at teardown."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    made: list[Any] = []

    def make(kind: str = "mha", layout: str = "page_first", root: Any = None, pool: Any = None,
             **kw: Any) -> tuple[Any, Any]:
        pool = pool if pool is not None else pools.build_pool(kind, layout)
        cfg = pools.storage_config(kind, layout, root or tmp_path, **kw)
        backend = StorageBackendFactory.create_backend("mooncake", cfg, pool)
        backend.register_mem_pool_host(pool)  # as HiCacheController.attach_storage_backend does
        made.append(backend)
        return backend, pool

    yield make
    for backend in made:
        backend.close()
