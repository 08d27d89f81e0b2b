"""``mooncake-sgl stats``: our counters as a per-tier table (or JSON), once or every N seconds.

    mooncake-sgl stats 127.0.0.1:30000            # a SGLang server's /metrics (--enable-metrics)
    mooncake-sgl stats 127.0.0.1:9480             # a pool server's /metrics (--metrics-port)
    mooncake-sgl stats --config tiers.yaml        # the counter files in the config's LMDB tier
    mooncake-sgl stats URL --json                 # machine-readable
    mooncake-sgl stats URL --watch 5              # refresh every 5 s, with the last interval's moves

Exit status: 0 shown, 1 nothing to read (endpoint down, no counter file yet), 2 bad arguments/config.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TextIO

from ..config import LmdbTierConfig, parse_size
from ..config_sources import our_file
from ..errors import ConfigError
from ..units import MAX_DURATION
from .model import Snapshot, as_json, diff, rows
from .persist import CounterFileError, find_counter_files, read_counters
from .scrape import MAX_BODY_BYTES, ScrapeError, fetch, is_pool, parse, parse_pool


class NothingToShow(Exception):
    """The source answered nothing we can show; the message says where we looked."""


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def tier_table(snapshot: Snapshot) -> str:
    """The per-tier table: hit share, bytes moved, evictions, and what each tier holds."""
    head = (f"{'tier':<15}{'hit share':>10}{'hits':>10}{'read':>12}{'written':>12}{'evictions':>11}"
            f"{'refused':>9}{'corrupt':>9}{'pages':>9}  resident / capacity")
    lines = [head]
    for r in rows(snapshot):
        if r.tier == "miss":
            lines.append(f"{'(no tier)':<15}{r.hit_share:>10.1%}{r.hits:>10.0f}")
            continue
        lines.append(f"{r.tier:<15}{r.hit_share:>10.1%}{r.hits:>10.0f}{human_bytes(r.read_bytes):>12}"
                     f"{human_bytes(r.written_bytes):>12}{r.evictions:>11.0f}{r.puts_refused:>9.0f}"
                     f"{r.corrupt_pages:>9.0f}{r.resident_pages:>9.0f}  "
                     f"{human_bytes(r.resident_bytes)} / {human_bytes(r.capacity_bytes)}"
                     + (f" (room for {human_bytes(r.holdable_bytes)} now)"
                        if 0 < r.holdable_bytes < r.capacity_bytes else ""))
    return "\n".join(lines)


def curve_table(snapshot: Snapshot) -> str:
    """Each tier's capacity curve: the prefix hit ratio it would have had at each size (estimated
    online by sampling, ``policy/curve.py``); empty where no curve is kept."""
    order = list(snapshot.by_tier())  # fastest first
    tiers = sorted({t for _, t, _ in snapshot.curves},
                   key=lambda t: order.index(t) if t in order else len(order))
    lines = []
    for tier in tiers:
        points = snapshot.curve_of(tier)
        if not any(looked for _, _, looked, _ in points):
            continue
        if not lines:
            lines.append("capacity curves: prefix hit ratio this tier would have had at each size "
                         "(sampled estimate)")
        lines.append(f"{tier:<15}" + "".join(f"{f'{m:g}x':>10}" for m, _, _, _ in points))
        lines.append(f"{'  size':<15}" + "".join(f"{human_bytes(cap):>10}" for _, cap, _, _ in points))
        lines.append(f"{'  hit ratio':<15}" + "".join(f"{(hits / looked if looked else 0):>10.1%}"
                                                      for _, _, looked, hits in points))
    looked = snapshot.store_total("lookup_pages")
    if lines and looked:
        busy, own = snapshot.store_total("curve_busy_seconds"), snapshot.store_total("curve_process_seconds")
        dropped = snapshot.store_total("curve_dropped_pages")
        lines.append(f"  cost: {busy:.1f} s in the server ({1e6 * busy / looked:.1f} us per "
                     f"looked-up page) and {own:.1f} s of the curve process's "
                     f"({1e6 * own / looked:.0f} us) for {looked:.0f} looked-up pages"
                     + (f"; {dropped:.0f} pages left out while it was behind" if dropped else ""))
    return "\n".join(lines)


def router_line(snapshot: Snapshot) -> str:
    """What the router announcements did (``router_events: local``); empty when they did nothing."""
    n = {f: snapshot.store_total(f"router_{f}") for f in ("announced_pages", "removed_pages",
                                                          "unannounced_pages", "skipped_other_namespace",
                                                          "skipped_not_sglang_hash")}
    if not any(n.values()):
        return ""
    return (f"router events: {n['announced_pages']:.0f} pages announced as DISK, "
            f"{n['removed_pages']:.0f} removed; {n['unannounced_pages']:.0f} could not be announced "
            f"when stored (SGLang never published their hash: a LoRA or cache_salt namespace, or no "
            f"--kv-events-config); {n['skipped_other_namespace'] + n['skipped_not_sglang_hash']:.0f} "
            f"keys of sidecar pools or other namespaces left out")


def gate_line(snapshot: Snapshot) -> str:
    """What the load gate declined (``load_gate``); empty when it declined nothing."""
    n = {f: snapshot.store_total(f"gate_{f}") for f in ("lookups", "declined_lookups", "declined_pages",
                                                        "probe_lookups", "abandoned_lookups",
                                                        "abandoned_pages")}
    if not (n["declined_lookups"] or n["probe_lookups"] or n["abandoned_lookups"]):
        return ""
    return (f"load gate: {n['declined_lookups']:.0f} of {n['lookups']:.0f} hits cut short, "
            f"{n['declined_pages']:.0f} page objects left to recompute (loading them was expected "
            f"to take longer than recomputing them); {n['abandoned_lookups']:.0f} hits given up "
            f"after their first page read slowly, {n['abandoned_pages']:.0f} page objects left; "
            f"{n['probe_lookups']:.0f} probe reads of tiers not read lately")


def pool_table(stats: dict[str, float]) -> str:
    cap = stats.get("capacity_bytes", 0.0)
    used = stats.get("used_bytes", 0.0)
    fill = used / cap if cap else 0.0
    lines = [f"pool: {fill:.1%} full ({human_bytes(used)} of {human_bytes(cap)}), "
             f"{stats.get('pages', 0):.0f} pages, {stats.get('connections', 0):.0f} connections"]
    for key in ("leased_bytes", "evictions_total", "puts_refused_total", "puts_waited_total",
                "get_hits_total", "gets_total", "received_bytes_total", "sent_bytes_total",
                "auth_failures_total"):
        if key in stats:
            v = stats[key]
            lines.append(f"  {key:<22}{human_bytes(v) if 'bytes' in key else f'{v:.0f}':>14}")
    return "\n".join(lines)


def _lmdb_paths(config_file: str) -> list[str]:
    from ..tiers.ssd import default_lmdb_path

    config, _ = our_file(config_file)
    paths = [t.path or default_lmdb_path() for t in config.tiers if isinstance(t, LmdbTierConfig)]
    if not paths:
        raise ConfigError(f"{config_file} has no lmdb tier: the store keeps its counters only in an "
                          "LMDB tier's directory (read a live server with `mooncake-sgl stats URL`)")
    return paths


def _reader(args: argparse.Namespace) -> Callable[[], tuple[str, object]]:
    """A function returning ``("tiers", Snapshot)`` or ``("pool", dict)`` for each refresh."""
    if args.config:
        paths = _lmdb_paths(args.config)

        def from_files() -> tuple[str, object]:
            if not find_counter_files(paths):
                raise NothingToShow(f"no counter file yet under {', '.join(paths)} (the store "
                                    "writes one every few seconds and at close)")
            return "tiers", read_counters(paths)
        return from_files

    def from_url() -> tuple[str, object]:
        text = fetch(args.target, args.timeout, args.max_bytes)
        try:
            if is_pool(text):
                return "pool", parse_pool(text)
            snap = parse(text)
        except ValueError as e:  # a page that is not Prometheus text (``scrape.samples``)
            raise NothingToShow(f"{args.target}: {e}") from e
        if not snap.tiers:
            raise NothingToShow(f"{args.target} serves no mooncake_sgl_ series (is SGLang running "
                                "with --enable-metrics and --hicache-storage-backend mooncake?)")
        return "tiers", snap
    return from_url


def _show(kind: str, data: object, previous: object, args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        doc = as_json(data) if kind == "tiers" else {"pool": data}
        if kind == "tiers" and isinstance(previous, Snapshot):
            doc["interval"] = as_json(diff(previous, data))
        print(json.dumps(doc, sort_keys=True), file=out, flush=True)
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    if kind == "pool":
        print(f"{stamp}  {args.target}\n{pool_table(data)}", file=out, flush=True)
        return
    taken = time.strftime("%H:%M:%S", time.localtime(data.taken_at)) if data.taken_at else "?"
    print(f"{stamp}  {args.config or args.target} (counters as of {taken})\n{tier_table(data)}",
          file=out)
    for extra in (curve_table(data), router_line(data), gate_line(data)):
        if extra:
            print(f"\n{extra}", file=out)
    if isinstance(previous, Snapshot):
        print(f"\nlast {args.watch:g} s:\n{tier_table(diff(previous, data))}", file=out)
    out.flush()


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    ap = argparse.ArgumentParser(prog="mooncake-sgl stats", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", nargs="?", help="host:port or URL of a /metrics endpoint")
    ap.add_argument("--config", help="tiers YAML: read the counter files of its LMDB tier instead")
    ap.add_argument("--json", action="store_true", help="one JSON document per refresh")
    ap.add_argument("--watch", type=float, metavar="N", help="refresh every N seconds until Ctrl-C")
    ap.add_argument("--timeout", type=float, default=5.0,
                    help="seconds in all to read /metrics: connect, headers and body (default 5)")
    ap.add_argument("--max-bytes", default=str(MAX_BODY_BYTES), metavar="SIZE",
                    help="refuse a /metrics body larger than this (default 64MiB)")
    args = ap.parse_args(argv)
    if bool(args.target) == bool(args.config):
        ap.error("give either a /metrics URL or --config FILE")
    if args.watch is not None and not 0 < args.watch <= MAX_DURATION:
        ap.error(f"--watch needs a number of seconds above 0 and at most {MAX_DURATION:g}, "
                 f"got {args.watch:g}")
    if not 0 < args.timeout <= MAX_DURATION:
        ap.error(f"--timeout needs a number of seconds above 0 and at most {MAX_DURATION:g}, "
                 f"got {args.timeout:g}")
    try:
        args.max_bytes = parse_size(args.max_bytes)
    except ValueError as e:
        ap.error(f"--max-bytes: {e}")
    try:
        read = _reader(args)
    except (ConfigError, OSError) as e:
        print(f"mooncake-sgl stats: {e}", file=sys.stderr)
        return 2
    try:
        return _loop(read, args, out)
    except KeyboardInterrupt:
        return 0


def _loop(read: Callable[[], tuple[str, object]], args: argparse.Namespace, out: TextIO) -> int:
    previous: object = None
    while True:
        try:
            kind, data = read()
        except (ScrapeError, CounterFileError, NothingToShow) as e:
            print(f"mooncake-sgl stats: {e}", file=sys.stderr)
            if args.watch is None:
                return 1
        else:
            _show(kind, data, previous, args, out)
            previous = data
        if args.watch is None:
            return 0
        time.sleep(args.watch)
