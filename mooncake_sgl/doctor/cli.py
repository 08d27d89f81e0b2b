"""``mooncake-sgl doctor URL... [--pool HOST:PORT]``: why storage hits did not happen, in sentences.

Reads each server's arguments and ``/metrics`` twice (``--window`` apart, for rates), and with
``--pool`` the namespace board of that pool (which configurations key into it). Every read is
bounded by ``--timeout``; a server or pool that cannot be read is itself a finding. Exit status:
0 with no warning, 1 with one or more, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import TextIO

from ..config import PoolTierConfig
from ..hicache.namespace_board import NamespaceRecord, read_board
from .evidence import ServerEvidence, gather
from .findings import WARNING, Finding, diagnose


def pool_board(endpoint: str, timeout: float) -> tuple[list[tuple[str, NamespaceRecord]], str]:
    """The records on the pool at ``endpoint``'s board, and an error (``""`` when read)."""
    from ..tiers.pool import PoolTier  # the pool client: only when a pool is asked about

    seconds = f"{timeout:g}s"
    try:
        tier = PoolTier(PoolTierConfig(endpoints=[endpoint], transport="tcp", timeout=seconds,
                                       connect_timeout=seconds, first_byte_timeout=seconds))
    except ValueError as e:
        return [], f"--pool {endpoint}: {e}"
    try:
        slots = read_board(tier)  # a dead pool reads as an empty board: its liveness tells them apart
        if tier.stats().get("endpoints_live", 1) == 0:
            return [], f"pool {endpoint} did not answer within {timeout:g} s"
        found = [(f"pool:{endpoint}", r) for _, r in slots if r is not None]
    except Exception as e:  # noqa: BLE001 - a dead or foreign pool is reported, not raised
        return [], f"pool {endpoint}: {type(e).__name__}: {e}"
    finally:
        tier.close()
    return found, ""


def render(findings: list[Finding], servers: list[ServerEvidence], out: TextIO) -> None:
    if not findings:
        names = ", ".join(s.name for s in servers)
        out.write(f"no findings for {names}: storage lookups, loads and backups look unobstructed\n")
        return
    for f in findings:
        out.write(f"{f.level.upper()} [{f.code}] {f.server}: {f.says}.\n")
        for e in f.evidence:
            out.write(f"    evidence: {e}\n")
        out.write(f"    fix: {f.fix}.\n\n")


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="mooncake-sgl doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("servers", nargs="+", metavar="URL", help="SGLang servers (host:port or URL)")
    parser.add_argument("--pool", action="append", default=[], metavar="HOST:PORT",
                        help="a pool whose namespace board to read (repeatable)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per read (default 5)")
    parser.add_argument("--window", type=float, default=2.0,
                        help="seconds between the two reads of /metrics (rates); 0 reads once")
    parser.add_argument("--json", action="store_true", help="findings as JSON")
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.window < 0:
        parser.error("--timeout must be > 0 and --window >= 0")
    with ThreadPoolExecutor(min(8, len(args.servers))) as ex:
        servers = list(ex.map(lambda s: gather(s, args.timeout, args.window), args.servers))
    board: list[tuple[str, NamespaceRecord]] = []
    errors = []
    for ep in args.pool:
        found, error = pool_board(ep, args.timeout)
        board += found
        if error:
            errors.append(Finding(f"pool:{ep}", "pool_unreadable", WARNING, "its namespace board could "
                                  "not be read", (error,), "check the pool's address and that it is up"))
    findings = errors + diagnose(servers, board)
    if args.json:
        json.dump({"servers": [s.name for s in servers], "findings": [asdict(f) for f in findings]},
                  out, indent=2)
        out.write("\n")
    else:
        render(findings, servers, out)
    return 1 if any(f.level == WARNING for f in findings) else 0
