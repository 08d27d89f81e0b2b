"""Two live servers on one shared remote tier: a prefix prefilled on server A is loaded, not
recomputed, on server B, with the same output. This is the project's core idea (KV cache pooled
across instances, one prefill serving many), over our pool server and over the real Mooncake Store.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from devtools.testing import MooncakeMaster
from mooncake_sgl.config import PoolTierConfig
from mooncake_sgl.hicache.namespace_board import SLOTS
from mooncake_sgl.keys import board_key
from mooncake_sgl.pool.process import PoolProcess
from mooncake_sgl.tiers.pool import PoolTier

from .conftest import Servers, wait_for, write_tiers
from .probe import LiveClient, prompt, reusable

PROMPT_TOKENS = 2048
PAGES = reusable(PROMPT_TOKENS) // 64


def pool_pages(endpoint: str) -> int:
    """Pages in the pool at ``endpoint``, not counting the namespace board's records (every
    attached instance posts one per configuration)."""
    out = subprocess.run([sys.executable, "-m", "mooncake_sgl.cli", "pool", "stats", endpoint, "--json"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return 0
    return int(json.loads(out.stdout)["pages"]) - board_records(endpoint)


def board_records(endpoint: str) -> int:
    with closing(PoolTier(PoolTierConfig(endpoints=[endpoint], transport="tcp"))) as tier:
        return sum(tier.contains([board_key(s) for s in range(SLOTS)]))


@contextmanager
def shared_tier(kind: str) -> Iterator[tuple[str, object]]:
    """The tier section both servers use, and a ``landed()`` probe: A's backup is there."""
    if kind == "pool":
        with PoolProcess(capacity="256MiB") as pool:
            section = f'{{kind: pool, endpoints: ["{pool.endpoint}"]}}'
            yield section, lambda: pool_pages(pool.endpoint) >= PAGES
    else:
        with MooncakeMaster() as master:
            section = (f'{{kind: mooncake_store, master: "{master.rpc_address}", metadata_server: '
                       f'"{master.metadata_url}", segment_size: 128MiB, buffer_size: 32MiB}}')
            yield section, lambda: master.metrics().get("master_key_count", 0) >= PAGES


@pytest.mark.parametrize("kind", ["pool", "mooncake_store"])
def test_prefill_on_one_server_is_a_storage_hit_on_the_other(servers: Servers, tmp_path: Path,
                                                             kind: str) -> None:
    with shared_tier(kind) as (section, landed):
        tiers = write_tiers(tmp_path / "shared.yaml", f"tiers:\n  - {{kind: host, capacity: 64MiB}}\n"
                                                      f"  - {section}\n")
        a, b = servers.start_many([("a", tiers), ("b", tiers)])
        ids = prompt(PROMPT_TOKENS, seed=3)
        cold = LiveClient(a.url).generate(ids)
        assert cold.storage_tokens == 0
        wait_for(landed, 60, f"server A's backup of {PAGES} pages in the shared {kind} tier")
        hit = LiveClient(b.url).generate(ids)
        assert hit.storage_tokens == reusable(PROMPT_TOKENS), hit
        assert hit.same_as(cold), (hit, cold)
