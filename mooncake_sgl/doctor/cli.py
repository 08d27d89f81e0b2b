"""``mooncake-sgl doctor URL... [--pool HOST:PORT]``: why storage hits did not happen, in sentences.

Reads each server's arguments and ``/metrics`` twice (``--window`` apart, for rates), and with
``--pool`` the namespace board of that pool (which configurations key into it; a pool with a
shared secret needs --pool-secret or $MOONCAKE_SGL_POOL_SECRET, a multi-tenant one --pool-tenant).
All reads of one server together take at most ``--timeout``; a server or pool that cannot be read
is itself a finding. Exit status: 0 with no warning, 1 with one or more, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TextIO

from .. import envs
from ..api import PageKey, PageView
from ..errors import AuthError, MooncakeSglError
from ..hicache.namespace_board import NamespaceRecord, read_board
from ..units import MAX_DURATION
from .evidence import ServerEvidence, gather
from .findings import WARNING, Finding, diagnose

if TYPE_CHECKING:
    from ..transfer.client import PoolClient


@dataclass(frozen=True)
class PoolAccess:
    """How to reach a pool's board: the credentials of ``mooncake-sgl pool stats``."""

    secret: str = ""
    tenant: str = ""  # "" = the pool's single tenant; a tenant's board holds its own records only


class _ClientBoard:
    """The one call ``read_board`` makes of a tier, on a bare client: the pool tier turns a refusal
    or a silent pool into misses, which read as an empty board and hid why ("did not answer" for a
    pool that refused a missing secret at once); the client raises, naming the cause."""

    def __init__(self, client: PoolClient) -> None:
        self._client = client

    def get_into(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        return self._client.get_batch(keys, pages)


def pool_board(endpoint: str, timeout: float, access: PoolAccess = PoolAccess()
               ) -> tuple[list[tuple[str, NamespaceRecord]], Finding | None]:
    """The records on the board of the pool at ``endpoint``, or the finding that says why it could
    not be read."""
    from ..transfer.client import PoolClient  # the pool client: only when a pool is asked about

    where = f"pool:{endpoint}"
    try:
        client = PoolClient(endpoint, transport="tcp", secret=access.secret, tenant=access.tenant,
                            connections=1, timeout=timeout)
    except ValueError as e:
        return [], _pool_unreadable(where, f"--pool {endpoint}: {e}")
    try:
        slots = read_board(_ClientBoard(client))  # type: ignore[arg-type]  # get_into is all it calls
    except AuthError as e:
        tenant = f"tenant {access.tenant!r}" if access.tenant else "no tenant"
        secret = "a secret" if access.secret else "no secret"
        return [], Finding(where, "pool_refused", WARNING,
                           f"the pool refused the doctor: {e}", (f"presented {secret} and {tenant}",),
                           "give the pool's secret with --pool-secret (or $MOONCAKE_SGL_POOL_SECRET) "
                           "and, on a multi-tenant pool, the tenant with --pool-tenant")
    except (MooncakeSglError, OSError) as e:
        return [], _pool_unreadable(where, f"pool {endpoint}: {e}")
    finally:
        client.close()
    return [(where, r) for _, r in slots if r is not None], None


def _pool_unreadable(where: str, why: str) -> Finding:
    return Finding(where, "pool_unreadable", WARNING, "its namespace board could not be read", (why,),
                   "check the pool's address and that it is up")


def _printable(text: str) -> str:
    """``text`` with control characters escaped: findings quote what endpoints served, and a
    newline there would forge a line of the report."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def render(findings: list[Finding], servers: list[ServerEvidence], out: TextIO) -> None:
    if not findings:
        names = ", ".join(s.name for s in servers)
        out.write(_printable(f"no findings for {names}: storage lookups, loads and backups look "
                             "unobstructed") + "\n")
        return
    for f in findings:
        out.write(_printable(f"{f.level.upper()} [{f.code}] {f.server}: {f.says}.") + "\n")
        for e in f.evidence:
            out.write(_printable(f"    evidence: {e}") + "\n")
        out.write(_printable(f"    fix: {f.fix}.") + "\n\n")


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="mooncake-sgl doctor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("servers", nargs="+", metavar="URL", help="SGLang servers (host:port or URL)")
    parser.add_argument("--pool", action="append", default=[], metavar="HOST:PORT",
                        help="a pool whose namespace board to read (repeatable)")
    parser.add_argument("--pool-secret", default=envs.MOONCAKE_SGL_POOL_SECRET.get(), metavar="SECRET",
                        help="the --pool's shared secret (default $MOONCAKE_SGL_POOL_SECRET, which "
                             "keeps it out of the process list); on a multi-tenant pool, the tenant's")
    parser.add_argument("--pool-tenant", default="", metavar="NAME",
                        help="the tenant whose board to read on a multi-tenant pool")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds in all for one server's reads, and for a pool's (default 5)")
    parser.add_argument("--window", type=float, default=2.0,
                        help="seconds between the two reads of /metrics (rates); 0 reads once")
    parser.add_argument("--json", action="store_true", help="findings as JSON")
    args = parser.parse_args(argv)
    # inf or nan would reach a socket's timeout (OverflowError) or a sleep.
    if not 0 < args.timeout <= MAX_DURATION:
        parser.error(f"--timeout needs a number of seconds above 0 and at most {MAX_DURATION:g}, "
                     f"got {args.timeout:g}")
    if not 0 <= args.window <= MAX_DURATION:
        parser.error(f"--window needs a number of seconds from 0 to {MAX_DURATION:g}, got {args.window:g}")
    with ThreadPoolExecutor(min(8, len(args.servers))) as ex:
        servers = list(ex.map(lambda s: gather(s, args.timeout, args.window), args.servers))
    board: list[tuple[str, NamespaceRecord]] = []
    errors = []
    access = PoolAccess(args.pool_secret, args.pool_tenant)
    for ep in args.pool:
        found, error = pool_board(ep, args.timeout, access)
        board += found
        if error is not None:
            errors.append(error)
    findings = errors + diagnose(servers, board)
    if args.json:
        json.dump({"servers": [s.name for s in servers], "findings": [asdict(f) for f in findings]},
                  out, indent=2)
        out.write("\n")
    else:
        render(findings, servers, out)
    return 1 if any(f.level == WARNING for f in findings) else 0
