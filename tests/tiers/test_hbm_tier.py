"""The HBM tier: the conformance suite on a CPU tensor (CI) and, where CUDA exists, on the device.

The CPU run goes through the same copy code as the GPU run (``torch`` copies between the tier's
buffer and the caller's host segments); only the stream differs.
"""

from __future__ import annotations

import pytest
import torch

from mooncake_sgl.api import Tier, TierKind
from mooncake_sgl.config import HbmTierConfig, StoreConfig
from mooncake_sgl.config_text import parse_config
from mooncake_sgl.errors import TierError
from mooncake_sgl.tiers import build_tier
from mooncake_sgl.tiers.hbm import HbmTier
from mooncake_sgl.tiers.host import HostTier

from .conformance import TierConformance, empty_like, key, make_page, same

CUDA = torch.cuda.is_available()


def hbm(capacity: int | str, device: str = "cpu", **kw) -> HbmTier:
    return HbmTier(HbmTierConfig(capacity=capacity, device=device, **kw))


class TestHbmOnCpuTensor(TierConformance):
    def make_tier(self, capacity_bytes: int) -> Tier:
        return hbm(capacity_bytes)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (scripts/gpu_check.py runs this on a GPU host)")
class TestHbmOnCuda(TierConformance):
    def make_tier(self, capacity_bytes: int) -> Tier:
        return hbm(capacity_bytes, device="cuda")


def test_it_reuses_the_host_tiers_slot_allocator() -> None:
    t = hbm("1MiB")
    assert isinstance(t, HostTier)  # one allocator for DRAM and HBM, not a copy of it
    assert t.kind is TierKind.HBM and t.name == "hbm"
    assert t.device == torch.device("cpu")
    assert t.put_from([key(1)], [make_page(1, 4096)]).ok == (True,)
    assert t.slot_size == 8192 and t.usage().pages == 1
    t.close()


@pytest.mark.skipif(CUDA, reason="checks the error raised when CUDA is absent")
def test_cuda_without_cuda_is_a_clear_tier_error() -> None:
    with pytest.raises(TierError, match="CUDA is not available.*device: cpu"):
        hbm("1MiB", device="cuda")


def test_bad_devices_are_tier_errors() -> None:
    with pytest.raises(TierError, match="invalid device"):
        hbm("1MiB", device="gpu0")
    with pytest.raises(TierError, match="not supported"):
        hbm("1MiB", device="meta")


def test_fraction_of_free_sizes_the_buffer() -> None:
    t = hbm(0, fraction_of_free=1e-6)  # about 20 KiB of this machine's free memory
    cap = t.usage().capacity_bytes
    assert 0 < cap < 1 << 22
    t.close()


def test_capacity_wins_over_fraction() -> None:
    t = hbm(64 * 1024, fraction_of_free=0.5)
    assert t.usage().capacity_bytes == 64 * 1024
    t.close()


def test_build_tier_and_yaml_config_make_an_hbm_tier() -> None:
    cfg = parse_config({"tiers": [{"kind": "hbm", "capacity": "1MiB", "device": "cpu"},
                                  {"kind": "host", "capacity": "1MiB"}]}, "test", StoreConfig)
    t = build_tier(cfg.tiers[0])
    assert isinstance(t, HbmTier)
    t.close()


def test_pages_round_trip_through_the_store_as_tier_zero() -> None:
    from mooncake_sgl.policy import build_policy
    from mooncake_sgl.store import TieredStore

    tiers = [hbm(8 * 8192), HostTier(parse_config({"tiers": [{"kind": "host", "capacity": "1MiB",
                                                               "pin_memory": False}]}).tiers[0])]
    store = TieredStore(tiers, build_policy(parse_config({"policy": {"name": "lru"}}).policy, tiers))
    pages = [make_page(i, 4096) for i in range(12)]  # more than the 8 HBM slots
    assert store.put_from([key(i) for i in range(12)], pages) == [True] * 12
    out = [empty_like(p) for p in pages]
    assert store.get_into([key(i) for i in range(12)], out) == [True] * 12
    assert all(same(a, b) for a, b in zip(pages, out))
    assert store.stats().tiers["hbm"].usage.pages <= 8
    store.close()


def test_copies_go_through_the_hbm_copy_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU the bytes can only move through HbmTier's own copy hooks (the host tier's numpy
    # copies cannot address device memory); on CPU prove those hooks are the path taken.
    calls: list[str] = []
    for name in ("_read_slots", "_write_slots"):
        orig = getattr(HbmTier, name)
        monkeypatch.setattr(HbmTier, name, lambda self, buf, items, _o=orig, _n=name: (calls.append(_n),
                                                                                        _o(self, buf, items)))
    t = hbm("1MiB")
    assert isinstance(t._tensor, torch.Tensor) and t._tensor.device == t.device
    page = make_page(3, 4096)
    assert t.put_from([key(3)], [page]).ok == (True,)
    out = empty_like(page)
    assert t.get_into([key(3)], [out]) == [True] and same(page, out)
    assert calls == ["_write_slots", "_read_slots"]
    t.close()
