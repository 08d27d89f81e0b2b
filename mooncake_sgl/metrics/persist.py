"""The store's counters, kept on disk in the LMDB tier's directory for ``mooncake-sgl stats --config``.

Why a file beside ``data.mdb`` and not a key inside it: a reader must not need an LMDB reader slot
of a live server (or the server's map size), a snapshot must never count against the tier's
capacity budget, and a damaged environment is moved aside together with its counters. The file is
small JSON, replaced atomically (temp file + ``os.replace``) every ``interval`` seconds and at close,
so a reader sees the last complete snapshot, at most ``interval`` seconds old while SGLang runs and
the final one after it stops.

Layout: ``<lmdb path>/<rank dir>/mooncake_sgl-counters.<rank>.json`` in the tier's own directory
(one per rank, see ``hicache.layout.rank_suffix``; the TP ranks of an MLA model share the writer's
directory, hence the rank in the file name)::

    {"version": 1, "written_at": <unix time>, "pid": 1234, "rank": "tp0_pp0_dp0_cp0", "stats": {...}}

where ``stats`` is ``TieredStore.stats().as_dict()``, read back by ``StoreReport.from_plain``.

Several processes on one directory and rank (two servers on one host with the default directory,
a restart that overlaps the old process's exit): the rank's file belongs to whichever holds the
``flock`` on ``mooncake_sgl-counters.<rank>.lock``; any other writes
``mooncake_sgl-counters.<rank>.<pid>.json``, shown as its own row, and takes the rank's file over
(deleting its own) once the owner is gone. Without this, each overwrote the other's file every few
seconds: ``stats`` showed one process at a time and its counters ran backwards. A process killed
mid-write leaves only a temp file, removed by the next writer of that rank once it is old.
"""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..store.stats import StoreReport
from .model import Snapshot, merge
from .source import snapshot_of

logger = logging.getLogger(__name__)

FILE_PREFIX = "mooncake_sgl-counters."
VERSION = 1
# Arbitrary: stale by at most this much while running; one small file write per interval.
DEFAULT_INTERVAL_S = 5.0
# A temp file this old is a killed writer's, never to be renamed (a write takes milliseconds).
_STALE_TMP_S = 60.0


class CounterFileError(ValueError):
    """A counter file that cannot be read; the message names the file and what is wrong."""


def counter_file_name(rank: str, pid: int | None = None) -> str:
    """The rank's file, or with ``pid`` the file of a process that does not own the rank's."""
    return f"{FILE_PREFIX}{rank}.json" if pid is None else f"{FILE_PREFIX}{rank}.{pid}.json"


def write_counter_file(directory: str, stats: StoreReport, rank: str, own: bool = True) -> str:
    """Write ``stats`` atomically into ``directory``, into the rank's file or (``own`` false) this
    process's; returns the file's path."""
    name = counter_file_name(rank, None if own else os.getpid())
    path = os.path.join(directory, name)
    body = json.dumps({"version": VERSION, "written_at": time.time(), "pid": os.getpid(),
                       "rank": rank, "stats": stats.as_dict()}, default=_plain)
    fd, tmp = tempfile.mkstemp(prefix=name, suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _plain(value: Any) -> Any:
    """JSON for what ``json`` does not know in ``StoreReport.as_dict()``: an observer's typed section
    (a dataclass, ``LoadGateStats``) as its fields, numbers of other types as floats."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return float(value)


def read_counter_file(path: str) -> Snapshot:
    """One rank's snapshot from its counter file.

    Raises:
        CounterFileError: unreadable, not JSON, or not a counter file of this version.
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise CounterFileError(f"{path}: cannot read counters: {e}") from e
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("stats"), dict):
        raise CounterFileError(f"{path}: not a mooncake_sgl counter file of version {VERSION}")
    rank = str(doc.get("rank", ""))
    if os.path.basename(path) != counter_file_name(rank):  # a second process on the same rank
        rank = f"{rank} pid {doc.get('pid', '?')}"
    return snapshot_of(StoreReport.from_plain(doc["stats"]), rank, float(doc.get("written_at", 0.0)))


def find_counter_files(lmdb_paths: Iterable[str]) -> list[str]:
    """Counter files in each LMDB tier path and its rank subdirectories, sorted."""
    found: list[str] = []
    for base in lmdb_paths:
        candidates = [base]
        if os.path.isdir(base):
            candidates += [os.path.join(base, d) for d in sorted(os.listdir(base))]
        for c in candidates:
            if os.path.isdir(c):
                found += [os.path.join(c, f) for f in sorted(os.listdir(c))
                          if f.startswith(FILE_PREFIX) and f.endswith(".json")]
    return found


def read_counters(lmdb_paths: Iterable[str]) -> Snapshot:
    """Every rank's snapshot found under ``lmdb_paths``, side by side. A file gone between the
    listing and its reading was its owner's cleanup (an extra process's file removed by the rank's
    next owner), not damage: it is left out."""
    snapshots = []
    for path in find_counter_files(lmdb_paths):
        try:
            snapshots.append(read_counter_file(path))
        except CounterFileError as e:
            if not isinstance(e.__cause__, FileNotFoundError):
                raise
    return merge(snapshots)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class CounterPersister:
    """Writes a store's counters into a directory every ``interval_s`` seconds and at ``close``.

    A failed write is logged (at most once per failure streak) and retried at the next interval:
    a full disk must not disturb serving.
    """

    def __init__(self, stats: Callable[[], StoreReport], directory: str, rank: str,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._stats = stats
        self.directory = directory
        self._rank = rank
        self._interval = interval_s
        self._stop = threading.Event()
        self._failing = False
        self._lock_fd = -1  # flock'ed while this process owns the rank's file
        self._thread = threading.Thread(target=self._run, daemon=True, name="mooncake-sgl-counters")

    def start(self) -> CounterPersister:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.write()

    def _own(self) -> bool:
        """Whether this process owns the rank's file, taking it over if its owner is gone."""
        if self._lock_fd >= 0:
            return True
        lock = os.path.join(self.directory, f"{FILE_PREFIX}{self._rank}.lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        self._sweep()
        return True

    def _sweep(self) -> None:
        """As the new owner: delete this process's own file (the rank's has its counters now),
        those of processes gone, and temp files of killed writers."""
        stem = glob.escape(os.path.join(self.directory, f"{FILE_PREFIX}{self._rank}."))
        for path in glob.glob(stem + "*.json") + glob.glob(stem + "*.tmp"):
            pid = os.path.basename(path)[len(FILE_PREFIX) + len(self._rank) + 1:].split(".")[0]
            try:
                if path.endswith(".tmp"):
                    gone = time.time() - os.path.getmtime(path) > _STALE_TMP_S
                else:
                    gone = pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid)))
                if gone:
                    os.unlink(path)
            except OSError:
                pass

    def write(self) -> bool:
        try:
            write_counter_file(self.directory, self._stats(), self._rank, own=self._own())
        except Exception as e:
            if not self._failing:
                logger.warning("mooncake_sgl: cannot write counters into %s: %s", self.directory, e)
            self._failing = True
            return False
        self._failing = False
        return True

    def close(self) -> None:
        """Stop the thread, then write the final snapshot; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.write()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
