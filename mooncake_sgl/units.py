"""Sizes and durations as configs and environment variables write them: ``64GiB``, ``250ms``."""

from __future__ import annotations

import math
import re

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0}
# Upper bounds, so an absurd value is a config error naming its key instead of an OverflowError
# deep inside mmap, LMDB or a socket call. Both far beyond any real setting (64 PiB, 30 days).
MAX_SIZE = 1 << 56
MAX_DURATION = 30 * 86400.0


def parse_size(value: int | str) -> int:
    """``64GiB`` → 68719476736. Raises ``ValueError`` naming the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 64GiB or a byte count, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        m = _SIZE_RE.match(str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"expected a size like 64GiB, 512MiB, 10GB or a byte count, got {value!r}")
        scaled = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if not math.isfinite(scaled):  # hundreds of digits: int() of it would be an OverflowError
            raise ValueError(f"size {value!r} is larger than any machine (at most {MAX_SIZE} bytes)")
        size = int(scaled)
    if size < 0:
        raise ValueError(f"size must not be negative, got {value!r}")
    if size > MAX_SIZE:
        raise ValueError(f"size {value!r} is larger than any machine (at most {MAX_SIZE} bytes)")
    return size


def parse_duration(value: float | int | str) -> float:
    """``250ms`` → 0.25 (seconds)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 5s or 250ms, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _SIZE_RE.match(str(value))
        if not m or m.group(2).lower() not in _DURATION_UNITS:
            raise ValueError(f"expected a duration like 5s, 250ms or 2m, got {value!r}")
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
    if not seconds >= 0:  # also NaN
        raise ValueError(f"duration must not be negative, got {value!r}")
    if seconds > MAX_DURATION:
        raise ValueError(f"duration {value!r} is longer than 30 days")
    return seconds
