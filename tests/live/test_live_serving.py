"""A live ``sglang.launch_server`` with our backend, as users run it (``scripts/serve_cpu.sh``).

The check that matters: a prompt served from our storage tiers gives the same greedy tokens and
bit-identical logprobs as computing it; the same hit shows in our series in SGLang's ``/metrics``
and in ``mooncake-sgl stats``. ``test_corrupted_loads_change_the_output`` proves that this
comparison would catch wrong bytes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from mooncake_sgl.metrics import diff, scrape
from mooncake_sgl.metrics.scrape import fetch

from .conftest import Servers, wait_for, write_tiers
from .probe import LiveClient, prompt, reusable, storage_hit

PROMPT_TOKENS = 2048
PAGE_TOKENS = 64


def host_lmdb(tmp_path: Path) -> Path:
    return write_tiers(tmp_path / "tiers.yaml", f"""
tiers:
  - {{kind: host, capacity: 64MiB}}
  - {{kind: lmdb, path: "{tmp_path / 'lmdb'}", capacity: 1GiB}}
""")


def test_storage_hit_is_identical_to_recompute_shows_in_metrics_and_survives_a_restart(
        servers: Servers, tmp_path: Path) -> None:
    """The scenario every user meets, once: a cold request, a storage hit identical to it and seen in
    our series and ``mooncake-sgl stats``, a stop by SIGTERM, and a restart served by LMDB."""
    tiers = host_lmdb(tmp_path)
    ids = prompt(PROMPT_TOKENS, seed=1)
    pages = reusable(PROMPT_TOKENS) // PAGE_TOKENS
    first = servers.start("first", tiers, ("--enable-metrics",))
    client = LiveClient(first.url)
    target = first.url.removeprefix("http://")
    cold = client.generate(ids)
    assert cold.storage_tokens == 0 and len(cold.output_ids) == 8
    # The backup lands in our tiers after the request; the exporter syncs once a second.
    wait_for(lambda: scrape(target).by_tier().get("host") and
             scrape(target).by_tier()["host"].written_bytes > 0, 60, "the backup in our series")
    before = scrape(target)

    hit = storage_hit(client, ids)
    assert hit.storage_backend == "MooncakeSglStorage"
    assert hit.storage_tokens == reusable(PROMPT_TOKENS) == pages * PAGE_TOKENS
    assert hit.same_as(cold), (hit, cold)
    _check_series_after_the_hit(target, before, pages, tmp_path)
    _check_stats_after_the_hit(target, tiers, pages, tmp_path)

    # What a user does to stop it: SIGTERM to the process group; nothing it started may remain.
    group = os.getpgid(first.proc.pid)
    members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == group]
    assert len(members) >= 3  # the launcher, sglang's main process, its scheduler (and more)
    os.killpg(group, signal.SIGTERM)
    gone, alive = psutil.wait_procs(members, timeout=30)
    assert not alive, f"still running 30 s after SIGTERM to the group: {alive}"
    # The counter file in the LMDB tier outlives the server.
    final = {r["tier"]: r for r in _stats_of_config(tiers)["tiers"]}
    (tmp_path / "stats-config.txt").write_text(stats("--config", str(tiers)).stdout)
    assert final["host"]["hits"] + final["lmdb"]["hits"] >= pages

    # A new server on the same tiers: the host tier starts empty, so the hit comes from LMDB. It
    # starts as on a fresh machine or container, without SGLang's page-hash extension built: its
    # first request must still read what is stored (that build used to be paid by this lookup).
    fresh = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "fresh-extensions")}
    again = servers.start("restarted", tiers, ("--enable-metrics",), env=fresh)
    restored = LiveClient(again.url).generate(ids)
    assert restored.storage_tokens == reusable(PROMPT_TOKENS), restored
    assert restored.same_as(cold), (restored, cold)
    target = again.url.removeprefix("http://")
    wait_for(lambda: scrape(target).by_tier().get("lmdb") and
             scrape(target).by_tier()["lmdb"].hits >= pages, 60, "LMDB hits in our series")
    (tmp_path / "metrics-restarted.txt").write_text(fetch(target))
    (tmp_path / "stats-restarted.txt").write_text(stats(target).stdout)


def _check_series_after_the_hit(target: str, before: Any, pages: int, tmp_path: Path) -> None:
    """Our series in SGLang's ``/metrics`` (``--enable-metrics``) count the hit, tier by tier."""
    def served() -> bool:
        d = diff(before, scrape(target)).by_tier()
        return sum(s.hits for s in d.values()) >= pages
    wait_for(served, 60, "the storage hit in our series")
    text = fetch(target)
    (tmp_path / "metrics.txt").write_text(text)
    after = diff(before, scrape(target))
    tier = after.by_tier()
    assert list(tier) == ["host", "lmdb"]
    assert tier["host"].hits + tier["lmdb"].hits >= pages
    assert tier["host"].read_bytes > 0
    assert after.store_total("read_pages") >= pages
    # SGLang's own series and ours side by side, ours labelled like SGLang's storage collector.
    assert "sglang:prefetched_tokens_total" in text or "sglang:cache_hit_rate" in text
    assert ('mooncake_sgl_tier_hits_total{attn_cp_rank="0",dp_rank="0",pp_rank="0",tier="host",'
            'tp_rank="0"}') in text
    assert "mooncake_sgl_tier_get_latency_seconds_bucket" in text
    # The default placement policy (adaptive) names the expert evicting from each bounded tier.
    assert ('mooncake_sgl_policy_leader{attn_cp_rank="0",dp_rank="0",expert="lru",pp_rank="0",'
            'tier="host",tp_rank="0"} 1.0') in text
    assert "mooncake_sgl_policy_shadow_hit_ratio{" in text


def _check_stats_after_the_hit(target: str, tiers: Path, pages: int, tmp_path: Path) -> None:
    """``mooncake-sgl stats`` shows the hit from the server's URL and from the tiers' counter file."""
    res = stats(target, "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["tier"]: r for r in json.loads(res.stdout)["tiers"]}
    assert rows["host"]["hits"] + rows["lmdb"]["hits"] >= pages
    table = stats(target)
    (tmp_path / "stats.txt").write_text(table.stdout)
    assert table.returncode == 0 and "hit share" in table.stdout
    # The counter file in the LMDB tier is readable while the server runs.
    wait_for(lambda: _stats_of_config(tiers).get("tiers", [{}])[0].get("hits", 0) >= pages, 30,
             "the storage hit in the counter file")


def stats(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", "stats", *args],
                          capture_output=True, text=True, timeout=60)


def _stats_of_config(tiers: Path) -> dict:
    res = stats("--config", str(tiers), "--json")
    return json.loads(res.stdout) if res.returncode == 0 else {}


def test_corrupted_loads_change_the_output(servers: Servers, tmp_path: Path) -> None:
    """Negative control: the same comparison, with every page zeroed after it is loaded."""
    tiers = host_lmdb(tmp_path)
    extra = ("--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config",
             '{"backend_name": "corrupting", "module_path": "tests.live.corrupting_backend", '
             f'"class_name": "CorruptingStorage", "interface_v1": 1, "config_file": "{tiers}"}}')
    server = servers.start("corrupting", tiers, extra)
    client = LiveClient(server.url)
    ids = prompt(PROMPT_TOKENS, seed=2)
    cold = client.generate(ids)
    hit = storage_hit(client, ids)
    assert hit.storage_tokens == reusable(PROMPT_TOKENS)
    assert not hit.same_as(cold), "zeroed KV gave the same output: the comparison detects nothing"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_serve_cpu_refuses_bad_arguments(tiny_model: Path, tmp_path: Path) -> None:
    from .conftest import SERVE

    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: [{kind: host, capacity: 12XB}]\n")
    started = time.monotonic()
    for args, message in (([], "usage"), (["http", str(tiny_model), str(bad)], "PORT"),
                          (["30000", str(tmp_path), str(bad)], "no config.json"),
                          (["30000", str(tiny_model), str(bad)], "tiers[0].capacity")):
        out = subprocess.run(["bash", str(SERVE), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    assert time.monotonic() - started < 120  # refused before any server starts
