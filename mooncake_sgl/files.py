"""Reading a file a user names by path: only a regular file, and only up to a stated size.

A path may name anything. ``/dev/zero`` never ends (an unbounded read fills memory), a FIFO blocks
its reader until a writer comes (for good, if none does), ``/dev/stdin`` is whatever the process was
started with, and a directory or socket cannot be read at all. A scheduler reading its config at
attach must get a clear error naming the path instead, at once: the path is checked before it is
opened (so no device is ever opened), opened without blocking, checked again on the descriptor
(the path may have been swapped in between) and read for at most ``limit + 1`` bytes (a regular
file may still grow, and a /proc file's size says 0).
"""

from __future__ import annotations

import os
import stat

from .errors import ConfigError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)


def _check(st: os.stat_result, source: str, what: str, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "something else")
        raise ConfigError(f"cannot read {what}: it is {kind}, not a regular file", source=source)
    if st.st_size > limit:
        raise ConfigError(f"cannot read {what}: it holds {st.st_size} bytes, over the limit of "
                          f"{limit} bytes", source=source)


def read_regular_file(path: str | os.PathLike[str], *, limit: int, what: str) -> bytes:
    """The bytes of the regular file at ``path`` (symbolic links followed), at most ``limit``.

    ``what`` names the file in errors ("config file"). Raises ``ConfigError`` naming ``path`` (its
    ``source``) for a path that cannot be opened, names no regular file (a device, a FIFO, a
    directory, a socket) or a file of more than ``limit`` bytes; it never blocks on the path.
    """
    source = os.fspath(path)
    if "\0" in source:  # os.stat would raise ValueError, not naming the path
        raise ConfigError(f"cannot read {what}: the path holds a NUL character", source=repr(source))
    try:
        _check(os.stat(source), source, what, limit)
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            _check(os.fstat(fd), source, what, limit)
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror}", source=source) from None
    if len(data) > limit:
        # It grew after the fstat, or its size says nothing (a /proc or sysfs file says 0).
        raise ConfigError(f"cannot read {what}: it holds more than the limit of {limit} bytes",
                          source=source)
    return data
