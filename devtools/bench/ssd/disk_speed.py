"""The SSD tier against ``dd`` on the same disk, for ``scripts/bench_tiers.py --modes disk-speed``.

The shape a fresh server meets (issue 50, item 4): per page size, N pages (two segments each, like
K and V) go through ONE ``LmdbTier.put_from`` into a NEW directory in a fresh process; the page
cache is dropped; a NEW process reads them all back with ONE ``get_into`` (cold) and checks the
bytes (untimed). ``dd`` runs on the same file system right before and right after each: as many
bytes written to a new file with ``oflag=direct`` around the put, and the tier's own page file
read with ``iflag=direct`` around the get (the very blocks the get reads: ``dd`` reading back a
file it had just written ran faster than reading one written a while before, which flattered
``dd``), in blocks of ``--disk-speed-dd-bs`` (8 MiB: the disk's sequential limit as ``dd`` sees
it, for every page size, so a small page's ratio is against the disk and not against ``dd`` at
that block size). The tier's figures are taken as ratios against the mean of the two ``dd`` runs
around them, because the disk and the machine drift from minute to minute.

``put`` is until ``put_from`` returned (what the caller waits for); ``put+sync`` adds an
``fdatasync`` of the tier's files, so pages the page cache took count until they are on the disk.
The source pages are page-aligned (``--disk-speed-memory aligned``: SGLang's pinned host pool) or
not (``unaligned``: CPU tensors of plain ``malloc`` memory, which ``O_DIRECT`` cannot use as they
are). The page cache is dropped with ``/proc/sys/vm/drop_caches`` as root, else every file is
``fdatasync``-ed and ``POSIX_FADV_DONTNEED``-ed, and the report says which.
``--disk-speed-loop-readahead KB`` (root) runs it all on a fresh ext4 on a loop device whose
``read_ahead_kb`` is KB: most disks' default is 128, where buffered cold reads wait on small
readahead windows (the development VM's disk has 8192).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..console import human, log
from .throttled import loop_disk
from .user_view import aligned_buffer, drop_cache, keys, page_data, page_views, sync_files

GB = 1e9


def _tier(directory: str):
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier

    return LmdbTier(LmdbTierConfig(path=directory, capacity="64GiB"))


def _buffer(nbytes: int, memory: str) -> np.ndarray:
    """Touched memory, page-aligned or 64 bytes past a page boundary (as ``malloc`` places a large
    array: never 4 KiB-aligned)."""
    if memory == "aligned":
        return aligned_buffer(nbytes)
    raw = np.empty(nbytes + 4096 + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 4096 + 64
    buf = raw[start:start + nbytes]
    buf.fill(1)
    return buf


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def child(argv: list[str]) -> None:
    """``bench_tiers.py _disk-speed put|get DIR SIZE N MEMORY``: one JSON line (seconds: wall, and
    CPU of every thread of the process, steadier than wall time on a shared machine)."""
    role, directory, size, n, memory = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4]
    names = keys(n)
    if role == "put":
        buf = _buffer(size * n, memory)
        buf[:] = page_data(size, n)
        tier = _tier(directory)
        cpu, t0 = _cpu_s(), time.perf_counter()
        ok = tier.put_from(names, page_views(buf, size, n)).ok
        put, cpu = time.perf_counter() - t0, _cpu_s() - cpu
        sync_files(directory)
        synced = time.perf_counter() - t0
        stats = tier.stats()
        tier.close()
        if not all(ok):
            raise SystemExit("bench: the tier refused pages in the disk-speed put")
        print(json.dumps({"put_s": put, "put_synced_s": synced, "put_cpu_s": cpu,
                          "direct_pages": stats.direct_pages}))
        return
    dst = _buffer(size * n, memory)
    tier = _tier(directory)
    cpu, t0 = _cpu_s(), time.perf_counter()
    ok = tier.get_into(names, page_views(dst, size, n))
    took, cpu = time.perf_counter() - t0, _cpu_s() - cpu
    tier.close()
    if not all(ok) or not np.array_equal(dst, page_data(size, n)):
        raise SystemExit("bench: the tier missed pages or returned wrong bytes in the disk-speed get")
    print(json.dumps({"get_s": took, "get_cpu_s": cpu}))


def _run_child(script: str, *args: object) -> dict:
    out = subprocess.run([sys.executable, script, "_disk-speed", *map(str, args)], capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"bench: disk-speed {args[0]} child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


_MEDIANS = ("put", "put_synced", "get_cold", "dd_write", "dd_read", "put_vs_dd", "put_synced_vs_dd",
            "get_cold_vs_dd", "put_cpu_s", "get_cpu_s", "load")
_DD_RATE = re.compile(r"(\d+) bytes .* copied, ([0-9.]+) s")


def _dd(args: list[str], bs: int, count: int) -> float:
    """GB/s of one ``dd`` run, as ``dd`` timed it."""
    out = subprocess.run(["dd", *args, f"bs={bs}", f"count={count}"], capture_output=True, text=True,
                         env={**os.environ, "LC_ALL": "C"})
    found = _DD_RATE.search(out.stderr)
    if out.returncode or found is None:
        raise SystemExit(f"bench: dd failed: {out.stderr.strip()[-500:]}")
    return int(found.group(1)) / float(found.group(2)) / GB


def dd_write(directory: Path, nbytes: int, bs: int) -> float:
    """``dd`` writes ``nbytes`` with ``oflag=direct`` to a new file in ``directory`` (removed)."""
    path = directory / "dd.bin"
    try:
        return _dd(["if=/dev/zero", f"of={path}", "oflag=direct"], bs, -(-nbytes // bs))
    finally:
        path.unlink(missing_ok=True)


def dd_read(path: Path, nbytes: int, bs: int) -> float:
    """``dd`` reads the first ``nbytes`` of ``path`` with ``iflag=direct``."""
    return _dd([f"if={path}", "of=/dev/null", "iflag=direct"], bs, -(-nbytes // bs))


def disk_speed(script: str, sizes: list[tuple[int, int]], rounds: int, workdir: Path, dd_bs: int,
               memory: str, loop_readahead_kb: int | None = None) -> dict:
    """Per size and round: dd, the tier (put, then cold get), dd again; GB/s and the ratios. With
    ``loop_readahead_kb``, on a fresh ext4 on a loop device over a file in ``workdir`` (root; the
    loop's I/O reaches the disk directly) whose ``read_ahead_kb`` is that: the kernel's default of
    128 on most disks, where the VM's own disk has 8192."""
    if loop_readahead_kb is None:
        return _disk_speed(script, sizes, rounds, workdir, dd_bs, memory)
    with loop_disk(workdir, 2 * max(size * n for size, n in sizes) + (1 << 30)) as disk:
        Path(f"/sys/block/{Path(disk.loop).name}/queue/read_ahead_kb").write_text(f"{loop_readahead_kb}\n")
        log(f"[disk speed] on {disk.loop} (read_ahead_kb {loop_readahead_kb}) mounted at {disk.mount}")
        out = _disk_speed(script, sizes, rounds, disk.mount, dd_bs, memory)
    out["loop_read_ahead_kb"] = loop_readahead_kb
    return out


def _disk_speed(script: str, sizes: list[tuple[int, int]], rounds: int, workdir: Path, dd_bs: int,
                memory: str) -> dict:
    results: dict[str, dict] = {}
    how = ""
    for size, n in sizes:
        label = f"{human(size)} x{n}"
        nbytes = size * n
        runs = []
        for r in range(rounds):
            tag = f"[disk speed {label}] round {r + 1}/{rounds}"
            load = os.getloadavg()[0]
            d = workdir / "disk-speed-tier"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            try:
                log(f"{tag}: dd write, put_from of {n} pages into a new directory (fresh process), "
                    f"dd write (load {load:.1f})")
                writes = [dd_write(workdir, nbytes, dd_bs)]
                put = _run_child(script, "put", d, size, n, memory)
                writes.append(dd_write(workdir, nbytes, dd_bs))
                how = drop_cache(d)
                log(f"{tag}: dd read of the page file, cold get_into in a new process (page cache "
                    f"dropped by {how}), dd read")
                reads = [dd_read(d / "pages.bin", nbytes, dd_bs)]
                drop_cache(d)
                got = _run_child(script, "get", d, size, n, memory)
                reads.append(dd_read(d / "pages.bin", nbytes, dd_bs))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            before, after = (writes[0], reads[0]), (writes[1], reads[1])
            dd_w, dd_r = sum(writes) / 2, sum(reads) / 2
            run = {"load": load, "dd_write": dd_w, "dd_read": dd_r, "dd_before": before,
                   "dd_after": after, "put": nbytes / put["put_s"] / GB,
                   "put_synced": nbytes / put["put_synced_s"] / GB, "get_cold": nbytes / got["get_s"] / GB,
                   "put_cpu_s": put["put_cpu_s"], "get_cpu_s": got["get_cpu_s"],
                   "direct_pages": put["direct_pages"]}
            run["put_vs_dd"] = run["put"] / dd_w
            run["put_synced_vs_dd"] = run["put_synced"] / dd_w
            run["get_cold_vs_dd"] = run["get_cold"] / dd_r
            log(f"{tag}: put {run['put']:.2f} ({run['put_vs_dd']:.2f}x dd), put+sync "
                f"{run['put_synced']:.2f}, cold get {run['get_cold']:.2f} ({run['get_cold_vs_dd']:.2f}x "
                f"dd), dd write {dd_w:.2f} read {dd_r:.2f} GB/s")
            runs.append(run)
        results[label] = summary(runs)
    return {"cache_dropped_by": how, "rounds": rounds, "dd_bs": human(dd_bs), "memory": memory,
            "cpus": os.cpu_count(), "results": results}


def summary(runs: list[dict]) -> dict:
    """A page size's rounds and their medians."""
    return {"runs": runs, "median": {k: statistics.median(run[k] for run in runs) for k in _MEDIANS}}


def disk_speed_table(res: dict) -> str:
    loads = [run["load"] for row in res["results"].values() for run in row["runs"]]
    where = (f"a loop device with read_ahead_kb {res['loop_read_ahead_kb']}: "
             if res.get("loop_read_ahead_kb") is not None else "")
    lines = [f"disk speed: {where}one put_from into a new directory (fresh process), page cache dropped "
             f"({res['cache_dropped_by']}), one cold get_into (new process); {res['memory']} source "
             f"memory; dd bs={res['dd_bs']} oflag=direct to a new file around the put, iflag=direct "
             f"of the page file around the get, as many bytes, same file system; GB/s, median of "
             f"{res['rounds']} rounds; ratios: median "
             f"[lowest-highest] of the rounds' tier / mean(dd before, dd after); load "
             f"{min(loads):.1f}-{max(loads):.1f} on {res['cpus']} CPUs",
             f"{'pages':>12} {'put':>6} {'put+sync':>9} {'cold get':>9} {'dd write':>9} {'dd read':>8}"
             f"   {'put/dd':<18} {'put+sync/dd':<18} {'cold get/dd':<18} CPU s put/get"]
    for label, row in res["results"].items():
        m = row["median"]
        ratios = " ".join(f"{_ratio(row['runs'], k):<18}" for k in ("put_vs_dd", "put_synced_vs_dd",
                                                                   "get_cold_vs_dd"))
        lines.append(f"{label:>12} {m['put']:>6.2f} {m['put_synced']:>9.2f} {m['get_cold']:>9.2f} "
                     f"{m['dd_write']:>9.2f} {m['dd_read']:>8.2f}   {ratios} "
                     f"{m['put_cpu_s']:.2f}/{m['get_cpu_s']:.2f}")
    return "\n".join(lines)


def _ratio(runs: list[dict], key: str) -> str:
    """Median and range of one ratio over the rounds."""
    xs = [run[key] for run in runs]
    return f"{statistics.median(xs):.2f}x [{min(xs):.2f}-{max(xs):.2f}]"
