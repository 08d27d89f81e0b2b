"""Two live SGLang instances, no session affinity: one shared ``mooncake-sgl pool`` vs isolated tiers.

The Mooncake idea in one run: KV cache pooled across instances, so a prefix prefilled on one server
is loaded, not recomputed, on the other. Multi-turn conversations alternate between two servers
(turn ``t`` of conversation ``c`` goes to server ``(c + t) % 2``), ``--max-parallel`` conversations
in flight, caches never flushed. Scenarios:

- ``shared``    both servers: host tier + one ``kind: pool`` tier on a pool server started here;
- ``isolated``  each server: host tier + its own LMDB tier.

Reported per scenario and server: prompt tokens, cached tokens (device / host / storage), TTFT, and
the cached share against the *reachable* share: the whole pages of the conversation's previous turn,
which a perfect cache shared by both servers would serve.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..tiny_model import TinyLlama, write_tiny_llama
from .client import RequestResult, SglangClient
from .console import log
from .results import percentile
from .server import LaunchedServer, free_port, has_gpu, launch_command, ours_args, server_env
from .workloads import BenchRequest, MultiTurnSpec, multiturn

PAGE_TOKENS = 64
SCENARIOS = ("shared", "isolated")


@dataclass
class Sent:
    server: int
    reachable: int
    result: RequestResult


def reachable_tokens(req: BenchRequest, page: int = PAGE_TOKENS) -> int:
    """Whole pages of the previous turn's prompt, and never the prompt's last token."""
    return min(req.reusable_tokens // page * page, (len(req.input_ids) - 1) // page * page)


def tiers_yaml(scenario: str, workdir: Path, index: int, pool_endpoint: str | None) -> Path:
    host = "  - {kind: host, capacity: 1GiB}\n"
    if scenario == "shared":
        slow = f'  - {{kind: pool, endpoints: ["{pool_endpoint}"]}}\n'
    else:
        slow = f'  - {{kind: lmdb, path: "{workdir / f"lmdb{index}"}", capacity: 8GiB}}\n'
    path = workdir / f"tiers-{scenario}-{index}.yaml"
    path.write_text("tiers:\n" + host + slow)
    return path


def drive(urls: list[str], conversations: list[list[BenchRequest]], max_parallel: int,
          progress: Any = None) -> list[Sent]:
    """Each conversation's turns in order, alternating servers; ``max_parallel`` conversations at once."""
    clients = [SglangClient(u) for u in urls]
    sent: list[Sent] = []
    lock = threading.Lock()

    def converse(c: int) -> None:
        for t, req in enumerate(conversations[c]):
            server = (c + t) % len(clients)
            res = clients[server].generate(req)
            with lock:
                sent.append(Sent(server, reachable_tokens(req), res))
                if progress is not None:
                    progress.update(1)

    with ThreadPoolExecutor(max(1, max_parallel)) as pool:
        list(pool.map(converse, range(len(conversations))))
    return sent


def summarise(sent: list[Sent]) -> dict[str, Any]:
    ok = [s for s in sent if not s.result.error]
    prompt = sum(s.result.prompt_tokens for s in ok)
    cached = sum(s.result.cached_tokens for s in ok)
    reachable = sum(s.reachable for s in ok)
    ttft = [s.result.ttft_s for s in ok]
    partial = [s for s in ok if s.reachable and s.result.cached_tokens < s.reachable]
    return {
        "requests": len(sent), "errors": len(sent) - len(ok), "prompt_tokens": prompt,
        "cached_tokens": cached, "reachable_tokens": reachable,
        "device_tokens": sum(s.result.device_tokens for s in ok),
        "host_tokens": sum(s.result.host_tokens for s in ok),
        "storage_tokens": sum(s.result.storage_tokens for s in ok),
        "cached_share": cached / prompt if prompt else 0.0,
        "reachable_share": reachable / prompt if prompt else 0.0,
        "cached_of_reachable": cached / reachable if reachable else 0.0,
        "requests_short_of_reachable": len(partial),
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else 0.0,
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    header = ["scenario", "server", "requests", "prompt tok", "cached", "device", "host", "storage",
              "cached share", "reachable", "of reachable", "short", "TTFT mean ms", "p50", "p99"]
    rows = []
    for name, res in results.items():
        for label, s in [("both", res["overall"])] + [(str(i), p) for i, p in enumerate(res["servers"])]:
            rows.append([name, label, str(s["requests"]), f"{s['prompt_tokens']:,}",
                         f"{s['cached_tokens']:,}",
                         f"{s['device_tokens']:,}", f"{s['host_tokens']:,}", f"{s['storage_tokens']:,}",
                         f"{s['cached_share']:.1%}", f"{s['reachable_share']:.1%}",
                         f"{s['cached_of_reachable']:.1%}", str(s["requests_short_of_reachable"]),
                         f"{s['ttft_mean_s'] * 1e3:,.0f}", f"{s['ttft_p50_s'] * 1e3:,.0f}",
                         f"{s['ttft_p99_s'] * 1e3:,.0f}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows])


def run_scenario(scenario: str, args: argparse.Namespace, model: Path, workdir: Path,
                 conversations: list[list[BenchRequest]]) -> dict[str, Any]:
    from devtools.testing.pool_process import PoolProcess

    cpu = not has_gpu()
    with ExitStack() as stack:
        endpoint = None
        if scenario == "shared":
            pool = stack.enter_context(PoolProcess(capacity=args.pool_capacity))
            endpoint = pool.endpoint
        servers = []
        for i in range(2):
            port = free_port()
            cmd = launch_command(str(model), port, ours_args(tiers_yaml(scenario, workdir, i, endpoint)),
                                 cpu=cpu, extra=tuple(args.server_arg))
            servers.append(LaunchedServer(cmd, port, Path(args.log_dir) / f"two-{scenario}-{i}.log",
                                          args.health_timeout, env=server_env(cpu)))
        log(f"[{scenario}] starting two servers (logs in {args.log_dir})")
        with ThreadPoolExecutor(2) as ex:  # start-ups overlap
            for s in ex.map(lambda s: s.start(), servers):
                stack.callback(s.stop)
        bar = None
        if not args.no_progress:
            from tqdm import tqdm

            bar = stack.enter_context(tqdm(total=sum(map(len, conversations)), desc=scenario,
                                           unit="req", file=sys.stderr))
        sent = drive([s.url for s in servers], conversations, args.max_parallel, bar)
    return {"overall": summarise(sent),
            "servers": [summarise([s for s in sent if s.server == i]) for i in range(2)],
            "requests": [{"server": s.server, "reachable": s.reachable, **asdict(s.result)} for s in sent]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = MultiTurnSpec(conversations=8, turns=4, first_turn_tokens=2048, user_tokens=512, output_tokens=16)
    p.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: both")
    p.add_argument("--conversations", type=int, default=d.conversations)
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--first-turn-tokens", type=int, default=d.first_turn_tokens)
    p.add_argument("--user-tokens", type=int, default=d.user_tokens)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--max-parallel", type=int, default=2, help="conversations in flight")
    p.add_argument("--model-path", help="default: a tiny random-weight Llama written here")
    p.add_argument("--model-layers", type=int, default=4)
    p.add_argument("--model-hidden", type=int, default=1024)
    p.add_argument("--pool-capacity", default="2GiB")
    p.add_argument("--server-arg", action="append", default=["--max-total-tokens=16384"],
                   help="extra launch_server argument(s)")
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-dir", default=".", help="server logs (created)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    spec = MultiTurnSpec(conversations=args.conversations, turns=args.turns,
                         first_turn_tokens=args.first_turn_tokens, user_tokens=args.user_tokens,
                         output_tokens=args.output_tokens, seed=args.seed)
    rounds = multiturn(spec)
    conversations = [[rounds[t][c] for t in range(spec.turns)] for c in range(spec.conversations)]
    results = {}
    with tempfile.TemporaryDirectory(prefix="mooncake-sgl-two-") as tmp:
        model = Path(args.model_path) if args.model_path else write_tiny_llama(
            Path(tmp) / "model", TinyLlama(layers=args.model_layers, hidden=args.model_hidden))
        for scenario in args.scenario or SCENARIOS:
            results[scenario] = run_scenario(scenario, args, model, Path(tmp), conversations)
    print(f"two instances, no session affinity: {spec.conversations} conversations x {spec.turns} turns, "
          f"{args.max_parallel} in flight")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "scenarios": results}, indent=2,
                                              default=str))
    return 1 if any(r["overall"]["errors"] for r in results.values()) else 0
