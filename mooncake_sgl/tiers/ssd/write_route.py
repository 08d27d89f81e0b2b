"""Which way the SSD tier's next write batch goes under ``direct_io: auto``: through the page cache
or with O_DIRECT. Policy only: ``page_io`` moves the bytes and reports each way's time here.

A buffered write is a memory copy while the kernel lets the writer run free, and is throttled to
the kernel's writeback speed once it does not. Where that starts cannot be read off the kernel's
thresholds: on the development VM (24 GiB, ``vm.dirty_background_ratio`` 10, ``vm.dirty_ratio``
20, so a free-run ceiling of 3.5 GiB by the kernel's own ``/proc/vmstat`` thresholds), sustained
8 MiB puts were throttled to 0.45 GB/s with 0.5-2.3 GiB dirty, while O_DIRECT wrote 0.6-1.9 GB/s
(``scripts/bench_tiers.py --modes backlog``). So the route is measured, not assumed:

- buffered while the page cache is below that ceiling (``DirtyRoom``) and the batches it takes
  run faster than O_DIRECT ones do: once both ways have a rate less than ``_RETRY_S`` old, the
  faster one. A busy CPU slows the page cache's memory copy, not the disk: on the 2-vCPU VM at
  load 4-5, one batch of 96 pages of 8 MiB went through the page cache at 1.2-2.5 GB/s and with
  O_DIRECT at 1.9-3.0 (``dd``: 1.6-2.3), with 0.24 s of CPU against 0.10;
- rates are of batches that went the same way one after another, judged once they add up to
  ``_JUDGED_BYTES`` (so a short put of small pages is never split to measure anything);
- a large batch times the ways it has no rate for (or only an old one) first: ``probes`` names
  them, ``PROBE_BYTES`` each, O_DIRECT first, and the rest of the batch goes the way ``buffered``
  then picks. A fresh tier's first batch thus learns both rates and writes the rest the faster
  way (before, it went through the page cache whole: on the VM at load 3, 96 pages of 8 MiB put at
  0.75-1.3x ``dd``, and 0.45-0.71x until they were on the disk). A probe is only its 32 MiB, not
  a whole batch: a whole 128 MiB batch O_DIRECT on a 300 MB/s disk took 0.43 s where the page
  cache took it as a memory copy (``bench_tiers.py --modes throttled``). The two ways are timed one
  after the other, never side by side: on one file they contend for its inode lock (ext4 holds it
  shared through each O_DIRECT write, a buffered write needs it alone), which on that disk slowed
  the page cache to the disk's pace;
- small batches go one way only: after the first buffered bytes that were judged, and again
  whenever the last O_DIRECT ones are ``_RETRY_S`` old, one goes O_DIRECT to learn the disk's rate
  (``probing``);
- a buffered batch that ran slower than the O_DIRECT ones, or at under half the fastest buffered
  batch seen, while the kernel held enough dirty bytes to be the cause, was throttled: from then on
  O_DIRECT, until the kernel has written back half of what was dirty then (O_DIRECT writes over
  dirty pages write them back first), or for ``_RETRY_S`` at most (the kernel writes back dirty
  pages only past its background threshold or once they are ``vm.dirty_expire_centisecs`` old, 30
  s by default, so the first alone could keep the tier off the page cache long after the burst; a
  retry that is throttled again costs one slow batch).

Thread context: one ``WriteRoute`` per tier, called by its one writer at a time (the tier's write
lock), so it holds no lock of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Rates are judged over consecutive batches that went the same way until they add up to this
# much: a few milliseconds of one small batch say more about the scheduler than the disk.
_JUDGED_BYTES = 32 << 20
# A buffered batch under this share of the fastest buffered one was throttled (the measured drop
# was 3-8x; a busy CPU moves a memory copy far less).
_THROTTLED_SHARE = 0.5
# Dirty bytes below which a slow buffered batch is not the kernel's throttling (it throttles only
# once writeback has work) but CPU contention; those batches change nothing.
_THROTTLE_MIN_DIRTY = 128 << 20
# Bytes of a batch written one way to learn its rate: one judged window.
PROBE_BYTES = _JUDGED_BYTES
# Weight of the newest judged window in a way's rate.
_WEIGHT = 0.5
# Seconds after a throttled batch before the page cache is tried again whatever is still dirty, and
# the age at which the disk's rate is measured again.
_RETRY_S = 30.0


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            name, _, rest = line.partition(b":")
            parts = rest.split()
            if parts:
                out[name.decode()] = int(parts[0]) * 1024
    return out


def _vm_setting(name: str) -> int:
    try:
        with open(f"/proc/sys/vm/{name}", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


class DirtyRoom:
    """The page cache's dirty bytes, and whether it takes ``nbytes`` more below the kernel's
    free-run ceiling: the midpoint of its background and foreground dirty thresholds (bytes
    settings, else ratios of the memory it can make dirty, which ``MemAvailable`` approximates).
    The thresholds are read once; the dirty and writeback totals per call (a read of
    ``/proc/meminfo``, tens of microseconds, once per batch)."""

    def __init__(self) -> None:
        self._bytes = (_vm_setting("dirty_background_bytes"), _vm_setting("dirty_bytes"))
        self._ratios = (_vm_setting("dirty_background_ratio") or 10, _vm_setting("dirty_ratio") or 20)

    def dirty(self) -> int | None:
        """Bytes dirty or under writeback, ``None`` where it cannot tell."""
        mem = self._read()
        return None if mem is None else _dirty_of(mem)

    def takes(self, nbytes: int) -> bool:
        """``False`` where it cannot tell."""
        mem = self._read()
        if mem is None:
            return False
        avail = mem.get("MemAvailable", 0)
        background, limit = (b or avail * r // 100 for b, r in zip(self._bytes, self._ratios))
        return _dirty_of(mem) + nbytes < (background + limit) // 2

    @staticmethod
    def _read() -> dict[str, int] | None:
        try:
            return _meminfo()
        except (OSError, ValueError):
            return None


def _dirty_of(mem: dict[str, int]) -> int:
    return mem.get("Dirty", 0) + mem.get("Writeback", 0)


class WriteRoute:
    """Buffered or O_DIRECT, per batch, from the page cache's room and the batches' measured rates."""

    def __init__(self, room: DirtyRoom | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._room = room or DirtyRoom()
        self._clock = clock
        self._fastest_buffered = 0.0  # bytes/s
        self._direct: float | None = None  # bytes/s, recent O_DIRECT batches
        self._direct_at = 0.0  # clock() of the last one timed
        self._buffered: float | None = None  # bytes/s, recent buffered batches
        self._buffered_at = 0.0
        self._buffered_timed = False
        self._resume_below: int | None = None  # dirty bytes; set while throttled
        self._retry_at = 0.0  # clock() when the page cache is tried again regardless
        self.throttled = 0  # times a buffered batch was found throttled (``stats``)
        self._window: tuple[bool, int, float] | None = None  # (buffered, bytes, seconds) not yet judged
        # Set by ``buffered``: it said O_DIRECT to learn the disk's rate.
        self.probing = False

    def buffered(self, nbytes: int) -> bool:
        """Whether a batch of ``nbytes`` goes through the page cache."""
        now = self._clock()
        self.probing = False
        if self._resume_below is not None:
            dirty = self._room.dirty()
            if (dirty is None or dirty >= self._resume_below) and now < self._retry_at:
                return False
            self._resume_below = None
        if self._buffered_timed and (self._direct is None or now - self._direct_at >= _RETRY_S):
            self.probing = True  # the disk's rate, to compare the page cache's with
            return False
        if not self._room.takes(nbytes):
            return False
        if (self._buffered is not None and now - self._buffered_at < _RETRY_S and
                self._direct is not None and now - self._direct_at < _RETRY_S):
            return self._buffered >= self._direct
        return True

    def probes(self, nbytes: int) -> list[bool]:
        """The ways (``True``: through the page cache) a large batch of ``nbytes`` times first,
        ``PROBE_BYTES`` each, before ``buffered`` picks the way of the rest: those with no rate or
        one ``_RETRY_S`` old, O_DIRECT first; the page cache only while it may take the batch."""
        now = self._clock()
        out = []
        if self._direct is None or now - self._direct_at >= _RETRY_S:
            out.append(False)
        if ((self._buffered is None or now - self._buffered_at >= _RETRY_S) and
                self._resume_below is None and self._room.takes(nbytes)):
            out.append(True)
        return out

    def wrote(self, buffered: bool, nbytes: int, seconds: float) -> None:
        """A batch of ``nbytes`` went the way ``buffered`` says, written in ``seconds``."""
        window = self._window
        if window is not None and window[0] == buffered:
            nbytes, seconds = window[1] + nbytes, window[2] + seconds
        if nbytes < _JUDGED_BYTES:
            self._window = (buffered, nbytes, seconds)
            return
        self._window = None
        if seconds > 0:
            self._judge(buffered, nbytes / seconds)

    def _judge(self, buffered: bool, rate: float) -> None:
        """A rate (bytes/s) of the way ``buffered`` says, over enough bytes to go by."""
        if not buffered:
            prev = self._direct
            self._direct = rate if prev is None else prev + _WEIGHT * (rate - prev)
            self._direct_at = self._clock()
            return
        prev = self._buffered
        self._buffered = rate if prev is None else prev + _WEIGHT * (rate - prev)
        self._buffered_at = self._clock()
        self._buffered_timed = True
        self._fastest_buffered = max(self._fastest_buffered, rate)
        slow = rate < self._fastest_buffered * _THROTTLED_SHARE or (
            self._direct is not None and rate < self._direct)
        if not slow:
            return
        dirty = self._room.dirty()
        if dirty is not None and dirty >= _THROTTLE_MIN_DIRTY:
            self._resume_below = dirty // 2
            self._retry_at = self._clock() + _RETRY_S
            self.throttled += 1
