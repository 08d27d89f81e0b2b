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

from devtools.bench.server import LaunchedServer
from devtools.testing import MooncakeMaster
from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.config import PoolTierConfig
from mooncake_sgl.hicache.namespace_board import SLOTS
from mooncake_sgl.keys import board_key
from mooncake_sgl.metrics.model import Snapshot, diff
from mooncake_sgl.metrics.scrape import scrape
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


def seen_by(server: LaunchedServer, before: Snapshot, kind: str) -> str:
    """What ``server``'s storage did in the request after ``before`` (a failure's evidence)."""
    delta = diff(before, scrape(server.url))
    return (f"lookups {delta.store_total('lookup_pages'):g} pages, {delta.store_total('lookup_hit_pages'):g} "
            f"hit, {delta.store_total('read_pages'):g} read; {kind}: {delta.by_tier().get(kind)}\n"
            f"{server.log_tail(4000)}")


def acknowledged(server: LaunchedServer) -> bool:
    """Whether ``server``'s Mooncake Store client had every page's put acknowledged: it counts
    the pages it wrote, and its one namespace-board record (``namespace_board.post``)."""
    tier = scrape(server.url).by_tier().get("mooncake_store")
    return tier is not None and tier.resident_pages >= PAGES + 1


@contextmanager
def shared_tier(kind: str) -> Iterator[tuple[str, object]]:
    """The tier section both servers use, and a ``landed(server_a)`` probe: A's backup is there."""
    if kind == "pool":
        with PoolProcess(capacity="256MiB") as pool:
            section = f'{{kind: pool, endpoints: ["{pool.endpoint}"]}}'
            yield section, lambda _: pool_pages(pool.endpoint) >= PAGES
    else:
        with MooncakeMaster() as master:
            section = (f'{{kind: mooncake_store, master: "{master.rpc_address}", metadata_server: '
                       f'"{master.metadata_url}", segment_size: 128MiB, buffer_size: 32MiB}}')
            # Not the master's key count: it counts the namespace board's records, and a key from
            # its put's start, before the bytes are readable (B asking then read 0 of 31 pages).
            yield section, acknowledged


@pytest.mark.parametrize("kind", ["pool", "mooncake_store"])
def test_prefill_on_one_server_is_a_storage_hit_on_the_other(servers: Servers, tmp_path: Path,
                                                             kind: str) -> None:
    with shared_tier(kind) as (section, landed):
        tiers = write_tiers(tmp_path / "shared.yaml", f"tiers:\n  - {{kind: host, capacity: 64MiB}}\n"
                                                      f"  - {section}\n")
        a, b = servers.start_many([("a", tiers), ("b", tiers)], ("--enable-metrics",))
        ids = prompt(PROMPT_TOKENS, seed=3)
        cold = LiveClient(a.url).generate(ids)
        assert cold.storage_tokens == 0
        wait_for(lambda: landed(a), 60, f"server A's backup of {PAGES} pages in the shared {kind} tier")
        before = scrape(b.url)
        hit = LiveClient(b.url).generate(ids)
        assert hit.storage_tokens == reusable(PROMPT_TOKENS), (hit, seen_by(b, before, kind),
                                                                 "A:", scrape(a.url).by_tier().get(kind))
        assert hit.same_as(cold), (hit, cold)
