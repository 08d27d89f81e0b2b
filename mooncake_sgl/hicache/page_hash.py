"""SGLang's page hash, loaded at attach rather than at the first lookup."""

from __future__ import annotations

import time


def load_page_hash() -> float:
    """Build or load SGLang's native page-hash extension now; returns the seconds it took.

    Why at attach: SGLang builds it (g++, seconds; longer on a loaded machine) at the first call, and
    that call is the storage lookup of the first request with a whole page, in the prefetch thread.
    The scheduler does not wait for that lookup, so on a machine or container without the build
    cache a fresh server's first request read nothing from storage however much was stored
    (measured: 0 of 1,024 tokens, against all 1,024 once the extension was built). Called from the
    backend's constructor, the server is not ready until the hash is.

    Raises: ``RuntimeError`` naming the toolchain the build needs when it fails.
    """
    started = time.monotonic()
    try:
        from sglang.srt.mem_cache.utils import get_hash_str

        get_hash_str([0])
    except Exception as e:
        raise RuntimeError(f"SGLang's page hashing could not load its C++ extension ({e}: {e.__cause__}). "
                           "It is compiled on first use and needs g++, ninja and the OpenSSL headers "
                           "(Debian: apt-get install g++ ninja-build libssl-dev)") from e
    return time.monotonic() - started
