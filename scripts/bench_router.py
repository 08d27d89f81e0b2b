#!/usr/bin/env python3
"""Routing by what each instance holds in its own tiers: live CPU servers with ``router_events:
local``, a multi-turn workload whose every turn arrives after its prefix left the device and host
pool (each round starts with ``/flush_cache`` on every server), routed by one policy per run:

- ``round_robin``  the next server in turn (no affinity);
- ``indexer``      the server NVIDIA Dynamo's KV indexer (``python -m dynamo.indexer``, fed by each
                   server's KV event stream, which carries our DISK events) credits with the longest
                   match of the prompt over device, host pool and our tiers (``/query``);
- ``cache_aware``  ``sglang-router --policy cache_aware`` (its own approximate tree of the requests
                   it routed; it sees no engine events and no storage tier), started afresh for
                   each run; ``--routers N`` puts N of them in front of the same servers, requests
                   taking turns, as a deployment with several router replicas does.

Runs interleave (A B C C B A by default); each one starts from empty caches and tiers. Per run:
prompt tokens served from SGLang's caches and from our storage, TTFT mean and p90, the load and
the prefill rate. ``--json PATH`` writes every request.

    python scripts/bench_router.py                       # 2 servers, 7 conversations x 4 turns
    python scripts/bench_router.py --order indexer,round_robin --turns 3 --json router.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.bench.client import RequestResult, SglangClient  # noqa: E402
from devtools.bench.console import log, run_script  # noqa: E402
from devtools.bench.results import percentile  # noqa: E402
from devtools.bench.server import (  # noqa: E402
    LaunchedServer,
    free_port,
    has_gpu,
    launch_command,
    ours_args,
    server_env,
    stop_all,
)
from devtools.bench.workloads import BenchRequest, MultiTurnSpec, multiturn  # noqa: E402
from devtools.testing.cluster import router_command, wait_router_ready  # noqa: E402
from devtools.tiny_model import write_tiny_llama  # noqa: E402

POLICIES = ("round_robin", "indexer", "cache_aware")
PAGE_TOKENS = 64
DYNAMO = ROOT / ".venv-dynamo" / "bin" / "python"


def post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return json.loads(text) if text.strip() else None


class Indexer:
    """Dynamo's standalone KV indexer, every server registered as its own instance."""

    def __init__(self, python: Path, logs: Path) -> None:
        if not python.exists():
            raise SystemExit(f"{python} is missing: scripts/bootstrap.sh installs Dynamo's indexer there")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = (logs / "indexer.log").open("wb")
        self._proc = subprocess.Popen([str(python), "-m", "dynamo.indexer", "--port", str(self.port),
                                       "--block-size", str(PAGE_TOKENS), "--threads", "1"],
                                      stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/workers", timeout=2).read()
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the indexer did not start (log: {logs / 'indexer.log'})") from None
                time.sleep(0.2)

    def register(self, instance: int, events: int, replay: int) -> None:
        post(f"{self.url}/register", {"instance_id": instance, "endpoint": f"tcp://127.0.0.1:{events}",
                                      "replay_endpoint": f"tcp://127.0.0.1:{replay}", "model_name": "m",
                                      "block_size": PAGE_TOKENS})

    def best(self, tokens: list[int]) -> tuple[int | None, int]:
        """(instance with the longest match over every tier, its matched tokens)."""
        found = post(f"{self.url}/query", {"token_ids": tokens, "model_name": "m"})["instances"]
        if not found:
            return None, 0
        instance, tiers = max(found.items(), key=lambda kv: (kv[1].get("disk", 0), -int(kv[0])))
        return int(instance), int(tiers.get("disk", 0))

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)
        self._log.close()


def tiers_yaml(path: Path, ssd: Path) -> Path:
    path.write_text("router_events: local\npolicy: {name: lru}\nprefetch_threshold: 64\ntiers:\n"
                    "  - {kind: host, capacity: 64MiB, pin_memory: false}\n"
                    f"  - {{kind: lmdb, path: {ssd}, capacity: 512MiB}}\n")
    return path


def start_servers(n: int, model: Path, work: Path, args: argparse.Namespace
                  ) -> tuple[list[LaunchedServer], list[tuple[int, int]]]:
    servers, streams = [], []
    cpu = not has_gpu()
    for i in range(n):
        events, replay = free_port(), free_port()
        config = json.dumps({"publisher": "zmq", "bind": True, "endpoint": f"tcp://127.0.0.1:{events}",
                             "replay_endpoint": f"tcp://127.0.0.1:{replay}"})
        tiers = tiers_yaml(work / f"tiers{i}.yaml", work / f"ssd{i}")
        extra = ("--enable-metrics", "--kv-events-config", config, "--max-total-tokens",
                 str(args.device_tokens))
        servers.append(LaunchedServer(lambda port, t=tiers, e=extra: launch_command(
            str(model), port, ours_args(t), cpu=cpu, extra=e), free_port(), work / f"server{i}.log",
            args.health_timeout, env=server_env(cpu, {"XDG_CACHE_HOME": str(work / "cache")})))
        streams.append((events, replay))
    with ThreadPoolExecutor(n) as ex:
        list(ex.map(lambda s: s.start(), servers))
    return servers, streams


class Routers:
    """``n`` sglang-router processes with ``cache_aware`` in front of ``servers``; each request goes
    to the next one."""

    def __init__(self, n: int, servers: list[LaunchedServer], logs: Path) -> None:
        self._procs, self.clients = [], []
        for i in range(n):
            port = free_port()
            self._procs.append(subprocess.Popen(router_command(port, [s.url for s in servers], "cache_aware"),
                                                stdout=(logs / f"router{i}.log").open("ab"),
                                                stderr=subprocess.STDOUT))
            wait_router_ready(f"http://127.0.0.1:{port}", len(servers), 120)
            self.clients.append(SglangClient(f"http://127.0.0.1:{port}", timeout_s=600))
        self._next = count()

    def pick(self) -> SglangClient:
        return self.clients[next(self._next) % len(self.clients)]

    def close(self) -> None:
        for proc in self._procs:
            proc.terminate()
            proc.wait(10)


def run_policy(policy: str, rounds: list[list[BenchRequest]], clients: list[SglangClient],
               servers: list[LaunchedServer], indexer: Indexer, args: argparse.Namespace,
               logs: Path) -> dict[str, Any]:
    for c in clients:
        c.flush_cache()
        c.clear_storage()
    routers = Routers(args.routers, servers, logs) if policy == "cache_aware" else None
    try:
        return _run(policy, rounds, clients, routers, indexer, args.max_parallel)
    finally:
        if routers is not None:
            routers.close()


def _run(policy: str, rounds: list[list[BenchRequest]], clients: list[SglangClient], routers: Routers | None,
         indexer: Indexer, max_parallel: int) -> dict[str, Any]:
    turn = count()
    load = os.getloadavg()[0]
    results: list[dict[str, Any]] = []
    for t, batch in enumerate(rounds):
        for c in clients:
            c.flush_cache()  # the turn's prefix left every device and host pool: storage or nothing

        def send(req: BenchRequest, t: int = t) -> dict[str, Any]:
            target, matched = None, 0
            if policy == "indexer":
                instance, matched = indexer.best(req.input_ids)
                target = clients[instance - 1] if instance and matched else None
            if routers is not None:
                target = routers.pick()
            if target is None:
                target = clients[next(turn) % len(clients)]
            res: RequestResult = target.generate(req)
            return {"rid": req.rid, "turn": t, "server": target.port, "indexer_matched": matched,
                    "prompt_tokens": res.prompt_tokens, "cached_tokens": res.cached_tokens,
                    "storage_tokens": res.storage_tokens, "reusable_tokens": req.reusable_tokens,
                    "ttft_s": res.ttft_s, "error": res.error}

        with ThreadPoolExecutor(max_parallel) as ex:
            results.extend(ex.map(send, batch))
        log(f"[{policy}] turn {t}: {sum(r['storage_tokens'] for r in results if r['turn'] == t)} "
            f"prompt tokens from storage")
    later = [r for r in results if r["turn"] > 0 and not r["error"]]
    ttft = [r["ttft_s"] for r in later]
    computed = sum(r["prompt_tokens"] - r["cached_tokens"] for r in later)
    name = f"{policy} x{len(routers.clients)}" if routers is not None and len(routers.clients) > 1 else policy
    return {"policy": name, "load": round((load + os.getloadavg()[0]) / 2, 2),
            "errors": sum(1 for r in results if r["error"]),
            "reusable_tokens": sum(r["reusable_tokens"] for r in later),
            "cached_tokens": sum(r["cached_tokens"] for r in later),
            "storage_tokens": sum(r["storage_tokens"] for r in later),
            "ttft_mean_s": statistics.fmean(ttft) if ttft else 0.0, "ttft_p90_s": percentile(ttft, 0.9),
            "prefill_tokens_per_s": computed / sum(ttft) if ttft else 0.0, "requests": results}


def table(runs: list[dict[str, Any]]) -> str:
    lines = [f"{'policy':<16}{'load':>6}{'reusable':>10}{'cached':>9}{'storage':>9}{'share':>7}"
             f"{'TTFT mean':>11}{'p90':>8}{'prefill tok/s':>15}"]
    for r in runs:
        share = r["cached_tokens"] / r["reusable_tokens"] if r["reusable_tokens"] else 0.0
        lines.append(f"{r['policy']:<16}{r['load']:>6.2f}{r['reusable_tokens']:>10}{r['cached_tokens']:>9}"
                     f"{r['storage_tokens']:>9}{share:>7.0%}{r['ttft_mean_s']:>10.3f}s{r['ttft_p90_s']:>7.3f}s"
                     f"{r['prefill_tokens_per_s']:>15,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--order", default="round_robin,indexer,cache_aware,cache_aware,indexer,round_robin",
                   help="policies, one run each, in this order (default: A B C C B A)")
    p.add_argument("--servers", type=int, default=2)
    # Coprime with --servers: with a multiple of it, round robin would send every turn of a
    # conversation to the same server (the same position in each round), affinity by accident.
    p.add_argument("--conversations", type=int, default=7)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--first-turn-tokens", type=int, default=1024)
    p.add_argument("--user-tokens", type=int, default=256)
    p.add_argument("--max-parallel", type=int, default=2)
    p.add_argument("--device-tokens", type=int, default=8192, help="each server's --max-total-tokens")
    p.add_argument("--health-timeout", type=float, default=600.0)
    p.add_argument("--routers", type=int, default=1, help="cache_aware routers in front of the servers")
    p.add_argument("--dynamo-python", type=Path, default=DYNAMO)
    p.add_argument("--json", type=Path, help="write every run and request here")
    args = p.parse_args(argv)
    order = args.order.split(",")
    bad = [x for x in order if x not in POLICIES]
    if bad or args.servers < 2:
        p.error(f"--order takes {', '.join(POLICIES)} (got {bad}); --servers at least 2")
    if math.gcd(args.conversations, args.servers) != 1:
        p.error("--conversations must share no factor with --servers, or round robin sends every turn "
                "of a conversation to one server")
    rounds = multiturn(MultiTurnSpec(conversations=args.conversations, turns=args.turns,
                                     first_turn_tokens=args.first_turn_tokens, user_tokens=args.user_tokens,
                                     output_tokens=16))
    with tempfile.TemporaryDirectory(prefix="mooncake-sgl-router-") as tmp:
        work = Path(tmp)
        model = write_tiny_llama(work / "model")
        indexer = Indexer(args.dynamo_python, work)
        servers: list[LaunchedServer] = []
        try:
            log(f"starting {args.servers} servers (logs under {work})")
            servers, streams = start_servers(args.servers, model, work, args)
            for i, (events, replay) in enumerate(streams, start=1):
                indexer.register(i, events, replay)
            clients = [SglangClient(s.url, timeout_s=600) for s in servers]
            runs = [run_policy(policy, rounds, clients, servers, indexer, args, work) for policy in order]
        finally:
            stop_all(servers)
            indexer.close()
    print(f"{args.conversations} conversations x {args.turns} turns over {args.servers} CPU servers; "
          "every turn after a /flush_cache (turns 1+ counted)")
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs},
                                        indent=2))
    return 1 if any(r["errors"] for r in runs) else 0


if __name__ == "__main__":
    run_script(main)
