"""The SSD tier's read path, for ``scripts/bench_tiers.py --modes get-profile``.

Per page size, a fresh process fills a fresh tier with N pages (batches of ``--batch-size``), then
times reading them all back twice: **warm** (the pages are still in the page cache, as right after
the writes) and **cold** (after the page cache was dropped: ``/proc/sys/vm/drop_caches`` as root,
else ``fdatasync`` + ``POSIX_FADV_DONTNEED`` of the tier's files). Each phase is summed over every
thread that runs it, so reads shared by several threads show as thread-seconds that may add up to
more than the get's wall time:

- ``index lookup``: ``get_into`` outside ``PageIO.read`` (the read transaction, ``txn.get`` and
  record parsing per key, counting);
- ``read syscalls``: ``preadv`` into the destination's segments or a bounce buffer, buffered (the
  copy out of the page cache) or with O_DIRECT (a cold run of a large batch), and on a cold read
  the wait for the disk;
- ``readahead hints``: ``posix_fadvise(WILLNEED)`` calls (the read path makes none now; a row
  here would say it does again);
- ``checksum``: xxh3 of every page (one-shot and streaming).

Every page read is compared with what was written (untimed).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np

from ..console import human, log
from .user_view import aligned_buffer, drop_cache, keys, page_data, page_views, run_profile_child

GB = 1e9


class _Phases:
    """Seconds per phase, summed over threads, into the current pass's table (``start``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def start(self) -> dict[str, float]:
        self.seconds = {}
        return self.seconds

    def add(self, label: str, s: float) -> None:
        with self._lock:
            self.seconds[label] = self.seconds.get(label, 0.0) + s

    def wrap(self, owner: object, name: str, label: str, only=None) -> None:
        fn = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if only is not None and not only(*args):
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - t0)
        setattr(owner, name, wrapper)


class _TimedHash:
    """``xxhash.xxh3_64`` whose ``update`` calls count as checksum time."""

    def __init__(self, phases: _Phases, inner) -> None:
        self._phases, self._inner = phases, inner

    def update(self, data) -> None:
        t0 = time.perf_counter()
        self._inner.update(data)
        self._phases.add("checksum", time.perf_counter() - t0)

    def intdigest(self) -> int:
        return self._inner.intdigest()


def profile_child(directory: str, size: int, n: int, batch: int) -> None:
    """``bench_tiers.py _get-profile DIR SIZE N BATCH``: prints one JSON line."""
    import types

    import xxhash

    from mooncake_sgl.tiers.ssd import direct, page_io

    from .write_path import _tier

    tier = _tier(directory)
    src = page_data(size, n)
    names = keys(n)
    pages = page_views(src, size, n)
    for i in range(0, n, batch):
        if not all(tier.put_from(names[i:i + batch], pages[i:i + batch]).ok):
            raise SystemExit("bench: the tier refused pages in the get profile")
    dst = aligned_buffer(size * n)
    views = page_views(dst, size, n)
    tier.get_into(names[:1], views[:1])  # untimed: the first call's imports and thread start
    phases = _Phases()
    phases.wrap(direct, "preadv_all", "read syscalls")
    phases.wrap(page_io.os, "posix_fadvise", "readahead hints",
                only=lambda fd, off, length, advice: advice == os.POSIX_FADV_WILLNEED)
    phases.wrap(page_io, "checksum", "checksum")
    if hasattr(page_io, "xxhash"):  # the streaming hash of large pages
        page_io.xxhash = types.SimpleNamespace(
            xxh3_64=lambda seed=0: _TimedHash(phases, xxhash.xxh3_64(seed=seed)),
            xxh3_64_intdigest=xxhash.xxh3_64_intdigest)
    in_read = [0.0]
    real_read = page_io.PageIO.read

    def read(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real_read(self, *args, **kwargs)
        finally:
            in_read[0] += time.perf_counter() - t0

    page_io.PageIO.read = read
    out: dict = {}
    for temp in ("warm", "cold"):
        how = drop_cache(Path(directory)) if temp == "cold" else "page cache"
        dst.fill(1)
        seconds = phases.start()
        in_read[0] = 0.0
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            if not all(tier.get_into(names[i:i + batch], views[i:i + batch])):
                raise SystemExit(f"bench: the tier missed pages in the {temp} get profile")
        took = time.perf_counter() - t0
        seconds["index lookup"] = took - in_read[0]
        out[temp] = {"get_s": took, "phases": dict(seconds), "cache": how}
        if not np.array_equal(dst, src):
            raise SystemExit(f"bench: the {temp} get profile read wrong bytes")
    tier.close()
    print(json.dumps(out), flush=True)


def get_profile(script: str, sizes: list[tuple[int, int]], batch: int, workdir: Path) -> dict:
    out: dict[str, dict] = {}
    for size, n in sizes:
        label = f"{human(size)} x{n}"
        log(f"[get profile {label}] fill, warm get, cold get")
        row = run_profile_child(script, "_get-profile", workdir / "get-profile", size, n, batch)
        row["nbytes"] = size * n
        out[label] = row
    return out


def get_profile_table(prof: dict) -> str:
    lines = ["get profile: fresh process; per phase, seconds summed over the threads that ran it "
             "(share of the get's wall time; reads shared by threads can add up to more than 100%)"]
    for label, row in prof.items():
        for temp in ("warm", "cold"):
            r = row[temp]
            get = r["get_s"]
            lines.append(f"{label} {temp} ({r['cache']}): get {get * 1e3:.0f} ms = "
                         f"{row['nbytes'] / get / GB:.2f} GB/s")
            for name, s in sorted(r["phases"].items(), key=lambda kv: -kv[1]):
                lines.append(f"    {name:<20} {s * 1e3:8.1f} ms {s / get:5.0%}")
    return "\n".join(lines)
