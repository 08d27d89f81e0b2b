"""The measuring half of ``scripts/gpu_check.py``: the host tier with pinned buffers, and our copy
paths between device and host timed against torch's own copies of the same bytes.

Every function takes the device to run on, so the same code runs on ``cuda`` (the real check) and on
``cpu`` (the script's self-test, where nothing is pinned and no copy crosses a bus).

The copy paths are the ones the package really uses to move bytes between a device and the host:

- ``hbm.put_from`` / ``hbm.get_into``: ``HbmTier``'s per-segment ``copy_(non_blocking=True)`` on
  its own stream, one synchronize per batch, from or into page-locked pages (SGLang's host pool);
- ``promote host->hbm`` / ``demote hbm->host``: what the store does between its host and HBM
  tiers (``Promoter._reread_and_write_up``, ``Placer._demote``): a ``get_into`` into a ``Staging``
  page, then a ``put_from`` of it into the other tier. The host tier itself never addresses device
  memory (its copies are numpy), so this staged route is how its pinned buffer meets the device.

The torch baseline copies the same segments with ``Tensor.copy_(non_blocking=True)`` between
page-locked host memory and one device tensor, then synchronizes: the ratio is what our
bookkeeping (and, for the staged routes, the extra host copy) costs on top of the copies themselves.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mooncake_sgl.config import HbmTierConfig, HostTierConfig
from mooncake_sgl.config_text import parse_config
from mooncake_sgl.policy import build_policy
from mooncake_sgl.store import TieredStore
from mooncake_sgl.store.staging import Staging
from mooncake_sgl.tiers.hbm import HbmTier
from mooncake_sgl.tiers.host import HostTier

PATHS = ("hbm.put_from H2D", "hbm.get_into D2H", "promote host->hbm", "demote hbm->host")
SEGMENTS = 2  # per page: K and V, as SGLang's non-layer-first layouts hand them


@dataclass(frozen=True)
class CopyResult:
    path: str
    page_bytes: int
    pages: int  # per batch
    rounds: int
    ours_gbps: float  # batch bytes / median time of one batch
    torch_gbps: float
    ratio: float  # ours / torch, measured interleaved in the same run


@dataclass(frozen=True)
class PinnedHostResult:
    device: str
    pinned: bool
    expected_pinned: bool  # page-locking needs CUDA: never expected on a CPU self-test
    pages: int
    byte_exact: bool
    store_hits: dict[str, int]  # pages each tier served to a TieredStore read (hbm over host)
    store_byte_exact: bool

    @property
    def ok(self) -> bool:
        return (self.pinned == self.expected_pinned and self.byte_exact and self.store_byte_exact
                and all(n > 0 for n in self.store_hits.values()))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_tensor(nbytes: int, device: torch.device) -> torch.Tensor:
    # Page-locked like SGLang's host pool; pinning needs CUDA, so a CPU self-test gets plain memory.
    t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    t.numpy()[:] = np.frombuffer(os.urandom(nbytes), dtype=np.uint8)
    return t


def _pages(host: torch.Tensor, page_bytes: int) -> list[list[memoryview]]:
    arr, seg = host.numpy(), page_bytes // SEGMENTS
    return [[memoryview(arr[p + s * seg:p + (s + 1) * seg]) for s in range(SEGMENTS)]
            for p in range(0, arr.nbytes, page_bytes)]


def _keys(n: int) -> list[bytes]:
    return [b"gpu-check-" + i.to_bytes(8, "big") for i in range(n)]


def check_pinned_host(device: torch.device, page_bytes: int = 64 << 10, pages: int = 16) -> PinnedHostResult:
    """A host tier asked to pin: is it pinned, are pages byte-exact through it, and does a store with
    an HBM tier on ``device`` above it serve exact pages from both tiers."""
    src = _host_tensor(pages * page_bytes, device)
    dst = _host_tensor(pages * page_bytes, device)
    keys = _keys(pages)
    host = HostTier(HostTierConfig(capacity=pages * page_bytes, slot_size=page_bytes, pin_memory=True))
    pinned = host.pinned
    try:
        assert host.put_from(keys, _pages(src, page_bytes)).ok == (True,) * pages
        dst.zero_()
        got = host.get_into(keys, _pages(dst, page_bytes))
        exact = got == [True] * pages and torch.equal(src, dst)
    finally:
        host.close()
    # HBM holds half the pages, so a read needs both tiers (the store writes through to host).
    tiers = [HbmTier(HbmTierConfig(capacity=pages // 2 * page_bytes, slot_size=page_bytes,
                                   device=str(device))),
             HostTier(HostTierConfig(capacity=pages * page_bytes, slot_size=page_bytes, pin_memory=True))]
    store = TieredStore(tiers, build_policy(parse_config({"policy": {"name": "lru"}}).policy, tiers),
                        mover="inline")
    try:
        store.put_from(keys, _pages(src, page_bytes))
        dst.zero_()
        got = store.get_into(keys, _pages(dst, page_bytes))
        store_exact = got == [True] * pages and torch.equal(src, dst)
        hits = {name: t.reads.hits for name, t in store.stats().tiers.items()}
    finally:
        store.close()
    return PinnedHostResult(str(device), pinned, device.type == "cuda", pages, exact, hits, store_exact)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _abba(ours: Callable[[], object], base: Callable[[], object], reset: Callable[[], object],
          rounds: int) -> tuple[float, float]:
    """Median seconds of ours and of the baseline, run A B B A per round so drift (clocks, other
    load) falls on both alike; ``reset`` (untimed) empties the tier a put writes into."""
    reset()
    ours()  # warm: first-touch page faults, stream creation, allocator caches
    base()
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        reset()
        a.append(_timed(ours))
        b.append(_timed(base))
        b.append(_timed(base))
        reset()
        a.append(_timed(ours))
    return statistics.median(a), statistics.median(b)


def _expect(results: Sequence[bool], what: str) -> None:
    if not all(results):
        raise AssertionError(f"{what}: {results.count(False)} of {len(results)} pages refused")


def measure_page_size(device: torch.device, page_bytes: int, batch_bytes: int, rounds: int,
                      progress: Callable[[str], None] = print) -> list[CopyResult]:
    """The four paths of ``PATHS`` for one page size, each checked byte-exact after it was timed."""
    n = max(1, batch_bytes // page_bytes)
    total = n * page_bytes
    keys = _keys(n)
    src, dst = _host_tensor(total, device), _host_tensor(total, device)
    src_pages, dst_pages = _pages(src, page_bytes), _pages(dst, page_bytes)
    staged = Staging().pages("gpu-check", [page_bytes] * n)
    dev = torch.empty(total, dtype=torch.uint8, device=device)
    seg = page_bytes // SEGMENTS
    # The baseline moves exactly the segments our paths move, one copy_ each.
    h2d = [(dev[o:o + seg], src[o:o + seg]) for o in range(0, total, seg)]
    d2h = [(dst[o:o + seg], dev[o:o + seg]) for o in range(0, total, seg)]

    def torch_copy(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
        def run() -> None:
            for d, s in pairs:
                d.copy_(s, non_blocking=True)
            sync(device)
        return run

    def exact(tier: HostTier, what: str) -> None:
        dst.zero_()
        _expect(tier.get_into(keys, dst_pages), what)
        if not torch.equal(src, dst):
            raise AssertionError(f"{what}: bytes differ after the copy")

    hbm = HbmTier(HbmTierConfig(capacity=total, slot_size=page_bytes, device=str(device)))
    host = HostTier(HostTierConfig(capacity=total, slot_size=page_bytes, pin_memory=True))
    out: list[CopyResult] = []

    def record(path: str, times: tuple[float, float]) -> None:
        ours_gbps, torch_gbps = total / times[0] / 1e9, total / times[1] / 1e9
        out.append(CopyResult(path, page_bytes, n, rounds, ours_gbps, torch_gbps, ours_gbps / torch_gbps))
        progress(f"gpu_check: c {path:<18} {_size(page_bytes):>8} x {n}: ours {ours_gbps:7.2f} GB/s, "
                 f"torch {torch_gbps:7.2f} GB/s")

    try:
        record(PATHS[0], _abba(lambda: _expect(hbm.put_from(keys, src_pages).ok, PATHS[0]),
                               torch_copy(h2d), hbm.clear, rounds))
        record(PATHS[1], _abba(lambda: _expect(hbm.get_into(keys, dst_pages), PATHS[1]),
                               torch_copy(d2h), lambda: None, rounds))
        exact(hbm, "hbm round trip")
        _expect(host.put_from(keys, src_pages).ok, "host fill")

        def promote() -> None:
            _expect(host.get_into(keys, staged), PATHS[2])
            _expect(hbm.put_from(keys, staged).ok, PATHS[2])

        def demote() -> None:
            _expect(hbm.get_into(keys, staged), PATHS[3])
            _expect(host.put_from(keys, staged).ok, PATHS[3])

        record(PATHS[2], _abba(promote, torch_copy(h2d), hbm.clear, rounds))
        exact(hbm, PATHS[2])
        record(PATHS[3], _abba(demote, torch_copy(d2h), host.clear, rounds))
        exact(host, PATHS[3])
    finally:
        hbm.close()
        host.close()
    return out


def measure_copies(device: torch.device, page_sizes: list[int], batch_bytes: int, rounds: int,
                   progress: Callable[[str], None] = print) -> list[CopyResult]:
    out: list[CopyResult] = []
    for page_bytes in page_sizes:
        out.extend(measure_page_size(device, page_bytes, batch_bytes, rounds, progress))
    return out


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB"


def format_table(results: list[CopyResult]) -> str:
    lines = [f"{'path':<18} {'page':>8} {'pages':>6} {'ours GB/s':>10} {'torch GB/s':>11} {'ours/torch':>10}"]
    for r in results:
        lines.append(f"{r.path:<18} {_size(r.page_bytes):>8} {r.pages:>6} {r.ours_gbps:>10.2f} "
                     f"{r.torch_gbps:>11.2f} {r.ratio:>10.2f}")
    return "\n".join(lines)
