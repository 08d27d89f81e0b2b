"""The HBM tier: pages in spare GPU memory, with the host tier's slot allocator.

Design. Spare device memory is one ``torch.uint8`` tensor preallocated on the device, cut into
fixed-size slots exactly as the host tier cuts DRAM: this class *is* a ``HostTier`` (free-slot stack,
two-phase reserve/commit, reader counts, usage in slots) and overrides only where the bytes live
and how they are copied (``_allocate``, ``_read_slots``, ``_write_slots``). One allocator, two media.

Copies run on a dedicated CUDA stream, so they never queue behind the model's compute stream; each
batch is issued as asynchronous copies between the device buffer and the caller's host segments
(SGLang's host pool, page-locked by SGLang) and synchronised once before the batch is answered, so a
page is committed only when its bytes are on the device and a read returns only when they are in
host memory.

Size: ``capacity`` bytes, or ``fraction_of_free`` of the device memory free when the tier starts
(``capacity`` wins when both are given). With ``device: cpu`` the same code runs on a CPU tensor
(tests and CI); ``cuda`` without CUDA is a ``TierError`` at construction, never a silent fallback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..api import PageView, TierKind, TierReport
from ..config import HbmTierConfig, HostTierConfig
from ..errors import TierError
from .host import HostTier, HostTierReport


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    # A CPU "device" (tests): available physical memory.
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def resolve_device(name: str) -> torch.device:
    """``cuda``/``cuda:N``/``cpu`` → a usable ``torch.device``; ``TierError`` when it is not."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise TierError(f"hbm tier: invalid device {name!r}: {e}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise TierError(f"hbm tier: device {name!r} is not supported (use cuda, cuda:N or cpu)")
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise TierError(f"hbm tier: device {name!r} requested but CUDA is not available (torch "
                        f"{torch.__version__}, {built}). Remove the hbm tier from the config, or set "
                        "'device: cpu' to exercise it on host memory.")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise TierError(f"hbm tier: device {name!r} does not exist ({torch.cuda.device_count()} visible)")
    return torch.device("cuda", index)


def resolve_capacity(config: HbmTierConfig, device: torch.device) -> int:
    if config.capacity:
        return int(config.capacity)
    capacity = int(_free_bytes(device) * config.fraction_of_free)
    if capacity <= 0:
        raise TierError(f"hbm tier: {config.fraction_of_free} of the free memory on {device} is 0 bytes")
    return capacity


@dataclass(frozen=True)
class HbmTierReport(TierReport):
    """The HBM tier's ``stats()``: the host tier's, and whether its slots are on a GPU."""

    host: HostTierReport
    on_cuda: float  # 1.0 on a CUDA device, 0.0 on the CPU stand-in (a 0/1 gauge, as exported)


class HbmTier(HostTier):
    """Pages in one preallocated device tensor of fixed-size slots (see the module docstring)."""

    name = "hbm"
    kind = TierKind.HBM

    def __init__(self, config: HbmTierConfig, device: str | None = None) -> None:
        self._device = resolve_device(device or config.device)
        self._stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        capacity = resolve_capacity(config, self._device)
        # The host tier's bookkeeping, configured for our buffer (pinning is a host-memory notion).
        super().__init__(HostTierConfig(capacity=capacity, slot_size=config.slot_size, pin_memory=False))

    @property
    def device(self) -> torch.device:
        return self._device

    def _allocate(self, nbytes: int) -> tuple[object, Any]:
        try:
            tensor = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        except (RuntimeError, torch.OutOfMemoryError) as e:
            raise TierError(f"hbm tier cannot allocate {nbytes} bytes on {self._device}: {e}. "
                            "Lower 'capacity' or 'fraction_of_free' of the hbm tier.") from None
        return tensor, tensor

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """``dst.copy_(src)`` for each pair, on the tier's stream, then wait for all of them."""
        if self._stream is None:
            for dst, src in pairs:
                dst.copy_(src)
            return
        with torch.cuda.stream(self._stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
        self._stream.synchronize()

    def _segments(self, buf: torch.Tensor, items: list[tuple[int, PageView]]
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(device slice, host segment tensor) per non-empty segment, in page order."""
        out = []
        for slot, page in items:
            off = slot * self._slot_size
            for seg in page:
                n = seg.nbytes
                if n:
                    out.append((buf[off:off + n], torch.frombuffer(seg, dtype=torch.uint8)))
                off += n
        return out

    def _read_slots(self, buf: Any, reads: list[tuple[int, PageView]]) -> None:
        self._copy([(host, dev) for dev, host in self._segments(buf, reads)])

    def _write_slots(self, buf: Any, writes: list[tuple[int, PageView]]) -> None:
        self._copy(self._segments(buf, writes))

    def stats(self) -> HbmTierReport:
        return HbmTierReport(super().stats(), float(self._device.type == "cuda"))
