"""What every benchmark script prints besides its table: progress lines on stderr, sizes as text."""

from __future__ import annotations

import sys


def log(msg: str) -> None:
    """A progress line on stderr, so stdout stays the table."""
    print(msg, file=sys.stderr, flush=True)


def human(n: int) -> str:
    """``1048576`` → ``1MiB``; sizes that are not whole KiB stay in bytes."""
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"
