#!/usr/bin/env python3
"""Latency of SGLang's storage calls while placement work is busy: placement inline ("before": the
promotion, eviction and demotion I/O runs on the calling thread, as the store did before the mover)
vs on the background mover ("after").

What is timed: ``TieredStore.get_into`` and ``TieredStore.put_from``, the calls ``batch_get_v1`` and
``batch_set_v1`` make (the adapter adds key derivation and page views over SGLang's host pool, the
same in both columns). Setup, the same for both columns and seeded: a small host DRAM tier in front
of LMDB (in a temporary directory), the heat policy tuned so that placement has work to do (every
page found in LMDB is promoted, every evicted page that was looked up is demoted, new pages reach
LMDB only by demotion), a prefetch thread (``exists_prefix`` + ``get_into`` of a document's pages,
documents drawn with Zipf popularity, most of them only in LMDB) and a backup thread (``put_from`` of
fresh documents), running at the same time, each pausing ``--gap-ms`` between calls (SGLang's
storage threads are paced by the scheduler; the mover works in those gaps). On a machine with spare
cores the mover runs beside the callers; on an oversubscribed one it competes with them for CPU and
the GIL, which shows in the "after" column.

    python scripts/bench_mover_latency.py --ops 300 --json /tmp/mover.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.bench.results import percentile  # noqa: E402
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig, PolicyConfig  # noqa: E402
from mooncake_sgl.policy import policy_for_capacities  # noqa: E402
from mooncake_sgl.store import TieredStore  # noqa: E402
from mooncake_sgl.tiers.host import HostTier  # noqa: E402
from mooncake_sgl.tiers.ssd import LmdbTier  # noqa: E402

MODES = ("inline", "background")
LABELS = {"inline": "before (inline)", "background": "after (mover)"}
# Arbitrary: pages per document (one prefetch or backup batch).
DOC_PAGES = 8


def page(seed: int, nbytes: int) -> list[memoryview]:
    """A two-segment page (as SGLang's page_first layout hands K and V) with seeded bytes."""
    half = nbytes // 2
    data = memoryview(bytearray(random.Random(seed).randbytes(16) * (nbytes // 16)))
    return [data[:half], data[half:]]


def doc_keys(d: int) -> list[bytes]:
    return [b"bench-mover-" + d.to_bytes(4, "big") + i.to_bytes(4, "big") for i in range(DOC_PAGES)]


def run_mode(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    nbytes = args.page_kib << 10
    host_cap = args.host_pages * nbytes
    lmdb_cap = max(64 << 20, 4 * (args.docs + args.ops) * DOC_PAGES * nbytes)
    tiers = [HostTier(HostTierConfig(capacity=host_cap, slot_size=nbytes, pin_memory=False)),
             LmdbTier(LmdbTierConfig(path=str(workdir / mode), capacity=lmdb_cap, sync=False))]
    config = PolicyConfig(name="heat", admission_min_hits=15, admission_min_reuse=1.0, demotion_min_hits=1,
                          promotion_min_hits=1)
    store = TieredStore(tiers, policy_for_capacities(config, [host_cap, lmdb_cap]), mover=mode)
    src = [page(s, nbytes) for s in range(64)]
    try:
        # Prefill: every document written once and looked up once (so its pages are warm), then
        # pushed out of DRAM into LMDB by the ones after it.
        for d in range(args.docs):
            store.exists_prefix(doc_keys(d))
            store.put_from(doc_keys(d), [src[(d + i) % 64] for i in range(DOC_PAGES)])
        store.drain(120)
        before = store.stats().as_dict()
        gets: list[float] = []
        puts: list[float] = []
        start = threading.Barrier(2)
        gap = args.gap_ms / 1e3

        def prefetch() -> None:
            rng = random.Random(args.seed)
            weights = [1.0 / (i + 1) ** 0.6 for i in range(args.docs)]
            dst = [[memoryview(bytearray(s.nbytes)) for s in src[0]] for _ in range(DOC_PAGES)]
            start.wait()
            for _ in range(args.ops):
                keys = doc_keys(rng.choices(range(args.docs), weights)[0])
                run = store.exists_prefix(keys)
                t0 = time.perf_counter()
                store.get_into(keys[:run], dst[:run])
                gets.append(time.perf_counter() - t0)
                time.sleep(gap)

        def backup() -> None:
            start.wait()
            for n in range(args.ops):
                keys = doc_keys(args.docs + n)
                pages = [src[(n + i) % 64] for i in range(DOC_PAGES)]
                t0 = time.perf_counter()
                store.put_from(keys, pages)
                puts.append(time.perf_counter() - t0)
                time.sleep(gap)

        threads = [threading.Thread(target=prefetch), threading.Thread(target=backup)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        store.drain(120)
        after = store.stats().as_dict()
    finally:
        store.close()
    moved = {}
    for name in ("promotions", "demotions", "evictions"):
        moved[name] = sum(after["tiers"][t]["store"][name] - before["tiers"][t]["store"][name]
                          for t in after["tiers"])
    return {"mode": mode, "wall_s": wall, "get_s": gets, "put_s": puts, "moved_pages": moved,
            "room_waits": after["mover"]["waits"] - before["mover"]["waits"],
            "promotions_dropped": after["store"]["promotions_dropped"]
            - before["store"]["promotions_dropped"]}


def table(results: dict[str, dict[str, Any]]) -> str:
    cols = list(results.values())
    rows = [f"{'':26}" + "".join(f"{LABELS[m]:>18}" for m in results)]
    for call, what in (("get", "get_into"), ("put", "put_from")):
        for q in ("p50_ms", "p99_ms", "max_ms"):
            rows.append(f"{what + ' ' + q[:-3]:26}" + "".join(f"{r[call][q]:15.2f} ms" for r in cols))
    for name in ("promotions", "demotions", "evictions"):
        rows.append(f"{name + ' (pages)':26}" + "".join(f"{r['moved_pages'][name]:18d}" for r in cols))
    rows.append(f"{'promotions dropped':26}" + "".join(f"{r['promotions_dropped']:18d}" for r in cols))
    rows.append(f"{'writes waiting for room':26}" + "".join(f"{r['room_waits']:18d}" for r in cols))
    rows.append(f"{'wall':26}" + "".join(f"{r['wall_s']:16.2f} s" for r in cols))
    return "\n".join(rows)


def pooled(mode: str, rounds: list[dict[str, Any]], samples: dict[str, list[float]]) -> dict[str, Any]:
    """One column from several rounds: percentiles over every call, sums of the counts."""
    out: dict[str, Any] = {"mode": mode, "rounds": len(rounds),
                           "wall_s": sum(r["wall_s"] for r in rounds),
                           "promotions_dropped": sum(r["promotions_dropped"] for r in rounds),
                           "room_waits": sum(r["room_waits"] for r in rounds),
                           "moved_pages": {k: sum(r["moved_pages"][k] for r in rounds)
                                           for k in rounds[0]["moved_pages"]}}
    for call in ("get", "put"):
        v = samples[call]
        out[call] = {"calls": len(v), "p50_ms": 1e3 * percentile(v, 0.5), "p99_ms": 1e3 * percentile(v, 0.99),
                     "max_ms": 1e3 * max(v, default=0.0)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=300, help="prefetch calls and backup calls, each (300)")
    ap.add_argument("--docs", type=int, default=200,
                    help=f"documents of {DOC_PAGES} pages written first (200)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds per column, alternating columns so machine noise hits both (3)")
    ap.add_argument("--page-kib", type=int, default=256, help="page size in KiB (256)")
    ap.add_argument("--host-pages", type=int, default=96, help="host DRAM tier size in pages (96)")
    ap.add_argument("--gap-ms", type=float, default=2.0,
                    help="pause after each call (SGLang's storage threads are paced by the scheduler, "
                         "not saturated); 0 runs back to back (2)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write both columns here")
    args = ap.parse_args(argv)
    if min(args.ops, args.docs, args.page_kib, args.rounds) < 1 or args.host_pages < DOC_PAGES:
        ap.error("--ops, --docs, --page-kib and --rounds must be positive, --host-pages at least "
                 f"{DOC_PAGES}")
    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-mover-") as tmp:
        for r in range(args.rounds):
            for mode in MODES:
                rounds[mode].append(run_mode(mode, args, Path(tmp) / str(r)))
    results = {m: pooled(m, rs, {"get": [x for r in rs for x in r["get_s"]],
                                 "put": [x for r in rs for x in r["put_s"]]})
               for m, rs in rounds.items()}
    print(f"{args.rounds} x ({args.ops} prefetch + {args.ops} backup calls, {args.gap_ms:g} ms apart) of "
          f"{DOC_PAGES} pages x {args.page_kib} KiB, host tier {args.host_pages} pages over LMDB, "
          f"{args.docs} documents\n")
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results},
                                        indent=1))
        print(f"\njson: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
