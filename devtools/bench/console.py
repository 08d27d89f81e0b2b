"""What every benchmark script shares besides its table: progress lines on stderr, sizes as text,
comma-list options, and the entry point that stops its servers on SIGTERM as on Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn


def comma_choices(parser: argparse.ArgumentParser, flag: str, text: str, allowed: tuple[str, ...]
                  ) -> list[str]:
    """``a,b`` given to ``flag``, each one of ``allowed``; a usage error (exit 2) otherwise."""
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    if not chosen or set(chosen) - set(allowed):
        parser.error(f"{flag}: expected some of {', '.join(allowed)}, got {text!r}")
    return chosen


def log(msg: str) -> None:
    """A progress line on stderr, so stdout stays the table."""
    print(msg, file=sys.stderr, flush=True)


def stamped(msg: str) -> None:
    """``log`` with the time of day: long live runs say when each step happened."""
    log(f"[{time.strftime('%H:%M:%S')}] {msg}")


def _interrupt(*_: object) -> NoReturn:
    raise KeyboardInterrupt


def run_script(main: Callable[[], int]) -> NoReturn:
    """Exit with ``main()``'s status. SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C does, so the
    script's own clean-up (servers stopped, a cluster torn down) runs on the way out; then 130."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)


def human(n: int) -> str:
    """``1048576`` → ``1MiB``; sizes that are not whole KiB stay in bytes."""
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"
