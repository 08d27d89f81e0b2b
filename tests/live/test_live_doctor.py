"""``mooncake-sgl doctor`` on live servers set up to produce each diagnosis it makes from metrics.

Two servers on one pool: A with storage slower (``slow_backend``: a second per load) than the
deadline its `timeout` prefetch policy allows, a 3 MiB SSD tier (at its size after two
prompts) and capacity curves (their process started inside SGLang's scheduler); B keyed by
another page size (its pages and A's never meet), a `prefetch_threshold` no prompt reaches and the
selective write policy.
The doctor, run as a user runs it, must name each cause with its evidence.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.metrics.scrape import scrape

from .conftest import Servers, wait_for, write_tiers
from .probe import LiveClient, prompt
from .test_live_shared import pool_pages

PROMPT_TOKENS = 2048


def doctor(*args: str) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", "doctor", *args],
                         capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


def test_doctor_names_the_threshold_the_deadline_the_write_policy_a_full_tier_and_a_namespace_split(
        servers: Servers, tmp_path: Path) -> None:
    with PoolProcess(capacity="256MiB") as pool:
        pool_section = f'{{kind: pool, endpoints: ["{pool.endpoint}"]}}'
        a_tiers = write_tiers(tmp_path / "a.yaml", (
            "tiers:\n  - {kind: host, capacity: 64MiB}\n"
            f"  - {pool_section}\n"
            f'  - {{kind: lmdb, path: "{tmp_path / "ssd"}", capacity: 3MiB}}\n'
            "policy: {capacity_curves: true}\n"))
        b_tiers = write_tiers(tmp_path / "b.yaml", (
            "tiers:\n  - {kind: host, capacity: 64MiB}\n"
            f"  - {pool_section}\n"
            "prefetch_threshold: 100000\n"))
        slow = ('{"backend_name": "slow", "module_path": "tests.live.slow_backend", '
                f'"class_name": "SlowStorage", "interface_v1": 1, "config_file": "{a_tiers}", '
                '"prefetch_timeout_base": 0.2, "prefetch_timeout_per_ki_token": 0.0}')
        a, b = servers.start_many([
            ("a", a_tiers, ("--hicache-storage-prefetch-policy", "timeout", "--hicache-storage-backend",
                            "dynamic", "--hicache-storage-backend-extra-config", slow)),
            ("b", b_tiers, ("--page-size", "32", "--hicache-write-policy", "write_through_selective")),
        ], ("--enable-metrics",))
        ids = prompt(PROMPT_TOKENS, seed=11)
        client_a = LiveClient(a.url)
        client_a.generate(ids)
        wait_for(lambda: pool_pages(pool.endpoint) >= PROMPT_TOKENS // 64 - 1, 60, "A's backup in the pool")
        client_a.generate(prompt(PROMPT_TOKENS, seed=14))  # 64 pages of 64 KiB: past the SSD tier's 3 MiB
        client_a.flush()
        client_a.generate(ids)  # found in storage; its prefetch's deadline has passed
        for seed in (12, 13):
            LiveClient(b.url).generate(prompt(PROMPT_TOKENS, seed=seed))

        rc, text = doctor(a.url, b.url, "--pool", pool.endpoint, "--window", "1")
        print(text)  # the operator's view, kept in the test log
        rc_json, raw = doctor(a.url, b.url, "--pool", pool.endpoint, "--window", "0", "--json")
        assert rc == rc_json == 1, text
        found = json.loads(raw)["findings"]
        by = {(f["code"], f["server"].split(" + ")[0]) for f in found}
        a_name, b_name = a.url.split("://")[1], b.url.split("://")[1]
        assert ("below_threshold", b_name) in by, text
        assert ("write_policy", b_name) in by, text
        assert ("prefetch_timeout", a_name) in by, text
        assert ("tier_full", a_name) in by, text
        [split] = [f for f in found if f["code"] == "namespace_mismatch"]
        assert "page size 64" in split["says"] and "32" in split["says"], text
        assert all(f["evidence"] and f["fix"] for f in found), text
        # A's curves ran in their own process, beside the scheduler, and reached its /metrics.
        snap = scrape(a.url)
        assert all(looked > 0 for _, _, looked, _ in snap.curve_of("host")), snap.curves
        assert snap.store_total("curve_process_seconds") > 0 and snap.store_total("curve_dropped_pages") == 0
