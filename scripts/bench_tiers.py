#!/usr/bin/env python3
"""Put/get bandwidth of the host DRAM and SSD (LMDB) tiers against their limits, in one run.

Modes (``--modes``, comma separated; default ``steady``):

- ``user-view``: the SSD tier as a user meets it: a writer process fills a fresh directory, the
  page cache is dropped, a new reader process reads every page; ours vs SGLang's ``HiCacheFile``
  vs raw ``O_DIRECT`` sequential I/O, as ratios (``devtools/bench/ssd/user_view.py``).
- ``throttled``: the user-view comparison on a loop device limited to each rate of
  ``--throttle-mbps`` by cgroup v1 blkio throttling (0: unthrottled), rounds A B B A; root only
  (``devtools/bench/ssd/throttled.py``).
- ``restart``: a new process opens a tier holding ``--restart-gib`` of pages: time to the first
  hit, pages recovered.
- ``put-profile``: where a put's time goes, per phase and by ``cProfile``, in a fresh process and
  directory per page size (``--user-view-pages``), and the writeback it leaves behind
  (``devtools/bench/ssd/write_path.py``).
- ``get-profile``: where a get's time goes, warm (page cache) and cold (page cache dropped), per
  phase summed over the threads that ran it, in a fresh process per page size
  (``--user-view-pages``; ``devtools/bench/ssd/read_path.py``).
- ``backlog``: pages offered at a GPU-like rate (``--backlog-rate`` GB/s) to the tier and to the raw
  disk in the same run: stored, refused, dropped, queue lag (``devtools/bench/ssd/write_path.py``).
- ``disk-speed``: one ``put_from`` of every page of a size into a new directory in a fresh process,
  then one cold ``get_into`` in a new one, against ``dd`` with ``oflag=direct`` / ``iflag=direct``
  on the same file system right before and after, as ratios (``devtools/bench/ssd/disk_speed.py``).
- ``steady``: steady state, within one process, described below.

Steady state: for each page size, batches of ``--batch-size`` pages (two segments each, like SGLang's K and V)
go through:

- ``memcpy``        numpy copies of the same segments: the DRAM tier's limit;
- ``host``          ``HostTier.put_from`` / ``get_into``;
- ``raw file``      one sequential ``writev`` / ``readv`` of the batch over an existing file (no
                    fsync, then with fsync): the disk's limit, through the page cache;
- ``lmdb``          ``LmdbTier`` with ``sync: false, writemap: false``; ``lmdb sync`` with
                    ``sync: true``; ``lmdb writemap`` (the default config) and ``lmdb sync wmap``:
                    the same with ``writemap: true``;
- ``HiCacheFile``   SGLang's ``file`` backend, ``batch_set`` / ``batch_get`` over torch tensors
                    viewing the same bytes (it never fsyncs).

Every buffer is touched once before timing (first touch of memory is slow on VMs): each backend
does an untimed put and get first, and its bytes are verified. Each round writes fresh keys after
an untimed ``clear``; reads follow the writes, so they are served from the page cache ("warm");
``--drop-caches`` (root) adds cold reads after dropping the page cache. Rounds interleave the
backends of a group (memcpy + host; raw file + lmdb + HiCacheFile), so load from other processes
hits them alike. Throughput is the best of ``--batches`` rounds (the JSON also has the median),
in GB/s (10^9 bytes/s).

    python scripts/bench_tiers.py                       # 64KiB, 1MiB, 8MiB; 3 rounds of 128 pages
    python scripts/bench_tiers.py --quick               # CI smoke (seconds)
    python scripts/bench_tiers.py --sizes 1MiB --batches 5 --json out.json
    python scripts/bench_tiers.py --modes user-view,restart --batches 3 --json ssd.json   # root
    python scripts/bench_tiers.py --modes put-profile,backlog --json write-path.json
    python scripts/bench_tiers.py --modes throttled --throttle-mbps 0,300 --batches 4   # root
    python scripts/bench_tiers.py --modes put-profile,get-profile --json profile.json
    python scripts/bench_tiers.py --modes disk-speed --batches 3 --json disk.json   # root: drop_caches
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.bench.console import human, log, run_script  # noqa: E402
from devtools.bench.ssd import modes as ssd_modes  # noqa: E402
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig, parse_size  # noqa: E402
from mooncake_sgl.tiers.host import HostTier  # noqa: E402
from mooncake_sgl.tiers.ssd import LmdbTier  # noqa: E402

GB = 1e9


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


class Batch:
    """``n`` pages of ``size`` bytes in one buffer; each page two adjacent segments (K, V)."""

    def __init__(self, n: int, size: int, seed: int) -> None:
        self.n, self.size = n, size
        self.buf = np.random.default_rng(seed).integers(0, 256, n * size, dtype=np.uint8)
        half = size // 2
        mv = memoryview(self.buf)
        self.pages = [[mv[i * size:i * size + half], mv[i * size + half:(i + 1) * size]] for i in range(n)]

    def nbytes(self) -> int:
        return self.n * self.size


def empty_batch(n: int, size: int) -> Batch:
    b = Batch.__new__(Batch)
    b.n, b.size = n, size
    b.buf = np.ones(n * size, dtype=np.uint8)  # ones, not zeros: forces the pages in now
    half = size // 2
    mv = memoryview(b.buf)
    b.pages = [[mv[i * size:i * size + half], mv[i * size + half:(i + 1) * size]] for i in range(n)]
    return b


def keys_for(r: int, n: int, tag: str) -> list[bytes]:
    return [f"{tag}-round{r}-page{i:04d}".encode() for i in range(n)]


def check(ok: object, what: str) -> None:
    if ok is not True and not (isinstance(ok, (list, tuple)) and all(ok)):
        raise SystemExit(f"bench: {what} failed (a tier refused or missed pages); aborting")


class Backend:
    """One row of the table. ``put(r)`` writes the batch under round ``r``'s keys (after an untimed
    ``reset``); ``get()`` reads the last round's pages into the destination batch."""

    name = ""
    reads = True
    on_disk = False  # cold reads only mean something for file-backed rows

    def __init__(self, src: Batch, dst: Batch) -> None:
        self.src, self.dst = src, dst
        self.last = -1

    def setup(self) -> None:
        """Untimed warm-up: one put and one get, so every buffer and file page is touched."""
        self.put(-1)
        if self.reads:
            self.get()

    def reset(self, r: int) -> None: ...
    def put(self, r: int) -> None: ...
    def get(self) -> None: ...
    def close(self) -> None: ...


class Memcpy(Backend):
    name = "memcpy"

    def put(self, r: int) -> None:
        for s, d in zip(self.src.pages, self.dst.pages):
            for a, b in zip(s, d):
                np.copyto(np.frombuffer(b, dtype=np.uint8), np.frombuffer(a, dtype=np.uint8))

    def get(self) -> None:
        self.put(0)


class Host(Backend):
    name = "host"

    def __init__(self, src: Batch, dst: Batch) -> None:
        super().__init__(src, dst)
        self.tier = HostTier(HostTierConfig(capacity=src.nbytes(), slot_size=src.size, pin_memory=True))

    def reset(self, r: int) -> None:
        self.tier.clear()

    def put(self, r: int) -> None:
        check(self.tier.put_from(keys_for(r, self.src.n, "host"), self.src.pages).ok, "host put")
        self.last = r

    def get(self) -> None:
        check(self.tier.get_into(keys_for(self.last, self.src.n, "host"), self.dst.pages), "host get")

    def close(self) -> None:
        self.tier.close()


class RawFile(Backend):
    """Sequential ``writev`` over the previous round's file (as LMDB writes over its own pages)."""

    on_disk = True

    def __init__(self, src: Batch, dst: Batch, workdir: Path, fsync: bool) -> None:
        super().__init__(src, dst)
        self.fsync, self.reads = fsync, not fsync
        self.name = "raw file fsync" if fsync else "raw file"
        self.path = workdir / ("raw-fsync.bin" if fsync else "raw.bin")
        self.iov_max = os.sysconf("SC_IOV_MAX")

    def put(self, r: int) -> None:
        segs = [s for page in self.src.pages for s in page]
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for i in range(0, len(segs), self.iov_max):
                os.writev(fd, segs[i:i + self.iov_max])
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def get(self) -> None:
        segs = [s for page in self.dst.pages for s in page]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for i in range(0, len(segs), self.iov_max):
                chunk = segs[i:i + self.iov_max]
                if os.readv(fd, chunk) != sum(c.nbytes for c in chunk):
                    raise SystemExit("bench: short read from the raw file")
        finally:
            os.close(fd)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


LMDB_VARIANTS = {"lmdb": {"sync": False, "writemap": False}, "lmdb sync": {"sync": True, "writemap": False},
                 "lmdb writemap": {"sync": False, "writemap": True},
                 "lmdb sync wmap": {"sync": True, "writemap": True}}


class Lmdb(Backend):
    on_disk = True

    def __init__(self, src: Batch, dst: Batch, workdir: Path, variant: str) -> None:
        super().__init__(src, dst)
        self.name = variant
        self.path = workdir / variant.replace(" ", "-")
        # Room for two batches: the live one and the pages the previous round freed.
        self.tier = LmdbTier(LmdbTierConfig(path=str(self.path), capacity=2 * src.nbytes() + (64 << 20),
                                            **LMDB_VARIANTS[variant]))

    def reset(self, r: int) -> None:
        self.tier.clear()

    def put(self, r: int) -> None:
        check(self.tier.put_from(keys_for(r, self.src.n, "lmdb"), self.src.pages).ok, f"{self.name} put")
        self.last = r

    def get(self) -> None:
        check(self.tier.get_into(keys_for(self.last, self.src.n, "lmdb"), self.dst.pages),
              f"{self.name} get")

    def close(self) -> None:
        self.tier.close()
        shutil.rmtree(self.path, ignore_errors=True)


class HiCacheFileBackend(Backend):
    """SGLang's ``file`` backend, built the way ``StorageBackendFactory`` builds it."""

    on_disk = True

    name = "HiCacheFile"

    def __init__(self, src: Batch, dst: Batch, workdir: Path) -> None:
        super().__init__(src, dst)
        import torch
        from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

        self.path = workdir / "hicache_file"
        os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)  # it would override the path
        storage_config = HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="bench-model", extra_config={"file_storage_path": str(self.path)})
        self.backend = HiCacheFile(storage_config)
        # Tensors over the very bytes the tiers move: one per page (K and V are adjacent).
        self.values = [torch.from_numpy(src.buf[i * src.size:(i + 1) * src.size]) for i in range(src.n)]
        self.targets = [torch.from_numpy(dst.buf[i * dst.size:(i + 1) * dst.size]) for i in range(dst.n)]

    def _keys(self, r: int) -> list[str]:
        return [k.decode() for k in keys_for(r, self.src.n, "file")]

    def reset(self, r: int) -> None:
        self.backend.clear()

    def put(self, r: int) -> None:
        check(self.backend.batch_set(self._keys(r), self.values), "HiCacheFile set")
        self.last = r

    def get(self) -> None:
        got = self.backend.batch_get(self._keys(self.last), self.targets)
        check(all(g is not None for g in got), "HiCacheFile get")

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def measure(group: list[Backend], nrounds: int, cold: bool, label: str) -> dict[str, dict[str, float]]:
    """Rounds interleave the backends of a group, so load from other processes hits them alike."""
    nbytes = group[0].src.nbytes()
    times: dict[str, dict[str, list[float]]] = {b.name: {"put": [], "get": [], "get_cold": []} for b in group}
    for b in group:
        log(f"{label} warm-up {b.name}")
        b.setup()
        if b.reads:
            verify(b.src, b.dst, b.name)
    for r in range(nrounds):
        log(f"{label} round {r + 1}/{nrounds}")
        for b in group:
            b.reset(r)
            t0 = time.perf_counter()
            b.put(r)
            times[b.name]["put"].append(time.perf_counter() - t0)
        for op in ("get", "get_cold") if cold else ("get",):
            for b in group:
                if not b.reads or (op == "get_cold" and not b.on_disk):
                    continue
                if op == "get_cold":
                    drop_page_cache()
                t0 = time.perf_counter()
                b.get()
                times[b.name][op].append(time.perf_counter() - t0)
    for b in group:  # the last round's pages, read once more untimed, must be exact
        if b.reads:
            b.get()
            verify(b.src, b.dst, b.name)
    # Best round: other processes' load only ever slows a round down; the median is kept too.
    out: dict[str, dict[str, float]] = {}
    for name, ops in times.items():
        row = out.setdefault(name, {})
        for op, ts in ops.items():
            if ts:
                row[op] = nbytes / min(ts) / GB
                row[f"{op}_median"] = nbytes / statistics.median(ts) / GB
    return out


def verify(src: Batch, dst: Batch, what: str) -> None:
    if not np.array_equal(src.buf, dst.buf):
        raise SystemExit(f"bench: {what} returned wrong bytes")
    dst.buf.fill(1)


def run_size(size: int, args: argparse.Namespace, workdir: Path) -> dict[str, dict[str, float]]:
    n, label = args.batch_size, f"[{human(size)}]"
    log(f"{label} allocating and touching 2 x {n * size / 2**20:.0f} MiB")
    src, dst = Batch(n, size, seed=size), empty_batch(n, size)
    res: dict[str, dict[str, float]] = {}
    factories: list[list[Callable[[], Backend]]] = [
        [lambda: Memcpy(src, dst), lambda: Host(src, dst)],
        [lambda: RawFile(src, dst, workdir, fsync=False), lambda: RawFile(src, dst, workdir, fsync=True)]
        + [lambda v=v: Lmdb(src, dst, workdir, v) for v in LMDB_VARIANTS]
        + ([] if args.no_hicache_file else [lambda: HiCacheFileBackend(src, dst, workdir)])]
    for makers in factories:
        group: list[Backend] = []
        try:
            for make in makers:
                group.append(make())
            res.update(measure(group, args.batches, args.drop_caches, label))
        finally:
            for b in group:
                b.close()
    return res


def table(results: dict[str, dict[str, dict[str, float]]], cold: bool) -> str:
    cols = ["put", "get"] + (["get_cold"] if cold else [])
    lines = [f"{'size':>7} {'backend':<15} " + " ".join(f"{c:>9}" for c in cols) + "   ratios"]
    for size, res in results.items():
        for name, row in res.items():
            cells = " ".join(f"{row[c]:>9.2f}" if c in row else f"{'-':>9}" for c in cols)
            ratios = []
            if name == "host":
                ratios += [f"put {row['put'] / res['memcpy']['put']:.0%} / get "
                           f"{row['get'] / res['memcpy']['get']:.0%} of memcpy"]
            if name.startswith("lmdb"):
                raw = res["raw file"]
                wraw = res["raw file fsync"] if name.startswith("lmdb sync") else raw
                wname = "raw fsync" if wraw is not raw else "raw"
                ratios += [f"put {row['put'] / wraw['put']:.0%} of {wname}, "
                           f"get {row['get'] / raw['get']:.0%} of raw"]
                if "HiCacheFile" in res:
                    hf = res["HiCacheFile"]
                    ratios += [f"vs HiCacheFile: put {row['put'] / hf['put']:.1f}x, "
                               f"get {row['get'] / hf['get']:.1f}x"]
            lines.append(f"{size:>7} {name:<15} {cells}   {'; '.join(ratios)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if ssd_modes.child(sys.argv[1:] if argv is None else argv):
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="steady",
                   help=f"steady, {', '.join(ssd_modes.MODES)} (comma separated)")
    ssd_modes.add_arguments(p)
    p.add_argument("--sizes", default="64KiB,1MiB,8MiB", help="page sizes, comma separated")
    p.add_argument("--batch-size", type=int, default=128, help="pages per put/get call (SGLang: 128)")
    p.add_argument("--batches", type=int, default=3, help="timed rounds (batches) per measurement")
    p.add_argument("--dir", default=None, help="scratch directory for LMDB, HiCacheFile and the raw file "
                   "(default: a temporary directory under $TMPDIR)")
    p.add_argument("--drop-caches", action="store_true",
                   help="also measure cold reads after dropping the page cache (needs root; "
                        "disturbs other processes' caches)")
    p.add_argument("--no-hicache-file", action="store_true", help="skip SGLang's HiCacheFile")
    p.add_argument("--quick", action="store_true", help="CI smoke: 64KiB and 1MiB, 16 pages, 1 round")
    p.add_argument("--no-metrics-overhead", action="store_true",
                   help="skip the store's put/get with metrics off vs on (devtools.metrics_overhead)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.batch_size, args.batches = "64KiB,1MiB", 16, 1
        ssd_modes.quick(args)
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    known = {"steady", *ssd_modes.MODES}
    if not modes or modes - known:
        p.error(f"--modes: expected some of {', '.join(sorted(known))}, got {args.modes!r}")
    ssd_values = ssd_modes.parsed(p, args, modes)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if any(s % 2 or s <= 0 for s in sizes):
        p.error("page sizes must be positive and even (two segments per page)")
    if args.batches < 1 or args.batch_size < 1:
        p.error("--batches and --batch-size must be at least 1")
    if args.drop_caches and not drop_page_cache():
        log("cannot drop the page cache (not root?); measuring warm reads only")
        args.drop_caches = False

    workdir = Path(tempfile.mkdtemp(prefix="bench_tiers.", dir=args.dir))
    results: dict[str, dict[str, dict[str, float]]] = {}
    started = time.perf_counter()
    script = str(Path(__file__).resolve())
    try:
        ssd = ssd_modes.run(modes, args, ssd_values, script, workdir, not args.no_hicache_file)
        if "steady" in modes:
            for size in sizes:
                results[human(size)] = run_size(size, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"scratch on {workdir.parent}; load average at the end {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    for text in ssd_modes.tables(ssd):
        print(text)
    if "steady" in modes:
        reads = "cold and warm" if args.drop_caches else "warm (page cache)"
        print(f"steady state (one process, rewriting freed space): GB/s, {args.batch_size} pages per "
              f"batch (2 segments each), best of {args.batches} rounds; file reads {reads}")
        print(table(results, args.drop_caches))
    overhead = None
    if "steady" in modes and not args.no_metrics_overhead:
        from devtools import metrics_overhead

        # Pages up to 1 MiB: the hook costs per call, so small pages show it most; larger ones
        # would only add GiBs of buffers.
        log("TieredStore put/get, --enable-metrics off vs on ...")
        overhead = metrics_overhead.run_in_child([s for s in sizes if s <= 1 << 20] or sizes[:1],
                                                 args.batch_size, 5 * args.batches, args.dir)
        print(metrics_overhead.table(overhead))
    log(f"done in {time.perf_counter() - started:.1f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "unit": "GB/s", "batch_size": args.batch_size, "rounds": args.batches,
            "cold_reads": args.drop_caches, "loadavg": os.getloadavg()[0], "results": results,
            "metrics_overhead": overhead, **ssd}, indent=2))
    return 0


if __name__ == "__main__":
    run_script(main)
