"""Who reads which run of a batch of the SSD tier's page reads (``page_io``), and through which
descriptor.

- ``Stretches``: buffered readers each take a contiguous stretch of the batch in file order: the
  kernel keeps readahead state per open file, so each reader is one sequential stream it can follow.
- ``InOrder``: O_DIRECT readers take the runs in file order between them.
- ``ReadDescriptors``: a descriptor of its own per buffered reader, kept for the next batch.

Thread context: one of each per batch (``ReadDescriptors``: per tier), shared by its readers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Stretches:
    """Which task each of a gang's readers takes next: worker ``w`` owns the ``w``-th contiguous
    stretch of ``0..ntasks-1`` and takes it front to back; once it is done, it takes the last task
    of the stretch with the most left (the owner keeps its sequential front)."""

    def __init__(self, ntasks: int, workers: int) -> None:
        bounds = [ntasks * w // workers for w in range(workers + 1)]
        self._left = [[bounds[w], bounds[w + 1]] for w in range(workers)]
        self._lock = threading.Lock()

    def next(self, worker: int) -> int | None:
        with self._lock:
            own = self._left[worker]
            if own[0] < own[1]:
                own[0] += 1
                return own[0] - 1
            other = max(self._left, key=lambda span: span[1] - span[0])
            if other[0] >= other[1]:
                return None
            other[1] -= 1
            return other[1]


class InOrder:
    """The next task in file order to whichever reader asks. O_DIRECT readers have no readahead of
    their own to keep sequential, so they make one sequential stream together, the pattern a device
    that reads ahead itself (a VM's disk image on its host) serves best."""

    def __init__(self, ntasks: int) -> None:
        self._tasks = iter(range(ntasks))
        self._lock = threading.Lock()

    def next(self, worker: int) -> int | None:
        with self._lock:
            return next(self._tasks, None)


class ReadDescriptors:
    """Read-only descriptors of the file, one per reader at a time, opened as needed and kept: the
    kernel's readahead state belongs to an open file, and readers at different offsets sharing one
    thrash it. Where no descriptor can be opened (out of descriptors), the shared one serves."""

    def __init__(self, path: str, shared_fd: int) -> None:
        self._path = path
        self._shared = shared_fd
        self._free: list[int] = []
        self._opened: list[int] = []
        self._lock = threading.Lock()

    @contextmanager
    def one(self) -> Iterator[int]:
        with self._lock:
            fd = self._free.pop() if self._free else -1
        if fd < 0:
            try:
                fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                yield self._shared
                return
            with self._lock:
                self._opened.append(fd)
        try:
            yield fd
        finally:
            with self._lock:
                self._free.append(fd)

    def close(self) -> None:
        with self._lock:
            for fd in self._opened:
                os.close(fd)
            self._opened.clear()
            self._free.clear()
