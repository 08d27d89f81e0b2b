"""The memory a process may still take: the host's MemAvailable and its cgroups' limits (v1, v2), read
from fake ``/proc`` and cgroup trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from mooncake_sgl.memory import MemoryRoots, memory_headroom

GiB = 1 << 30
V1_UNLIMITED = "9223372036854771712"


def fake(tmp_path: Path, self_cgroup: str | None, files: dict[str, str],
         host_available: int | None = 64 * GiB) -> MemoryRoots:
    """``/proc`` with ``meminfo`` and ``self/cgroup``, and a cgroup mount holding ``files``."""
    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    cgroup.mkdir()
    if host_available is not None:
        (proc / "meminfo").write_text(f"MemTotal: 1 kB\nMemAvailable: {host_available // 1024} kB\n")
    if self_cgroup is not None:
        (proc / "self" / "cgroup").write_text(self_cgroup)
    for rel, text in files.items():
        (cgroup / rel).parent.mkdir(parents=True, exist_ok=True)
        (cgroup / rel).write_text(text)
    return MemoryRoots(proc=str(proc), cgroup=str(cgroup))


def test_without_a_cgroup_limit_it_is_the_hosts_memavailable(tmp_path: Path) -> None:
    roots = fake(tmp_path, "0::/\n", {"cgroup.controllers": "memory\n"})
    room = memory_headroom(roots)
    assert room is not None and room.nbytes == 64 * GiB and room.bound == "the host's MemAvailable"


def test_a_v2_limit_below_the_host_bounds_it_less_what_is_in_use(tmp_path: Path) -> None:
    roots = fake(tmp_path, "0::/pod/ctr\n", {
        "pod/ctr/memory.max": f"{4 * GiB}\n", "pod/ctr/memory.current": f"{GiB}\n",
        "pod/ctr/memory.stat": f"anon {GiB // 2}\ninactive_file {GiB // 4}\n"})
    room = memory_headroom(roots)
    # Page cache the kernel can drop is headroom, as on the host.
    assert room is not None and room.nbytes == 4 * GiB - (GiB - GiB // 4)
    assert "memory.max of 4294967296 bytes" in room.bound and "pod/ctr" in room.bound


def test_v2_max_is_no_limit_and_a_tighter_parent_wins(tmp_path: Path) -> None:
    roots = fake(tmp_path, "0::/pod/ctr\n", {
        "pod/ctr/memory.max": "max\n", "pod/ctr/memory.current": f"{GiB}\n",
        "pod/memory.max": f"{2 * GiB}\n", "pod/memory.current": f"{GiB}\n"})
    room = memory_headroom(roots)
    assert room is not None and room.nbytes == GiB and room.bound.endswith(f"pod, {GiB} bytes of it in use")


def test_a_v1_limit_bounds_it_and_its_unlimited_value_does_not(tmp_path: Path) -> None:
    # The container's mount is its own cgroup, while /proc/self/cgroup names it from the host's root.
    roots = fake(tmp_path, "4:memory:/docker/abc\n1:cpu:/docker/abc\n0::/\n", {
        "memory/memory.limit_in_bytes": f"{3 * GiB}\n", "memory/memory.usage_in_bytes": f"{2 * GiB}\n",
        "memory/memory.stat": f"inactive_file 7\ntotal_inactive_file {GiB // 2}\n"})
    room = memory_headroom(roots)
    assert room is not None and room.nbytes == GiB + GiB // 2
    assert "memory.limit_in_bytes of 3221225472 bytes" in room.bound
    (tmp_path / "cgroup" / "memory" / "memory.limit_in_bytes").write_text(V1_UNLIMITED)
    assert memory_headroom(roots).bound == "the host's MemAvailable"


def test_a_cgroup_over_its_limit_has_no_headroom(tmp_path: Path) -> None:
    roots = fake(tmp_path, "0::/c\n", {"c/memory.max": f"{GiB}\n", "c/memory.current": f"{2 * GiB}\n"})
    assert memory_headroom(roots).nbytes == 0


@pytest.mark.parametrize("self_cgroup", [None, "", "garbage\n", "0::/gone\n"])
def test_missing_or_odd_cgroup_files_leave_the_hosts_figure(tmp_path: Path, self_cgroup: str | None) -> None:
    roots = fake(tmp_path, self_cgroup, {"memory.max": "not a number\n"})
    assert memory_headroom(roots).nbytes == 64 * GiB


def test_nothing_readable_is_none(tmp_path: Path) -> None:
    assert memory_headroom(fake(tmp_path, None, {}, host_available=None)) is None


def test_a_limit_without_usage_files_is_the_limit(tmp_path: Path) -> None:
    roots = fake(tmp_path, "0::/\n", {"memory.max": f"{GiB}\n"}, host_available=None)
    assert memory_headroom(roots).nbytes == GiB
