"""The SSD tier on a disk throttled on purpose, for ``scripts/bench_tiers.py --modes throttled``.

The development VM's disk swings between slow and fast phases, so a comparison made in one phase
says little about the other. Here the slow phase is made: a sparse file under the scratch
directory becomes a loop device (``losetup --direct-io=on``, so the loop's I/O reaches the real
disk without a second page cache), gets a fresh ext4, is mounted, and each rate of
``--throttle-mbps`` is imposed on it with cgroup v1 ``blkio.throttle.{read,write}_bps_device``
before the user-view comparison (``user_view``: ours vs ``HiCacheFile`` vs raw ``O_DIRECT``,
puts and cold gets in fresh processes, rounds A B B A) runs on it. Rate 0 is the loop device
unthrottled: the same file system and path, at the real disk's speed.

What throttles writes: the limit is set in the *root* blkio cgroup, on the loop device only.
cgroup v1 charges buffered writeback to the flusher threads, not to the process that dirtied the
pages, so a limit in a child cgroup that the measured processes join throttles their reads and
O_DIRECT writes but lets their buffered writes reach the disk at full speed (measured: ``dd``
buffered + ``fdatasync`` ran 135 MB/s under a 200 MB/s root limit, as a slow disk's writeback
would). The loop device is this run's alone, so the root limit touches no other process's I/O.

The loop device's ``read_ahead_kb`` is set to that of the disk holding the image (a loop device
starts at 128 KiB; the VM's disk has 8192), so the kernel's readahead behaves as on the real disk.

Needs root, ``losetup``, ``mkfs.ext4`` and the blkio controller; ``unavailable`` says what is
missing. Everything is undone on the way out (the limit, the mount, the loop device, the image),
on an error or Ctrl-C too.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..console import log
from . import user_view as uv

BLKIO = Path("/sys/fs/cgroup/blkio")
_OPS = (("put", "put"), ("put_synced", "put+sync"), ("get", "cold get"))


def unavailable() -> str | None:
    """Why this machine cannot run the mode, or ``None``."""
    if os.geteuid() != 0:
        return "needs root (a loop device, a mount and a blkio limit)"
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"needs {tool} on PATH"
    if not (BLKIO / "blkio.throttle.read_bps_device").exists():
        return f"needs the cgroup v1 blkio controller with throttling at {BLKIO}"
    if not Path("/dev/loop-control").exists():
        return "needs loop devices (/dev/loop-control is missing)"
    return None


def _run(*cmd: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def _readahead_of(path: Path) -> Path | None:
    """``read_ahead_kb`` of the block device holding ``path`` (a partition's is its disk's)."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for cand in (node / "queue/read_ahead_kb", node / "../queue/read_ahead_kb"):
        if cand.exists():
            return cand
    return None


class Disk:
    """A mounted loop device whose read and write rates can be limited."""

    def __init__(self, loop: str, mount: Path) -> None:
        self.loop = loop
        self.mount = mount
        st = os.stat(loop)
        self.dev = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"

    def limit(self, mbps: int) -> None:
        """Both directions at ``mbps`` MB/s (10^6 bytes); 0 removes the limit."""
        for f in ("blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"):
            (BLKIO / f).write_text(f"{self.dev} {mbps * 1_000_000}\n")


@contextmanager
def loop_disk(workdir: Path, nbytes: int) -> Iterator[Disk]:
    """A fresh ext4 of ``nbytes`` on a loop device over a sparse file in ``workdir``, mounted;
    torn down on the way out, whatever happened."""
    image, mount = workdir / "throttled.img", workdir / "throttled"
    with open(image, "wb") as f:
        f.truncate(nbytes)
    undo: list[tuple[str, ...]] = []
    disk = None
    try:
        loop = _run("losetup", "--find", "--show", "--direct-io=on", str(image))
        undo.append(("losetup", "-d", loop))
        # Inode tables and journal written now, not by a kernel thread during the measurement.
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop)
        mount.mkdir()
        _run("mount", loop, str(mount))
        undo.append(("umount", str(mount)))
        disk = Disk(loop, mount)
        ra = _readahead_of(workdir)
        if ra is not None:
            Path(f"/sys/block/{Path(loop).name}/queue/read_ahead_kb").write_text(ra.read_text())
        yield disk
    finally:
        if disk is not None:
            disk.limit(0)
        for cmd in reversed(undo):
            try:
                _run(*cmd)
            except RuntimeError as e:
                log(f"bench: clean-up: {e}")
        shutil.rmtree(mount, ignore_errors=True)
        image.unlink(missing_ok=True)


def throttled(script: str, sizes: list[tuple[int, int]], rounds: int, batch: int, rates: list[int],
              workdir: Path, hicache_file: bool) -> dict:
    """The user-view comparison at each rate of ``rates`` (MB/s, 0: unthrottled), one after the
    other on one loop device. The disk under the image may drift between rates, so the figures to
    compare are the ratios within a rate's run, where the backends ran next to each other."""
    # Room for one backend's pages at a time (each round's directory is removed after it), its
    # index and the file system's own, with slack.
    need = max(size * n for size, n in sizes) * 2 + (1 << 30)
    out: dict = {"rates_mbps": rates, "runs": {}}
    with loop_disk(workdir, need) as disk:
        out["loop"], out["read_ahead_kb"] = disk.loop, int(
            Path(f"/sys/block/{Path(disk.loop).name}/queue/read_ahead_kb").read_text())
        for mbps in rates:
            disk.limit(mbps)
            tag = f"throttled {mbps} MB/s" if mbps else "loop unthrottled"
            log(f"[{tag}] on {disk.loop} ({disk.dev}) mounted at {disk.mount}")
            out["runs"][str(mbps)] = uv.user_view(script, sizes, rounds, batch, disk.mount, hicache_file,
                                                  mirrored=True, tag=tag)
    return out


def _ratio(ours: list[float], ref: list[float]) -> tuple[float, float, float]:
    """Median, lowest and highest of the per-round ratios (rounds of one run are paired: the
    backends ran next to each other)."""
    r = [a / b for a, b in zip(ours, ref)]
    return statistics.median(r), min(r), max(r)


def throttled_table(res: dict) -> str:
    """GB/s per backend and ours' ratios (median, range over rounds) per rate, side by side."""
    runs = res["runs"]
    first = next(iter(runs.values()))
    lines = [f"SSD tier on a loop device ({res['loop']}, read_ahead_kb {res['read_ahead_kb']}), "
             f"limited by blkio throttling; GB/s, median of {first['rounds']} rounds (A B B A); "
             "ratios: median [lowest-highest] of the rounds",
             "rate       pages        backend        " + " ".join(f"{h:>9}" for _, h in _OPS)
             + "   ours vs HiCacheFile / vs raw O_DIRECT (" + ", ".join(h for _, h in _OPS) + ")"]
    for mbps, run in runs.items():
        rate = f"{mbps} MB/s" if mbps != "0" else "none"
        for label, row in run["results"].items():
            for b, v in row.items():
                ratios = ""
                if b == "ours":
                    ratios = " / ".join(
                        ", ".join("{:.2f}x [{:.2f}-{:.2f}]".format(*_ratio(v[f"{op}_rounds"],
                                                                          row[ref][f"{op}_rounds"]))
                                  for op, _ in _OPS)
                        for ref in ("HiCacheFile", "raw O_DIRECT") if ref in row)
                lines.append(f"{rate:<10} {label:<12} {b:<14} "
                             + " ".join(f"{v[op]:>9.2f}" for op, _ in _OPS) + f"   {ratios}")
    return "\n".join(lines)


def parse_rates(text: str) -> list[int]:
    """``--throttle-mbps``: MB/s figures, comma separated, 0 for none. Raises ``ValueError``."""
    rates = [int(r) for r in text.split(",") if r.strip()]
    if not rates or any(r < 0 for r in rates):
        raise ValueError(text)
    return rates

