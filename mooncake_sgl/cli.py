"""``mooncake-sgl``: the command line.

    mooncake-sgl config check FILE     validate a tiers YAML (or SGLang's built-in Mooncake JSON);
                                       exit 2 naming the bad key (or --extra-config JSON|@FILE;
                                       --decode-offload: as a PD decode with offload reads it)
    mooncake-sgl config show [FILE]    print the effective config (defaults filled in); without FILE,
                                       the one an SGLang process would run on in this environment
    mooncake-sgl pool ...              run or query the pooled DRAM server (``pool --help``)
    mooncake-sgl stats URL|--config F  per-tier hit share, bytes moved, evictions (``stats --help``)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import builtin_config as bc
from .builtin_translate import describe_tiers, translate
from .config import StoreConfig
from .config_sources import ResolvedConfig, our_file, resolve_config
from .config_text import MAX_CONFIG_BYTES, dump_config
from .errors import ConfigError
from .files import read_regular_file


def _builtin_json(path: Path) -> bool:
    """Is ``path`` SGLang's built-in Mooncake JSON rather than our config? (Its keys, none of ours;
    a typo among them is then reported by the built-in's reader, naming it.)"""
    if path.suffix != ".json":
        return False
    try:
        data = json.loads(read_regular_file(path, limit=MAX_CONFIG_BYTES, what="config file"))
    except ValueError:  # ConfigError too: our loader reports it (with the line and column)
        return False
    ours = set(StoreConfig.__struct_fields__)
    return isinstance(data, dict) and bool(set(data) & bc.BUILTIN_KEYS) and not set(data) & ours


def _extra_config(text: str) -> dict[str, Any]:
    """``--extra-config`` as SGLang takes ``--hicache-storage-backend-extra-config``: JSON, or
    ``@file`` (JSON or YAML)."""
    source, body = "--extra-config", text
    try:
        if text.startswith("@"):
            source = text[1:]
            body = read_regular_file(source, limit=MAX_CONFIG_BYTES,
                                     what="--extra-config file").decode("utf-8")
        if text.startswith("@") and Path(source).suffix in (".yaml", ".yml"):
            import yaml

            try:
                data = yaml.safe_load(body)
            except yaml.YAMLError as e:  # not a ValueError: reported below like bad JSON
                raise ValueError(str(e)) from None
        else:
            data = json.loads(body)
    except ConfigError:
        raise  # the file's own error (not a regular file, too large), naming it
    except ValueError as e:
        raise ConfigError(f"not valid JSON or YAML: {e}", source=source) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping, got {type(data).__name__}", source=source)
    return data


def _resolve(args: argparse.Namespace) -> ResolvedConfig:
    ranks = bc.Ranks(tp_size=args.tp_size, pp_size=args.pp_size, tp_rank=args.tp_rank)
    if args.file:
        path = Path(args.file)
        if _builtin_json(path):
            translation = translate(bc.read_file(path), ranks)
            return ResolvedConfig(translation.config,
                                  f"SGLang's built-in Mooncake config in {path}", translation.notes,
                                  translation.check_server_url)
        config, _ = our_file(path)  # as SGLang's @FILE form hands it over
        return ResolvedConfig(config, str(path))
    extra = _extra_config(args.extra_config) if args.extra_config else None
    return resolve_config(extra, ranks)


# SGLang 0.5.23's decode offload manager (``disaggregation/decode_kvcache_offload_manager.py``)
# parses --hicache-storage-backend-extra-config with a bare ``json.loads``: an ``@file`` there
# stops the decode at start. Our ``config_file`` key names the same file in JSON.
DECODE_OFFLOAD = "--disaggregation-decode-enable-offload-kvcache"


def decode_offload_warning(file: str | None, extra_config: str | None) -> str | None:
    """What a PD decode with offload would make of this config argument, when it is not usable."""
    at_file = file or (extra_config[1:] if extra_config and extra_config.startswith("@") else None)
    if at_file is None:
        return None
    inline = json.dumps({"config_file": str(Path(at_file).resolve())})
    return (f"a decode with {DECODE_OFFLOAD} parses --hicache-storage-backend-extra-config as bare JSON, "
            f"so '@{at_file}' stops it at start; give it --hicache-storage-backend-extra-config "
            f"'{inline}' (or leave it out and set $MOONCAKE_SGL_CONFIG)")


def _config(args: argparse.Namespace) -> int:
    try:
        resolved = _resolve(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.action == "check":
        print(f"ok: {args.file or args.extra_config}: {describe_tiers(resolved.config)}")
        warning = decode_offload_warning(args.file, args.extra_config) if args.decode_offload else None
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        for note in resolved.notes:
            print(f"note: {note}")
        return 0
    print(f"# config from {resolved.source}")
    for note in resolved.notes:
        print(f"# note: {note}")
    if resolved.check_server_url:
        print(f"# check_server: attach waits for a store server at {resolved.check_server_url}")
    print(dump_config(resolved.config), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pool"]:
        from .pool.cli import main as pool_main

        return pool_main(argv[1:])
    if argv[:1] == ["doctor"]:
        from .doctor.cli import main as doctor_main

        return doctor_main(argv[1:])
    if argv[:1] == ["stats"]:
        from .metrics.cli import main as stats_main

        return stats_main(argv[1:])
    if argv[:1] == ["trace"]:
        from .sim.gen_suite import main as trace_main

        return trace_main(argv[1:])
    parser = argparse.ArgumentParser(prog="mooncake-sgl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    cfg = sub.add_parser("config", help="validate or show a tiers YAML, or translate SGLang's "
                                        "built-in Mooncake config")
    cfg.add_argument("action", choices=["check", "show"])
    cfg.add_argument("file", nargs="?",
                     help="our YAML or JSON, or SGLang's built-in Mooncake JSON "
                          "(SGLANG_HICACHE_MOONCAKE_CONFIG_PATH); show: omit for what this "
                          "environment gives")
    cfg.add_argument("--extra-config", metavar="JSON|@FILE",
                     help="as --hicache-storage-backend-extra-config (ours or the built-in's keys)")
    cfg.add_argument("--decode-offload", action="store_true",
                     help=f"check: the config is for a PD decode with {DECODE_OFFLOAD}, which takes "
                          "only inline JSON (warns at an @file form)")
    for flag, default in (("--tp-size", 1), ("--pp-size", 1), ("--tp-rank", 0)):
        cfg.add_argument(flag, type=int, default=default,
                         help="show/check a built-in config as this rank sees it (the built-in splits "
                              "global_segment_size over tp x pp ranks; device_name may map NICs by rank)")
    sub.add_parser("pool", help="the pooled DRAM server; see `mooncake-sgl pool --help`")
    sub.add_parser("stats", help="our counters from a /metrics URL or an LMDB tier; see `stats --help`")
    sub.add_parser("doctor", help="why storage hits did not happen, from live servers; see "
                                  "`doctor --help`")
    sub.add_parser("trace", help="write a seeded generated workload (chat, agent, rag, scan, mix, "
                                 "tenants) as a Mooncake-format trace; see `trace --help`")
    args = parser.parse_args(argv)
    if args.command == "config":
        if args.action == "check" and not (args.file or args.extra_config):
            parser.error("config check needs a FILE or --extra-config")
        if args.file and args.extra_config:
            parser.error("give FILE or --extra-config, not both")
        if args.tp_size < 1 or args.pp_size < 1 or not 0 <= args.tp_rank < args.tp_size:
            parser.error("need --tp-size >= 1, --pp-size >= 1 and 0 <= --tp-rank < --tp-size")
        return _config(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
