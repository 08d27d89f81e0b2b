"""Two SGLang instances configured only as SGLang's built-in Mooncake backend is configured (each of
its three forms), each with its own cache directory, share pages through one real
``mooncake_master``: the second reads the first's pages byte for byte, and every one of them comes
from the mooncake_store tier. Before the built-in's configuration was read, the extra-config form
failed the attach and the other two fell back to private default tiers (the second read 0 pages).

Each instance is a fresh interpreter (``builtin_worker``) whose environment is only what the test
gives it, so one instance's ``MOONCAKE_*`` variables cannot leak into the other's config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("GLOG_minloglevel", "2")

from devtools.testing import MooncakeMaster  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PAGES = 24
SEGMENT = 32 << 20
# Every variable that would configure an instance besides what a test gives it.
_CONFIG_VARS = ("MOONCAKE_", "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", "LOCAL_HOSTNAME", "XDG_CACHE_HOME")


@pytest.fixture(scope="module")
def master() -> Iterator[MooncakeMaster]:
    with MooncakeMaster() as m:
        yield m


def _env(instance: Path, extra_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CONFIG_VARS)}
    # Our default tiers live under $XDG_CACHE_HOME: a directory of its own per instance, so only
    # the Mooncake Store can connect them. torch's extension cache also follows XDG_CACHE_HOME;
    # pin it where it is, so each instance does not rebuild SGLang's page-hash extension.
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(cache, "torch_extensions"))
    env["XDG_CACHE_HOME"] = str(instance / "cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env["GLOG_minloglevel"] = "2"
    return {**env, **extra_env}


def _start(role: str, instance: Path, extra: dict[str, Any], extra_env: dict[str, str],
           seed: int) -> subprocess.Popen:
    instance.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "tests.hicache.builtin_worker", role, str(PAGES), str(seed),
            json.dumps(extra)]
    return subprocess.Popen(
        argv, cwd=REPO, env=_env(instance, extra_env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=open(instance / f"{role}.log", "w"), text=True)


def _report(proc: subprocess.Popen, word: str, log: Path) -> dict[str, Any]:
    line = proc.stdout.readline()
    assert line.startswith(word + " "), f"no {word} line: {line!r}\n{log.read_text()[-4000:]}"
    return json.loads(line[len(word) + 1:])


def _forms(m: MooncakeMaster, tmp: Path) -> dict[str, Any]:
    """Per form: (extra-config, environment) of one instance, given its directory."""
    def extra_form(inst: Path) -> tuple[dict, dict]:
        return ({"master_server_address": m.rpc_address, "protocol": "tcp",
                 "global_segment_size": SEGMENT, "metadata_server": m.metadata_url,
                 "local_hostname": "127.0.0.1"}, {})

    def file_form(inst: Path) -> tuple[dict, dict]:
        path = inst / "mooncake.json"
        path.write_text(json.dumps({
            "master_server_address": m.rpc_address, "protocol": "tcp", "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": str(SEGMENT), "enable_ssd_offload": True,
            "ssd_offload_path": str(inst / "ssd")}))
        return {}, {"SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": str(path)}

    def env_form(inst: Path) -> tuple[dict, dict]:
        return {}, {"MOONCAKE_MASTER": m.rpc_address, "MOONCAKE_PROTOCOL": "tcp",
                    "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(SEGMENT), "MOONCAKE_DEVICE": "",
                    "MOONCAKE_TE_META_DATA_SERVER": m.metadata_url, "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1"}

    return {"extra-config": extra_form, "file": file_form, "env": env_form}


@pytest.mark.parametrize("form,source", [
    ("extra-config", "--hicache-storage-backend-extra-config"),
    ("file", "mooncake.json"),
    ("env", "the MOONCAKE_* environment"),
])
def test_two_instances_configured_as_the_builtin_share_pages_through_mooncake(
        master: MooncakeMaster, tmp_path: Path, form: str, source: str) -> None:
    make = _forms(master, tmp_path)[form]
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    seed = 40 + ["extra-config", "file", "env"].index(form)  # distinct pages per form on one master
    writer = _start("write", one, *make(one), seed=seed)
    reader = _start("read", two, *make(two), seed=seed)  # imports meanwhile; attaches when told
    kinds = ["host", "mooncake_store"] + (["lmdb"] if form == "file" else [])
    try:
        wrote = _report(writer, "READY", one / "write.log")
        assert wrote["stored"] == PAGES
        assert wrote["tiers"] == kinds
        assert reader.stdout.readline().strip() == "IMPORTED", (two / "read.log").read_text()[-4000:]
        reader.stdin.write("go\n")
        reader.stdin.flush()
        got = _report(reader, "RESULT", two / "read.log")
        assert reader.wait(120) == 0, (two / "read.log").read_text()[-4000:]
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
        writer.stdin.close()  # the writer serves its segment until here
        try:
            writer.wait(120)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    assert got["tiers"] == kinds
    assert got["exists"] == PAGES and got["read"] == PAGES
    assert got["digests"] == wrote["digests"]  # byte-exact, page by page
    assert got["hits"]["mooncake_store"] == PAGES  # nothing else could have had them
    assert got["hits"].get("lmdb", 0) == 0
    for inst, role in ((one, "write"), (two, "read")):
        log = (inst / f"{role}.log").read_text()
        line = next((x for x in log.splitlines() if "mooncake_sgl: config from" in x), "")
        assert "config from SGLang's built-in Mooncake config in" in line and source in line, log[-3000:]
        assert "mooncake_store (master " + master.rpc_address in line
    if form == "file":  # enable_ssd_offload + ssd_offload_path: our SSD tier, a folder per rank
        assert wrote["lmdb_paths"] == [str(one / "ssd")]
        assert any((one / "ssd").iterdir())


# ------------------------------------------------------------------ tenant_id, check_server

def _backend(tmp: Path, extra: dict[str, Any]) -> tuple[Any, Any]:
    from mooncake_sgl.hicache.backend import MooncakeSglStorage

    from . import pools

    pool = pools.build_pool("mha", "page_first")
    backend = MooncakeSglStorage(pools.storage_config("mha", "page_first", tmp, extra=extra), pool)
    backend.register_mem_pool_host(pool)
    return backend, pool


def test_tenant_id_keeps_tenants_apart_on_a_multi_tenant_master(tmp_path: Path) -> None:
    """``tenant_id`` reaches Mooncake's ``setup``: on a master with tenants, another tenant reads
    nothing of this one's pages, and the same tenant reads all of them from another instance."""
    from . import pools

    quota = tmp_path / "tenants.yaml"
    quota.write_text("version: 1\ntenants:\n" + "".join(
        f"  - name: {t}\n    quota: {64 << 20}\n" for t in ("default", "tenant-a", "tenant-b")))
    with MooncakeMaster(extra_args=["--enable_multi_tenants=true",
                                    f"--tenant_quota_connector_uri={quota}"]) as m:
        def extra(tenant: str) -> dict[str, Any]:
            return {"master_server_address": m.rpc_address, "protocol": "tcp", "local_hostname": "127.0.0.1",
                    "global_segment_size": SEGMENT, "tenant_id": tenant}

        made = []
        try:
            made.append(writer := _backend(tmp_path / "a1", extra("tenant-a")))
            backend, pool = writer
            hashes, idx = pools.page_hashes(PAGES, seed=60), pool.alloc(PAGES * pools.PAGE)
            pools.fill_random(pool, idx, seed=60)
            want = pools.page_bytes(pool, idx)
            assert backend.batch_set_v1(hashes, idx) == [True] * PAGES

            made.append(other := _backend(tmp_path / "b", extra("tenant-b")))
            assert other[0].batch_exists(hashes) == 0
            made.append(same := _backend(tmp_path / "a2", extra("tenant-a")))
            backend, pool = same
            idx = pool.alloc(PAGES * pools.PAGE)
            assert backend.batch_exists(hashes) == PAGES
            assert backend.batch_get_v1(hashes, idx) == [True] * PAGES
            assert pools.page_bytes(pool, idx) == want
        finally:
            for b, _ in made:
                b.close()


def test_check_server_waits_for_a_store_server_as_the_builtin_does(tmp_path: Path) -> None:
    from mooncake_sgl.builtin_config import wait_for_store_server
    from mooncake_sgl.errors import TierError

    with MooncakeMaster() as m:
        url = f"{m.metrics_url}/get_all_segments"
        with pytest.raises(TierError, match="no Mooncake store server mounted a segment within 1 s"):
            wait_for_store_server(url, timeout_s=1.0, interval_s=0.2)
        extra = {"master_server_address": m.rpc_address, "protocol": "tcp", "local_hostname": "127.0.0.1",
                 "global_segment_size": SEGMENT}
        first, _ = _backend(tmp_path / "one", extra)
        try:
            assert wait_for_store_server(url, timeout_s=10.0, interval_s=0.2) < 10.0
            second, _ = _backend(tmp_path / "two", {**extra, "check_server": True,
                                                    "master_metrics_port": m.metrics_port})
            second.close()
        finally:
            first.close()
