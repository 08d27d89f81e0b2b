"""What a live SGLang server needs to run HiCache on a host without CUDA: opt-in, never a side effect.

This distribution (``mooncake-sgl-cpu``, ``cpu_host/`` of the mooncake_sgl repository) is installed
where SGLang runs on the CPU: the tests, the benchmarks, ``scripts/serve_cpu.sh`` and the main job
(``scripts/bootstrap.sh`` installs it). Even installed it changes nothing unless an operator asks
with ``MOONCAKE_SGL_CPU_ADAPTATIONS=1``, and then only on a host without an accelerator and with a
checked sglang version (``CHECKED_SGLANG``); otherwise nothing is patched, and one log line says
why when the switch is on. What it changes is ``touch_points.POINTS``, each with its reason; the
sglang file behind each CUDA assumption is named there.

sglang 0.5.23 starts on a CPU-only host with ``SGLANG_USE_CPU_ENGINE=1 ... --device cpu``, but its
HiCache path has three CUDA assumptions (``sgl_kernel`` at import, pinned host pools, host<->device
copy ops bound only on CUDA/ROCm/XPU), on the CPU its attention and its scheduler waste what a cache
hit saves, and its prefill/decode send path has CUDA assumptions of its own (``disaggregation``).

Timing: most points apply in ``register()``, the ``sglang.srt.plugins`` entry point SGLang calls at
the start of every process it spawns, before any pool exists. The ``sgl_kernel`` stand-in cannot
wait that long: the scheduler's module imports reach ``cache_move`` before ``load_plugins()`` runs.
The earliest hook SGLang offers is platform discovery (``sglang.srt.platforms`` entry points are
called when ``current_platform`` is first resolved, which precedes that import), so
``platform_hook`` is declared there; it never claims a platform (it returns ``None``). A
consequence of SGLang's rules: when ``SGLANG_PLATFORM`` selects another platform, SGLang calls
neither entry point of this distribution.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import sys
import types
from collections.abc import Callable

from mooncake_sgl import envs
from mooncake_sgl.hicache.touch_points import CHECKED_SGLANG, Phase, TouchPoint, owner_of, sglang_version
from mooncake_sgl.hicache.touch_points import apply as apply_points

from . import touch_points

logger = logging.getLogger(__name__)

# The names sglang 0.5.23 imports from ``sgl_kernel`` at module level on the CPU engine's path.
SGL_KERNEL_CPU_NAMES = (
    "copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu", "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu", "build_tree_kernel_efficient_cpu", "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu", "verify_tree_greedy_cpu",
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


def on_a_cpu_host() -> bool:
    """The condition of every point here: the switch is on and this process has no accelerator."""
    return requested() and no_accelerator()


def sgl_kernel_standin(point: TouchPoint) -> bool:
    """Make ``import sgl_kernel`` (``point.target``) work where no usable one is installed. True if
    installed now."""
    name = point.target
    if _STANDIN_MARK in getattr(sys.modules.get(name), "__dict__", {}):
        return False
    if importlib.util.find_spec(name) is not None:
        try:
            importlib.import_module(name)
            return False
        except Exception as e:  # a CUDA-only build on a CPU host fails to load its objects
            logger.warning("mooncake_sgl: the installed %s does not load here (%s: %s); "
                           "using a stand-in", name, type(e).__name__, e)
    module = types.ModuleType(name, "mooncake_sgl's stand-in: importable, every op raises.")
    setattr(module, _STANDIN_MARK, True)
    for op in SGL_KERNEL_CPU_NAMES:
        setattr(module, op, _unavailable(op))
    sys.modules[name] = module
    return True


def _unavailable(name: str) -> Callable[..., None]:
    def op(*_args: object, **_kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel.{name} has no CPU build; mooncake_sgl only provides a "
                                  "stand-in so that sglang imports without CUDA")
    op.__name__ = name
    return op


def unpinned_host_pools(point: TouchPoint) -> bool:
    """Host pools (``HostKVCache.__init__``) allocate unpinned memory (no ``cudaHostRegister``).
    True if patched now."""
    cls, name = owner_of(point.target)
    original = getattr(cls, name)
    if getattr(original, _UNPINNED_MARK, False):
        return False

    def __init__(self: object, *args: object, **kwargs: object) -> None:
        kwargs["pin_memory"] = False
        original(self, *args, **kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(__init__, _UNPINNED_MARK, True)
    setattr(cls, name, __init__)
    return True


# Bytes SGLang keeps back from a HiCache host pool's size check (10 GiB in sglang 0.5.23, sized for
# a GPU server's host); set for test servers on a shared CPU machine (devtools/testing/cluster.py)
# whose tiny pools would otherwise be refused whenever other processes hold the RAM.
HOST_RESERVE_ENV = envs.MOONCAKE_SGL_HOST_RESERVE.name


def host_reserve(point: TouchPoint) -> bool:
    """SGLang's host-pool reserve (``point.target``) set from ``$MOONCAKE_SGL_HOST_RESERVE``. True if
    set now; unset or malformed (logged), SGLang's stands."""
    try:
        reserve = envs.MOONCAKE_SGL_HOST_RESERVE.get()
    except ValueError as e:  # a typo must not quietly keep SGLang's 10 GiB, nor crash the plug-in
        logger.error("mooncake_sgl: $%s ignored: %s", HOST_RESERVE_ENV, e)
        return False
    if reserve is None:
        return False
    module, name = owner_of(point.target)
    setattr(module, name, reserve)
    return True


def direct_io_op(point: TouchPoint) -> bool:
    """Bind the torch version of the ``direct`` op ``point.target`` names into its pool module where
    the module has none. True if bound now; False also where the module does not import."""
    from .kvcacheio import DIRECT_OPS

    try:
        module, name = owner_of(point.target)
    except ImportError:
        return False
    if getattr(module, name, None) is not None:
        return False
    setattr(module, name, DIRECT_OPS[name])
    return True


def extend_attention_new_tokens(point: TouchPoint) -> bool:
    """``TorchNativeAttnBackend`` attends from new tokens only in extend. True if patched now.

    Skipped (``False``, one log line) when the method's parameters are not those of sglang 0.5.23.
    """
    from .attention import EXTEND_PARAMETERS, make_sdpa_forward_extend

    cls, name = owner_of(point.target)
    original = getattr(cls, name)
    if getattr(original, _NEW_TOKENS_MARK, False):
        return False
    found = tuple(inspect.signature(original).parameters)
    if found != EXTEND_PARAMETERS:
        logger.warning("mooncake_sgl: %s takes %s, not the parameters this adaptation was written for; "
                       "left as it is", point.target, ", ".join(found))
        return False
    patched = make_sdpa_forward_extend(original)
    setattr(patched, _NEW_TOKENS_MARK, True)
    setattr(cls, name, patched)
    return True


# sglang 0.5.23's switch (``srt/environ.py``, read at every scheduler step in
# ``Scheduler.is_disable_overlap_for_batch``): results of a prefill batch go out before the next
# prefill batch runs.
CONSECUTIVE_PREFILL = envs.SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP
CONSECUTIVE_PREFILL_ENV = CONSECUTIVE_PREFILL.name


def consecutive_prefills_in_order(_point: TouchPoint) -> bool:
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
    """``sglang.srt.platforms`` entry point: applies the points of platform discovery (the
    ``sgl_kernel`` stand-in), claims nothing.

    Must never raise (a raising platform plugin is logged by SGLang and skipped, but noise at every
    start is a defect) and must stay cheap: it runs in every SGLang process at platform discovery.
    Silent on an unchecked sglang: ``register`` says it once, later in the same process.
    """
    try:
        if on_a_cpu_host() and sglang_version() in CHECKED_SGLANG and apply_points(
                touch_points.POINTS, Phase.PLATFORM):
            logger.info("mooncake_sgl: no accelerator here; installed an sgl_kernel stand-in")
    except Exception:
        logger.exception("mooncake_sgl: the CPU sgl_kernel stand-in could not be installed")
    return None


def register() -> None:
    """``sglang.srt.plugins`` entry point: ``apply``."""
    apply()


def apply() -> list[TouchPoint]:
    """The points of ``load_plugins()`` this process needs; those applied now.

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
    applied = apply_points(touch_points.POINTS, Phase.PLUGINS)
    if applied:
        logger.info("mooncake_sgl: no accelerator here (sglang %s); applied: %s", version,
                    ", ".join(p.target for p in applied))
    return applied
