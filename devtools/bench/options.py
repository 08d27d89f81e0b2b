"""Command-line options that several live-server benchmark scripts share, each script keeping its
own defaults and help, and what those options mean once parsed: the model, the order of passes,
the progress bar and the ``--json`` file."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..tiny_model import TinyLlama, write_tiny_llama


def add_passes(p: argparse.ArgumentParser, order: str) -> None:
    """``--passes``; ``order`` shows one pass of the script's variants in its help."""
    p.add_argument("--passes", type=int, default=1,
                   help=f"each pass runs every variant forward then backward ({order})")


def schedule(variants: list[str], passes: int, base_seed: int = 0) -> list[tuple[int, str, int]]:
    """(pass, variant, seed) of every run: A B C C B A per pass; the forward half of pass p runs on
    seed base+2p, the backward half on base+2p+1, so variants of one half share their prompts and no
    variant ever meets the same prompts twice."""
    out = []
    for p in range(passes):
        out += [(p, v, base_seed + 2 * p) for v in variants]
        out += [(p, v, base_seed + 2 * p + 1) for v in reversed(variants)]
    return out


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The model every server loads and its device KV budget (SGLang's ``--max-total-tokens``)."""
    p.add_argument("--model-path", help="default: a tiny random Llama written for the run")
    p.add_argument("--max-total-tokens", type=int, default=16384)


def model_path(args: argparse.Namespace, workdir: Path) -> Path:
    """``--model-path``, else a tiny random Llama written under ``workdir``."""
    return Path(args.model_path) if args.model_path else write_tiny_llama(workdir / "model", TinyLlama())


def add_host_reserve(p: argparse.ArgumentParser) -> None:
    # SGLang keeps 10 GiB back when it sizes a host pool: several servers on one machine leave
    # nothing past that, so the benches pass a smaller reserve.
    p.add_argument("--host-reserve", default="512MiB",
                   help="host memory SGLang leaves aside when it sizes each HiCache host pool (CPU hosts)")


def add_run_options(p: argparse.ArgumentParser, *, workdir: str, json_help: str,
                    plot_default: str | None = None, plot_help: str | None = None) -> None:
    """How long a server may take to come up, where the run keeps its files, and what it writes:
    ``--health-timeout``, ``--workdir``, ``--json``, ``--plot``, ``--no-progress``."""
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--workdir", default=workdir)
    p.add_argument("--json", help=json_help)
    p.add_argument("--plot", default=plot_default, help=plot_help)
    p.add_argument("--no-progress", action="store_true")


@contextmanager
def progress(args: argparse.Namespace, total: int, desc: str) -> Iterator[Any]:
    """A bar of requests on stderr (stdout stays the table), closed on the way out; ``None`` with
    ``--no-progress``."""
    if args.no_progress:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="req", file=sys.stderr)
    try:
        yield bar
    finally:
        bar.close()


def write_json(args: argparse.Namespace, **body: Any) -> None:
    """``{"args": ..., **body}`` to ``--json``, if given; values JSON has no type for as text."""
    if not args.json:
        return
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(args), **body}, indent=2, default=str))
