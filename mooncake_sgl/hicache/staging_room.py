"""Whether SGLang's host pool leaves room to stage the storage hits we find.

A storage hit reaches the GPU through SGLang's host pool: SGLang allocates host slots for it
(``allocate_storage_hit``), evicting host-only pages first, and refuses the hit when nothing is
free (``storage_prefetch_unfulfilled_tokens_total{reason="host_capacity"}``). Under
``--hicache-write-policy write_through`` in the default ``cache`` host-memory mode, every page on
the device has a host copy that cannot be evicted while the device page lives. A host pool no
only a little larger than the device pool (less than the smallest hit SGLang stages,
``prefetch_threshold`` tokens) can then be pinned whole by a full device, and a hit we found is
recomputed instead.

Measured with ``scripts/bench_prefetch.py --trace`` (docs/benchmarks.md, storage hits found and
loaded): at ``--hicache-ratio 1.0`` every refused hit met 0 free host tokens with nothing
evictable, the device 96% full and no backup of ours queued; 34-42% of the tokens found were
loaded, for our backend and SGLang's built-in alike. At SGLang's default ratio (2.0), or with
``--hicache-host-memory-mode buffer_only``, 100% were.

This is SGLang's sizing, not something our backend can make up for, so the attach says it once, in
one line, with the settings that fix it.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


# SGLang's default ``prefetch_threshold``: the fewest tokens of a hit it stages (extra-config key).
SGLANG_PREFETCH_THRESHOLD = 256


def advice(host_tokens: int, device_tokens: int, memory_mode: str, write_policy: str, role: str,
           threshold: int = SGLANG_PREFETCH_THRESHOLD) -> str | None:
    """The warning to log for these settings, or ``None`` when hits have room to be staged."""
    if role == "decode" or memory_mode != "cache" or write_policy != "write_through":
        # A decode's pool only writes; buffer_only stages in flight; the other write policies copy
        # to the host on reuse or eviction, so device pages do not pin a host copy each.
        return None
    if host_tokens <= 0 or device_tokens <= 0 or host_tokens - device_tokens >= threshold:
        return None
    return (f"mooncake_sgl: SGLang's host pool holds {host_tokens} tokens and the device pool "
            f"{device_tokens}: under write_through each page on the device pins its host copy, so a "
            "full device leaves no host slot to stage a storage hit in, and hits are recomputed "
            "(storage_prefetch_unfulfilled_tokens_total{reason=\"host_capacity\"}). Use "
            "--hicache-ratio 2 (SGLang's default) or more, or --hicache-host-memory-mode buffer_only "
            "with our host tier as the DRAM cache (docs/tiers.md, SGLang's host pool)")


def check(host_tokens: int, device_tokens: int, role: str, extra_config: dict[str, Any] | None
          ) -> str | None:
    """``advice`` for a live SGLang host pool (``sglang_pool.HostPool``'s ``host_tokens`` and
    ``device_tokens``) and this process's server arguments; logged as a warning when there is one.
    Settings SGLang does not expose here (a unit test, another release) give no advice."""
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
        mode, policy = str(args.hicache_host_memory_mode), str(args.hicache_write_policy)
        extra = extra_config if isinstance(extra_config, dict) else {}
        threshold = int(extra.get("prefetch_threshold", SGLANG_PREFETCH_THRESHOLD))
    except Exception:  # noqa: BLE001 - SGLang's runtime context is not ours to validate
        return None
    text = advice(host_tokens, device_tokens, mode, policy, role, threshold)
    if text:
        logger.warning(text)
    return text
