"""docs/grafana-dashboard.json and docs/prometheus-scrape.yml: loaded, every query parsed as PromQL,
and every series a query names is one we export (a renamed series fails here, not on a wall
screen)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import yaml

from mooncake_sgl.metrics.model import (
    COUNTERS,
    CURVE_COUNTERS,
    CURVE_GAUGES,
    GAUGES,
    LATENCY,
    POLICY_COUNTERS,
    POLICY_GAUGES,
    POOL_PREFIX,
    STORE_COUNTERS,
)
from mooncake_sgl.pool import metrics as pool_metrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Grafana's own variables, replaced by what Grafana substitutes before sending a query.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s"}


def exported_series() -> set[str]:
    names = {n + "_total" for n in (*COUNTERS.values(), *STORE_COUNTERS.values(), *POLICY_COUNTERS.values())}
    names |= set(GAUGES.values()) | set(POLICY_GAUGES.values()) | set(CURVE_GAUGES.values())
    names |= {n + "_total" for n in CURVE_COUNTERS.values()}
    names |= {n + sfx for n in LATENCY.values() for sfx in ("_bucket", "_sum", "_count")}
    names |= {POOL_PREFIX + n for n, _ in pool_metrics.GAUGES.values()}
    names |= {POOL_PREFIX + n + "_total" for n, _ in pool_metrics.COUNTERS.values()}
    names |= {POOL_PREFIX + pool_metrics.LATENCY_NAME + sfx for sfx in ("_bucket", "_sum", "_count")}
    return names


def selectors(node) -> list[str]:  # noqa: ANN001 (promql_parser's node classes)
    """Metric names of every vector selector in a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        return [node.name]
    out: list[str] = []
    for attr in ("args", "expr", "lhs", "rhs", "param", "vector_selector"):
        child = getattr(node, attr, None)
        for c in child if isinstance(child, list) else [child]:
            if c is not None and not isinstance(c, (int, float, str)):
                out += selectors(c)
    return out


def queries(dashboard: dict) -> list[tuple[str, str]]:
    out = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [(v["name"], v["definition"]) for v in dashboard["templating"]["list"] if "definition" in v]
    return out


def promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def test_every_dashboard_query_parses_and_names_only_our_series() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exported = exported_series()
    named: set[str] = set()
    for title, expr in queries(dashboard):
        m = re.fullmatch(r"label_values\((\w+), *\w+\)", expr)
        if m:  # a template variable's query, not PromQL
            names = [m.group(1)]
        else:
            names = selectors(promql_parser.parse(promql(expr)))
        assert names, f"panel {title!r}: no series in {expr!r}"
        unknown = [n for n in names if n not in exported]
        assert not unknown, f"panel {title!r} queries series we never export: {unknown}"
        named |= set(names)
    # The panels docs/observability.md lists are there.
    for needed in ("mooncake_sgl_tier_hits_total", "mooncake_sgl_read_pages_total",
                   "mooncake_sgl_tier_read_bytes_total", "mooncake_sgl_tier_written_bytes_total",
                   "mooncake_sgl_tier_get_latency_seconds_bucket",
                   "mooncake_sgl_tier_put_latency_seconds_bucket",
                   "mooncake_sgl_pool_used_bytes", "mooncake_sgl_pool_capacity_bytes"):
        assert needed in named, f"no panel shows {needed}"


def test_the_dashboard_is_well_formed_for_grafana() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, f"panel {p['title']!r} is off the grid"
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            used = set(re.findall(r"\$(\w+)", " ".join(t["expr"] for t in p["targets"])))
            assert used - {"__rate_interval", "__range"} <= variables, p["title"]


def test_the_scrape_config_names_both_kinds_of_endpoint() -> None:
    doc = yaml.safe_load((DOCS / "prometheus-scrape.yml").read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert set(jobs) == {"sglang", "mooncake-sgl-pool"}
    for job in jobs.values():
        assert job["metrics_path"] == "/metrics"
        assert all(re.fullmatch(r"[\w.-]+:\d+", t) for c in job["static_configs"] for t in c["targets"])
