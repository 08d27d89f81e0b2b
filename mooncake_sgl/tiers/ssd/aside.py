"""Damaged SSD tier directories, moved aside: kept for a post-mortem, never left to fill the disk.

A damaged directory is renamed to ``<path>.damaged-<time>-<ns>-<pid>``, unique however close two
damage events fall, and its page file is deleted at once: the index (small) and ``DAMAGED.txt``
say what was lost and why, while the page bytes (the whole preallocated ``pages.bin``) would keep
the disk the fresh tier needs. Of the damaged directories beside ``path`` at most ``KEEP`` stay,
holding at most ``KEEP_BYTES`` together; the oldest go first, the newest always stays. Directories
moved aside by older versions lose their page files the same way.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from ...errors import TierError
from .probe import fix_for, open_failed, write_refusal

logger = logging.getLogger(__name__)

PAGE_FILE = "pages.bin"
KEEP = 3  # arbitrary: enough to compare a few damage events
KEEP_BYTES = 256 << 20  # arbitrary: indexes only, so a few million pages' worth


def set_aside(path: str, reason: str) -> None:
    """Move the damaged directory ``path`` aside (``move_aside``), say so, and create ``path``
    again, empty.

    Raises:
        TierError: it could not be moved (naming a read-only file system as such) or recreated.
    """
    aside = aside_name(path)
    try:
        move_aside(path, aside, reason)
    except OSError as e:
        refused = write_refusal(e)
        if refused is not None:
            raise TierError(f"LMDB tier at {path} is damaged ({reason}) and {refused}, so it cannot "
                            f"be moved aside: {fix_for(refused)} (the tier then moves it aside itself), "
                            "or point the tier's path at another disk.") from None
        raise TierError(f"LMDB tier at {path} is damaged ({reason}) and cannot be moved aside: "
                        f"{e}. Delete the directory; its pages will be recomputed.") from None
    logger.error("LMDB tier at %s is damaged (%s); moved it to %s (its page file deleted) and "
                 "starting empty", path, reason, aside)
    try:
        os.makedirs(path)
    except OSError as e:
        raise open_failed(path, e) from None


def aside_name(path: str) -> str:
    """Where ``path`` goes when damaged: named by the time (to the nanosecond) and the process."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{path}.damaged-{stamp}-{time.time_ns() % 1_000_000_000:09d}-{os.getpid()}"


def move_aside(path: str, aside: str, reason: str) -> None:
    """Rename ``path`` to ``aside``, release its page file and prune older damaged directories;
    the caller creates ``path`` again.

    Raises:
        OSError: from the rename; nothing was moved.
    """
    os.rename(path, aside)
    try:
        with open(os.path.join(aside, "DAMAGED.txt"), "w") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S %z')}: moved aside from {path}: {reason}\n")
    except OSError:
        pass  # a note for people; the move itself is done
    prune(path)


def damaged_dirs(path: str) -> list[str]:
    """The directories moved aside from ``path``, oldest first (their names start with the time)."""
    parent, base = os.path.split(os.path.abspath(path))
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return [os.path.join(parent, n) for n in sorted(names) if n.startswith(f"{base}.damaged-")
            and os.path.isdir(os.path.join(parent, n))]


def prune(path: str, keep: int = KEEP, keep_bytes: int = KEEP_BYTES) -> list[str]:
    """Release the page files of ``path``'s damaged directories and delete the oldest until at
    most ``keep`` remain in at most ``keep_bytes``; never the newest. Returns what was deleted.
    Never raises: a directory it cannot delete is logged and left."""
    dirs = damaged_dirs(path)
    for d in dirs:
        _release_pages(d)
    sizes = [disk_bytes(d) for d in dirs]
    gone = []
    while len(dirs) > 1 and (len(dirs) > keep or sum(sizes) > keep_bytes):
        d, _ = dirs.pop(0), sizes.pop(0)
        try:
            shutil.rmtree(d)
            gone.append(d)
        except OSError as e:
            logger.warning("could not delete the damaged SSD tier directory %s: %s", d, e)
    return gone


def _release_pages(d: str) -> None:
    try:
        os.unlink(os.path.join(d, PAGE_FILE))
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("could not delete the page file of the damaged SSD tier directory %s: %s", d, e)


def disk_bytes(d: str | os.PathLike[str]) -> int:
    """Bytes of disk blocks held under ``d`` (a sparse ``data.mdb`` of a large map holds only what it
    wrote); files that vanish meanwhile count nothing."""
    total = 0
    for root, _, files in os.walk(d):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total
