"""Which runs a regime benchmark makes, in which order, on which prompts.

Per regime and shape, each pass runs the backends forward then backward (A B C C B A), so that
the machine's load, which drifts over minutes, falls on each backend alike. The forward half of
pass ``p`` uses seed ``base + 2p``, the backward half ``base + 2p + 1``: the backends of one half
answer identical prompts (their greedy outputs are compared), and no run meets prompts an earlier
run stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

REGIMES = ("pressure", "restart", "instances", "slow")
SHAPES = ("chat", "doc")
BACKENDS = ("ours", "builtin", "lifeboat", "ours-dram", "builtin-dram", "recompute")


@dataclass(frozen=True)
class Cell:
    """One run: a fresh server (two for ``instances``) of ``backend`` with empty storage."""
    regime: str
    shape: str
    backend: str
    pass_index: int
    seed: int


def interleave(items: Sequence[str]) -> list[str]:
    """``A B C`` -> ``A B C C B A``."""
    return [*items, *reversed(items)]


def backends_in(regime: str, backends: Sequence[str]) -> list[str]:
    """``ours-dram`` is ours with DRAM for everything, which is what ``instances`` gives every
    backend already, and ``builtin-dram`` the built-in without offload, which is what it runs there:
    there each would repeat another."""
    return [b for b in backends if not (regime == "instances" and b in ("ours-dram", "builtin-dram"))]


def schedule(regimes: Sequence[str], shapes: Sequence[str], backends: Sequence[str], passes: int,
             base_seed: int) -> list[Cell]:
    out = []
    for regime in regimes:
        mine = backends_in(regime, backends)
        for shape in shapes:
            for p in range(passes):
                half = len(mine)
                for i, backend in enumerate(interleave(mine)):
                    out.append(Cell(regime, shape, backend, p, base_seed + 2 * p + (i >= half)))
    return out
