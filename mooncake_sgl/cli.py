"""``mooncake-sgl``: the command line.

    mooncake-sgl config check FILE     validate a tiers YAML; exit 2 naming the bad key
    mooncake-sgl config show [FILE]    print the effective config (defaults filled in)
    mooncake-sgl pool ...              run or query the pooled DRAM server (``pool --help``)
    mooncake-sgl stats URL|--config F  per-tier hit share, bytes moved, evictions (``stats --help``)
"""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError, StoreConfig, dump_config, load_config_file, tier_kind


def _describe(config: StoreConfig) -> str:
    parts = []
    for t in config.tiers:
        cap = getattr(t, "capacity", None)
        parts.append(f"{tier_kind(t)}" + (f" {cap / 2**30:.2f}GiB" if isinstance(cap, int) and cap else ""))
    return f"tiers: {', '.join(parts)}; policy: {config.policy.name}"


def _config(args: argparse.Namespace) -> int:
    try:
        config = load_config_file(args.file) if args.file else StoreConfig()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.action == "check":
        print(f"ok: {args.file}: {_describe(config)}")
    else:
        print(dump_config(config), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pool"]:
        from .pool.cli import main as pool_main

        return pool_main(argv[1:])
    if argv[:1] == ["stats"]:
        from .metrics.cli import main as stats_main

        return stats_main(argv[1:])
    parser = argparse.ArgumentParser(prog="mooncake-sgl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cfg = sub.add_parser("config", help="validate or show a tiers YAML")
    cfg.add_argument("action", choices=["check", "show"])
    cfg.add_argument("file", nargs="?", help="YAML or JSON file (show: omit for the embedded default)")
    sub.add_parser("pool", help="the pooled DRAM server; see `mooncake-sgl pool --help`")
    sub.add_parser("stats", help="our counters from a /metrics URL or an LMDB tier; see `stats --help`")
    args = parser.parse_args(argv)
    if args.command == "config":
        if args.action == "check" and not args.file:
            parser.error("config check needs a FILE")
        return _config(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
