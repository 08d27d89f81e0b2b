#!/usr/bin/env python3
"""Throughput of a hybrid model's storage batch (KV pages plus their sidecar pool) through our host
tier vs SGLang's own Mooncake Store backend, in one process and one run.

For each setup of ``devtools.testing.hybrid_pools`` (MHA+Mamba, MLA+DSA indexer, MHA+SWA, MHA
with a draft model's KV), with
real sglang host pools on CPU at the sizes given below, both backends get the calls SGLang's cache
controller makes for one batch of ``--pages`` pages:

- backup:  ``batch_set_v2`` (the sidecar: Mamba state / SWA window at the batch end, or the DSA
           indexer / draft KV of every page) then ``batch_set_v1`` (the KV pages), fresh keys every
           round;
- restore: ``batch_exists_v2`` then ``batch_get_v1`` and ``batch_get_v2`` into other host slots,
           verified byte for byte against the source.

Ours: ``MooncakeSglStorage`` with one host DRAM tier (``lru``, so nothing but the tier is timed).
Baseline: SGLang's ``MooncakeStore`` on a real ``mooncake_master`` (127.0.0.1, protocol tcp; an
in-process client copies with memcpy). Rounds interleave the two backends so other load hits both
alike; the table shows the median of ``--rounds`` (and the ratio of the best rounds; the JSON has
every round), in GB/s (10^9 B/s) of KV plus sidecar bytes. Each round starts from a cleared backend
(untimed) and writes fresh keys.

    python scripts/bench_v2.py                      # 32-page batches, 10 rounds, all setups
    python scripts/bench_v2.py --quick              # seconds: tiny pools, 1 round
    python scripts/bench_v2.py --setups mha+mamba --pages 64 --rounds 5 --json v2.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.bench.console import human, log  # noqa: E402

# Realistic per-page sizes at a small scale: 64-token pages, 8 layers of 8 heads x 128 (2 MiB KV
# pages), a Mamba state of about 0.8 MiB, a 4-layer SWA pool, MLA rows of 576 with a DSA indexer.
FULL = {"page": 64, "layers": 8, "heads": 8, "head_dim": 128, "swa_layers": 4, "mla_dim": 576,
        "mamba_layers": 6, "mamba_heads": 8, "mamba_state": 64}
LEASE_S = 0.5  # the master's read lease (arbitrary: long enough for a batch under load)
QUICK = {"page": 16, "layers": 2, "heads": 2, "head_dim": 32, "swa_layers": 2, "mla_dim": 64,
         "mamba_layers": 2, "mamba_heads": 2, "mamba_state": 16}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setups", default="mha+mamba,mla+dsa,mha+swa,mha+draft",
                   help="comma-separated hybrid setups (default: all four)")
    p.add_argument("--pages", type=int, default=32, help="KV pages per batch (default 32)")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds per backend (default 10)")
    p.add_argument("--quick", action="store_true", help="tiny pools, one round, 8 pages (CI smoke)")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args(argv)
    if args.quick:
        args.pages, args.rounds = 8, 1
    if args.pages < 1 or args.rounds < 1:
        p.error("--pages and --rounds must be at least 1")
    return args


class Batch:
    """One backend's pools and the calls of one batch; every round uses fresh page hashes."""

    def __init__(self, name: str, shape: Any, pages: int, make_backend: Any) -> None:
        from devtools.testing import hybrid_pools

        self.hp = hybrid_pools
        self.setup = hybrid_pools.build(name, shape)
        self.backend = make_backend(self.setup)
        s = self.setup
        self.pages = pages
        self.src, self.dst = s.kv.alloc(pages * s.page), s.kv.alloc(pages * s.page)
        self.side_n = pages if s.kv_derived else s.window
        if not s.kv_derived:
            self.side_src = s.side.alloc(s.side_slots(self.side_n))
            self.side_dst = s.side.alloc(s.side_slots(self.side_n))
        hybrid_pools.fill(s.kv, self.src, seed=1)
        hybrid_pools.fill(s.side, self.src if s.kv_derived else self.side_src, seed=2)
        self.nbytes = (pages * hybrid_pools.page_nbytes(s.kv)
                       + self.side_n * hybrid_pools.page_nbytes(s.side))
        self.round = 0

    def _sidecar(self, hashes: list[str], restore: bool) -> Any:
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

        s = self.setup
        if s.kv_derived:
            return PoolTransfer(name=s.side_name, host_indices=self.dst if restore else self.src,
                                keys=hashes, indices_from_pool=PoolName.KV)
        return PoolTransfer(name=s.side_name, host_indices=self.side_dst if restore else self.side_src,
                            keys=hashes[-self.side_n:], hit_policy=PoolHitPolicy.TRAILING_PAGES)

    def run(self) -> tuple[float, float]:
        """One backup and one restore of fresh pages: (backup seconds, restore seconds). The
        backend is cleared first (untimed), so every round writes into memory the warm-up touched:
        first touch of fresh memory on a VM costs more than the copy being measured."""
        s, b = self.setup, self.backend
        if self.round:
            time.sleep(LEASE_S)  # Mooncake keeps leased objects through a clear
        b.clear()
        self.round += 1
        hashes = s.hashes(s.tokens(self.pages, seed=1000 + self.round))
        t0 = time.perf_counter()
        stored = b.batch_set_v2([self._sidecar(hashes, restore=False)])
        ok = all(next(iter(stored.values()))) and all(b.batch_set_v1(hashes, self.src))
        t1 = time.perf_counter()
        found = b.batch_exists_v2(hashes, [s.query_transfer()])
        got = b.batch_get_v1(hashes, self.dst)
        side = b.batch_get_v2([self._sidecar(hashes, restore=True)])
        t2 = time.perf_counter()
        if not ok or found.kv_hit_pages != self.pages or not all(got) or not all(next(iter(side.values()))):
            raise RuntimeError(f"{type(b).__name__} {s.name}: stored={ok} hit={found.kv_hit_pages} "
                               f"got={sum(got)} sidecar={side}")
        self._verify()
        return t1 - t0, t2 - t1

    def _verify(self) -> None:
        s, hp = self.setup, self.hp
        if hp.read(s.kv, self.dst) != hp.read(s.kv, self.src):
            raise RuntimeError(f"{s.name}: restored KV bytes differ")
        side_src, side_dst = (self.src, self.dst) if s.kv_derived else (self.side_src, self.side_dst)
        if hp.read(s.side, side_dst) != hp.read(s.side, side_src):
            raise RuntimeError(f"{s.name}: restored {s.side_name} bytes differ")
        hp.fill(s.kv, self.dst, seed=3)  # the next round's restore must write every byte again
        hp.fill(s.side, side_dst, seed=4)


def _gbps(nbytes: int, seconds: list[float]) -> dict[str, float]:
    return {"best_gbps": nbytes / min(seconds) / 1e9,
            "median_gbps": nbytes / statistics.median(seconds) / 1e9}


def bench_setup(name: str, shape: Any, args: argparse.Namespace, master: Any) -> dict[str, Any]:
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    from devtools.testing import hybrid_pools
    from mooncake_sgl.hicache.backend import MooncakeSglStorage

    def room(setup: Any) -> int:
        # One batch (each round starts from a cleared backend), whole parts and slots included,
        # with an arbitrary 2x margin.
        per_page = hybrid_pools.page_nbytes(setup.kv) + hybrid_pools.page_nbytes(setup.side)
        return int(per_page * args.pages * 2) + (64 << 20)

    def ours(setup: Any) -> Any:
        extra = {"tiers": [{"kind": "host", "capacity": room(setup), "pin_memory": False}],
                 "policy": {"name": "lru"}}
        return setup.attach(MooncakeSglStorage(setup.storage_config(extra), setup.kv))

    def theirs(setup: Any) -> Any:
        extra = {"master_server_address": master.rpc_address, "metadata_server": "P2PHANDSHAKE",
                 "protocol": "tcp", "local_hostname": "127.0.0.1", "global_segment_size": room(setup),
                 "device_name": ""}
        return setup.attach(MooncakeStore(setup.storage_config(extra), setup.kv))

    batches = {"ours": Batch(name, shape, args.pages, ours), "sglang": Batch(name, shape, args.pages, theirs)}
    for b in batches.values():
        b.run()  # warm-up: first touch of every buffer, untimed
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in batches}
    for _ in range(args.rounds):
        for label, b in batches.items():
            w, r = b.run()
            times[label][0].append(w)
            times[label][1].append(r)
    nbytes = batches["ours"].nbytes
    out = {"setup": name, "pages": args.pages, "batch_bytes": nbytes,
           "kv_page_bytes": batches["ours"].hp.page_nbytes(batches["ours"].setup.kv),
           "sidecar": str(batches["ours"].setup.side_name),
           "sidecar_page_bytes": batches["ours"].hp.page_nbytes(batches["ours"].setup.side)}
    for label in batches:
        out[label] = {"backup": _gbps(nbytes, times[label][0]), "restore": _gbps(nbytes, times[label][1]),
                      "backup_s": times[label][0], "restore_s": times[label][1]}
    batches["ours"].backend.close()
    for b in batches.values():
        b.backend = None
    batches.clear()
    gc.collect()  # the Mooncake client unmounts its segment while the master is still up
    return out


def table(results: list[dict[str, Any]]) -> str:
    header = ["setup", "batch", "op", "ours GB/s", "SGLang mooncake GB/s", "ratio", "ratio of bests"]
    rows = []
    for r in results:
        for op in ("backup", "restore"):
            ours, base = r["ours"][op], r["sglang"][op]
            rows.append([r["setup"], f"{r['pages']}x{human(r['kv_page_bytes'])}+{r['sidecar']}", op,
                         f"{ours['median_gbps']:.2f}", f"{base['median_gbps']:.2f}",
                         f"{ours['median_gbps'] / base['median_gbps']:.2f}x",
                         f"{ours['best_gbps'] / base['best_gbps']:.2f}x"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows])


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from devtools.testing import MooncakeMaster
    from devtools.testing.hybrid_pools import SETUPS, Shape

    names = [n.strip() for n in args.setups.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETUPS]
    if unknown:
        log(f"unknown setup(s) {unknown}; known: {', '.join(SETUPS)}")
        return 2
    shape = Shape(pages=2 * args.pages + 2, **(QUICK if args.quick else FULL))
    results = []
    # Mooncake leases every object it serves (10 s by default) and will not remove it meanwhile;
    # a short lease, waited out before the untimed clear between rounds, frees the segment.
    with MooncakeMaster(lease_ttl=f"{int(LEASE_S * 1000)}ms") as master:
        for name in names:
            log(f"{name}: {args.pages}-page batches, {args.rounds} round(s) per backend")
            results.append(bench_setup(name, shape, args, master))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=2))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
