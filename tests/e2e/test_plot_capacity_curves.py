"""``scripts/plot_capacity_curves.py --url``: a served /metrics with curve series becomes the table,
the JSON and the PNG (the live-server mode drives the same reader after its own replay)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import plot_capacity_curves  # noqa: E402

from devtools.bench.server import free_port  # noqa: E402
from mooncake_sgl.config import HostTierConfig  # noqa: E402
from mooncake_sgl.metrics.exporter import StoreExporter  # noqa: E402
from mooncake_sgl.policy.curve_feed import CurveFeed  # noqa: E402
from mooncake_sgl.policy.lru import LruPolicy  # noqa: E402
from mooncake_sgl.store.tiered_store import TieredStore  # noqa: E402
from mooncake_sgl.tiers.host import HostTier  # noqa: E402

from ..metrics.stores import key  # noqa: E402

PAGE = 4096


def test_a_served_curve_is_tabled_plotted_and_written(tmp_path: Path, capsys) -> None:
    host = HostTier(HostTierConfig(capacity=8 * PAGE, slot_size=PAGE, pin_memory=False))
    store = TieredStore([host], LruPolicy(1), mover="inline")
    feed = CurveFeed(store.tiers, store.names, store.policy, "process")
    store.observe(feed)
    registry = CollectorRegistry()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        exporter = StoreExporter(store.stats, {"tp_rank": 0}, registry=registry)
        for _ in range(3):
            store.exists_prefix([key(i) for i in range(4)])
            store.put_from([key(i) for i in range(4)], [[memoryview(bytearray(PAGE))] for _ in range(4)])
        assert feed.sync(30)
        exporter.sync()
        png, out = tmp_path / "c.png", tmp_path / "c.json"
        assert plot_capacity_curves.main(["--url", f"127.0.0.1:{port}", "--png", str(png),
                                          "--json", str(out)]) == 0
    finally:
        server.shutdown()
        store.close()
        feed.close()
    text = capsys.readouterr().out
    assert "<- its size" in text and "8x" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = json.loads(out.read_text())["curves"]["host"]
    assert [p["multiplier"] for p in curves] == [0.125, 0.25, 0.5, 1, 2, 4, 8]
    own = next(p for p in curves if p["multiplier"] == 1)
    # What the series say (their values are pinned in tests/metrics/test_exporter.py), turned into
    # a ratio and the prefill tokens of the hits.
    assert 0 < own["hits"] <= own["lookups"] and own["hit_ratio"] == own["hits"] / own["lookups"]
    assert own["tokens_served"] == own["hits"] * plot_capacity_curves.PAGE_TOKENS
    cost = json.loads(out.read_text())["cost"]
    assert cost["lookup_pages"] == 12 and cost["dropped_pages"] == 0
    assert 0 < cost["serving_us_per_page"] < cost["process_us_per_page"]
    assert "cost per looked-up page (12 pages)" in text


def test_a_server_without_curves_is_told_how_to_turn_them_on(capsys) -> None:
    registry = CollectorRegistry()
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        assert plot_capacity_curves.main(["--url", f"127.0.0.1:{port}"]) == 1
    finally:
        server.shutdown()
    assert "capacity_curves: true" in capsys.readouterr().err
