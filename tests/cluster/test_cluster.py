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


def _mounted(path: str) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


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
def test_a_host_limited_in_what_it_sends_is_read_from_at_that_rate_and_freed_again(cluster2: Cluster) -> None:
    """A pool on a slow link (``limit_egress``): its replies come at the limit, what it is sent
    does not; lifted, reads run at the bridge's speed again."""
    from mooncake_sgl.transfer.client import PoolClient

    pool = cluster2.pool(cluster2.hosts[1], capacity="32MiB", slab_size="1MiB")
    client = PoolClient(pool.endpoint, transport="tcp", connections=1, timeout=30)
    keys = [b"slow-%d" % i for i in range(4)]
    out = [[memoryview(bytearray(1 << 20))] for _ in keys]

    def read_s() -> float:
        start = time.monotonic()
        assert client.get_batch(keys, out) == [True] * 4
        return time.monotonic() - start

    try:
        cluster2.limit_egress(cluster2.hosts[1], 2e6)  # 4 MiB at 2 MB/s: about 2.1 s
        pages = [[memoryview(bytes([i]) * (1 << 20))] for i in range(4)]
        start = time.monotonic()
        assert client.put_batch(keys, pages).ok == (True,) * 4
        assert time.monotonic() - start < 1.5  # writes reach the pool unshaped
        assert 1.6 < read_s() < 6.0
        assert [bytes(o[0][:1]) for o in out] == [b"\x00", b"\x01", b"\x02", b"\x03"]
        cluster2.limit_egress(cluster2.hosts[1], None)
        assert read_s() < 1.0
    finally:
        client.close()


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
    mine = tmp_path / "c" / "mine"
    mine.parent.mkdir()
    mine.write_text("the caller's")
    with pytest.raises(RuntimeError, match="boom"):
        with Cluster(2, tmp_path / "c") as c:
            pool = c.pool(c.hosts[0], capacity="16MiB", slab_size="1MiB")
            pid = pool.pid
            raise RuntimeError("boom")
    assert _gone(c)
    assert not os.path.exists(f"/proc/{pid}")
    assert not os.path.exists(pool.workdir), "the pool's directory outlived the cluster"
    assert mine.read_text() == "the caller's"  # a directory given to the cluster is kept


@needs_netns
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_tears_down_and_a_killed_cluster_is_cleaned_by_the_next(tmp_path: Path, sig) -> None:
    code = ("import sys, time; from devtools.testing.cluster import Cluster\n"
            "with Cluster(2) as c:\n"
            "    p = c.pool(c.hosts[1], capacity='16MiB', slab_size='1MiB')\n"
            "    d = c.disk('1m')\n"
            "    print(c.bridge, d, p.workdir, ' '.join(h.netns for h in c.hosts), p.pid, flush=True)\n"
            "    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    bridge, disk, pool_dir, *rest = proc.stdout.readline().split()
    netns, pool_pid = rest[:-1], int(rest[-1])
    assert set(netns) <= _ours()[0]
    assert _mounted(disk)
    proc.send_signal(sig)
    proc.wait(60)
    if sig == signal.SIGKILL:  # nothing ran its teardown: the next cluster cleans up after it
        assert set(netns) <= _ours()[0]
        with Cluster(1, tmp_path / "next"):
            pass
    ns, links = _ours()
    assert not set(netns) & ns and bridge not in links
    assert not _mounted(disk), "the cluster's tmpfs outlived it"
    # The directory it made for itself: deleted by its teardown, or by the next cluster.
    assert not os.path.exists(os.path.dirname(disk)), "the cluster's directory outlived it"
    assert not os.path.exists(pool_dir), "the pool's directory outlived its cluster"
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
    code = ("import os; from devtools.testing.cluster import Cluster, ClusterUnavailable\n"
            "c = Cluster(1)\n"
            "try:\n    c.start()\nexcept ClusterUnavailable as e:\n    print(e)\n"
            "print('workdir left' if os.path.exists(c.workdir) else 'workdir gone')\n")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                          "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    assert "cannot make a cluster of network namespaces: creating network namespaces needs root" \
        in out.stdout, out
    assert "workdir gone" in out.stdout, out
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


def test_the_router_is_handed_out_only_once_it_routes_to_every_worker(tmp_path: Path) -> None:
    """A worker whose /health answers 503 for its first seconds (SGLang does while it starts or a
    check times out): a request sent the moment ``Cluster.router`` returns must reach it. Before,
    the router was returned on its own /health, which answers before any worker is registered,
    and the request was a 503 "No available workers" (bench_cluster's three failed requests)."""
    import http.server
    import json
    import threading
    import urllib.request

    pytest.importorskip("sglang_router")
    first_check: list[float] = []

    class Worker(http.server.BaseHTTPRequestHandler):
        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if not self.path.startswith("/health"):
                self._reply(200, {})
                return
            first_check[:] = first_check or [time.monotonic()]  # 503 for 5 s from the first check
            self._reply(200 if time.monotonic() > first_check[0] + 5 else 503, {})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._reply(200, {"text": "ok", "output_ids": [1], "meta_info": {}})

        def log_message(self, *args: object) -> None:
            pass

    from devtools.testing.procs import pick_port

    worker = http.server.ThreadingHTTPServer(("127.0.0.1", pick_port("127.0.0.1")), Worker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    c = Cluster(1, tmp_path / "c")  # the router runs on this machine's side: no namespace needed
    try:
        router = c.router([f"http://127.0.0.1:{worker.server_address[1]}"], "round_robin")
        req = urllib.request.Request(f"{router.url}/generate", data=b'{"input_ids": [1, 2]}',
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
    finally:
        c.close()
        worker.shutdown()
