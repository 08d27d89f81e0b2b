"""The pool server in a subprocess, with clients in other processes: concurrent writers and
readers with every byte checked, a crash mid-batch and a restart, sustained puts into a full pool.
Clients run in separate (spawned) processes so the server, the clients and this test share nothing
but sockets and the segment."""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.config import PoolTierConfig
from mooncake_sgl.tiers.pool import PoolTier
from mooncake_sgl.transfer.client import PoolClient

KIB = 1024


def content(key_id: int, size: int) -> np.ndarray:
    """The only bytes key ``key_id`` may ever hold (so any mix-up or tear is detectable)."""
    return np.random.default_rng(key_id).integers(0, 256, size, dtype=np.uint8)


def key(key_id: int) -> bytes:
    return b"proc-test/%d" % key_id


def pages_of(arrays: list[np.ndarray]) -> list[list[memoryview]]:
    # Two segments per page, as K and V halves of an SGLang page.
    return [[memoryview(a[: a.size // 2]), memoryview(a[a.size // 2:])] for a in arrays]


def check(ids: list[int], size: int, out: list[np.ndarray], hits: list[bool]) -> list[str]:
    return [f"key {i}: wrong bytes" for i, a, h in zip(ids, out, hits)
            if h and not np.array_equal(a, content(i, size))]


# spawn, not fork: the test process may hold threads (torch, sglang) that a fork would copy mid-lock.
_ctx = mp.get_context("spawn")


def _run(target, args_list: list[tuple]) -> list:  # noqa: ANN001
    with _ctx.Pool(len(args_list)) as pool:
        return pool.starmap(target, args_list, chunksize=1)


# ------------------------------------------------------------------- many concurrent clients

def _mixed_worker(endpoint: str, transport: str, wid: int, rounds: int, size: int) -> dict:
    client = PoolClient(endpoint, transport=transport, connections=2)
    rng = random.Random(wid)
    errors: list[str] = []
    written: list[int] = []
    for r in range(rounds):
        # Own keys plus keys every worker writes at once (same bytes: exercises concurrent puts
        # of one key).
        ids = [wid * 10_000 + r * 16 + j for j in range(12)] + [r * 4 + j for j in range(4)]
        res = client.put_batch([key(i) for i in ids], pages_of([content(i, size) for i in ids])).ok
        if not all(res):
            errors.append(f"round {r}: put refused {res.count(False)} pages in a roomy pool")
        written += ids
        probe = rng.sample(written, min(24, len(written))) + [r * 4 + 100_000]  # last one absent
        out = [np.zeros(size, np.uint8) for _ in probe]
        hits = client.get_batch([key(i) for i in probe], pages_of(out))
        errors += check(probe, size, out, hits)
        if hits[:-1] != [True] * (len(probe) - 1) or hits[-1]:
            errors.append(f"round {r}: hits {hits}")
        if client.exists_batch([key(i) for i in probe]) != hits:
            errors.append(f"round {r}: exists disagrees with get")
    mode = client.mode
    client.close()
    return {"errors": errors, "mode": mode}


def test_many_processes_write_and_read_concurrently_byte_exact() -> None:
    with PoolProcess(capacity="128MiB", slab_size="4MiB") as pool:
        results = _run(_mixed_worker, [(pool.endpoint, tr, w, 12, 96 * KIB)
                                       for w, tr in enumerate(["shm", "tcp", "shm", "tcp"])])
        assert [r["mode"] for r in results] == ["shm", "tcp", "shm", "tcp"]
        assert [r["errors"] for r in results] == [[]] * 4
        client = PoolClient(pool.endpoint, transport="tcp")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # workers' last RELEASEs and closes land asynchronously
            stats = client.stats()
            if stats["leased"] == 0 and stats["writing"] == 0:
                break
            time.sleep(0.01)
        assert stats["evictions"] == 0 and stats["leased"] == 0 and stats["writing"] == 0
        client.close()


def test_a_batch_naming_a_key_twice_is_stored_over_both_transports() -> None:
    # Shared memory reserves the whole batch before copying: the second mention of a key used to
    # wait for the first, its own reservation, until put_wait ran out, then report it not stored.
    size = 64 * KIB
    with PoolProcess(capacity="8MiB", slab_size="1MiB", put_wait="1s") as pool:
        for base, transport in ((0, "shm"), (100, "tcp")):
            client = PoolClient(pool.endpoint, transport=transport)
            ids = [base, base + 1, base, base + 2, base + 1]
            assert client.put_batch([key(i) for i in ids], pages_of([content(i, size) for i in ids])).ok \
                == (True,) * 5
            out = [np.zeros(size, np.uint8) for _ in ids]
            assert client.get_batch([key(i) for i in ids], pages_of(out)) == [True] * 5
            assert check(ids, size, out, [True] * 5) == []
            client.close()
        client = PoolClient(pool.endpoint, transport="tcp")
        stats = client.stats()
        client.close()
        assert stats["pages"] == 6 and stats["put_dup_writes"] == 4 and stats["put_waits"] == 0


# --------------------------------------------------------------------- crash and restart

def _crash_worker(endpoint: str, transport: str, wid: int, seconds: float, size: int,
                  ready_dir: str) -> dict:
    """Rounds of puts and reads until the crash was seen and three whole rounds came back after it,
    or ``seconds`` pass: not a fixed window, which on a loaded host could close before the crash
    (or the restart) came. After its first whole round it says so with a file in ``ready_dir``:
    the pool is killed only once every worker is mid-stream."""
    tier = PoolTier(PoolTierConfig(endpoints=[endpoint], transport=transport, retry_after=0.1,
                                   timeout=2.0, connections=2))
    errors: list[str] = []
    failures = recovered_after_failure = rounds = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (failures and recovered_after_failure >= 3):
        ids = [wid * 1_000_000 + rounds * 8 + j for j in range(8)]
        rounds += 1
        ok = tier.put_from([key(i) for i in ids], pages_of([content(i, size) for i in ids])).ok
        out = [np.zeros(size, np.uint8) for _ in ids]
        hits = tier.get_into([key(i) for i in ids], pages_of(out))
        errors += check(ids, size, out, hits)  # a hit is never wrong, crash or not
        if all(ok) and all(hits):
            recovered_after_failure += failures > 0
            if not failures:
                (Path(ready_dir) / str(wid)).touch()
        else:
            failures += 1
    tier.close()
    return {"errors": errors, "failures": failures, "recovered": recovered_after_failure,
            "rounds": rounds}


def test_server_killed_mid_batch_and_restarted_clients_recover_without_wrong_data(tmp_path: Path) -> None:
    transports = ["shm", "tcp", "tcp"]
    crashed: list[bool] = []
    with PoolProcess(capacity="64MiB", slab_size="4MiB") as pool:
        def crash() -> None:
            # Every worker has stored and read a whole round (counting connections is not enough:
            # two workers' pools of connections can reach any count while the third still starts).
            deadline = time.monotonic() + 150
            while len(list(tmp_path.iterdir())) < len(transports) and time.monotonic() < deadline:
                time.sleep(0.05)
            if len(list(tmp_path.iterdir())) < len(transports):
                return
            time.sleep(0.5)  # mid-stream
            pool.kill()  # SIGKILL while batches are in flight
            time.sleep(0.3)
            pool.start()  # same port, empty pool
            crashed.append(True)

        t = threading.Thread(target=crash)
        t.start()
        results = _run(_crash_worker, [(pool.endpoint, tr, w, 180.0, 256 * KIB, str(tmp_path))
                                       for w, tr in enumerate(transports)])
        t.join()
    assert crashed, f"the workers did not all complete a round within 150 s: {results}"
    for r in results:
        assert r["errors"] == []
        assert r["failures"] >= 1, r  # the crash was seen ...
        assert r["recovered"] >= 3, r  # ... and full service came back after it


# ------------------------------------------------------------------------ full pool

def _filler(endpoint: str, transport: str, wid: int, batches: int, size: int) -> dict:
    client = PoolClient(endpoint, transport=transport, connections=2)
    refused = readback_miss = 0
    errors: list[str] = []
    acked: list[int] = []
    for b in range(batches):
        ids = [wid * 1_000_000 + b * 16 + j for j in range(16)]
        res = client.put_batch([key(i) for i in ids], pages_of([content(i, size) for i in ids])).ok
        refused += res.count(False)
        acked += [i for i, ok in zip(ids, res) if ok]
        out = [np.zeros(size, np.uint8) for _ in ids]
        hits = client.get_batch([key(i) for i in ids], pages_of(out))
        readback_miss += hits.count(False)
        errors += check(ids, size, out, hits)
    client.close()
    return {"refused": refused, "acked": acked, "errors": errors, "readback_miss": readback_miss}


def test_full_pool_under_sustained_puts_never_refuses_and_loses_only_evicted_pages() -> None:
    size = 64 * KIB
    with PoolProcess(capacity="8MiB", slab_size="1MiB") as pool:  # 128 slots
        results = _run(_filler, [(pool.endpoint, tr, w, 40, size) for w, tr in enumerate(["shm", "tcp"])])
        client = PoolClient(pool.endpoint, transport="tcp")
        assert [r["refused"] for r in results] == [0, 0]
        assert [r["errors"] for r in results] == [[], []]
        acked = [i for r in results for i in r["acked"]]
        assert len(acked) == 2 * 40 * 16  # 10x the capacity went in
        # A page just written is read back at once, except for the rare one a concurrent writer
        # evicted in between.
        assert sum(r["readback_miss"] for r in results) <= 0.05 * len(acked)
        out = [np.zeros(size, np.uint8) for _ in acked]
        hits = []
        for i in range(0, len(acked), 256):
            hits += client.get_batch([key(k) for k in acked[i:i + 256]], pages_of(out[i:i + 256]))
        assert check(acked, size, out, hits) == []
        present = sum(hits)
        # Counted after the reads: background eviction down to the low watermark may still run
        # after the last put, and a page it takes then is a miss above but still an eviction.
        stats = client.stats()
        assert stats["put_no_room"] == 0 and stats["aborts"] == 0 and stats["writing"] == 0
        # Every acknowledged page is either still there or was evicted: no page is lost. The
        # server's snapshot is taken under its lock, so its counts add up exactly.
        assert len(acked) - present <= stats["evictions"]
        assert stats["pages"] + stats["evictions"] == len(acked)
        # ... and the pool stays filled to its watermarks rather than emptied.
        assert present >= 0.85 * 128 * 0.9
        client.close()


@pytest.fixture(autouse=True)
def _no_leftover_children() -> None:
    yield
    assert mp.active_children() == []


# ------------------------------------------------------------------------ reads in flight

def test_pages_leased_by_a_shared_memory_reader_survive_a_flood_and_their_removal() -> None:
    # Story: a same-host reader has leased 8 pages (it is mid-copy out of the segment). Another
    # process floods the pool with 3x its capacity and removes half of the leased keys. Until the
    # reader releases, the bytes at its offsets must not change: no eviction, no slot reuse.
    from mooncake_sgl.transfer import protocol as P

    size = 64 * KIB
    with PoolProcess(capacity="4MiB", slab_size="1MiB") as pool:  # 64 slots
        reader = PoolClient(pool.endpoint, transport="shm")
        ids = list(range(8))
        ok = reader.put_batch([key(i) for i in ids], pages_of([content(i, size) for i in ids])).ok
        assert ok == (True,) * 8
        with reader._borrow() as link:
            lease = link.conn.call(P.Op.LEASE, P.KeysSizes([key(i) for i in ids], [size] * 8), P.Lease)
            assert lease.sizes == [size] * 8
            flood = _ctx.Process(target=_flood, args=(pool.endpoint, ids[:4], size))
            flood.start()
            flood.join(60)
            assert flood.exitcode == 0
            for i, off in zip(ids, lease.offsets):
                out = np.zeros(size, np.uint8)
                link.mapping.read_page(off, pages_of([out])[0])
                assert np.array_equal(out, content(i, size)), f"leased page {i} was overwritten"
            link.conn.send(P.Op.RELEASE, P.ReleaseReq(lease.lease), flags=P.FLAG_NO_REPLY)
        assert reader.exists_batch([key(i) for i in ids[:4]]) == [False] * 4  # removed stays removed
        stats = reader.stats()
        # 192 pages went through the 56 slots not held by the reader.
        assert stats["evictions"] >= 192 - 56 and stats["put_no_room"] == 0
        reader.close()


def _flood(endpoint: str, remove_ids: list[int], size: int) -> None:
    client = PoolClient(endpoint, transport="tcp")
    assert client.remove([key(i) for i in remove_ids]) == len(remove_ids)
    for b in range(12):
        ids = [500_000 + b * 16 + j for j in range(16)]
        ok = client.put_batch([key(i) for i in ids], pages_of([content(i, size) for i in ids])).ok
        assert ok == (True,) * 16
    client.close()


def test_a_pool_on_port_0_gets_a_port_below_the_ephemeral_range_and_keeps_it() -> None:
    # A kernel-picked port is in the ephemeral range: by a restart, any outgoing connection of any
    # process may hold it. A picked one is below it, and the restart finds it free.
    from devtools.testing.procs import ephemeral_range

    with PoolProcess(capacity="16MiB", slab_size="1MiB") as pool:
        port = pool.port
        assert port < ephemeral_range()[0]
        pool.kill()
        pool.start()
        assert pool.port == port
