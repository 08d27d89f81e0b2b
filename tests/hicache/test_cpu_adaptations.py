"""The no-CUDA adaptations a live CPU server needs (``mooncake_sgl.hicache.cpu.adaptations``): opt-in
(without ``MOONCAKE_SGL_CPU_ADAPTATIONS`` an installed wheel changes nothing in SGLang but the
backend's name), and each shown to be necessary: without it the same sglang code fails, with it it
works. The live tests in tests/live/ run them all together in real servers."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

from mooncake_sgl.hicache.cpu import adaptations
from mooncake_sgl.hicache.cpu.kvcacheio import DIRECT_OPS

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


# What every SGLang process does first (platform discovery, then ``load_plugins()``), then what each
# adaptation would have changed. A module the plug-in never imported is one it did not patch: without
# the switch sglang's pool and attention modules are not even importable here (no sgl_kernel).
_LOOK_AT_SGLANG = textwrap.dedent("""
    import json, os, sys
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    from sglang.srt.platforms import current_platform
    str(current_platform)
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    def patched(module, owner, name, mark):
        found = sys.modules.get(module)
        target = getattr(getattr(found, owner), name) if found is not None and owner else \
            getattr(found, name, None)
        return bool(getattr(target, mark, False)) if mark else target is not None

    print(json.dumps({
        "backend": StorageBackendFactory._registry.get("mooncake", {}).get("class_name"),
        "sgl_kernel": sys.modules.get("sgl_kernel") is not None,
        "prefill_order": os.environ.get("SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP"),
        "unpinned": patched("sglang.srt.mem_cache.pool_host.base", "HostKVCache", "__init__",
                            "__mooncake_sgl_unpinned__"),
        "attention": patched("sglang.srt.layers.attention.torch_native_backend", "TorchNativeAttnBackend",
                             "_run_sdpa_forward_extend", "__mooncake_sgl_new_tokens__"),
        "direct_ops": patched("sglang.srt.mem_cache.pool_host.mha", None,
                              "transfer_kv_all_layer_direct_lf_pf", None),
    }))
""")


def _look_at_sglang(switch: str | None) -> dict:
    import json
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in (adaptations.SWITCH.name, adaptations.CONSECUTIVE_PREFILL_ENV)}
    if switch is not None:
        env[adaptations.SWITCH.name] = switch
    out = subprocess.run([sys.executable, "-c", _LOOK_AT_SGLANG], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("switch", [None, "0"])
def test_installed_without_the_switch_sglang_is_untouched_but_for_the_backend_name(
        switch: str | None) -> None:
    assert _look_at_sglang(switch) == {
        "backend": "MooncakeSglStorage", "sgl_kernel": False, "prefill_order": None,
        "unpinned": False, "attention": False, "direct_ops": False}


def test_with_the_switch_every_adaptation_is_applied() -> None:
    assert _look_at_sglang("1") == {
        "backend": "MooncakeSglStorage", "sgl_kernel": True, "prefill_order": "1",
        "unpinned": True, "attention": True, "direct_ops": True}


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
    assert adaptations.host_reserve() is None and base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 10 << 30
    monkeypatch.setenv(adaptations.HOST_RESERVE_ENV, str(1 << 30))
    assert adaptations.host_reserve() == 1 << 30
    assert base.HICACHE_HOST_MEMORY_RESERVE_BYTES == 1 << 30
    monkeypatch.setenv(adaptations.HOST_RESERVE_ENV, "2GiB")
    assert adaptations.host_reserve() == 2 << 30


def test_a_malformed_host_pool_reserve_is_logged_and_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from sglang.srt.mem_cache.pool_host import base

    monkeypatch.setattr(base, "HICACHE_HOST_MEMORY_RESERVE_BYTES", 10 << 30)
    monkeypatch.setenv(adaptations.HOST_RESERVE_ENV, "12XB")
    with caplog.at_level(logging.ERROR, logger=adaptations.logger.name):
        assert adaptations.host_reserve() is None
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
        assert adaptations.consecutive_prefills_in_order()
    assert f"{adaptations.CONSECUTIVE_PREFILL_ENV}=1" in caplog.text  # the operator sees it
    assert not _overlaps_consecutive_prefills()
    assert not adaptations.consecutive_prefills_in_order()  # already set: nothing to do

    monkeypatch.setenv(adaptations.CONSECUTIVE_PREFILL_ENV, "0")  # the operator's choice stands
    assert not adaptations.consecutive_prefills_in_order()
    assert _overlaps_consecutive_prefills()


def test_apply_sets_the_prefill_order_where_it_adapts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(adaptations.CONSECUTIVE_PREFILL_ENV, raising=False)
    applied = adaptations.apply()
    assert f"consecutive prefills in order (${adaptations.CONSECUTIVE_PREFILL_ENV}=1)" in applied
    assert not _overlaps_consecutive_prefills()
