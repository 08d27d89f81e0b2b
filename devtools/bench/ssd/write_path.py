"""The SSD tier's write path, for ``scripts/bench_tiers.py --modes put-profile`` and ``backlog``.

Put profile: per page size, a fresh process puts N pages into a fresh directory (as a new server
meets the tier) with each phase of the put timed where it runs on the calling thread: the checksums,
the write of the page bytes (``PageIO.write``: the wait for the writer threads, the checksums and
the index's ``txn.put`` of each page included, as they run while the bytes are written), extent
allocation, preallocation of the page file, the index's disk check; the rest of the put is the
index transaction (the lookups, the commit) and Python. Then ``os.sync`` times the
page-cache writeback the put left behind. The top functions of a ``cProfile`` of the same puts
follow (a second fresh process, so the profiler's cost is not in the phases).

Backlog: pages offered at a GPU-like rate (``--backlog-rate`` GB/s of ``--backlog-page`` pages in
batches of ``--backlog-batch``) for ``--backlog-seconds``, into a queue of ``--backlog-queue``
bytes, as SGLang's write-through hands backups to its storage thread. One consumer thread takes
batches off the queue and stores them; a batch offered while the queue is full is dropped (SGLang
drops backups then: ``sglang:hicache_backup_dropped_tokens_total``). Consumers, each in a fresh
process and directory, rounds interleaved: ``ours <mode>`` (``LmdbTier.put_from``, the default
config with ``direct_io`` from ``--backlog-direct-io``; the oldest batch removed when the next
would not fit in ``--backlog-capacity``, as the store evicts)
and ``raw O_DIRECT`` (the same bytes written sequentially with ``O_DIRECT`` in a ring of the same
size, as many requests of the same size in flight as the tier's writer keeps: the disk's limit).
Rounds run the consumers in A B B A order, so a disk whose speed drifts during the run meets each
alike, and each consumer's writeback is finished before the next one starts. Reported: pages
stored, refused, dropped, the lag from offer to stored (p50, p99, max), the rate stored (over the
run, and "on disk": over the run plus the writeback it left in the page cache, timed by an
``os.sync`` after the consumer ends), and the share of the run the tier's writer was busy (its
``write_busy_s`` over the run: ``rate(mooncake_sgl_tier_write_busy_seconds_total)`` in
``/metrics``; near 1, it cannot keep up); and per round the tier's on-disk rate over the raw
disk's in the same round. ``--backlog-rate`` takes several rates: one above what the disk absorbs
shows what each drops, one below it that the tier drops nothing the disk could have taken.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..console import human, log
from .user_view import keys, page_data, page_views, run_profile_child

GB = 1e9
_CHUNK = 4 << 20  # raw O_DIRECT request size, as ssd_user_view's raw rows
_IN_FLIGHT = 4  # raw O_DIRECT requests at once in the backlog, as the tier's writer (page_io._DIRECT_LANE)


def _tier(directory: str, capacity: int | str = "64GiB", direct_io: str = "auto"):
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier

    return LmdbTier(LmdbTierConfig(path=directory, capacity=capacity, direct_io=direct_io))


# ------------------------------------------------------------------------------ put profile

def profile_child(directory: str, size: int, n: int, batch: int, with_cprofile: bool) -> None:
    """``bench_tiers.py _put-profile DIR SIZE N BATCH 0|1``: prints one JSON line."""
    from mooncake_sgl.tiers.ssd import extents, index, page_io

    phases: dict[str, float] = {}

    def timed(owner: object, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[label] = phases.get(label, 0.0) + time.perf_counter() - t0
        setattr(owner, name, wrapper)

    if not with_cprofile:
        timed(page_io, "checksum", "checksum (caller)")
        timed(page_io.PageIO, "write", "page bytes written (checksums, index puts included)")
        timed(extents.ExtentAllocator, "allocate", "extent allocation")
        timed(extents.ExtentFile, "reserve", "page file preallocation")
        timed(index.LmdbIndex, "room", "index disk check")
    buf = page_data(size, n)
    pages, names = page_views(buf, size, n), keys(n)
    tier = _tier(directory)
    prof = cProfile.Profile() if with_cprofile else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    for i in range(0, n, batch):
        if not all(tier.put_from(names[i:i + batch], pages[i:i + batch]).ok):
            raise SystemExit("bench: the tier refused pages in the put profile")
    if prof is not None:
        prof.disable()
    took = time.perf_counter() - t0
    t1 = time.perf_counter()
    os.sync()
    writeback = time.perf_counter() - t1
    direct = tier._io.direct
    tier.close()
    out: dict = {"put_s": took, "writeback_s": writeback, "o_direct_available": direct}
    if prof is None:
        out["phases"] = phases
    else:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(8)
        out["profile"] = [line for line in text.getvalue().splitlines()
                          if line.strip() and not line.startswith(("   Ordered", "         "))][-9:]
    print(json.dumps(out), flush=True)


def put_profile(script: str, sizes: list[tuple[int, int]], batch: int, workdir: Path) -> dict:
    out: dict[str, dict] = {}
    for size, n in sizes:
        label = f"{human(size)} x{n}"
        row: dict = {}
        for prof in (0, 1):
            log(f"[put profile {label}] {'cProfile' if prof else 'phases'}")
            got = run_profile_child(script, "_put-profile", workdir / "put-profile", size, n, batch, prof)
            row.update(got if not prof else {"profile": got["profile"]})
        row["nbytes"] = size * n
        out[label] = row
    return out


def put_profile_table(prof: dict) -> str:
    lines = ["put profile: fresh process and directory; each phase's seconds on the calling thread "
             "(share of the put)"]
    for label, row in prof.items():
        put, nbytes = row["put_s"], row["nbytes"]
        lines.append(f"{label}: put {put * 1e3:.0f} ms = {nbytes / put / GB:.2f} GB/s; writeback after "
                     f"it (os.sync) {row['writeback_s'] * 1e3:.0f} ms; O_DIRECT "
                     f"{'available' if row['o_direct_available'] else 'not available'}")
        accounted = 0.0
        for name, s in sorted(row["phases"].items(), key=lambda kv: -kv[1]):
            # The checksums run inside the write phase; count them once.
            accounted += s if not name.startswith("checksum") else 0.0
            lines.append(f"    {name:<42} {s * 1e3:8.1f} ms {s / put:5.0%}")
        rest = put - accounted
        lines.append(f"    {'index lookups, commit, Python':<42} {rest * 1e3:8.1f} ms {rest / put:5.0%}")
        lines.extend("    | " + line for line in row["profile"])
    return "\n".join(lines)


# ------------------------------------------------------------------------------ backlog

def backlog_child(consumer: str, directory: str, page: int, batch: int, rate: float, seconds: float,
                  queue_bytes: int, capacity: int) -> None:
    """``bench_tiers.py _backlog auto|direct|buffered|raw DIR PAGE BATCH RATE SECONDS QUEUE
    CAPACITY``: one JSON line."""
    pool = 2 * batch  # source pages, reused like a host pool's slots
    buf = page_data(page, pool)
    views = page_views(buf, page, pool)
    batch_bytes = page * batch
    interval = batch_bytes / (rate * GB)
    q: deque[tuple[float, int]] = deque()
    cv = threading.Condition()
    counts = {"offered": 0, "stored": 0, "refused": 0, "dropped": 0}
    lags: list[float] = []
    producing = True

    tier = _tier(directory, capacity, consumer) if consumer != "raw" else None
    raw_writers = ThreadPoolExecutor(_IN_FLIGHT)
    fd = -1
    if tier is None:
        fd = os.open(os.path.join(directory, "raw.bin"), os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        os.posix_fallocate(fd, 0, capacity)
    ring = capacity // batch_bytes
    held: deque[list[bytes]] = deque()

    def store(seq: int) -> int:
        names = [b"backlog-%09d-%03d" % (seq, j) for j in range(batch)]
        src = [views[(seq * batch + j) % pool] for j in range(batch)]
        if tier is None:
            at = (seq % ring) * batch_bytes
            mv = memoryview(buf)
            writes = []
            for j in range(batch):
                first = (seq * batch + j) % pool * page
                writes.extend((mv[first + off:first + min(page, off + _CHUNK)], at + j * page + off)
                              for off in range(0, page, _CHUNK))
            list(raw_writers.map(lambda w: os.pwrite(fd, *w), writes))
            return batch
        if len(held) >= ring:  # the store evicts the oldest pages to make room
            tier.remove(held.popleft())
        ok = tier.put_from(names, src).ok
        held.append([k for k, good in zip(names, ok) if good])
        return sum(ok)

    def consume() -> None:
        while True:
            with cv:
                while not q and producing:
                    cv.wait()
                if not q:
                    return
                offered_at, seq = q[0]
            got = store(seq)
            done = time.perf_counter()
            with cv:
                q.popleft()
                counts["stored"] += got
                counts["refused"] += batch - got
            lags.append(done - offered_at)

    worker = threading.Thread(target=consume)
    worker.start()
    t0 = time.perf_counter()
    seq = 0
    while True:
        due = t0 + seq * interval
        if due - t0 >= seconds:
            break
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        with cv:
            counts["offered"] += batch
            if (len(q) + 1) * batch_bytes > queue_bytes:
                counts["dropped"] += batch
            else:
                q.append((time.perf_counter(), seq))
                cv.notify()
        seq += 1
    with cv:
        producing = False
        cv.notify()
    worker.join()
    elapsed = time.perf_counter() - t0
    stats = tier.stats() if tier is not None else None
    busy = stats.write_busy_s / elapsed if stats is not None else None
    raw_writers.shutdown()
    if tier is not None:
        tier.close()
    else:
        os.close(fd)
    lags.sort()
    print(json.dumps({**counts, "elapsed_s": elapsed, "stored_gbps": counts["stored"] * page / elapsed / GB,
                      "lag_p50_s": lags[len(lags) // 2] if lags else 0.0,
                      "lag_p99_s": lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else 0.0,
                      "lag_max_s": lags[-1] if lags else 0.0, "writer_busy": busy,
                      "direct_pages": stats.direct_pages if stats is not None else None,
                      "buffered_throttled": stats.buffered_throttled if stats is not None else None}),
          flush=True)


def backlog(script: str, page: int, batch: int, rates: list[float], seconds: float, queue_bytes: int,
            capacity: int, rounds: int, workdir: Path, modes: list[str]) -> list[dict]:
    """One result per offered rate, its rounds interleaved A B B A."""
    return [_backlog_at(script, page, batch, rate, seconds, queue_bytes, capacity, rounds, workdir, modes)
            for rate in rates]


def _backlog_at(script: str, page: int, batch: int, rate: float, seconds: float, queue_bytes: int,
                capacity: int, rounds: int, workdir: Path, modes: list[str]) -> dict:
    consumers = ["raw O_DIRECT", *(f"ours {m}" for m in modes)]
    runs: dict[str, list[dict]] = {c: [] for c in consumers}
    for r in range(rounds):
        for c in consumers if r % 2 == 0 else consumers[::-1]:
            log(f"[backlog {rate:.2f} GB/s of {human(page)} pages] round {r + 1}/{rounds}: {c}")
            d = workdir / "backlog"
            d.mkdir(parents=True)
            try:
                verb = c.split()[-1] if c.startswith("ours") else "raw"
                res = subprocess.run([sys.executable, script, "_backlog", verb, str(d),
                                      *map(str, (page, batch, rate, seconds, queue_bytes, capacity))],
                                     capture_output=True, text=True)
                # What the page cache still holds goes to the disk now, before the files are deleted
                # (which would discard it) and before the next consumer (which would pay for it).
                t0 = time.perf_counter()
                os.sync()
                writeback = time.perf_counter() - t0
            finally:
                shutil.rmtree(d, ignore_errors=True)
            if res.returncode:
                raise SystemExit(f"bench: backlog child failed: {res.stderr[-2000:]}")
            run = json.loads(res.stdout.splitlines()[-1])
            run["writeback_s"] = writeback
            run["on_disk_gbps"] = run["stored"] * page / (run["elapsed_s"] + writeback) / GB
            runs[c].append(run)
    summary = {c: {k: statistics.median(run[k] for run in rs) for k in rs[0] if rs[0][k] is not None}
               for c, rs in runs.items()}
    raw = runs["raw O_DIRECT"]
    vs_raw = {c: [o["on_disk_gbps"] / w["on_disk_gbps"] if w["on_disk_gbps"] else None
                  for o, w in zip(rs, raw)] for c, rs in runs.items() if c != "raw O_DIRECT"}
    return {"rate_gbps": rate, "page": human(page), "batch": batch, "seconds": seconds,
            "queue_bytes": queue_bytes, "capacity": capacity, "rounds": rounds, "runs": runs,
            "median": summary, "vs_raw_by_round": vs_raw}


def backlog_table(b: dict) -> str:
    lines = [f"backlog: {b['rate_gbps']:.2f} GB/s offered for {b['seconds']:g}s in batches of "
             f"{b['batch']} x {b['page']}, queue {b['queue_bytes'] / 2**20:.0f} MiB; medians of "
             f"{b['rounds']} interleaved rounds (fresh process and directory each)",
             "(GB/s: stored over the run; on disk: stored over the run and the writeback it left)",
             f"{'consumer':<13} {'offered':>8} {'stored':>7} {'refused':>8} {'dropped':>8} "
             f"{'GB/s':>6} {'on disk':>8} {'lag p50':>8} {'p99':>7} {'max':>7} {'writer busy':>12}"]
    for c, m in b["median"].items():
        bound = f"{m['writer_busy']:.0%}" if "writer_busy" in m else "-"
        lines.append(f"{c:<13} {m['offered']:>8.0f} {m['stored']:>7.0f} {m['refused']:>8.0f} "
                     f"{m['dropped']:>8.0f} {m['stored_gbps']:>6.2f} {m['on_disk_gbps']:>8.2f} "
                     f"{m['lag_p50_s']:>7.2f}s {m['lag_p99_s']:>6.2f}s {m['lag_max_s']:>6.2f}s {bound:>12}")
    raw = b["median"]["raw O_DIRECT"]
    for c, ratios in b["vs_raw_by_round"].items():
        m = b["median"][c]
        rounds = ", ".join("-" if x is None else f"{x:.2f}" for x in ratios)
        lines.append(f"{c}: on-disk rate over the raw disk's in the same round {rounds}; dropped "
                     f"{m['dropped']:.0f} pages to its {raw['dropped']:.0f} (medians)")
    return "\n".join(lines)
