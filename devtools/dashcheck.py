"""Load the Grafana dashboard's queries into a real Prometheus and check that each returns data.

A real pool server (``metrics_port``) and a real store (host DRAM, the pool, LMDB) exporting its
series on an HTTP ``/metrics`` run a small mixed workload (writes past the host tier, reads of old,
new and unknown pages, a client with a wrong secret); a Prometheus server scrapes both every second
with the scrape config of ``docs/prometheus-scrape.yml`` (targets replaced); then every panel query
and template variable of the dashboard is evaluated through Prometheus' HTTP API. Exit 0 when each
returned at least one series.

    python -m devtools.dashcheck --prometheus /usr/bin/prometheus

Prometheus is not a dependency of the package: Debian's ``prometheus`` package has the binary
(``apt-get download prometheus && dpkg-deb -x prometheus_*.deb DIR`` extracts it without
installing a service).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

DOCS = Path(__file__).resolve().parents[1] / "docs"
SECRET = "dashcheck"
# What Grafana substitutes before sending a query; short windows because the run is short.
SUBSTITUTE = {"$__rate_interval": "10s", "$__range": "1m", "$instance": ".*", "$pool": ".*"}


def _workload(store: Any, pool_endpoint: str, stop: threading.Event) -> None:
    from mooncake_sgl.transfer.client import PoolClient

    seg = 32 * 1024
    page = [memoryview(bytearray(seg)), memoryview(bytearray(seg))]
    out = [memoryview(bytearray(seg)), memoryview(bytearray(seg))]
    i = 0
    while not stop.is_set():
        keys = [f"page-{i + j}".encode() for j in range(8)]
        store.put_from(keys, [page] * 8)
        old = [f"page-{max(0, i - 64) + j}".encode() for j in range(8)]
        store.get_into(old + [b"never-written"], [out] * 9)  # host, then pool/LMDB, then a miss
        store.get_into(keys, [out] * 8)
        store.exists_prefix(keys)
        store.exists_prefix(old)  # a lookup seen before: the curves have reuse to count
        i += 8
        if i % 64 == 0:
            bad = PoolClient(pool_endpoint, transport="tcp", secret="wrong", connections=1, timeout=2)
            try:
                bad.exists_batch([b"x"])
            except Exception:
                pass  # refused, as intended: an authentication failure to count
            bad.close()
        time.sleep(0.05)


def _query(base: str, expr: str) -> list[Any]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.load(resp)
    if doc.get("status") != "success":
        raise RuntimeError(f"{expr}: {doc}")
    return doc["data"]["result"]


def _label_values(base: str, metric: str, label: str) -> list[str]:
    url = f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["data"]


def check(prometheus: str, dashboard_path: Path, seconds: float) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    from mooncake_sgl.config import HostTierConfig, LmdbTierConfig, PoolTierConfig, StoreConfig
    from mooncake_sgl.metrics.exporter import StoreExporter
    from mooncake_sgl.policy.curve_feed import CurveFeed
    from mooncake_sgl.pool.config import PoolServerConfig
    from mooncake_sgl.pool.server import PoolServer
    from mooncake_sgl.store import build_store

    from .bench.server import free_port

    dashboard = json.loads(dashboard_path.read_text())
    with tempfile.TemporaryDirectory(prefix="mooncake_sgl_dashcheck_") as tmp:
        pool = PoolServer(PoolServerConfig(port=0, metrics_port=0, capacity="64MiB", slab_size="1MiB",
                                           populate=False, secret=SECRET)).start()
        host, port = pool.address
        store = build_store(StoreConfig(
            tiers=[HostTierConfig(capacity="2MiB", pin_memory=False),
                   PoolTierConfig(endpoints=[f"{host}:{port}"], transport="tcp", secret=SECRET),
                   LmdbTierConfig(path=f"{tmp}/lmdb", capacity="256MiB")]))  # the default policy
        # Capacity curves in a process of their own, as a server with ``policy.capacity_curves``
        # runs them: their panels read real points and costs.
        curves = CurveFeed(store.tiers, store.names, store.policy, "process")
        store.observe(curves)
        registry = CollectorRegistry()
        exporter = StoreExporter(store.stats, {"tp_rank": 0}, frozenset(), registry,
                                 store.policy.name).start()
        store.time_tier_calls(exporter.observe_tier(store))
        sglang_port = free_port()
        http, _ = start_http_server(sglang_port, addr="127.0.0.1", registry=registry)
        scrape = yaml.safe_load((DOCS / "prometheus-scrape.yml").read_text())
        scrape["global"]["scrape_interval"] = "1s"
        targets = {"sglang": f"127.0.0.1:{sglang_port}",
                   "mooncake-sgl-pool": f"127.0.0.1:{pool.metrics_http.port}"}
        for job in scrape["scrape_configs"]:
            job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        Path(f"{tmp}/prometheus.yml").write_text(yaml.safe_dump(scrape))
        prom_port = free_port()
        prom = subprocess.Popen([prometheus, f"--config.file={tmp}/prometheus.yml",
                                 f"--storage.tsdb.path={tmp}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/prometheus.log", "w"))
        stop = threading.Event()
        load = threading.Thread(target=_workload, args=(store, f"{host}:{port}", stop), daemon=True)
        load.start()
        failures = 0
        try:
            time.sleep(seconds)
            base = f"http://127.0.0.1:{prom_port}"
            for var in dashboard["templating"]["list"]:
                if "definition" in var:
                    metric, label = var["definition"].removeprefix("label_values(").rstrip(")").split(", ")
                    values = _label_values(base, metric, label)
                    failures += not values
                    print(f"{'ok ' if values else 'EMPTY'} variable ${var['name']}: {values}")
            for panel in dashboard["panels"]:
                for target in panel.get("targets", []):
                    expr = target["expr"]
                    for k, v in SUBSTITUTE.items():
                        expr = expr.replace(k, v)
                    result = _query(base, expr)
                    failures += not result
                    sample = ", ".join(f"{r['metric'].get('tier') or r['metric'].get('op') or ''}"
                                       f"={float(r['value'][1]):.4g}" for r in result[:4])
                    print(f"{'ok ' if result else 'EMPTY'} {panel['title']} [{target['legendFormat']}]: "
                          f"{len(result)} series ({sample})")
        finally:
            stop.set()
            load.join(timeout=10)
            prom.terminate()
            prom.wait(timeout=30)
            http.shutdown()
            exporter.close()
            store.close()
            pool.stop()
    print(f"{'all queries returned data' if not failures else f'{failures} queries returned nothing'}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prometheus", required=True, help="path of a prometheus server binary")
    ap.add_argument("--dashboard", default=str(DOCS / "grafana-dashboard.json"))
    ap.add_argument("--seconds", type=float, default=25.0, help="workload and scraping before the queries")
    args = ap.parse_args(argv)
    return check(args.prometheus, Path(args.dashboard), args.seconds)


if __name__ == "__main__":
    sys.exit(main())
