"""``python -m devtools.bench COMMAND [ARGS]``: the live-server benchmarks against SGLang.

  long-context    shared long documents, many questions each (what scripts/compare_long_context.sh runs)
  multiturn       growing conversations, caches flushed between turns
  two-instances   two servers, requests alternating: one shared pool vs isolated tiers

Each runs on any host: with ``--launch`` (long-context, multiturn) or always (two-instances) it
starts its own servers, on a host without a GPU CPU servers with a tiny random-weight Llama.
``python -m devtools.bench COMMAND --help`` lists a command's options. Examples::

  python -m devtools.bench long-context --launch --tiers configs/full-stack.yaml --docs 4
  python -m devtools.bench long-context --url http://127.0.0.1:30000   # a server already running
  python -m devtools.bench multiturn --launch --conversations 8 --turns 4
  python -m devtools.bench two-instances --scenario shared --json two.json
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from . import two_instances
from .runner import long_context_main, multiturn_main

COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "long-context": long_context_main,
    "multiturn": multiturn_main,
    "two-instances": two_instances.main,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    sys.argv[0] = f"python -m devtools.bench {argv[0]}"  # argparse names the command in its usage
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
