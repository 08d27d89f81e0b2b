"""``scripts/bench_load_gate.py --medium link``: each variant's pool in a network namespace, its
replies shaped to the phase's rate (root)."""

from __future__ import annotations

import time
from pathlib import Path

from devtools.testing.scripts import load_script
from mooncake_sgl.config import PoolTierConfig
from mooncake_sgl.config_text import load_config_file
from mooncake_sgl.transfer.client import PoolClient

from .conftest import needs_netns


@needs_netns
def test_a_link_medium_gives_each_variant_its_own_pool_across_the_namespace_and_shapes_its_replies(
        tmp_path: Path) -> None:
    bench = load_script("bench_load_gate")
    with bench.slow_medium("link", tmp_path) as (tiers_for, limit):
        configs = {v: load_config_file(tiers_for(v)) for v in ("gate", "nogate")}
        assert configs["gate"].load_gate.enabled and not configs["nogate"].load_gate.enabled
        (gate,), (nogate,) = configs["gate"].tiers, configs["nogate"].tiers
        assert isinstance(gate, PoolTierConfig) and isinstance(nogate, PoolTierConfig)
        assert gate.transport == "tcp"
        assert gate.endpoints != nogate.endpoints
        client = PoolClient(gate.endpoints[0], transport="tcp", connections=1, timeout=30)
        try:
            page = [memoryview(bytearray(1 << 20))]
            assert client.put_batch([b"k"], [[memoryview(bytes(1 << 20))]]).ok == (True,)
            limit(1.0)  # MB/s, as --rates gives it: 1 MiB takes about a second
            start = time.monotonic()
            assert client.get_batch([b"k"], [page]) == [True]
            assert time.monotonic() - start > 0.8
            limit(0)
            start = time.monotonic()
            assert client.get_batch([b"k"], [page]) == [True]
            assert time.monotonic() - start < 0.5
        finally:
            client.close()
