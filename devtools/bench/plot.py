"""The ``--plot`` PNG of the live-server benchmarks that compare runs: panels side by side, each a
group of bars per run."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# One bar: its legend label and a value per run.
Series = tuple[str, list[float]]


@dataclass(frozen=True)
class Panel:
    ylabel: str
    # The bars of a run, side by side; each slot a stack of series drawn bottom up. An empty slot
    # keeps its place, so the bars do not move when a run has nothing to stack there.
    slots: list[list[Series]]
    legend_size: float | None = None  # matplotlib's default when None


def bar_panels(path: str | Path, title: str, labels: list[str], panels: list[Panel], *,
               figsize: tuple[float, float], label_size: float, title_size: float | None = None) -> None:
    """Write the panels to ``path`` as a PNG, one tick per run labelled with ``labels``, and say so
    on stderr."""
    import matplotlib

    matplotlib.use("Agg")  # no display: benchmarks run on headless hosts
    import matplotlib.pyplot as plt

    x = list(range(len(labels)))
    fig, axes = plt.subplots(1, len(panels), figsize=figsize)
    for ax, panel in zip(axes, panels):
        width = 0.8 / len(panel.slots)
        for k, stack in enumerate(panel.slots):
            offset = (k - (len(panel.slots) - 1) / 2) * width
            bottom = [0.0] * len(x)
            for label, values in stack:
                ax.bar([i + offset for i in x], values, width, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_ylabel(panel.ylabel)
        ax.set_xticks(x, labels, fontsize=label_size)
        ax.legend(fontsize=panel.legend_size)
    # suptitle's size is the figure title's only when none is passed (None means the body text's).
    fig.suptitle(title, **({} if title_size is None else {"fontsize": title_size}))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}", file=sys.stderr)
