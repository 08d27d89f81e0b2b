"""Our series in a live SGLang server's ``/metrics`` (``--enable-metrics``) after a storage hit, and
``mooncake-sgl stats`` reading them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mooncake_sgl.metrics import diff, scrape
from mooncake_sgl.metrics.scrape import fetch

from .conftest import Servers, wait_for, write_tiers
from .probe import LiveClient, prompt, reusable, storage_hit

PROMPT_TOKENS = 2048
PAGE_TOKENS = 64


def test_a_storage_hit_shows_in_our_series_and_in_stats(servers: Servers, tmp_path: Path) -> None:
    tiers = write_tiers(tmp_path / "tiers.yaml", f"""
tiers:
  - {{kind: host, capacity: 64MiB}}
  - {{kind: lmdb, path: "{tmp_path / 'lmdb'}", capacity: 1GiB}}
""")
    server = servers.start("metrics", tiers, ("--enable-metrics",))
    client = LiveClient(server.url)
    target = server.url.removeprefix("http://")
    ids = prompt(PROMPT_TOKENS, seed=3)
    client.generate(ids)
    # The backup lands in our tiers after the request; the exporter syncs once a second.
    wait_for(lambda: scrape(target).by_tier().get("host") and
             scrape(target).by_tier()["host"].written_bytes > 0, 60, "the backup in our series")
    before = scrape(target)
    hit = storage_hit(client, ids)
    pages = reusable(PROMPT_TOKENS) // PAGE_TOKENS
    assert hit.storage_tokens == pages * PAGE_TOKENS

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

    res = stats(target, "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["tier"]: r for r in json.loads(res.stdout)["tiers"]}
    assert rows["host"]["hits"] + rows["lmdb"]["hits"] >= pages
    table = stats(target)
    (tmp_path / "stats.txt").write_text(table.stdout)
    assert table.returncode == 0 and "hit share" in table.stdout

    # The counter file in the LMDB tier: readable while the server runs and after it stopped.
    def from_disk() -> dict:
        res = stats("--config", str(tiers), "--json")
        return json.loads(res.stdout) if res.returncode == 0 else {}
    wait_for(lambda: from_disk().get("tiers", [{}])[0].get("hits", 0) >= pages, 30,
             "the storage hit in the counter file")
    server.stop()
    final = {r["tier"]: r for r in from_disk()["tiers"]}
    (tmp_path / "stats-config.txt").write_text(stats("--config", str(tiers)).stdout)
    assert final["host"]["hits"] + final["lmdb"]["hits"] >= pages

    # A restarted server starts with an empty host tier: the same prompt is served by LMDB.
    again = servers.start("restarted", tiers, ("--enable-metrics",))
    restored = LiveClient(again.url).generate(ids)
    assert restored.storage_tokens == pages * PAGE_TOKENS
    target = again.url.removeprefix("http://")
    wait_for(lambda: scrape(target).by_tier().get("lmdb") and
             scrape(target).by_tier()["lmdb"].hits >= pages, 60, "LMDB hits in our series")
    (tmp_path / "metrics-restarted.txt").write_text(fetch(target))
    (tmp_path / "stats-restarted.txt").write_text(stats(target).stdout)


def stats(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", "stats", *args],
                          capture_output=True, text=True, timeout=60)
