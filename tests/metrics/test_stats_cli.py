"""``mooncake-sgl stats --config``: the store's counters, kept in its LMDB tier's directory, read by
another process while the store runs and after it stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mooncake_sgl.cli import main as cli_main
from mooncake_sgl.config import HostTierConfig, LmdbTierConfig, StoreConfig
from mooncake_sgl.config_text import dump_config
from mooncake_sgl.metrics.persist import CounterPersister, counter_file_name, read_counter_file
from mooncake_sgl.metrics.source import snapshot_of
from mooncake_sgl.store import build_store

from .stores import PAGE, host_lmdb_store, read, write

RANK_DIR = "tp0_pp0"


def config_file(tmp_path: Path) -> Path:
    cfg = StoreConfig(tiers=[HostTierConfig(capacity=4 * PAGE, slot_size=PAGE, pin_memory=False),
                             LmdbTierConfig(path=str(tmp_path / "lmdb"), capacity="64MiB")])
    path = tmp_path / "tiers.yaml"
    path.write_text(dump_config(cfg))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_the_persister_writes_what_the_store_counted(tmp_path: Path) -> None:
    store = host_lmdb_store(tmp_path / "db")
    persister = CounterPersister(store.stats, str(tmp_path / "db"), "tp0_pp0_dp0_cp0",
                                 interval_s=0.05).start()
    try:
        write(store, range(3))
        read(store, range(3))
        deadline = time.monotonic() + 10
        path = tmp_path / "db" / counter_file_name("tp0_pp0_dp0_cp0")
        while time.monotonic() < deadline:
            if path.exists() and read_counter_file(str(path)).by_tier()["host"].hits == 3:
                break
            time.sleep(0.05)
        assert read_counter_file(str(path)).by_tier()["host"].hits == 3
    finally:
        persister.close()
        store.close()


def test_stats_config_reads_the_counters_after_the_store_stopped(tmp_path: Path) -> None:
    from mooncake_sgl.metrics.attach import observe_store

    cfg_path = config_file(tmp_path)
    from mooncake_sgl.config_text import load_config_file

    store = build_store(load_config_file(str(cfg_path)), rank_suffix=RANK_DIR)
    watch = observe_store(store, storage_config=None, enabled=False, reports_local_usage=True)
    write(store, range(6))
    read(store, range(6))
    expected = snapshot_of(store.stats()).by_tier()
    watch.close()  # the final snapshot: written at close, whatever the interval
    store.close()
    res = run_cli("stats", "--config", str(cfg_path), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    by_tier = {row["tier"]: row for row in doc["tiers"]}
    assert [r["tier"] for r in doc["tiers"]] == ["host", "lmdb", "miss"]
    assert by_tier["host"]["hits"] + by_tier["lmdb"]["hits"] == 6
    assert by_tier["host"]["hits"] == expected["host"].hits
    assert sum(r["hit_share"] for r in doc["tiers"]) == pytest.approx(1.0)
    table = run_cli("stats", "--config", str(cfg_path))
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[1].split()[0] == "tier"
    assert {line.split()[0] for line in table.stdout.splitlines()[2:]} == {"host", "lmdb", "(no"}


def test_stats_config_watch_refreshes_with_the_last_interval(tmp_path: Path) -> None:
    cfg_path = config_file(tmp_path)
    rank_dir = tmp_path / "lmdb" / RANK_DIR
    rank_dir.mkdir(parents=True)
    store = host_lmdb_store(rank_dir)
    persister = CounterPersister(store.stats, str(rank_dir), "tp0_pp0_dp0_cp0", interval_s=0.05).start()
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_sgl.cli", "stats", "--config",
                             str(cfg_path), "--json", "--watch", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        write(store, range(2))
        docs = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            docs.append(json.loads(line))
            read(store, range(2))
            if len(docs) >= 3 and docs[-1]["interval"]["tiers"][0]["hits"] > 0:
                break
        assert "interval" not in docs[0]
        assert docs[-1]["interval"]["tiers"][0]["tier"] == "host"
        assert docs[-1]["interval"]["tiers"][0]["hits"] > 0
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            stderr = proc.communicate()[1][-2000:]
            raise AssertionError(f"stats --watch ignored Ctrl-C for 10 s: {stderr}") from None
        finally:
            persister.close()
            store.close()
        assert code == 0, proc.stderr.read()[-2000:]


def test_a_damaged_counter_file_is_named_in_the_error(tmp_path: Path) -> None:
    cfg_path = config_file(tmp_path)
    rank_dir = tmp_path / "lmdb" / RANK_DIR
    rank_dir.mkdir(parents=True)
    damaged = rank_dir / counter_file_name("tp0_pp0_dp0_cp0")
    damaged.write_text('{"version": 1, "stats": ')
    res = run_cli("stats", "--config", str(cfg_path))
    assert res.returncode == 1
    assert str(damaged) in res.stderr


def test_no_counter_file_yet_says_where_it_looked(tmp_path: Path, capsys) -> None:
    cfg_path = config_file(tmp_path)
    assert cli_main(["stats", "--config", str(cfg_path)]) == 1
    assert str(tmp_path / "lmdb") in capsys.readouterr().err


def test_a_config_without_an_lmdb_tier_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "host-only.yaml"
    path.write_text(dump_config(StoreConfig(tiers=[HostTierConfig(capacity="1GiB")])))
    assert cli_main(["stats", "--config", str(path)]) == 2
    assert "has no lmdb tier" in capsys.readouterr().err


def test_either_a_url_or_a_config(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        cli_main(["stats"])
    assert e.value.code == 2
    assert "either a /metrics URL or --config" in capsys.readouterr().err


def test_an_unreachable_url_is_exit_1_naming_it(capsys) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connection refused
        assert cli_main(["stats", f"127.0.0.1:{port}", "--timeout", "2"]) == 1
    assert f"http://127.0.0.1:{port}/metrics" in capsys.readouterr().err


def test_an_mla_lmdb_shared_by_tp_ranks_is_counted_once(tmp_path: Path) -> None:
    # The TP ranks of an MLA model share the storage writer's LMDB directory: each rank writes its
    # own counter file there, and only TP rank 0 reports the directory's usage.
    from types import SimpleNamespace

    from mooncake_sgl.hicache.layout import reports_local_usage
    from mooncake_sgl.metrics.attach import observe_store
    from mooncake_sgl.metrics.persist import read_counters

    store = host_lmdb_store(tmp_path / "mla_pp0")
    ranks = [SimpleNamespace(tp_rank=r, pp_rank=0, dp_rank=0, attn_cp_rank=0, is_mla_model=True)
             for r in (0, 1)]
    watches = [observe_store(store, cfg, enabled=False, reports_local_usage=reports_local_usage(cfg))
               for cfg in ranks]
    write(store, range(3))
    for w in watches:
        w.close()
    store_pages = snapshot_of(store.stats()).by_tier()["lmdb"].resident_pages
    store.close()
    snap = read_counters([str(tmp_path)])
    assert {rank for rank, _ in snap.tiers} == {"tp0_pp0_dp0_cp0", "tp1_pp0_dp0_cp0"}
    assert store_pages == 3
    assert snap.by_tier()["lmdb"].resident_pages == 3


def test_a_counter_file_gone_while_listed_is_left_out_and_a_damaged_one_named(tmp_path, monkeypatch) -> None:
    # The next owner of a rank removes an extra process's file: listing and reading race with it.
    from mooncake_sgl.metrics import persist
    from mooncake_sgl.metrics.persist import CounterFileError, counter_file_name, read_counters

    gone = str(tmp_path / counter_file_name("tp0_pp0_dp0_cp0"))
    monkeypatch.setattr(persist, "find_counter_files", lambda paths: [gone])
    assert read_counters([str(tmp_path)]).tiers == {}
    (tmp_path / counter_file_name("tp0_pp0_dp0_cp0")).write_text("{")
    with pytest.raises(CounterFileError, match="cannot read counters"):
        read_counters([str(tmp_path)])


def test_the_table_says_when_a_tier_has_less_room_than_its_capacity() -> None:
    from mooncake_sgl.metrics.cli import tier_table
    from mooncake_sgl.metrics.model import Snapshot, TierSample

    full = TierSample(hits=1, misses=1, resident_bytes=3 << 20, capacity_bytes=64 << 20,
                      holdable_bytes=8 << 20)
    roomy = TierSample(hits=1, resident_bytes=1 << 20, capacity_bytes=4 << 20, holdable_bytes=4 << 20)
    lines = tier_table(Snapshot({("r", "host"): roomy, ("r", "lmdb"): full})).splitlines()
    lmdb = next(line for line in lines if line.startswith("lmdb"))
    host = next(line for line in lines if line.startswith("host"))
    assert lmdb.endswith("/ 64.0 MiB (room for 8.0 MiB now)"), lmdb
    assert "room for" not in host


def test_the_load_gate_line_says_what_was_declined_and_stays_silent_otherwise() -> None:
    from mooncake_sgl.metrics.cli import gate_line
    from mooncake_sgl.metrics.model import Snapshot

    declined = {"gate_lookups": 50.0, "gate_declined_lookups": 20.0, "gate_declined_pages": 640.0,
                "gate_probe_lookups": 2.0, "gate_abandoned_lookups": 3.0, "gate_abandoned_pages": 90.0}
    line = gate_line(Snapshot({}, 0.0, {"r": declined}))
    assert "20 of 50 hits cut short" in line and "640 page objects" in line and "2 probe reads" in line
    assert "3 hits given up after their first page read slowly, 90 page objects left" in line
    abandoned_only = {"gate_lookups": 50.0, "gate_abandoned_lookups": 1.0, "gate_abandoned_pages": 7.0}
    assert "1 hits given up" in gate_line(Snapshot({}, 0.0, {"r": abandoned_only}))
    assert gate_line(Snapshot({}, 0.0, {"r": {"gate_lookups": 50.0}})) == ""
