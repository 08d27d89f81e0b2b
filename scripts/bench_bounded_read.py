#!/usr/bin/env python3
"""What reading a hit the load gate judges again costs over reading it in one call, in one process:
an SSD tier (``TieredStore`` over one ``LmdbTier``), a hit of ``--pages`` pages written in one batch
and dropped from the page cache before each read (root: all of it, as ``bench_load_gate.py``
does; otherwise the tier's files; ``--warm``: nothing dropped, a hit written lately), then read either

  one      in one ``get_into`` call (what the backend does where the gate has nothing to judge);
  stepped  as the gate reads a disk that may have turned slow: the first page, then doubling steps
           (1, 2, 4, ...), each a ``get_into_within`` bounded by ``--bound-ms``.

Rounds interleave the variants (one stepped stepped one). ``--busy`` runs a Python thread beside
the reads that holds the GIL most of the time, as SGLang's scheduler does in the server: every
hand-off between threads then waits for it. Prints per variant the median and range, and the ratio
stepped / one; ``--json PATH`` writes every read.

    python scripts/bench_bounded_read.py                        # 63 pages of 64 KiB, 12 rounds
    python scripts/bench_bounded_read.py --busy --dir /mnt/ssd --json bounded.json
    python scripts/bench_bounded_read.py --busy --warm           # a hit in the page cache
    python scripts/bench_bounded_read.py --busy --loop           # bench_load_gate.py's loop device
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.console import human, log, run_script  # noqa: E402
from devtools.bench.ssd.throttled import loop_disk  # noqa: E402
from devtools.bench.ssd.throttled import unavailable as loop_unavailable  # noqa: E402
from devtools.bench.ssd.user_view import drop_cache  # noqa: E402
from mooncake_sgl.config import LmdbTierConfig  # noqa: E402
from mooncake_sgl.policy.lru import LruPolicy  # noqa: E402
from mooncake_sgl.store import TieredStore  # noqa: E402
from mooncake_sgl.tiers.ssd import LmdbTier  # noqa: E402
from mooncake_sgl.units import parse_size  # noqa: E402

VARIANTS = ("one", "stepped")


def steps(n: int) -> list[int]:
    """The gate's step sizes over a hit of ``n`` pages: the first page, then doubling."""
    out, done = [], 0
    while done < n:
        out.append(max(1, min(n - done, done)))
        done += out[-1]
    return out


class Busy:
    """A thread that holds the GIL but for short sleeps, as a busy scheduler does."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        x = 0
        while not self._stop.is_set():
            for _ in range(3000):
                x += 1
            time.sleep(0.0003)

    def __enter__(self) -> Busy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(directory: Path, npages: int, page: int, rounds: int, bound_s: float, busy: bool,
            warm: bool) -> tuple[dict[str, list[float]], str]:
    tier = LmdbTier(LmdbTierConfig(path=str(directory), capacity=max(64 << 20, 4 * npages * page)))
    store = TieredStore([tier], LruPolicy(1), mover="inline")
    src = np.random.default_rng(0).integers(0, 256, npages * page, dtype=np.uint8)
    dst = np.zeros_like(src)
    half = page // 2

    def views(buf: np.ndarray) -> list[list[memoryview]]:
        mv = memoryview(buf)
        return [[mv[i * page:i * page + half], mv[i * page + half:(i + 1) * page]] for i in range(npages)]

    src_pages, dst_pages = views(src), views(dst)
    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    how = "nothing (--warm)"
    try:
        with Busy() if busy else nullcontext():
            for r in range(rounds):
                for variant in ("one", "stepped", "stepped", "one"):
                    keys = [os.urandom(16) for _ in range(npages)]
                    if not all(store.put_from(keys, src_pages)):
                        raise RuntimeError("the SSD tier did not take the hit's pages")
                    if not warm:
                        how = drop_cache(directory)
                    dst[:] = 0
                    t0 = time.perf_counter()
                    ok = read(store, keys, dst_pages, variant, bound_s)
                    out[variant].append(time.perf_counter() - t0)
                    if ok is None or not all(ok) or not np.array_equal(dst, src):
                        raise RuntimeError(f"{variant}: the hit was not read back whole (bound too short?)")
                    store.remove(keys)
                last = ", ".join(f"{v} {out[v][-1] * 1e3:.2f} ms" for v in VARIANTS)
                log(f"round {r + 1}/{rounds}: {last}")
    finally:
        store.close()
    return out, how


def read(store: TieredStore, keys: list[bytes], pages: list[list[memoryview]], variant: str,
         bound_s: float) -> list[bool] | None:
    if variant == "one":
        return store.get_into(keys, pages)
    ok: list[bool] = []
    at = 0
    for n in steps(len(keys)):
        got = store.get_into_within(keys[at:at + n], pages[at:at + n], bound_s)
        if got is None:
            return None
        ok += got
        at += n
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=63, help="pages in the hit (default 63: 4,032 tokens at 64)")
    p.add_argument("--page-size", default="64KiB", help="bytes per page (two segments, K and V)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--bound-ms", type=float, default=500.0,
                   help="each step's bound; long enough that a healthy disk never meets it")
    p.add_argument("--busy", action="store_true", help="a GIL-holding thread beside the reads")
    p.add_argument("--dir", type=Path, default=None, help="where the tier's files go (default: a temp dir)")
    p.add_argument("--loop", action="store_true",
                   help="on a fresh ext4 on a loop device in --dir, as bench_load_gate.py's disk (root)")
    p.add_argument("--warm", action="store_true",
                   help="drop nothing before each read: the hit is in the page cache, as one written lately")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    page = parse_size(args.page_size)
    if args.pages < 1 or page < 2 or page % 2:
        p.error("--pages must be at least 1 and --page-size an even number of bytes")
    if args.loop and (why := loop_unavailable()) is not None:
        p.error(f"--loop: {why}")
    with tempfile.TemporaryDirectory(dir=args.dir) as d, \
            loop_disk(Path(d), max(1 << 30, 8 * args.pages * page)) if args.loop else nullcontext() as disk:
        where = disk.mount if disk is not None else Path(d)
        res, how = measure(where / "tier", args.pages, page, args.rounds, args.bound_ms / 1e3, args.busy,
                      args.warm)
    med = {v: statistics.median(res[v]) for v in VARIANTS}
    busy = ", busy thread" if args.busy else ""
    on = "a loop device" if args.loop else "the disk of --dir"
    print(f"hit of {args.pages} pages of {human(page)} on {on}, dropped from the page cache before each "
          f"read: {how}; {args.rounds * 2} reads each, load {os.getloadavg()[0]:.2f}{busy}")
    for v in VARIANTS:
        print(f"  {v:<8} median {med[v] * 1e3:7.2f} ms  [{min(res[v]) * 1e3:.2f}-{max(res[v]) * 1e3:.2f}]")
    print(f"  stepped / one: {med['stepped'] / med['one']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"pages": args.pages, "page_bytes": page, "busy": args.busy,
                                         "dropped": how, "seconds": res,
                                         "ratio": med["stepped"] / med["one"]}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main)
