"""The SSD tier as a user meets it, for ``scripts/bench_tiers.py --user-view`` and ``--restart``.

User's view, per page size and round, for each backend in turn (rounds interleave them):

1. a **writer process** puts N pages into a fresh directory in batches, times the puts, then
   ``fdatasync``-s every file in the directory and times the puts again up to that point ("put +
   sync": until the bytes are on the disk, not just in the page cache), exits;
2. the page cache is dropped (root: ``/proc/sys/vm/drop_caches``; otherwise every file written is
   ``posix_fadvise(DONTNEED)``-ed after a sync, and the report says so);
3. a **reader process** opens the directory, times reading every page into a destination buffer
   (cold), then reading them all again (warm: from the page cache now), and checks the bytes
   (untimed).

Backends: ``ours`` (``LmdbTier``, the default config: ``sync: false``), ``HiCacheFile`` (SGLang's
``file`` backend, ``batch_set`` / ``batch_get``), and ``raw O_DIRECT``: one file written and read
sequentially in 4 MiB ``O_DIRECT`` requests, the disk's own limit.

Restart: a writer process fills a fresh tier with ``--restart-gib`` of pages and exits; after the
cache is dropped a new process measures the time from constructing the tier to its first hit, the
pages recovered (``scan``), and the time to list them.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..console import human, log

GB = 1e9
BACKENDS = ("ours", "HiCacheFile", "raw O_DIRECT")
_CHUNK = 4 << 20  # O_DIRECT request size for the raw disk rows (arbitrary, large)


def page_data(size: int, n: int) -> np.ndarray:
    """The bytes of all ``n`` pages, the same in writer and reader (in page-aligned memory)."""
    buf = aligned_buffer(size * n)
    buf[:] = np.random.default_rng(size).integers(0, 256, size * n, dtype=np.uint8)
    return buf


def aligned_buffer(nbytes: int) -> np.ndarray:
    """Anonymous, page-aligned memory (O_DIRECT needs aligned buffers), touched once."""
    buf = np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)
    buf.fill(1)
    return buf


def page_views(buf: np.ndarray, size: int, n: int) -> list[list[memoryview]]:
    """Each page as two segments (K and V), as SGLang hands them over."""
    mv, half = memoryview(buf), size // 2
    return [[mv[i * size:i * size + half], mv[i * size + half:(i + 1) * size]] for i in range(n)]


def keys(n: int) -> list[bytes]:
    return [b"user-view-page-%07d" % i for i in range(n)]


def _tier(directory: str):
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier

    # The default config's flags; the capacity is the run's disk budget.
    return LmdbTier(LmdbTierConfig(path=directory, capacity="64GiB"))


def _hicache_file(directory: str):
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

    os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)  # it would override the path
    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="bench-model", extra_config={"file_storage_path": directory})
    return HiCacheFile(cfg)


def sync_files(directory: str) -> None:
    """``fdatasync`` every file under ``directory`` (the backend's pages and index)."""
    for f in Path(directory).rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)


def child_main(argv: list[str]) -> None:
    """``bench_tiers.py _user-view write|read BACKEND DIR SIZE N BATCH``: prints seconds (a writer:
    of the puts, then of the puts plus ``sync_files``; a reader: of the cold pass, then of the
    warm one)."""
    role, backend, directory = argv[0], argv[1], argv[2]
    size, n, batch = int(argv[3]), int(argv[4]), int(argv[5])
    buf = page_data(size, n) if role == "write" else aligned_buffer(size * n)
    names = keys(n)
    passes = 1 if role == "write" else 2
    took: list[float] = []
    if backend == "ours":
        tier = _tier(directory)
        pages = page_views(buf, size, n)

        def op(ks: list[bytes], ps: list) -> Sequence[bool]:
            return tier.put_from(ks, ps).ok if role == "write" else tier.get_into(ks, ps)

        for _ in range(passes):
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                if not all(op(names[i:i + batch], pages[i:i + batch])):
                    raise SystemExit(f"bench: our tier refused or missed pages in the {role}r")
            took.append(time.perf_counter() - t0)
        if role == "write":
            sync_files(directory)
            took.append(time.perf_counter() - t0)
        tier.close()
    elif backend == "HiCacheFile":
        import torch

        store = _hicache_file(directory)
        tensors = [torch.from_numpy(buf[i * size:(i + 1) * size]) for i in range(n)]
        str_names = [k.decode() for k in names]
        for _ in range(passes):
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                if role == "write":
                    ok = store.batch_set(str_names[i:i + batch], tensors[i:i + batch])
                else:
                    ok = all(t is not None for t in store.batch_get(str_names[i:i + batch],
                                                                    tensors[i:i + batch]))
                if not ok:
                    raise SystemExit(f"bench: HiCacheFile failed in the {role}r")
            took.append(time.perf_counter() - t0)
        if role == "write":
            sync_files(directory)
            took.append(time.perf_counter() - t0)
    else:
        path = os.path.join(directory, "raw.bin")
        flags = (os.O_WRONLY | os.O_CREAT if role == "write" else os.O_RDONLY) | os.O_DIRECT
        fd = os.open(path, flags, 0o644)
        mv = memoryview(buf)
        try:
            for _ in range(passes):  # O_DIRECT has no page cache: its "warm" read is the disk again
                t0 = time.perf_counter()
                for off in range(0, size * n, _CHUNK):
                    part = mv[off:off + _CHUNK]
                    done = os.pwrite(fd, part, off) if role == "write" else os.preadv(fd, [part], off)
                    if done != min(_CHUNK, size * n - off):
                        raise SystemExit("bench: short O_DIRECT transfer")
                took.append(time.perf_counter() - t0)
            if role == "write":  # the bytes are on the device already; its cache is flushed
                os.fdatasync(fd)
                took.append(time.perf_counter() - t0)
        finally:
            os.close(fd)
    if role == "read" and not np.array_equal(buf, page_data(size, n)):
        raise SystemExit(f"bench: {backend} returned wrong bytes")
    print(*took, flush=True)


def _child(script: str, *args: object) -> list[float]:
    out = subprocess.run([sys.executable, script, "_user-view", *map(str, args)], capture_output=True,
                         text=True, check=False)
    if out.returncode:
        raise SystemExit(f"bench: child {args[:2]} failed: {out.stderr[-2000:]}")
    return [float(x) for x in out.stdout.split()]


def run_profile_child(script: str, mode: str, directory: Path, *args: object) -> dict:
    """Run ``script mode directory *args`` in a fresh process on a fresh ``directory`` (removed
    after); the JSON object of its last output line."""
    directory.mkdir(parents=True)
    try:
        res = subprocess.run([sys.executable, script, mode, str(directory), *map(str, args)],
                             capture_output=True, text=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if res.returncode:
        raise SystemExit(f"bench: {mode.strip('_')} child failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.splitlines()[-1])


def drop_cache(directory: Path) -> str:
    """Drop the page cache; ``"drop_caches"`` or ``"fadvise"`` says how."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        for f in directory.rglob("*"):
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        return "fadvise"


def user_view(script: str, sizes: list[tuple[int, int]], rounds: int, batch: int, workdir: Path,
              hicache_file: bool, mirrored: bool = False, tag: str = "user view") -> dict:
    """Per size: median GB/s of put, put until on disk, cold get and warm get per backend, and how
    the cache was dropped. ``mirrored``: every other round runs the backends in reverse order
    (A B B A), so a disk that drifts within a round favours none of them."""
    backends = [b for b in BACKENDS if hicache_file or b != "HiCacheFile"]
    results: dict[str, dict] = {}
    how = ""
    for size, n in sizes:
        label = f"{human(size)} x{n}"
        times = {b: {"put": [], "put_synced": [], "get": [], "get_warm": []} for b in backends}
        for r in range(rounds):
            for b in backends[::-1] if mirrored and r % 2 else backends:
                log(f"[{tag} {label}] round {r + 1}/{rounds}: {b}")
                d = workdir / f"uv-{b.replace(' ', '_')}"
                d.mkdir(parents=True)
                try:
                    put, synced = _child(script, "write", b, d, size, n, batch)
                    how = drop_cache(d)
                    cold, warm = _child(script, "read", b, d, size, n, batch)
                    for op, t in (("put", put), ("put_synced", synced), ("get", cold), ("get_warm", warm)):
                        times[b][op].append(t)
                    gb = size * n / GB
                    log(f"[{tag} {label}] {b}: put {gb / put:.2f}, put + sync {gb / synced:.2f}, "
                        f"cold get {gb / cold:.2f}, warm get {gb / warm:.2f} GB/s")
                finally:
                    shutil.rmtree(d, ignore_errors=True)
        row = results.setdefault(label, {})
        for b in backends:
            row[b] = {op: size * n / statistics.median(ts) / GB for op, ts in times[b].items()}
            row[b].update({f"{op}_rounds": [size * n / t / GB for t in ts] for op, ts in times[b].items()})
    return {"cache_dropped_by": how, "rounds": rounds, "results": results}


def user_view_table(uv: dict) -> str:
    lines = [f"user's view: writer process -> page cache dropped ({uv['cache_dropped_by']}) -> reader "
             f"process; GB/s, median of {uv['rounds']} interleaved rounds",
             "(put + sync: until every file of the backend is fdatasync-ed)",
             f"{'pages':>12} {'backend':<13} {'put':>6} {'put+sync':>9} {'cold get':>9} {'warm get':>9}   "
             "ours vs HiCacheFile / vs raw O_DIRECT (put, put + sync, cold get, warm get)"]
    for label, row in uv["results"].items():
        for b, v in row.items():
            ratios = ""
            if b == "ours":
                parts = []
                for ref in ("HiCacheFile", "raw O_DIRECT"):
                    if ref in row:
                        parts.append(f"put {v['put'] / row[ref]['put']:.2f}x "
                                     f"synced {v['put_synced'] / row[ref]['put_synced']:.2f}x "
                                     f"cold {v['get'] / row[ref]['get']:.2f}x "
                                     f"warm {v['get_warm'] / row[ref]['get_warm']:.2f}x")
                ratios = " / ".join(parts)
            lines.append(f"{label:>12} {b:<13} {v['put']:>6.2f} {v['put_synced']:>9.2f} {v['get']:>9.2f} "
                         f"{v['get_warm']:>9.2f}   "
                         f"{ratios}")
    return "\n".join(lines)


def restart_child(directory: str, size: int) -> None:
    """``bench_tiers.py _restart DIR SIZE``: open -> first hit -> scan, in a fresh process."""
    t0 = time.perf_counter()
    tier = _tier(directory)
    opened = time.perf_counter() - t0
    dst = page_views(aligned_buffer(size), size, 1)
    hit = tier.get_into(keys(1), dst) == [True]
    first_hit = time.perf_counter() - t0
    t1 = time.perf_counter()
    pages = sum(1 for _ in tier.scan())
    scanned = time.perf_counter() - t1
    tier.close()
    print(f"{opened} {first_hit if hit else -1} {pages} {scanned}", flush=True)


def restart(script: str, gib: float, size: int, batch: int, workdir: Path) -> dict:
    n = int(gib * (1 << 30)) // size
    d = workdir / "restart"
    d.mkdir(parents=True)
    try:
        log(f"[restart] writing {n} pages of {human(size)} ({n * size / 2**30:.1f} GiB)")
        chunk = max(batch, (1 << 30) // size)  # one writer process per GiB keeps memory bounded
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            out = subprocess.run([sys.executable, script, "_restart-fill", *map(str, (
                d, size, start, min(chunk, n - start), batch))], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"bench: restart fill failed: {out.stderr[-2000:]}")
        wrote = time.perf_counter() - t0
        on_disk = sum(f.stat().st_blocks * 512 for f in d.rglob("*") if f.is_file())
        how = drop_cache(d)
        out = subprocess.run([sys.executable, script, "_restart", str(d), str(size)], capture_output=True,
                             text=True)
        if out.returncode:
            raise SystemExit(f"bench: restart reader failed: {out.stderr[-2000:]}")
        opened, first_hit, pages, scanned = out.stdout.split()
        return {"page": human(size), "pages_written": n, "bytes_on_disk": on_disk, "fill_s": wrote,
                "open_s": float(opened), "first_hit_s": float(first_hit), "pages_recovered": int(pages),
                "scan_s": float(scanned), "cache_dropped_by": how}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def restart_fill(directory: str, size: int, start: int, n: int, batch: int) -> None:
    """``bench_tiers.py _restart-fill DIR SIZE START N BATCH``: pages start..start+n, one buffer
    reused (the restart measures the index, not the bytes)."""
    tier = _tier(directory)
    buf = page_data(size, batch)
    pages = page_views(buf, size, batch)
    names = [b"user-view-page-%07d" % i for i in range(start, start + n)]
    for i in range(0, n, batch):
        part = names[i:i + batch]
        if not all(tier.put_from(part, pages[:len(part)]).ok):
            raise SystemExit("bench: the tier refused pages while filling")
    tier.close()
