"""How much memory this process may still take: the least of the host's ``MemAvailable`` and the
headroom of its memory cgroup and each cgroup above it (v2 ``memory.max`` less
``memory.current``; v1 ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``).

A container's limit is not in ``/proc/meminfo``: sized by the host's figure, a process is killed by
its cgroup's OOM killer with no message of ours. Page cache the kernel can drop (the cgroup's
``inactive_file``) counts as headroom, as ``MemAvailable`` counts it on the host.

    room = memory_headroom()        # None where nothing could be read
    room.nbytes, room.bound         # 2147483648, "the cgroup limit memory.max of 4294967296 ..."
    memory_headroom(MemoryRoots(proc=str(tmp / "proc"), cgroup=str(tmp / "cgroup")))  # tests
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

# v1 writes "no limit" as its largest page count in bytes (about 2**63); v2 writes "max".
UNLIMITED = 1 << 60


@dataclass(frozen=True)
class MemoryRoots:
    """Where the kernel's files are: ``/proc`` and the cgroup mount (tests point them elsewhere)."""
    proc: str = "/proc"
    cgroup: str = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Headroom:
    """Bytes this process may still take, and what bounds them, in words for an error."""
    nbytes: int
    bound: str


def memory_headroom(roots: MemoryRoots = MemoryRoots()) -> Headroom | None:
    """The tightest of the host's and every enclosing cgroup's headroom; ``None`` if none is known."""
    rooms = [r for r in (_host(roots), *_cgroup_rooms(roots)) if r is not None]
    return min(rooms, key=lambda r: r.nbytes, default=None)


def _host(roots: MemoryRoots) -> Headroom | None:
    try:
        with open(os.path.join(roots.proc, "meminfo")) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return Headroom(int(line.split()[1]) * 1024, "the host's MemAvailable")
    except (OSError, ValueError, IndexError):
        pass
    return None


def _own_cgroups(roots: MemoryRoots) -> tuple[str | None, str | None]:
    """This process's cgroup paths from ``/proc/self/cgroup``: (v2, v1 memory controller)."""
    v2 = v1 = None
    try:
        with open(os.path.join(roots.proc, "self", "cgroup")) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if not controllers:
                    v2 = path
                elif "memory" in controllers.split(","):
                    v1 = path
    except (OSError, ValueError):
        pass
    return v2, v1


def _cgroup_rooms(roots: MemoryRoots) -> list[Headroom]:
    v2, v1 = _own_cgroups(roots)
    rooms = []
    if v2 is not None:
        rooms += [_room(d, "memory.max", "memory.current", "inactive_file") for d in _dirs(roots.cgroup, v2)]
    if v1 is not None:
        rooms += [_room(d, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
                  for d in _dirs(os.path.join(roots.cgroup, "memory"), v1)]
    return [r for r in rooms if r is not None]


def _dirs(mount: str, path: str) -> Iterator[str]:
    """The cgroup's directory and each one above it under ``mount``, those that exist. In a
    container the mount is often the container's own cgroup while ``/proc/self/cgroup`` names it
    from the host's root: then only the mount itself exists, and it holds the container's limit."""
    parts = [p for p in path.split("/") if p and p != ".."]
    for n in range(len(parts), -1, -1):
        d = os.path.join(mount, *parts[:n])
        if os.path.isdir(d):
            yield d


def _room(d: str, limit_name: str, usage_name: str, reclaimable: str) -> Headroom | None:
    limit = _read_int(os.path.join(d, limit_name))
    if limit is None or limit >= UNLIMITED:
        return None
    used = max(0, (_read_int(os.path.join(d, usage_name)) or 0) - _stat(d, reclaimable))
    return Headroom(max(0, limit - used), f"the cgroup limit {limit_name} of {limit} bytes at {d}, "
                                          f"{used} bytes of it in use")


def _read_int(path: str) -> int | None:
    """The number in a cgroup file; ``None`` for ``max``, a missing file or anything else."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _stat(d: str, key: str) -> int:
    try:
        with open(os.path.join(d, "memory.stat")) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0
