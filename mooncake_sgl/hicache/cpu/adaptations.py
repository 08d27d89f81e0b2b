"""What a live SGLang server needs to run HiCache on a host without CUDA: opt-in, never a side effect.

A plain install of the wheel changes nothing in SGLang but the storage backend's name. These
adaptations run only where an operator asks for them with ``MOONCAKE_SGL_CPU_ADAPTATIONS=1`` (what
``scripts/serve_cpu.sh``, the benchmarks and the test suite set), and even then only on a host
without an accelerator and with a checked sglang version (``CHECKED_SGLANG``); otherwise nothing is
patched, and one log line says why when the switch is on.

sglang 0.5.23 starts on a CPU-only host with ``SGLANG_USE_CPU_ENGINE=1 ... --device cpu``, but its
HiCache path has three CUDA assumptions (each item names the sglang file that makes it), and on
the CPU its attention (4) and its scheduler (5) waste what a cache hit saves:

1. ``sgl_kernel`` has no CPU build on PyPI, yet ``kernels/ops/kvcache/cache_move.py`` imports eight
   ``*_cpu`` names from it at module level. ``sgl_kernel_standin`` makes ``import sgl_kernel``
   succeed with exactly those names; each raises if ever called (none is, serving HiCache with a
   dense attention model).
2. Host KV pools page-lock their buffers with ``cudaHostRegister`` whatever the device
   (``pool_host/common.py``); ``unpinned_host_pools`` makes ``HostKVCache`` allocate unpinned.
3. The host pools bind their host<->device copy ops only on CUDA/ROCm/XPU; ``direct_io_ops`` binds
   torch versions of the ``direct`` io backend's three ops where a pool module has none
   (``kvcacheio``). Servers then run with ``--hicache-io-backend direct``.
4. The ``torch_native`` attention backend computes a sequence's attention for every token of it,
   cached prefix included, and keeps the new tokens' rows: a storage hit saved no attention, and a
   12k-token hit cost what recomputing it did. ``extend_attention_new_tokens`` makes it compute the
   new tokens' rows only (``attention``; the same rows, bit for bit).
5. The overlap scheduler launches batch N+1 before it hands out batch N's tokens. On CUDA the
   launch returns at once and N+1 runs on the device while the CPU does N's bookkeeping; on the
   CPU device the launch *is* the forward, so a prefill's first token waited for the whole forward
   of the next prefill batch (a storage hit queued behind a cold prompt's 4k-token chunk paid for
   that chunk). sglang's own switch ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP`` makes the
   scheduler emit N's results first when both batches are prefills; ``consecutive_prefills_in_order``
   sets it (unless the operator set it). It changes no batch and no output: the batch to run is
   chosen before the switch is read, and only the order of "process N" and "run N+1" changes.
6. Prefill/decode disaggregation's prefill send path has two CUDA assumptions of its own, and a
   race between its transfer worker and the scheduler (``disaggregation``).

Timing: (2) to (5) run in ``register()`` of the ``sglang.srt.plugins`` entry point, which SGLang
calls at the start of every process it spawns, before any pool exists. (1) cannot wait that long:
the scheduler's module imports reach ``cache_move`` before ``load_plugins()`` runs. The earliest
hook SGLang offers is platform discovery (``sglang.srt.platforms`` entry points are called when
``current_platform`` is first resolved, which precedes that import), so ``platform_hook`` is
declared there; it never claims a platform (it returns ``None``), it only installs the stand-in,
and only under the switch.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import types
from collections.abc import Callable

from ... import envs
from . import disaggregation

logger = logging.getLogger(__name__)

CHECKED_SGLANG = frozenset({"0.5.23"})

# The names sglang 0.5.23 imports from ``sgl_kernel`` at module level on the CPU engine's path.
SGL_KERNEL_CPU_NAMES = (
    "copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu", "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu", "build_tree_kernel_efficient_cpu", "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu", "verify_tree_greedy_cpu",
)

# Pool modules whose host<->device ops are bound only on CUDA/ROCm/XPU.
POOL_MODULES = (
    "sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.pool_host.mamba", "sglang.srt.mem_cache.pool_host.dsa",
)

_STANDIN_MARK = "__mooncake_sgl_standin__"
_UNPINNED_MARK = "__mooncake_sgl_unpinned__"
_NEW_TOKENS_MARK = "__mooncake_sgl_new_tokens__"


SWITCH = envs.MOONCAKE_SGL_CPU_ADAPTATIONS


def requested() -> bool:
    """True when the operator asked for the adaptations; a malformed switch is logged and reads off."""
    try:
        return SWITCH.get()
    except ValueError as e:
        logger.error("mooncake_sgl: $%s ignored, no CPU adaptation applied: %s", SWITCH.name, e)
        return False


def no_accelerator() -> bool:
    """True when this process sees no CUDA/ROCm, XPU or NPU device: the only case we adapt."""
    import torch

    if torch.cuda.is_available():
        return False
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return False
    return importlib.util.find_spec("torch_npu") is None


def sglang_version() -> str:
    try:
        from sglang.version import __version__
    except ImportError:
        return "unknown"
    return str(__version__)


def sgl_kernel_standin() -> bool:
    """Make ``import sgl_kernel`` work where no usable one is installed. True if installed now."""
    if _STANDIN_MARK in getattr(sys.modules.get("sgl_kernel"), "__dict__", {}):
        return False
    if importlib.util.find_spec("sgl_kernel") is not None:
        try:
            importlib.import_module("sgl_kernel")
            return False
        except Exception as e:  # a CUDA-only build on a CPU host fails to load its objects
            logger.warning("mooncake_sgl: the installed sgl_kernel does not load here (%s: %s); "
                           "using a stand-in", type(e).__name__, e)
    module = types.ModuleType("sgl_kernel", "mooncake_sgl's stand-in: importable, every op raises.")
    setattr(module, _STANDIN_MARK, True)
    for name in SGL_KERNEL_CPU_NAMES:
        setattr(module, name, _unavailable(name))
    sys.modules["sgl_kernel"] = module
    return True


def _unavailable(name: str) -> Callable[..., None]:
    def op(*_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel.{name} has no CPU build; mooncake_sgl only provides a "
                                  "stand-in so that sglang imports without CUDA")
    op.__name__ = name
    return op


def unpinned_host_pools() -> bool:
    """Host pools allocate unpinned memory (no ``cudaHostRegister``). True if patched now."""
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    original = HostKVCache.__init__
    if getattr(original, _UNPINNED_MARK, False):
        return False

    def __init__(self: HostKVCache, *args: object, **kwargs: object) -> None:
        kwargs["pin_memory"] = False
        original(self, *args, **kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(__init__, _UNPINNED_MARK, True)
    HostKVCache.__init__ = __init__  # type: ignore[method-assign]
    return True


# Bytes SGLang keeps back from a HiCache host pool's size check (10 GiB in sglang 0.5.23, sized for
# a GPU server's host); set for test servers on a shared CPU machine (devtools/testing/cluster.py)
# whose tiny pools would otherwise be refused whenever other processes hold the RAM.
HOST_RESERVE_ENV = envs.MOONCAKE_SGL_HOST_RESERVE.name


def host_reserve() -> int | None:
    """SGLang's host-pool reserve set from ``$MOONCAKE_SGL_HOST_RESERVE``; the bytes, or None."""
    from sglang.srt.mem_cache.pool_host import base

    try:
        reserve = envs.MOONCAKE_SGL_HOST_RESERVE.get()
    except ValueError as e:  # a typo must not quietly keep SGLang's 10 GiB, nor crash the plug-in
        logger.error("mooncake_sgl: $%s ignored: %s", HOST_RESERVE_ENV, e)
        return None
    if reserve is None:
        return None
    base.HICACHE_HOST_MEMORY_RESERVE_BYTES = reserve
    return reserve


def direct_io_ops() -> list[str]:
    """Bind torch ``direct`` ops into the pool modules that lack them; the names bound."""
    from .kvcacheio import DIRECT_OPS

    bound = []
    for module_name in POOL_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, op in DIRECT_OPS.items():
            if getattr(module, name, None) is None:
                setattr(module, name, op)
                bound.append(f"{module_name.rsplit('.', 1)[1]}.{name}")
    return bound


def extend_attention_new_tokens() -> bool:
    """``TorchNativeAttnBackend`` attends from new tokens only in extend. True if patched now.

    Skipped (``False``, one log line) when the method's parameters are not those of sglang 0.5.23.
    """
    import inspect

    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from .attention import EXTEND_PARAMETERS, make_sdpa_forward_extend

    original = TorchNativeAttnBackend._run_sdpa_forward_extend
    if getattr(original, _NEW_TOKENS_MARK, False):
        return False
    found = tuple(inspect.signature(original).parameters)
    if found != EXTEND_PARAMETERS:
        logger.warning("mooncake_sgl: TorchNativeAttnBackend._run_sdpa_forward_extend takes %s, not the "
                       "parameters this adaptation was written for; left as it is", ", ".join(found))
        return False
    patched = make_sdpa_forward_extend(original)
    setattr(patched, _NEW_TOKENS_MARK, True)
    TorchNativeAttnBackend._run_sdpa_forward_extend = patched  # type: ignore[method-assign]
    return True


# sglang 0.5.23's switch (``srt/environ.py``, read at every scheduler step in
# ``Scheduler.is_disable_overlap_for_batch``): results of a prefill batch go out before the next
# prefill batch runs.
CONSECUTIVE_PREFILL = envs.SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP
CONSECUTIVE_PREFILL_ENV = CONSECUTIVE_PREFILL.name


def consecutive_prefills_in_order() -> bool:
    """A prefill's tokens go out before the next prefill batch's forward. True if set now.

    Left alone (``False``) when the operator set the variable, either way.
    """
    if CONSECUTIVE_PREFILL.is_set():
        return False
    CONSECUTIVE_PREFILL.set_default(1)  # inherited by the processes this one starts
    # A warning, so that it reaches the server's log (SGLang configures logging after plugins load,
    # so info lines from here are dropped); once per server, as the spawned processes inherit it.
    logger.warning("mooncake_sgl: CPU device: set %s=1 (a prefill's first token no longer waits for "
                   "the next prefill batch's forward; outputs unchanged); set it to 0 to keep sglang's "
                   "default", CONSECUTIVE_PREFILL_ENV)
    return True


def platform_hook() -> None:
    """``sglang.srt.platforms`` entry point: installs the ``sgl_kernel`` stand-in, claims nothing.

    Must never raise (a raising platform plugin is logged by SGLang and skipped, but noise at every
    start is a defect) and must stay cheap: it runs in every SGLang process at platform discovery.
    """
    try:
        if (requested() and no_accelerator() and sglang_version() in CHECKED_SGLANG
                and sgl_kernel_standin()):
            logger.info("mooncake_sgl: no accelerator here; installed an sgl_kernel stand-in")
    except Exception:
        logger.exception("mooncake_sgl: the CPU sgl_kernel stand-in could not be installed")
    return None


def apply() -> list[str]:
    """Every adaptation this process needs; the names of those applied.

    Empty without ``$MOONCAKE_SGL_CPU_ADAPTATIONS``, on a host with an accelerator, and on an
    unchecked sglang version."""
    if not requested():
        return []
    if not no_accelerator():
        logger.warning("mooncake_sgl: $%s is set, but this process sees an accelerator; no CPU "
                       "adaptation applied", SWITCH.name)
        return []
    version = sglang_version()
    if version not in CHECKED_SGLANG:
        logger.warning("mooncake_sgl: sglang %s has no accelerator here, and the CPU adaptations were "
                       "checked only against sglang %s; none applied (a live CPU server with HiCache "
                       "may then fail inside sglang)", version, ", ".join(sorted(CHECKED_SGLANG)))
        return []
    applied = []
    if sgl_kernel_standin():
        applied.append("sgl_kernel stand-in")
    if unpinned_host_pools():
        applied.append("unpinned host pools")
    applied += [f"torch {name}" for name in direct_io_ops()]
    if extend_attention_new_tokens():
        applied.append("torch_native extend attention over new tokens only")
    if consecutive_prefills_in_order():
        applied.append(f"consecutive prefills in order (${CONSECUTIVE_PREFILL_ENV}=1)")
    applied += disaggregation.apply()
    reserve = host_reserve()
    if reserve is not None:
        applied.append(f"host pool reserve {reserve} bytes (${HOST_RESERVE_ENV})")
    if applied:
        logger.info("mooncake_sgl: no accelerator here (sglang %s); applied: %s", version, ", ".join(applied))
    return applied
