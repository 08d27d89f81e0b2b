"""The no-CUDA adaptations a live CPU server needs (the ``mooncake-sgl-cpu`` distribution,
``cpu_host/``): opt-in, and each shown to be necessary: without it the same sglang code fails, with
it it works. What they change in SGLang, and that nothing else is changed, is
``test_touch_points.py``'s; the live tests in tests/live/ run them all together in real servers."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

from mooncake_sgl_cpu import adaptations
from mooncake_sgl_cpu import touch_points as cpu_points
from mooncake_sgl_cpu.kvcacheio import DIRECT_OPS

from . import pools

# Imports the module whose import chain needs sgl_kernel, with or without our entry points.
_IMPORT_SCHEDULER = textwrap.dedent("""
    import importlib.metadata as md, os, sys
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    os.environ["MOONCAKE_SGL_CPU_ADAPTATIONS"] = "1"
    if sys.argv[1] == "without":
        every = md.entry_points
        md.entry_points = lambda **kw: md.EntryPoints(
            [e for e in every(**kw) if not e.value.startswith("mooncake_sgl")]) if kw else every()
    try:
        import sglang.srt.managers.scheduler
    except ImportError as e:
        print("FAILED", e)
    else:
        print("IMPORTED", type(sys.modules["sgl_kernel"]).__name__,
              getattr(sys.modules["sgl_kernel"], "__mooncake_sgl_standin__", False))
""")


def _import_scheduler(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", _IMPORT_SCHEDULER, mode], capture_output=True, text=True,
                         timeout=300)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]


def test_sgl_kernel_standin_lets_the_scheduler_import_without_cuda() -> None:
    assert _import_scheduler("without") == "FAILED No module named 'sgl_kernel'"
    assert _import_scheduler("with") == "IMPORTED module True"


def test_a_malformed_switch_is_logged_and_applies_nothing(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(adaptations.SWITCH.name, "perhaps")
    with caplog.at_level(logging.ERROR, logger=adaptations.__name__):
        assert adaptations.apply() == []
    assert "MOONCAKE_SGL_CPU_ADAPTATIONS" in caplog.text and "perhaps" in caplog.text


def test_standin_ops_raise_if_called() -> None:
    import sgl_kernel

    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        sgl_kernel.copy_all_layer_kv_cache_cpu()


def test_host_pools_are_unpinned_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    patched = HostKVCache.__init__
    assert getattr(patched, "__mooncake_sgl_unpinned__", False)  # the plug-in ran in this process
    pool = pools.build_pool("mha", "page_first_direct", pin_memory=True)  # as sglang's assembler asks
    assert pool.pin_memory is False

    monkeypatch.setattr(HostKVCache, "__init__", patched.__wrapped__)
    with pytest.raises(RuntimeError, match="(?i)nvidia|cuda"):
        pools.build_pool("mha", "page_first_direct", pin_memory=True)


def _device_rows(pool: object, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in (*pool.device_k_buffers, *pool.device_v_buffers):
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))


def test_direct_io_ops_round_trip_through_the_page_first_direct_layout() -> None:
    pool = pools.build_pool("mha", "page_first_direct")
    _device_rows(pool, seed=1)
    host = pool.alloc(2 * pools.PAGE)
    device = torch.arange(3 * pools.PAGE, 5 * pools.PAGE)
    pool.backup_from_device_all_layer(None, host, device, "direct")

    # The host layout SGLang's page_first_direct defines: (pages, layers, page_size, heads, dim).
    page, offset = host // pools.PAGE, host % pools.PAGE
    for layer in range(pools.LAYERS):
        assert torch.equal(pool.k_buffer[page, layer, offset], pool.device_k_buffers[layer][device])
        assert torch.equal(pool.v_buffer[page, layer, offset], pool.device_v_buffers[layer][device])

    before = [t[device].clone() for t in (*pool.device_k_buffers, *pool.device_v_buffers)]
    elsewhere = torch.arange(8 * pools.PAGE, 10 * pools.PAGE)
    for layer in range(pools.LAYERS):
        pool.load_to_device_per_layer(None, host, elsewhere, layer, "direct")
    after = [t[elsewhere] for t in (*pool.device_k_buffers, *pool.device_v_buffers)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_without_the_direct_ops_the_first_backup_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.mem_cache.pool_host import mha

    pool = pools.build_pool("mha", "page_first_direct")
    for name in DIRECT_OPS:
        monkeypatch.delattr(mha, name)
    with pytest.raises(NameError, match="transfer_kv_all_layer_direct_lf_pf"):
        pool.backup_from_device_all_layer(None, pool.alloc(pools.PAGE), torch.arange(pools.PAGE), "direct")


def test_nothing_is_adapted_on_an_unchecked_sglang_or_with_an_accelerator(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(adaptations, "sglang_version", lambda: "0.6.0")
    with caplog.at_level(logging.WARNING, logger=adaptations.__name__):
        assert adaptations.apply() == []
    assert "checked only against sglang 0.5.23" in caplog.text and "0.6.0" in caplog.text

    monkeypatch.setattr(adaptations, "no_accelerator", lambda: False)
    assert adaptations.apply() == []
    assert adaptations.platform_hook() is None  # never claims a platform


def test_the_host_pool_reserve_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.mem_cache.pool_host import base

    monkeypatch.setattr(base, "HICACHE_HOST_MEMORY_RESERVE_BYTES", base.HICACHE_HOST_MEMORY_RESERVE_BYTES)
    monkeypatch.delenv(adaptations.HOST_RESERVE_ENV, raising=False)
    assert not adaptations.host_reserve(cpu_points.HOST_RESERVE)
    assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 10 << 30
    monkeypatch.setenv(adaptations.HOST_RESERVE_ENV, str(1 << 30))
    assert adaptations.host_reserve(cpu_points.HOST_RESERVE)
    assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 1 << 30
    monkeypatch.setenv(adaptations.HOST_RESERVE_ENV, "2GiB")
    assert adaptations.host_reserve(cpu_points.HOST_RESERVE)
    assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 2 << 30


def test_a_malformed_host_pool_reserve_is_logged_and_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from sglang.srt.mem_cache.pool_host import base

    monkeypatch.setattr(base, "HICACHE_HOST_MEMORY_RESERVE_BYTES", 10 << 30)
    monkeypatch.setenv(adaptations.HOST_RESERVE_ENV, "12XB")
    with caplog.at_level(logging.ERROR, logger=adaptations.logger.name):
        assert not adaptations.host_reserve(cpu_points.HOST_RESERVE)
    assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 10 << 30
    assert "MOONCAKE_SGL_HOST_RESERVE" in caplog.text and "12XB" in caplog.text


def _overlaps_consecutive_prefills() -> bool:
    """What sglang's own scheduler decides for a prefill batch right after another one: True if it
    runs the new batch before handing out the last one's tokens (the overlap)."""
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def prefill() -> SimpleNamespace:
        return SimpleNamespace(forward_mode=ForwardMode.EXTEND, spec_algorithm=SpeculativeAlgorithm.NONE)

    scheduler = SimpleNamespace(require_mlp_sync=False)
    return not Scheduler.is_disable_overlap_for_batch(scheduler, prefill(), last_batch=prefill())


def test_a_prefills_tokens_go_out_before_the_next_prefill_runs(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # On the CPU device "launch the next batch" is its whole forward: with sglang's default the
    # first token of a prefill waited for the next prefill batch's forward.
    monkeypatch.delenv(adaptations.CONSECUTIVE_PREFILL_ENV, raising=False)
    assert _overlaps_consecutive_prefills()
    with caplog.at_level(logging.WARNING, logger=adaptations.__name__):
        assert adaptations.consecutive_prefills_in_order(cpu_points.PREFILL_ORDER)
    assert f"{adaptations.CONSECUTIVE_PREFILL_ENV}=1" in caplog.text  # the operator sees it
    assert not _overlaps_consecutive_prefills()
    assert not adaptations.consecutive_prefills_in_order(cpu_points.PREFILL_ORDER)  # already set

    monkeypatch.setenv(adaptations.CONSECUTIVE_PREFILL_ENV, "0")  # the operator's choice stands
    assert not adaptations.consecutive_prefills_in_order(cpu_points.PREFILL_ORDER)
    assert _overlaps_consecutive_prefills()


def test_apply_sets_the_prefill_order_where_it_adapts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(adaptations.CONSECUTIVE_PREFILL_ENV, raising=False)
    applied = adaptations.apply()
    assert cpu_points.PREFILL_ORDER in applied
    assert not _overlaps_consecutive_prefills()
