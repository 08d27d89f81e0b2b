"""Every change this distribution makes to SGLang, declared once, in mooncake_sgl's record type.

``adaptations.platform_hook`` applies the points of ``Phase.PLATFORM`` and ``adaptations.register``
those of ``Phase.PLUGINS``; nothing else here changes SGLang. ``docs/sglang-touch-points.md``
quotes ``table(POINTS)`` and the boundary test (``tests/hicache/test_touch_points.py``) requires a
fresh SGLang process with the switch on to change exactly these.
"""

from __future__ import annotations

from mooncake_sgl import envs
from mooncake_sgl.hicache.touch_points import CHECKED_SGLANG, Condition, Kind, Phase, TouchPoint

from .kvcacheio import DIRECT_OPS

CPU_HOST = Condition(
    "`MOONCAKE_SGL_CPU_ADAPTATIONS=1` on a host without an accelerator (no CUDA/ROCm, XPU or NPU in "
    "the process)", "mooncake_sgl_cpu.adaptations:on_a_cpu_host")

# Pool modules whose host<->device ops SGLang binds only on CUDA/ROCm/XPU.
POOL_MODULES = (
    "sglang.srt.mem_cache.pool_host.mha", "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.pool_host.mamba", "sglang.srt.mem_cache.pool_host.dsa",
)

HOST_POOL = "sglang.srt.mem_cache.pool_host.base"
MOONCAKE_CONN = "sglang.srt.disaggregation.mooncake.conn"

_PLUGINS = (Phase.PLUGINS,)

STANDIN = TouchPoint(
    target="sgl_kernel", kind=Kind.SYS_MODULE,
    change="a stand-in module with the eight `*_cpu` names SGLang imports, each raising if called, "
           "where no loadable sgl_kernel is installed",
    phases=(Phase.PLATFORM, Phase.PLUGINS), condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="sgl_kernel has no CPU build on PyPI, yet kernels/ops/kvcache/cache_move.py imports eight `*_cpu` "
        "names from it at module level (none is called serving HiCache with a dense attention model); "
        "installed at platform discovery because the scheduler's imports reach cache_move before "
        "load_plugins()",
    apply="mooncake_sgl_cpu.adaptations:sgl_kernel_standin")

UNPINNED = TouchPoint(
    target=f"{HOST_POOL}.HostKVCache.__init__", kind=Kind.WRAP,
    change="called with `pin_memory=False`",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="host KV pools page-lock their buffers with cudaHostRegister whatever the device "
        "(pool_host/common.py): without CUDA the first pool raises",
    apply="mooncake_sgl_cpu.adaptations:unpinned_host_pools")

DIRECT_IO = tuple(TouchPoint(
    target=f"{module}.{name}", kind=Kind.BIND,
    change="the torch version of the op (kvcacheio.py), where the module has none",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="host pools bind their host<->device copy ops only on CUDA/ROCm/XPU, and the first backup "
        "dies of a NameError; the `direct` io backend needs these three (servers run "
        "`--hicache-io-backend direct`)",
    apply="mooncake_sgl_cpu.adaptations:direct_io_op") for module in POOL_MODULES for name in DIRECT_OPS)

ATTENTION = TouchPoint(
    target="sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_extend",
    kind=Kind.REPLACE,
    change="attention of the new tokens only, against every key of the sequence (attention.py; "
           "encoder-decoder batches still go to SGLang's); left alone if its parameters are not "
           "sglang 0.5.23's",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="SGLang's computes the attention of every token, cached prefix included, and keeps the new "
        "tokens' rows: a storage hit saved none of the attention (a 12k-token hit cost what "
        "recomputing it did)",
    apply="mooncake_sgl_cpu.adaptations:extend_attention_new_tokens")

PREFILL_ORDER = TouchPoint(
    target=envs.SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP.name, kind=Kind.ENV_DEFAULT,
    change="1 unless the operator set it (one warning in the server log says so; inherited by the "
           "processes SGLang starts)",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="the overlap scheduler launches batch N+1 before it hands out batch N's tokens; on the CPU "
        "device the launch is the whole forward, so a storage hit's first token waited for the next "
        "prefill batch. SGLang's own switch: same batches, same outputs",
    apply="mooncake_sgl_cpu.adaptations:consecutive_prefills_in_order")

HOST_RESERVE = TouchPoint(
    target=f"{HOST_POOL}.HICACHE_HOST_MEMORY_RESERVE_BYTES", kind=Kind.SET,
    change="the bytes of `$MOONCAKE_SGL_HOST_RESERVE`, when it is set",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="SGLang refuses a host pool while less than 10 GiB is free beside it, sized for a GPU "
        "server's host; test servers on a shared CPU machine have tiny pools",
    apply="mooncake_sgl_cpu.adaptations:host_reserve")

PLAIN_PAGE_INDICES = TouchPoint(
    target=f"{MOONCAKE_CONN}.MooncakeKVSender.supports_host_tensor_indices", kind=Kind.SET,
    change="False: the sender takes SGLang's plain `kv_to_page_indices` path, as every other "
           "transfer backend does",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="True makes the prefill copy a chunk's page indices into a pinned host tensor and record a "
        "CUDA event (disaggregation/prefill.py, send_kv_chunk): the first PD request killed the "
        "prefill with 'Found no NVIDIA driver'",
    apply="mooncake_sgl_cpu.disaggregation:plain_page_indices")

EARLY_SEND = TouchPoint(
    target="sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.maybe_send_cached_prefix_chunk",
    kind=Kind.WRAP,
    change="runs as with the overlap scheduler off for the call: the early send happens, without a "
           "CUDA event",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="under the overlap scheduler it records a torch.cuda.Event on the forward stream, a "
        "torch.cpu.Stream here, and the record raises: a repeated prompt killed the prefill. On the "
        "CPU the forward has ended before the scheduler goes on: nothing to wait for",
    apply="mooncake_sgl_cpu.disaggregation:early_send_without_event")

ROOM_GONE = TouchPoint(
    target=f"{MOONCAKE_CONN}.MooncakeKVManager.check_status", kind=Kind.REPLACE,
    change="a room that is gone reads as `KVPoll.Failed` (concluded) instead of raising KeyError",
    phases=_PLUGINS, condition=CPU_HOST, sglang=CHECKED_SGLANG,
    why="SGLang's race, not the CPU's (docs/sglang-touch-points.md, upstream): the prefill's transfer "
        "worker reads `room not in request_status or check_status(room)` while the scheduler's "
        "`sender.clear()` pops the room; a pop between the two reads kills the worker and every later "
        "request of that prefill fails after the 300 s transfer timeout. Two shared cores widen the "
        "window (one prefill in five runs here); under the CPU switch because mooncake_sgl changes "
        "nothing of SGLang's transfer path on a GPU host",
    apply="mooncake_sgl_cpu.disaggregation:room_gone_is_concluded")

POINTS: tuple[TouchPoint, ...] = (STANDIN, UNPINNED, *DIRECT_IO, ATTENTION, PREFILL_ORDER, HOST_RESERVE,
                                  PLAIN_PAGE_INDICES, EARLY_SEND, ROOM_GONE)
