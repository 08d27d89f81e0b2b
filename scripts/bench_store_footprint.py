#!/usr/bin/env python3
"""What a tracked SSD page costs the store in host memory, and what opening a full SSD tier costs.

An SSD tier fills once with ``--pages`` small pages (their size does not change what the store
tracks per page). Then, for each policy and for the baseline, a fresh process opens that
directory and reports:

- ``attach_s``: wall time from nothing to a store that answers (the tier opened, its index walked
  by the damage probe, every page read back and handed to the policy);
- ``heap_bytes_per_page``: the process's anonymous memory (``RssAnon``) after the open minus
  before, per page: the store's residency records and the policy's per-page state;
- ``index_locked_bytes_per_page``: the index the SSD tier keeps locked in memory
  (``tiers/ssd/resident``), per page; it is file-backed, so not in the line above;
- and what keeping that index resident costs a lookup of 64 pages, guarded against unguarded in
  the same process (the baseline variant's process).

Baseline, in the same run: the SSD tier opened alone and its pages listed (``LmdbTier.scan``), with
no store or policy; ratios are store over baseline. Figures are also scaled per 100k pages.

    python scripts/bench_store_footprint.py                          # 100k pages, lru + adaptive + heat
    python scripts/bench_store_footprint.py --pages 300000 --json footprint.json
    python scripts/bench_store_footprint.py --pages 20000 --quick    # seconds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from devtools.bench.console import comma_choices, run_script, stamped  # noqa: E402

POLICIES = ("lru", "adaptive", "heat")
PAGE_BYTES = 4096
BATCH = 1024
# Budget per page on disk (4 KiB extents) with room for the index; the capacity is a budget, not
# preallocated disk.
CAPACITY_PER_PAGE = 8 << 10

_CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0

path, what, capacity = sys.argv[2], sys.argv[3], sys.argv[4]
from mooncake_sgl.config import LmdbTierConfig, StoreConfig  # imports before the first reading
from mooncake_sgl.config_sources import load_config
from mooncake_sgl.store import build_store
from mooncake_sgl.tiers.ssd import LmdbTier
before = anon()
t0 = time.perf_counter()
if what == "tier-only":
    tier = LmdbTier(LmdbTierConfig(path=path, capacity=capacity))
    pages = sum(1 for _ in tier.scan())
    locked = tier.stats().index_locked_bytes
    held = tier
else:
    store = build_store(load_config({"policy": {"name": what},
                                     "tiers": [{"kind": "lmdb", "path": path, "capacity": capacity}]}))
    pages = int(store.stats().tiers["lmdb"].usage.pages)
    locked = store.stats().tiers["lmdb"].tier.as_dict()["index_locked_bytes"]
    held = store
attach = time.perf_counter() - t0
heap = anon() - before
guard = {}
if what == "tier-only":  # what keeping the index resident costs a lookup: guarded vs not, A B B A
    keys = [k for k, _ in zip((k for k, _ in tier.scan()), range(6400))]
    real = tier._index.resident.guard
    for rnd, on in enumerate((True, False, False, True)):
        tier._index.resident.guard = real if on else (lambda: None)
        t = time.perf_counter()
        for i in range(0, len(keys), 64):
            tier.contains(keys[i:i + 64])
        guard.setdefault("on" if on else "off", []).append(
            1e6 * (time.perf_counter() - t) / (len(keys) // 64))
    tier._index.resident.guard = real
print(json.dumps({"attach_s": attach, "heap_bytes": heap, "pages": pages,
                  "index_locked_bytes": locked, "contains64_us": guard}), flush=True)
held.close()
"""


def page_key(i: int) -> bytes:
    """A key shaped like SGLang's through ours (``keys.page_key``): a 16-byte namespace digest, a
    kind byte and a 32-byte page hash, in no particular order."""
    return b"footprint-ns-dig" + b"\x01" + hashlib.sha256(i.to_bytes(8, "little")).digest()


def fill(path: str, pages: int, capacity: int) -> float:
    from mooncake_sgl.config import LmdbTierConfig
    from mooncake_sgl.tiers.ssd import LmdbTier

    page = [memoryview(bytes(PAGE_BYTES))]
    t0 = time.perf_counter()
    tier = LmdbTier(LmdbTierConfig(path=path, capacity=capacity))
    try:
        for start in range(0, pages, BATCH):
            keys = [page_key(i) for i in range(start, min(pages, start + BATCH))]
            stored = tier.put_from(keys, [page] * len(keys)).ok
            if not all(stored):
                raise SystemExit(f"the SSD tier refused pages at {start}: is the disk under {path} full?")
            if start // BATCH % 20 == 0:
                stamped(f"filled {start + len(keys):,} of {pages:,} pages")
    finally:
        tier.close()
    return time.perf_counter() - t0


def measure(path: str, what: str, capacity: int) -> dict:
    child = subprocess.run([sys.executable, "-c", _CHILD, str(REPO), path, what, str(capacity)],
                           capture_output=True, text=True, timeout=3600)
    if child.returncode != 0:
        raise SystemExit(f"{what}: the measuring process failed (rc {child.returncode}): "
                         f"{child.stderr.strip()[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def per_page(row: dict, pages: int) -> dict:
    return {**row,
            "heap_bytes_per_page": row["heap_bytes"] / pages,
            "index_locked_bytes_per_page": row["index_locked_bytes"] / pages,
            "attach_s_per_100k_pages": row["attach_s"] * 100_000 / pages}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=100_000, help="pages in the SSD tier (default 100000)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma list of " + ", ".join(POLICIES))
    p.add_argument("--rounds", type=int, default=2,
                   help="opens per variant, interleaved (A B B A ...); the median is reported")
    p.add_argument("--dir", type=Path, help="where to put the SSD tier (default: a temporary directory)")
    p.add_argument("--quick", action="store_true", help="one round")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    policies = comma_choices(p, "--policies", args.policies, POLICIES)
    if args.pages < 1000:
        p.error("--pages: at least 1000, so per-page figures are not dominated by fixed costs")
    rounds = 1 if args.quick else max(1, args.rounds)
    capacity = args.pages * CAPACITY_PER_PAGE

    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        path = os.path.join(root, "ssd")
        stamped(f"filling an SSD tier with {args.pages:,} pages of {PAGE_BYTES} bytes at {path}")
        fill_s = fill(path, args.pages, capacity)
        variants = ["tier-only", *policies]
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for v in order:
                stamped(f"round {r + 1}/{rounds}: opening it as {v}")
                runs[v].append(measure(path, v, capacity))

    def median(v: str, field: str) -> float:
        values = sorted(run[field] for run in runs[v])
        return values[len(values) // 2]

    results = {v: per_page({f: median(v, f) for f in ("attach_s", "heap_bytes", "index_locked_bytes")},
                           args.pages) for v in variants}
    base = results["tier-only"]
    print(f"\n{args.pages:,} SSD pages (filled in {fill_s:.1f} s); medians of {rounds} opens per variant")
    print(f"{'variant':<12} {'attach s':>9} {'s/100k':>7} {'x tier':>7} {'heap B/page':>12} "
          f"{'index B/page':>13}")
    for v, row in results.items():
        ratio = row["attach_s"] / base["attach_s"] if base["attach_s"] else float("nan")
        print(f"{v:<12} {row['attach_s']:>9.2f} {row['attach_s_per_100k_pages']:>7.2f} {ratio:>6.1f}x "
              f"{row['heap_bytes_per_page']:>12.0f} {row['index_locked_bytes_per_page']:>13.0f}")
    timed = [r["contains64_us"] for r in runs["tier-only"] if r.get("contains64_us")]
    if timed:
        on = sorted(t for r in timed for t in r["on"])[len(timed)]
        off = sorted(t for r in timed for t in r["off"])[len(timed)]
        print(f"\na lookup of 64 pages on the SSD tier: {on:.1f} us with its index kept resident "
              f"(tiers/ssd/resident.py), {off:.1f} us without ({on / off:.2f}x; medians, A B B A)")
    if args.json:
        args.json.write_text(json.dumps({"pages": args.pages, "page_bytes": PAGE_BYTES, "fill_s": fill_s,
                                         "rounds": rounds, "results": results, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    run_script(main)
