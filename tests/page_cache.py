"""Making the kernel let go of a file's cached pages, for tests of reads that must meet the disk."""

from __future__ import annotations

import os
from pathlib import Path

# The kernel drops only whole folios, and a file's may be as large as this.
FOLIO_MAX = 2 << 20


def drop_from(path: Path, offset: int = 0) -> None:
    """The page cache lets go of ``path`` from ``offset`` (on ``FOLIO_MAX``) on, written back first."""
    assert offset % FOLIO_MAX == 0, "the kernel keeps a folio that straddles the offset"
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, offset, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
