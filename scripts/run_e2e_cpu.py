#!/usr/bin/env python3
"""CPU end-to-end: SGLang's real HiCacheController and host pool drive mooncake_sgl's tiers.

Prints, per round and per tier of our store, where prompt tokens came from, pages and bytes moved,
and the load time per request against recomputing the same tokens at a stated prefill rate.
Needs no GPU, no model and no network (token-id prompts, synthetic KV bytes checked on load).

Sizes (``--size``; any flag below overrides the preset):
  ci       2-layer pages (256 KiB), 3 short documents: seconds, for tests
  default  Llama-3-8B pages (8 MiB), 3 documents of 4k-8k tokens, 4 questions each: ~1 min, ~2.5 GiB
  large    Llama-3-8B pages, 4 documents of 8k-32k tokens, 6 questions each: minutes, ~5 GiB RAM +
           ~12 GiB disk

Example:
  python scripts/run_e2e_cpu.py --size default --json e2e.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.e2e import (  # noqa: E402
    DEFAULT_PREFILL_TOKENS_PER_S,
    E2EConfig,
    KvShape,
    WorkloadSpec,
    format_report,
    run_e2e,
)

PRESETS: dict[str, E2EConfig] = {
    "ci": E2EConfig(shape=KvShape(layers=2),
                    workload=WorkloadSpec(docs=3, min_doc_tokens=1024, max_doc_tokens=2048, questions=3),
                    host_pool_pages=40, host_tier="8MiB", lmdb_capacity="1GiB"),
    "default": E2EConfig(),  # 3 documents of 4k-8k tokens, 4 questions, 136-page host pool
    "large": E2EConfig(workload=WorkloadSpec(docs=4, min_doc_tokens=8192, max_doc_tokens=32768, questions=6),
                       host_pool_pages=520, host_tier="1GiB", lmdb_capacity="32GiB"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(PRESETS), default="default")
    p.add_argument("--layers", type=int, help="KV layers per page (32 = Llama-3-8B)")
    p.add_argument("--docs", type=int, help="number of shared documents")
    p.add_argument("--min-doc-tokens", type=int)
    p.add_argument("--max-doc-tokens", type=int)
    p.add_argument("--questions", type=int, help="questions per document (= rounds)")
    p.add_argument("--host-pool-pages", type=int, help="SGLang host (L2) pool, in pages")
    p.add_argument("--host-tier", help="our DRAM tier capacity, e.g. 512MiB; '' to leave it out")
    p.add_argument("--lmdb-capacity", help="our LMDB tier capacity, e.g. 16GiB")
    p.add_argument("--policy", choices=["lru", "heat", "adaptive"],
                   help="our store's placement policy (default adaptive, as with no config)")
    p.add_argument("--lmdb-sync", action="store_true", help="fsync every LMDB commit")
    p.add_argument("--work-dir", help="where the temporary LMDB directory goes (default: $TMPDIR)")
    p.add_argument("--prefill-tokens-per-s", type=float,
                   help="recompute rate to compare loads against (default "
                        f"{DEFAULT_PREFILL_TOKENS_PER_S:,.0f}, Llama-3-8B prefill on one H100)")
    p.add_argument("--json", metavar="PATH", help="also write the full report as JSON")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> E2EConfig:
    base = PRESETS[args.size]
    shape = base.shape if args.layers is None else dataclasses.replace(base.shape, layers=args.layers)
    wl = {k: v for k, v in (("docs", args.docs), ("min_doc_tokens", args.min_doc_tokens),
                            ("max_doc_tokens", args.max_doc_tokens), ("questions", args.questions))
          if v is not None}
    top = {k: v for k, v in (("host_pool_pages", args.host_pool_pages), ("host_tier", args.host_tier),
                             ("lmdb_capacity", args.lmdb_capacity), ("work_dir", args.work_dir),
                             ("prefill_tokens_per_s", args.prefill_tokens_per_s), ("policy", args.policy))
           if v is not None}
    if args.lmdb_sync:
        top["lmdb_sync"] = True
    return dataclasses.replace(base, shape=shape, workload=dataclasses.replace(base.workload, **wl), **top)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = config_from_args(args)
    total = config.workload.docs * config.workload.questions
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="requests", unit="req", file=sys.stderr)
    print(f"CPU end-to-end ({args.size}): building SGLang pools and controller, then {total} requests; "
          "no GPU is used or needed.", file=sys.stderr, flush=True)

    def on_request(row: dict) -> None:
        if bar is not None:
            bar.set_postfix(rid=row["rid"], storage_tok=row["storage_tokens"])
            bar.update(1)

    try:
        report = run_e2e(config, on_request=on_request)
    finally:
        if bar is not None:
            bar.close()
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"report written to {args.json}", file=sys.stderr)
    failed = report["verify_failures"] or report["backup_failures"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
