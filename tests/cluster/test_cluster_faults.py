"""Faults under live traffic, short version (2 hosts, one fault of each kind, bounded time).

Host 0 runs a live CPU SGLang server (our backend over a pool tier, the Mooncake Store and an LMDB
tier on a small file system of its own, filled before the server started) and the standby Mooncake
master; host 1 the pool server, etcd and the leading master. sglang-router, on this machine, sends
the traffic to the server. The faults are ``cluster_faults.schedule``'s (the bench's too): the SSD
tier's disk full, the server's host cut off 10 s, the pool's host killed and restarted, the active
master killed. For each: no request may fail, no answer may differ from its cold answer (greedy ids,
bit-identical logprobs), and storage hits must resume after it is healed.

Each wait has its own generous deadline (a loaded two-core machine); nothing is timed to pass.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from devtools.testing import cluster_faults as F
from devtools.testing.cluster import Cluster
from devtools.tiny_model import write_tiny_llama

from .conftest import needs_netns

# What the filled disk leaves free: enough for the LMDB index to open (about 1.1 MiB here), a few
# 64 KiB pages at most; the tier's budget (24 MiB) is far beyond it.
DISK_LEFT = 1536 << 10


def tiers(path: Path, pool: str, etcd: str, local: str, disk: Path) -> Path:
    path.write_text(f"""
tiers:
  - {{kind: pool, endpoints: ["{pool}"], timeout: 2s}}
  - {{kind: mooncake_store, master: "etcd://{etcd}", local_hostname: "{local}", segment_size: 16MiB,
     buffer_size: 8MiB, reconnect_after: 1s, put_retry_window: 0.5s}}
  - {{kind: lmdb, path: "{disk / 'lmdb'}", capacity: 24MiB}}
""")
    return path


@needs_netns
def test_each_fault_costs_no_request_and_no_output_and_hits_resume(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "model")
    rng = random.Random(3)
    prompts = [[rng.randrange(10, 32000) for _ in range(1024)] for _ in range(3)]
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    with Cluster(2, tmp_path / "cluster") as c:
        a, b = c.hosts
        pool = c.pool(b, capacity="128MiB", slab_size="1MiB")
        etcd = c.etcd(b)
        masters = [c.master(b, etcd), c.master(a, etcd)]
        disk = c.disk("48m")
        free = F.fill(disk, DISK_LEFT)
        tiers_yaml = tiers(tmp_path / "tiers.yaml", pool.endpoint, etcd.endpoint, a.addr, disk)
        server = c.sglang(a, model, tiers_yaml, extra=("--max-total-tokens", "16384", "--enable-metrics"))
        log(f"server up (its SSD tier opened with {free >> 10} KiB free)")
        with ThreadPoolExecutor(1) as ex:  # the router's start (a minute or more when loaded) overlaps
            starting = ex.submit(c.router, [server.url], "round_robin", extra=F.ROUTER_RETRIES)
            cold = F.cold_outputs(server.url, prompts, 4)
            log("cold answers done")
            router = starting.result()
        log("router routes to the server")
        traffic = F.Traffic(router.url, [server.url], prompts, cold, 4).start()
        try:
            traffic.wait_for(3, 600)
            rig = F.Rig(c, a, b, lambda: (pool.start(), etcd.start(), masters[0].start()), masters, disk,
                        [server.url])
            reports = F.schedule(rig, traffic, F.scraper([server.url]), log)
        finally:
            traffic.stop()
    print(json.dumps([r.as_dict() for r in reports], indent=1))
    log("done")
    for r in reports:
        assert r.failed == 0 and r.differing == 0, r
        assert r.hits_resume_s is not None, r
    full = reports[0]
    assert full.fault.startswith("SSD tier's disk full"), full
    # While full, the SSD tier could hold next to nothing of its 24 MiB and took the pages written
    # again only by refusing them or evicting its own; the hits came from the pool.
    during, after = full.tiers["during"], full.tiers["after"]
    assert during["lmdb"]["holdable_bytes"] < 2 << 20, full
    assert during["lmdb"]["puts_refused"] + during["lmdb"]["evictions"] > 0, full
    assert during["pool"]["hits"] > 0, full
    assert after["lmdb"]["holdable_bytes"] > 16 << 20, full  # the filler removed: room again
