#!/usr/bin/env python3
"""Put/get GB/s across processes: our pool (shared memory, TCP) against the real Mooncake Store
(TCP), a raw loopback socket and memcpy as limits, and in-process Mooncake against our host tier.

Contenders (``--contenders``, default all; each is set up once, runs every size, is torn down):

- ``pool-shm``        pool server subprocess; client maps its segment (one memcpy per page)
- ``pool-tcp``        the same server over TCP
- ``mooncake-tcp``    mooncake_master + a storage process owning the segment; this process is a
                      pure client (``global_segment_size=0``), ``batch_put_from``/``batch_get_into``
                      on registered buffers, protocol tcp
- ``mooncake-tier``   our ``MooncakeStoreTier`` (pure client) over the same master + storage process
- ``raw-socket``      limit: one loopback connection to a subprocess that ``recv_into``s /
                      ``sendall``s a whole batch per request, 1-byte ack
- ``memcpy``          limit: numpy copies of the same pages (one process)
- ``mooncake-inproc`` Mooncake with its segment inside this process (SGLang's one-node setup)
- ``host-tier``       our in-process DRAM tier (``HostTier``)

Each round writes ``--batch`` fresh keys of one size (timed put), reads them back (timed get,
then verified byte for byte, untimed), and removes them (untimed). Round 0 is a warm-up and is not
reported; figures are the median of ``--rounds`` rounds in GB/s (10^9 B/s). Existence checks are
``--exists-keys`` present keys per call, reported in keys/s.

Adding a contender: a class with the five calls devtools/bench/transfer_contenders.py names, and
one line in its ``CONTENDERS``.

    python scripts/bench_transfer.py                              # 64KiB, 1MiB, 8MiB x128 (~3 min)
    python scripts/bench_transfer.py --sizes 64KiB --batch 16 --rounds 1     # smoke
    python scripts/bench_transfer.py --contenders pool-shm,mooncake-tcp --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("GLOG_minloglevel", "2")  # before mooncake is imported: quiet its logs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.bench.console import human, log  # noqa: E402
from devtools.bench.transfer_contenders import CONTENDERS, Ctx, page_aligned  # noqa: E402
from mooncake_sgl.config import parse_size  # noqa: E402

GB = 1e9


# -------------------------------------------------------------------------------------- runner

def run_round(c: object, size: int, r: int, args: argparse.Namespace, ctx: Ctx) -> tuple:
    """One put + get of a fresh batch: (put GB/s, get GB/s, failed pages, wrong bytes?, keys)."""
    n = size * args.batch
    src_pages = [[memoryview(ctx.src[i * size:(i + 1) * size])] for i in range(args.batch)]
    dst_pages = [[memoryview(ctx.dst[i * size:(i + 1) * size])] for i in range(args.batch)]
    keys = [f"bench/{human(size)}/{r}/{i}".encode() for i in range(args.batch)]
    ctx.dst[:n].fill(0)
    t0 = time.perf_counter()
    ok = c.put_batch(keys, src_pages)
    t1 = time.perf_counter()
    got = c.get_batch(keys, dst_pages)
    t2 = time.perf_counter()
    wrong = getattr(c, "verify", True) and not np.array_equal(ctx.src[:n], ctx.dst[:n])
    return n / (t1 - t0) / GB, n / (t2 - t1) / GB, ok.count(False) + got.count(False), wrong, keys


def exists_rate(c: object, keys: list[bytes], args: argparse.Namespace) -> tuple[float, int]:
    probe = (keys * (args.exists_keys // len(keys) + 1))[:args.exists_keys]
    calls = failed = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.exists_seconds:
        failed += c.exists_batch(probe).count(False)
        calls += 1
    return calls * len(probe) / (time.perf_counter() - t0), failed


def run_group(group: dict[str, object], sizes: list[int], args: argparse.Namespace, ctx: Ctx) -> dict:
    """Every contender of a group runs each round in turn, so a load change on a shared machine
    hits all of them alike rather than whichever ran at the time."""
    out: dict = {name: {} for name in group}
    for size in sizes:
        n = size * args.batch
        for i in range(args.batch):  # each page distinct, so a misplaced page shows
            ctx.src[i * size:i * size + 8] = np.frombuffer(struct.pack("<Q", i ^ size), dtype=np.uint8)
        acc = {name: {"put": [], "get": [], "failed": 0, "wrong": 0, "exists": None} for name in group}
        for r in range(args.rounds + 1):
            for name, c in group.items():
                put, get, failed, wrong, keys = run_round(c, size, r, args, ctx)
                a = acc[name]
                a["failed"] += failed
                a["wrong"] += wrong
                if r:  # round 0 warms up connections, mappings and the stores' memory
                    a["put"].append(put)
                    a["get"].append(get)
                if r == args.rounds and c.exists_batch is not None:
                    a["exists"], missing = exists_rate(c, keys, args)
                    a["failed"] += missing
                c.remove(keys)
        for name, a in acc.items():
            res = out[name][human(size)] = {
                "put_gbps": statistics.median(a["put"]), "get_gbps": statistics.median(a["get"]),
                "put_gbps_all": a["put"], "get_gbps_all": a["get"], "failed_pages": a["failed"],
                "rounds_with_wrong_bytes": a["wrong"], "exists_keys_per_s": a["exists"]}
            log(f"  {name:16s} {human(size):>6s}  put {res['put_gbps']:6.2f} GB/s  "
                f"get {res['get_gbps']:6.2f} GB/s  ({n / 2**20:.0f} MiB batches)"
                + (f"  exists {a['exists'] / 1e6:5.2f} M keys/s" if a["exists"] else "")
                + (f"  FAILED {a['failed']}" if a["failed"] else "")
                + (f"  WRONG BYTES x{a['wrong']}" if a["wrong"] else ""))
    return out


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:4.1f}x" if a and b else "  -  "


def report(results: dict, sizes: list[int], batch: int) -> list[dict]:
    names = list(results)
    print(f"\nput / get GB/s (median), batches of {batch}; ratio to mooncake-tcp in brackets\n")
    print(f"{'size':>6s} {'op':4s}" + "".join(f"{n:>22s}" for n in names))
    for size in sizes:
        for op in ("put", "get"):
            row = f"{human(size):>6s} {op:4s}"
            base = results.get("mooncake-tcp", {}).get(human(size), {}).get(f"{op}_gbps")
            for n in names:
                v = results[n].get(human(size), {}).get(f"{op}_gbps")
                base_n = (results.get("mooncake-inproc", {}).get(human(size), {}).get(f"{op}_gbps")
                          if n in ("host-tier", "mooncake-inproc") else base)
                row += f"{v:12.2f} ({ratio(v, base_n)})" if v is not None else f"{'n/a':>22s}"
            print(row)
    print("\nexistence checks, M keys/s: " + ", ".join(
        f"{n} {results[n][human(sizes[0])]['exists_keys_per_s'] / 1e6:.2f}" for n in names
        if results[n].get(human(sizes[0]), {}).get("exists_keys_per_s")))
    print("(host-tier and mooncake-inproc are in-process; their ratio is to mooncake-inproc)")

    def v(n: str, size: int, op: str) -> float | None:
        return results.get(n, {}).get(human(size), {}).get(f"{op}_gbps")

    targets = []
    for size in sizes:
        for op in ("put", "get"):
            need_tcp = 1.5 if size < (1 << 20) else 1.25
            checks = [("pool-tcp", need_tcp)] + ([("pool-shm", 3.0)] if size >= (1 << 20) else [])
            for n, need in checks:
                a, b = v(n, size, op), v("mooncake-tcp", size, op)
                if a and b:
                    targets.append({"what": f"{n} {op} {human(size)} >= {need}x mooncake-tcp",
                                    "ratio": round(a / b, 2), "met": a / b >= need})
    ex = {n: results.get(n, {}).get(human(sizes[0]), {}).get("exists_keys_per_s")
          for n in ("pool-shm", "pool-tcp", "mooncake-tcp")}
    for n in ("pool-shm", "pool-tcp"):
        if ex[n] and ex["mooncake-tcp"]:
            r = ex[n] / ex["mooncake-tcp"]
            targets.append({"what": f"{n} exists >= mooncake-tcp", "ratio": round(r, 2), "met": r >= 1})
    print("\ntargets:")
    for t in targets:
        print(f"  {'MET    ' if t['met'] else 'MISSED '} {t['what']}: {t['ratio']}x")
    return targets


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64KiB,1MiB,8MiB")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per size (plus one warm-up)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--exists-keys", type=int, default=2000)
    ap.add_argument("--exists-seconds", type=float, default=0.3)
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        ap.error(f"unknown contenders {unknown}; have {list(CONTENDERS)}")
    max_bytes = max(sizes) * args.batch
    # A third of slack: slab rounding and Mooncake's 90% eviction watermark.
    capacity = (max_bytes * 4 // 3 + (64 << 20)) // (32 << 20) * (32 << 20)
    log(f"allocating 2 x {max_bytes / 2**20:.0f} MiB of page buffers (touched before timing)")
    rng = np.random.default_rng(0)
    src = page_aligned(max_bytes)
    src[:] = np.resize(rng.integers(0, 256, 16 << 20, dtype=np.uint8), max_bytes)
    dst = page_aligned(max_bytes)
    dst.fill(1)
    ctx = Ctx(capacity, max_bytes, src, dst)
    results: dict = {}
    t_start = time.perf_counter()
    # Cross-process contenders run interleaved, then the in-process pair (so that only one
    # group's memory is allocated at a time).
    in_proc = ("mooncake-inproc", "host-tier")
    for group_names in ([n for n in names if n not in in_proc], [n for n in names if n in in_proc]):
        group: dict[str, object] = {}
        try:
            for name in group_names:
                log(f"[{time.perf_counter() - t_start:5.0f}s] {name}: starting")
                try:
                    group[name] = CONTENDERS[name][0](ctx)
                except Exception as e:  # a missing wheel or binary must not sink the others
                    log(f"  {name}: cannot start: {e}")
            if group:
                results.update(run_group(group, sizes, args, ctx))
        finally:
            for c in group.values():
                c.close()
    targets = report(results, sizes, args.batch)
    log(f"total {time.perf_counter() - t_start:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sizes": [human(s) for s in sizes], "batch": args.batch, "rounds": args.rounds,
            "results": results, "targets": targets,
            "roles": {n: CONTENDERS[n][1] for n in results}}, indent=2))
    bad = any(r.get("rounds_with_wrong_bytes") for c in results.values() for r in c.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
