"""The torch ``direct`` io ops (``mooncake_sgl_cpu.kvcacheio``) through a real sglang host pool:
whole aligned pages (what HiCache moves) take the page path, anything else the token path, and both
put the same bytes in the same places."""

from __future__ import annotations

import pytest
import torch

from mooncake_sgl_cpu import kvcacheio as cpu_kvcacheio

from . import pools


def _fill_device(pool: object, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in (*pool.device_k_buffers, *pool.device_v_buffers):
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))


def _device_layers(pool: object) -> list[torch.Tensor]:
    return [*pool.device_k_buffers, *pool.device_v_buffers]


def _pages_of(first: int, count: int) -> torch.Tensor:
    return torch.arange(first * pools.PAGE, (first + count) * pools.PAGE)


@pytest.mark.parametrize("device_slots", ["whole-pages", "scattered-tokens"])
def test_backup_then_load_round_trips(device_slots: str) -> None:
    pool = pools.build_pool("mha", "page_first_direct")
    _fill_device(pool, seed=4)
    host = pool.alloc(3 * pools.PAGE)
    if device_slots == "whole-pages":
        device = torch.cat([_pages_of(9, 1), _pages_of(2, 2)])  # pages, out of order
    else:
        # Tokens from the first 32 pages in random order (page 40 stays untouched).
        device = torch.randperm(32 * pools.PAGE, generator=torch.Generator().manual_seed(1))[:3 * pools.PAGE]
    pool.backup_from_device_all_layer(None, host, device, "direct")

    page, offset = host // pools.PAGE, host % pools.PAGE
    for layer in range(pools.LAYERS):
        assert torch.equal(pool.k_buffer[page, layer, offset], pool.device_k_buffers[layer][device])
        assert torch.equal(pool.v_buffer[page, layer, offset], pool.device_v_buffers[layer][device])

    before = [t[device].clone() for t in _device_layers(pool)]
    elsewhere = _pages_of(20, 3) if device_slots == "whole-pages" else device.flip(0) + 0
    untouched = [t[_pages_of(40, 1)].clone() for t in _device_layers(pool)]
    for t in _device_layers(pool):
        t[elsewhere] = 0
    for layer in range(pools.LAYERS):
        pool.load_to_device_per_layer(None, host, elsewhere, layer, "direct")
    after = [t[elsewhere] for t in _device_layers(pool)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    layers = _device_layers(pool)
    assert all(torch.equal(t[_pages_of(40, 1)], u) for t, u in zip(layers, untouched, strict=True))


def test_whole_pages_are_recognised_only_when_aligned_and_in_order() -> None:
    p = pools.PAGE
    assert cpu_kvcacheio._whole_pages(torch.cat([_pages_of(5, 1), _pages_of(1, 1)]), p).tolist() == [5, 1]
    assert cpu_kvcacheio._whole_pages(torch.arange(1, p + 1), p) is None  # not aligned
    assert cpu_kvcacheio._whole_pages(_pages_of(2, 1).flip(0), p) is None  # a page, tokens reversed
    assert cpu_kvcacheio._whole_pages(torch.arange(p // 2), p) is None  # part of a page


def test_page_path_copies_one_row_per_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole pages move as page rows (one index per page), not as per-token (or per-byte) rows."""
    pool = pools.build_pool("mha", "page_first_direct")
    rows_copied: list[int] = []
    real = cpu_kvcacheio._copy

    def counting(dst: torch.Tensor, dst_idx: torch.Tensor, src: torch.Tensor, src_idx: torch.Tensor) -> None:
        rows_copied.append(len(src_idx))
        real(dst, dst_idx, src, src_idx)

    monkeypatch.setattr(cpu_kvcacheio, "_copy", counting)
    host = pool.alloc(4 * pools.PAGE)
    pool.backup_from_device_all_layer(None, host, _pages_of(3, 4), "direct")
    pool.load_to_device_per_layer(None, host, _pages_of(8, 4), 0, "direct")
    assert rows_copied == [4] * (2 * pools.LAYERS) + [4, 4]


def test_rows_of_another_size_are_refused() -> None:
    host = torch.zeros(4, 2, pools.PAGE, 8, dtype=torch.bfloat16)  # 16-byte token rows
    device = torch.zeros(8 * pools.PAGE, 4, dtype=torch.bfloat16)  # 8-byte token rows
    for indices in (_pages_of(1, 1), torch.arange(3, 3 + pools.PAGE)):
        with pytest.raises(ValueError, match="cannot be copied"):
            cpu_kvcacheio.transfer_kv_per_layer_direct_pf_lf([host], [device], _pages_of(0, 1), indices, 0,
                                                             pools.PAGE)
