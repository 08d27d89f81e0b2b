"""The test cluster: hosts as network namespaces on one bridge (``devtools.testing.cluster``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.testing.cluster import PREFIX, Cluster, ClusterUnavailable, unavailable_reason

from .conftest import needs_netns

REPO = Path(__file__).resolve().parents[2]


def _ours() -> tuple[set[str], set[str]]:
    """Namespaces and links of ours that exist now."""
    ns = {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                     text=True).stdout.splitlines() if line}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return ({n for n in ns if n.startswith(PREFIX)},
            {w.rstrip(":").split("@")[0] for w in links.split() if w.startswith(PREFIX)})


def _gone(c: Cluster) -> bool:
    ns, links = _ours()
    return not ({h.netns for h in c.hosts} & ns) and c.bridge not in links and \
        not any(h.veth in links for h in c.hosts)


@needs_netns
def test_auto_transport_is_tcp_across_hosts_and_shared_memory_inside_one(cluster2: Cluster) -> None:
    pool = cluster2.pool(cluster2.hosts[1], capacity="32MiB", slab_size="1MiB", secret="s")
    assert pool.endpoint.startswith(cluster2.hosts[1].addr)
    assert cluster2.transport(cluster2.hosts[0], pool.endpoint, "s") == "tcp"
    assert cluster2.transport(cluster2.hosts[1], pool.endpoint, "s") == "shm"


@needs_netns
def test_a_cut_host_reaches_nothing_until_reconnected(cluster2: Cluster) -> None:
    a, b = cluster2.hosts
    pool = cluster2.pool(b, capacity="16MiB", slab_size="1MiB")
    connect = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)"

    def ping() -> bool:
        return cluster2.run(a, [sys.executable, "-c", connect, b.addr, str(pool.port)],
                            timeout_s=20).returncode == 0

    assert ping()
    cluster2.cut(a)
    assert not ping()
    cluster2.reconnect(a)
    deadline = time.monotonic() + 10
    while not ping():
        assert time.monotonic() < deadline, "still cut off after reconnect"


@needs_netns
def test_a_failure_inside_tears_down_namespaces_bridge_and_processes(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Cluster(2, tmp_path / "c") as c:
            pool = c.pool(c.hosts[0], capacity="16MiB", slab_size="1MiB")
            pid = pool.pid
            raise RuntimeError("boom")
    assert _gone(c)
    assert not os.path.exists(f"/proc/{pid}")


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_tears_down_and_a_killed_cluster_is_cleaned_by_the_next(tmp_path: Path, sig) -> None:
    code = ("import sys, time; from devtools.testing.cluster import Cluster\n"
            "with Cluster(2) as c:\n"
            "    p = c.pool(c.hosts[1], capacity='16MiB', slab_size='1MiB')\n"
            "    print(c.bridge, ' '.join(h.netns for h in c.hosts), p.pid, flush=True)\n"
            "    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    bridge, *rest = proc.stdout.readline().split()
    netns, pool_pid = rest[:-1], int(rest[-1])
    assert set(netns) <= _ours()[0]
    proc.send_signal(sig)
    proc.wait(60)
    if sig == signal.SIGKILL:  # nothing ran its teardown: the next cluster cleans up after it
        assert set(netns) <= _ours()[0]
        with Cluster(1, tmp_path / "next"):
            pass
    ns, links = _ours()
    assert not set(netns) & ns and bridge not in links
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pool_pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pool_pid}"), "the pool outlived its cluster"


def test_refuses_with_the_reason_where_namespaces_are_not_allowed(tmp_path: Path) -> None:
    if os.geteuid() != 0:  # this very machine refuses
        with pytest.raises(ClusterUnavailable, match="root"):
            Cluster(1, tmp_path).start()
        return
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop root for this check")
    code = ("from devtools.testing.cluster import Cluster, ClusterUnavailable\n"
            "try:\n    Cluster(1).start()\nexcept ClusterUnavailable as e:\n    print(e)\n")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                          "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert "cannot make a cluster of network namespaces: creating network namespaces needs root" \
        in out.stdout, out
    assert unavailable_reason() is None


@needs_netns
def test_the_standby_master_in_another_host_takes_over_from_a_killed_leader(cluster2: Cluster) -> None:
    etcd = cluster2.etcd(cluster2.hosts[1])
    masters = [cluster2.master(cluster2.hosts[1], etcd), cluster2.master(cluster2.hosts[0], etcd)]

    def roles() -> list[str]:
        out = []
        for m in masters:
            try:
                import urllib.request

                with urllib.request.urlopen(f"{m.metrics_url}/role", timeout=2) as r:
                    out.append(r.read().decode().strip())
            except OSError:
                out.append("down")
        return out

    deadline = time.monotonic() + 30
    while "leader" not in " ".join(roles()):
        assert time.monotonic() < deadline, roles()
        time.sleep(0.5)
    leader = next(m for m, r in zip(masters, roles()) if "leader" in r)
    leader.kill()
    other = next(m for m in masters if m is not leader)
    deadline = time.monotonic() + 60
    while "leader" not in roles()[masters.index(other)]:
        assert time.monotonic() < deadline, f"no new leader: {roles()}"
        time.sleep(0.5)
