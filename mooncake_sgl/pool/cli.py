"""``mooncake-sgl pool``: run a pool server, or ask one for its stats and health.

    mooncake-sgl pool --config pool.yaml                 # serve until SIGTERM / Ctrl-C
    mooncake-sgl pool --port 0 --capacity 2GiB           # flags override the file
    mooncake-sgl pool stats 127.0.0.1:7480 [--secret S] [--tenant T] [--json]
    mooncake-sgl pool health 127.0.0.1:7480              # exit 0 when it answers, 1 otherwise

Once listening, the server prints one line ``READY <host>:<port> ...`` on stdout (scripts and the
test helper ``devtools.testing.pool_process.PoolProcess`` wait for it; with ``--port 0`` it is how
the chosen port is learned).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from .. import envs
from ..errors import MooncakeSglError


def _serve(argv: list[str]) -> int:
    from .config import load_pool_config
    from .server import PoolServer

    ap = argparse.ArgumentParser(prog="mooncake-sgl pool", description="Run a pooled DRAM page store.")
    ap.add_argument("--config", help="YAML or JSON PoolServerConfig file")
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--capacity", help="segment size, e.g. 16GiB")
    ap.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port of the "
                    "bind host (0: a free one, shown in the READY line)")
    ap.add_argument("--secret", help="shared secret (prefer the config file or $MOONCAKE_SGL_POOL_SECRET)")
    args = ap.parse_args(argv)
    secret = args.secret or envs.MOONCAKE_SGL_POOL_SECRET.get() or None
    try:
        cfg = load_pool_config(args.config, {"host": args.host, "port": args.port,
                                             "capacity": args.capacity, "secret": secret,
                                             "metrics_port": args.metrics_port})
    except MooncakeSglError as e:
        print(f"mooncake-sgl pool: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = PoolServer(cfg)
    try:
        server.start()
    except MooncakeSglError as e:
        print(f"mooncake-sgl pool: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"mooncake-sgl pool: cannot start on {cfg.host}:{cfg.port}: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    host, port = server.address
    print(f"READY {host}:{port} capacity={server.capacity} tenants={len(server.tenants)} "
          f"shm={'on' if server.unix_name else 'off'} rdma={'on' if server.rdma else 'off'} "
          f"pid={os.getpid()}"
          + (f" metrics={host}:{server.metrics_http.port}" if server.metrics_http else ""), flush=True)
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0


def _query(argv: list[str], what: str) -> int:
    from ..transfer.client import PoolClient

    ap = argparse.ArgumentParser(prog=f"mooncake-sgl pool {what}")
    ap.add_argument("endpoint", nargs="?", default="127.0.0.1:7480")
    ap.add_argument("--secret", default=envs.MOONCAKE_SGL_POOL_SECRET.get())
    ap.add_argument("--tenant", default="", help="tenant name on a multi-tenant pool (its pages' "
                    "counters are shown; --secret is then that tenant's)")
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args(argv)
    client = PoolClient(args.endpoint, transport="tcp", secret=args.secret, tenant=args.tenant,
                        connections=1, timeout=args.timeout)
    try:
        stats = client.stats()
    except MooncakeSglError as e:
        print(f"{args.endpoint}: unhealthy: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if what == "health":
        used = stats["used_bytes"] / max(1.0, stats["capacity_bytes"])
        print(f"{args.endpoint}: ok, {int(stats['pages'])} pages, {used:.0%} full, "
              f"{int(stats['connections'])} connections")
    elif args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        for k in sorted(stats):
            v = stats[k]
            print(f"{k:24s} {int(v) if float(v).is_integer() else round(v, 3)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; the package CLI calls ``main(argv_after_pool)``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("stats", "health"):
        return _query(argv[1:], argv[0])
    if argv and argv[0] == "serve":
        argv = argv[1:]
    return _serve(argv)
