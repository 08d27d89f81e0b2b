"""The SSD tier's LMDB maps kept in memory, so a failing disk under the index is an error, not SIGBUS.

LMDB reads its B-tree through a shared memory map of ``data.mdb`` and keeps its reader table in a
map of ``lock.mdb``. A page of either that the kernel paged out is read back from the disk at the
moment LMDB touches it; when the disk answers with an I/O error (a dying SSD, a detached volume, a
device shrunk under the file system), or the file was truncated under the map, that read is SIGBUS
and the process dies. In SGLang that process is the scheduler. Page bytes already fail cleanly
(``preadv`` returns the error), the index did not.

What this does instead, before every use of the environment (``LmdbTier._lmdb_errors``):

- Every page of ``lock.mdb`` and of ``data.mdb`` up to LMDB's last used page is faulted in with
  ``MADV_POPULATE_READ``, which *returns* the error where a touch would be SIGBUS, and locked with
  ``mlock2(MLOCK_ONFAULT)``, so it is never paged out and never read from the disk again. Only
  the growth since the last call is populated (measured: populating a resident 37 MB index again
  costs 1.1 ms; the check that nothing grew, ~2 us).
- A ``data.mdb`` shorter than what is locked was truncated under the map: refused before LMDB
  reads past its end.

The cost is the index's own size in locked memory (100-250 bytes per stored page: about 0.1-0.25
GiB per million pages); the pages it locks were in the page cache anyway whenever the tier was
busy. Where the process may not lock that much (``RLIMIT_MEMLOCK`` without ``CAP_IPC_LOCK``: 8 MiB
for most users, 64 KiB in some containers), one warning says so and how to allow it, and every
call reads the whole index in first instead (about 30 us per MiB of index: memory pressure may
have paged it out since the last call). What remains then is a page paged out in the microseconds
between that and LMDB's read. Kernels before 5.14 have no
``MADV_POPULATE_READ``: one warning, and the maps are left to LMDB as before.

Thread context: ``guard`` is called from any thread; growth is populated under one lock.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import resource
import threading

import lmdb

logger = logging.getLogger(__name__)

_MADV_POPULATE_READ = 22  # Linux 5.14
_MLOCK_ONFAULT = 1
_NOT_ALLOWED = (errno.EPERM, errno.ENOMEM, errno.EAGAIN)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_mlock2 = getattr(_libc, "mlock2", None)  # glibc 2.27
if _mlock2 is not None:
    _mlock2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _mlock2.restype = ctypes.c_int


class IndexUnreadable(OSError):
    """The disk failed a read of the index's map (populating it returned the error)."""


def _populate(addr: int, length: int) -> None:
    if length and _libc.madvise(addr, length, _MADV_POPULATE_READ) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _lock(addr: int, length: int) -> None:
    if _mlock2 is None:
        raise OSError(errno.ENOSYS, "mlock2 is not available")
    if length and _mlock2(addr, length, _MLOCK_ONFAULT) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _mapping_of(fd: int) -> tuple[int, int] | None:
    """``(address, length)`` of this process's map of the file open as ``fd``, if there is one.
    A locked part of a map is listed apart from the rest: adjacent entries are one map."""
    st = os.fstat(fd)
    start = end = 0
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 5 or fields[4] != str(st.st_ino):
                    continue
                major, minor = (int(x, 16) for x in fields[3].split(":"))
                if os.makedev(major, minor) != st.st_dev:
                    continue
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if end and lo != end:
                    break  # another map of the same file; LMDB keeps one
                start, end = start or lo, hi
    except OSError:
        return None
    return (start, end - start) if end else None


class ResidentIndex:
    """Keeps ``env``'s maps populated and locked; see the module docstring.

    ``index_fd`` and ``lock_fd`` are descriptors of ``data.mdb`` and ``lock.mdb`` that the tier
    holds open as long as the environment (this class never closes them).
    """

    def __init__(self, env: lmdb.Environment, index_fd: int, lock_fd: int, where: str) -> None:
        self._env = env
        self._index_fd = index_fd
        self._where = where
        self._psize = env.stat()["psize"]
        self._grow = threading.Lock()
        self._addr = 0
        self._covered = 0  # bytes of data.mdb's map populated (and locked, if allowed) from its start
        self._locking = _mlock2 is not None
        self._failing = False
        self._supported = True
        self.locked_bytes = 0
        self._lock_map = _mapping_of(lock_fd)  # LMDB's reader table, written on every begin
        if self._lock_map is not None:
            self._cover(*self._lock_map)

    def guard(self) -> None:
        """Make every page LMDB may read now resident; raise ``OSError`` where that fails. The
        first failure is logged, and so is the first success after it."""
        if not self._supported:
            return
        try:
            self._make_resident()
        except IndexUnreadable as e:
            if not self._failing:
                self._failing = True
                logger.error("SSD tier at %s: %s; every call of the tier is a miss until it reads "
                             "again", self._where, e.strerror)
            raise
        if self._failing:
            self._failing = False
            logger.warning("SSD tier at %s: its index reads again", self._where)

    def _make_resident(self) -> None:
        end = (self._env.info()["last_pgno"] + 1) * self._psize
        if end <= self._covered:
            self._check_size(self._covered)
            if not self._locking:  # pages may have been paged out since: read them in again
                if self._lock_map is not None:
                    self._read_in(*self._lock_map)
                self._read_in(self._addr, self._covered)
            return
        with self._grow:
            self._check_size(max(end, self._covered))
            # Where the map lies is looked up on growth only (py-lmdb does not say; about 0.1 ms):
            # LMDB maps the file again when another process set a larger map size.
            found = _mapping_of(self._index_fd)
            if found is None:
                return
            if found[0] != self._addr:  # the old map, and its locks, are gone
                self.locked_bytes -= min(self._covered, self.locked_bytes)
                self._addr, self._covered = found[0], 0
            end = min(end, found[1])
            if end > self._covered:
                self._cover(self._addr + self._covered, end - self._covered)
                self._covered = end

    def _check_size(self, used: int) -> None:
        """A ``data.mdb`` shorter than the pages LMDB uses was truncated under the map by something
        outside this process: LMDB's next read past its end would be SIGBUS."""
        size = os.fstat(self._index_fd).st_size
        if size < used:
            raise IndexUnreadable(errno.EIO, f"data.mdb was truncated to {size} bytes under the "
                                             f"tier (it uses {used}); delete the directory and "
                                             "restart to start it empty")

    def _cover(self, addr: int, length: int) -> None:
        if self._locking:
            try:
                _lock(addr, length)
                self.locked_bytes += length
            except OSError as e:
                self._locking = False
                if e.errno not in _NOT_ALLOWED and e.errno != errno.ENOSYS:
                    raise
                soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
                logger.warning(
                    "SSD tier at %s: cannot lock its index in memory (%s; RLIMIT_MEMLOCK %s, %d "
                    "bytes locked so far). Every call of the tier now reads the whole index in "
                    "first (about 30 us per MiB of index), so that a failing disk is an error and "
                    "not SIGBUS inside LMDB. Allow locking with a higher memlock limit (ulimit -l "
                    "unlimited; docker run --ulimit memlock=-1) or CAP_IPC_LOCK.", self._where,
                    e.strerror,
                    "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes",
                    self.locked_bytes)
        self._read_in(addr, length)

    def _read_in(self, addr: int, length: int) -> None:
        try:
            _populate(addr, length)
        except OSError as e:
            if e.errno == errno.EINVAL:  # no MADV_POPULATE_READ before Linux 5.14
                self._supported = False
                logger.warning("SSD tier at %s: this kernel cannot read the index in ahead "
                               "(MADV_POPULATE_READ needs Linux 5.14); a disk failing under it can "
                               "stop this process with SIGBUS inside LMDB", self._where)
                return
            # EFAULT: where a touch of the page would have been SIGBUS (an I/O error, or no file)
            why = "an I/O error" if e.errno in (errno.EFAULT, errno.EIO) else e.strerror
            raise IndexUnreadable(e.errno, f"the disk failed reading the tier's index ({why})"
                                  ) from None
