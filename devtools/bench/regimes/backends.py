"""Each backend at its documented best for one budget: SGLang flags, environment, config files.

- ``ours``       our backend (``--hicache-storage-backend mooncake``): a host tier of the DRAM
                 budget over an LMDB tier of the disk budget (policy ``adaptive``, the default);
                 with several instances, one ``mooncake-sgl pool`` of the DRAM budget they share.
- ``ours-dram``  the same with a host tier that holds the whole working set: what pressure costs.
- ``builtin-dram`` the built-in below without its SSD offload: its segment alone.
- ``builtin``    SGLang's ``MooncakeStore`` through the ``dynamic`` backend (our package holds the
                 name ``mooncake``) on a real ``mooncake_master``, protocol tcp, zero-copy v1
                 calls, a segment of the DRAM budget, and Mooncake's SSD offload of the disk
                 budget where the wheel has it (master ``--enable_offload``, client
                 ``enable_ssd_offload``); several instances share one master, a segment each.
- ``lifeboat``   ``lifeboatcache`` through ``dynamic``, its ``single_node_gpu`` preset (a local
                 ``nvme`` tier with O_DIRECT reads, fp8 on that rung, episodic eviction) with a
                 tier of the disk budget; several instances share its directory
                 (``storage.shared_lookup``). In SGLang it writes to its first tier only and never
                 demotes, so a memory tier in front would be the only one written: it gets no L3
                 DRAM (it reads through the page cache, as our LMDB tier does).
- ``recompute``  no HiCache at all: every token a device miss computes again. The baseline a
                 storage hit must beat (issue 50: never slower than recomputing).
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..console import log
from ..server import HICACHE, ours_args
from .budget import Budget

LIFEBOAT = "lifeboatcache"
LIFEBOAT_VERSION = "0.1.11"
# What lifeboatcache 0.1.11 requires (its metadata); every one is in SGLang's own environment.
LIFEBOAT_REQUIRES = ("numpy", "pydantic", "PyYAML", "zstandard")
# What installing it must never change.
PINNED = ("torch", "sglang", "transformers")
# The built-in's offload: how often the client asks the master what to write (10 s by default;
# pages evicted from DRAM before that are lost), and the bucket its default store fills before it
# writes one: 500 keys or 256 MiB by default, which a working set of a few hundred pages never
# fills (measured: 0 bytes offloaded in a run). A bucket of 16 keys or 8 MiB reaches the disk.
OFFLOAD_HEARTBEAT_S = 1
OFFLOAD_BUCKET_KEYS = 16
OFFLOAD_BUCKET_BYTES = 8 << 20
MOONCAKE_MIN_SEGMENT = 16 << 20  # "Total size must be at least 16777216" (the client's allocator)
FULL_DRAM = 1.25  # the DRAM of "the whole working set": the working set and room for its metadata


@dataclass(frozen=True)
class Services:
    """Shared processes a run's servers talk to (started by the rig)."""
    master_rpc: str | None = None
    pool_endpoint: str | None = None


@dataclass(frozen=True)
class Launch:
    """One server of one run: its backend flags and environment."""
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def full_dram(b: Budget) -> int:
    return -(-int(b.working_set * FULL_DRAM) // b.page_bytes) * b.page_bytes


def ours_tiers(regime: str, backend: str, b: Budget, disk_dir: Path, pool: str | None) -> str:
    if regime == "instances":
        return f'tiers:\n  - {{kind: pool, endpoints: ["{pool}"]}}\n'
    host = full_dram(b) if backend == "ours-dram" else b.dram
    return (f"tiers:\n  - {{kind: host, capacity: {host}}}\n"
            f'  - {{kind: lmdb, path: "{disk_dir / "lmdb"}", capacity: {b.disk}}}\n')


def builtin_extra(master_rpc: str, segment: int, offload_dir: Path | None) -> dict[str, object]:
    """SGLang's MooncakeStore through the dynamic loader; ``interface_v1`` makes the controller use
    the zero-copy page calls, as it does for the registered ``mooncake``."""
    extra: dict[str, object] = {
        "backend_name": "mooncake_builtin",
        "module_path": "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store",
        "class_name": "MooncakeStore", "interface_v1": 1, "master_server_address": master_rpc,
        "metadata_server": "P2PHANDSHAKE", "protocol": "tcp", "local_hostname": "127.0.0.1",
        "global_segment_size": segment, "device_name": ""}
    if offload_dir is not None:
        extra |= {"enable_ssd_offload": True, "ssd_offload_path": str(offload_dir)}
    return extra


def lifeboat_yaml(b: Budget, tier_dir: Path, shared: bool) -> str:
    return "\n".join([
        "extends: single_node_gpu",
        "device: cpu",
        "storage:",
        "  tiers:",
        f'    - {{name: nvme, type: nvme, enabled: true, path: "{tier_dir}", direct_io: true,',
        f"       capacity_gb: {b.disk / (1 << 30)!r}, min_free_gb: 0, scope: node}}",
        "  fallback_local: {enabled: false}",
        f"  shared_lookup: {'true' if shared else 'false'}",
        # Ports 9400 and 9402 are fixed: two servers at once would collide on them.
        "dashboard: {enabled: false}",
        "telemetry: {prometheus: {enabled: false}}",
        ""])


def launch(backend: str, regime: str, b: Budget, run_dir: Path, disk_dir: Path, services: Services,
           servers: int, offload: bool) -> Launch:
    """Backend flags and environment of one server; files it needs are written into ``run_dir``.
    ``disk_dir``: the run's disk folder (shared by its servers in ``instances``)."""
    if backend in ("ours", "ours-dram"):
        path = run_dir / "tiers.yaml"
        path.write_text(ours_tiers(regime, backend, b, disk_dir, services.pool_endpoint))
        return Launch(ours_args(path))
    if backend in ("builtin", "builtin-dram"):
        assert services.master_rpc is not None
        shared = regime == "instances"
        segment = full_dram(b) // servers if shared else b.dram
        use_offload = offload and not shared and backend == "builtin"
        extra = builtin_extra(services.master_rpc, segment, disk_dir / "offload" if use_offload else None)
        # The wheel's default offload store (buckets) reads its own limit; without it, 90% of the disk.
        env = {"MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(b.disk),
               "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE": str(b.disk),
               "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT": str(OFFLOAD_BUCKET_KEYS),
               "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES": str(OFFLOAD_BUCKET_BYTES),
               "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": str(OFFLOAD_HEARTBEAT_S)} if use_offload else {}
        return Launch((HICACHE, "--hicache-storage-backend", "dynamic",
                       "--hicache-storage-backend-extra-config", json.dumps(extra)), env)
    if backend == "lifeboat":
        path = run_dir / "lifeboat.yaml"
        path.write_text(lifeboat_yaml(b, disk_dir / "lifeboat", shared=regime == "instances"))
        extra = {"backend_name": "lifeboat", "module_path": "lifeboat_cache.integrations.sglang_backend",
                 "class_name": "LifeboatHiCacheStorage", "lifeboat_config": str(path)}
        # Its home (default ~/.lifeboat_cache) holds a config it may write back: keep it in the run.
        return Launch((HICACHE, "--hicache-storage-backend", "dynamic",
                       "--hicache-storage-backend-extra-config", json.dumps(extra)),
                      {"LIFEBOAT_CACHE_HOME": str(run_dir / "lifeboat_home")})
    if backend == "recompute":
        return Launch(())
    raise ValueError(f"unknown backend {backend!r}")


def builtin_offload_available() -> bool:
    """Does the installed Mooncake client take ``enable_ssd_offload`` in ``setup`` (SGLang retries
    without it, with a warning, where it does not)."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError:
        return False
    return "enable_ssd_offload" in (MooncakeDistributedStore.setup.__doc__ or "")


def _versions(names: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


def ensure_lifeboat(install: bool) -> str:
    """The installed lifeboatcache's version; installs the pinned one, without its dependencies
    (each is checked present first) when it is missing and ``install``; ``SystemExit`` saying how
    otherwise. Fails loudly if the install changed torch, sglang or transformers."""
    have = _versions((LIFEBOAT,))[LIFEBOAT]
    if have:
        return have
    how = f"{sys.executable} -m pip install --no-deps {LIFEBOAT}=={LIFEBOAT_VERSION}"
    if not install:
        raise SystemExit(f"bench_regimes: the backend lifeboat needs {LIFEBOAT}, not installed here; "
                         f"run `{how}` (or drop --no-install), or leave lifeboat out of --backends")
    missing = [n for n, v in _versions(LIFEBOAT_REQUIRES).items() if v is None]
    if missing:
        raise SystemExit(f"bench_regimes: {LIFEBOAT} needs {', '.join(missing)}, missing here; install "
                         f"them, then `{how}`")
    before = _versions(PINNED)
    log(f"bench_regimes: installing {LIFEBOAT}=={LIFEBOAT_VERSION} for the backend lifeboat: `{how}` "
        f"(its requirements {', '.join(LIFEBOAT_REQUIRES)} are already here)")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", f"{LIFEBOAT}=={LIFEBOAT_VERSION}"],
                   check=True)
    importlib.invalidate_caches()
    after = _versions(PINNED)
    if after != before:
        raise SystemExit(f"bench_regimes: installing {LIFEBOAT} changed {before} to {after}")
    return _versions((LIFEBOAT,))[LIFEBOAT] or LIFEBOAT_VERSION


def check_lifeboat_config(path: Path) -> None:
    """Load the config as the backend will (its loader validates every key), so that a key this
    version does not know fails here, not in a server's scheduler."""
    from lifeboat_cache.config import load_or_default

    load_or_default(str(path))


def features(b: Budget, offload: bool, lifeboat_version: str | None, servers: int) -> dict[str, str]:
    """What each backend was given and which of its features ran, in words (the report's)."""
    mib = 1 << 20
    return {
        "ours": f"host tier {b.dram / mib:.1f} MiB over an LMDB tier of {b.disk / mib:.0f} MiB, policy "
                f"adaptive (default); instances: one pool of {full_dram(b) / mib:.1f} MiB, no other tier",
        "ours-dram": f"host tier {full_dram(b) / mib:.1f} MiB (the whole working set) over the same LMDB",
        "builtin": f"MooncakeStore segment {b.dram / mib:.1f} MiB, tcp, P2PHANDSHAKE, zero-copy v1; SSD "
                   + (f"offload on: master --enable_offload, client enable_ssd_offload, a limit of "
                      f"{b.disk / mib:.0f} MiB, heartbeat {OFFLOAD_HEARTBEAT_S} s, buckets of "
                      f"{OFFLOAD_BUCKET_KEYS} keys or {OFFLOAD_BUCKET_BYTES >> 20} MiB" if offload
                      else "offload off (not in this wheel, or --no-offload)")
                   + f"; instances: one master, {servers} segments of {full_dram(b) / servers / mib:.1f} "
                     "MiB, no offload",
        "builtin-dram": f"MooncakeStore segment {b.dram / mib:.1f} MiB, no SSD offload",
        "recompute": "no HiCache: SGLang's device cache only, every other token computed",
        "lifeboat": (f"lifeboatcache {lifeboat_version}: preset single_node_gpu, nvme tier of "
                     f"{b.disk / mib:.0f} MiB (O_DIRECT, fp8 on that rung, episodic eviction), no L3 "
                     "DRAM tier; instances: one shared directory, shared_lookup on"
                     if lifeboat_version else "not run"),
    }
