"""SGLang's built-in Mooncake config, as ``builtin_config`` read it, translated into our tiers.

The translation (``translate``) is the host tier of our embedded default over a ``mooncake_store``
tier with that master, metadata server, protocol, device, hostname and per-rank segment, plus our
LMDB SSD tier where ``enable_ssd_offload`` asks for SSD. A key with no equivalent is an error that
names it and says why; a key that changes nothing here says so in ``Translation.notes``, which the
backend logs at attach. ``describe_tiers`` is the attach line's summary of whichever config results.

What this module touches: the ``BuiltinSettings`` and ranks it is handed, and the schema it builds
(through ``config_text.parse_config``, so a translated config is checked as a written one is); no
file, variable or network. Reading the built-in's forms, and the ``check_server`` wait, are
``builtin_config``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .builtin_config import DEFAULT_TENANT, EXTRA_SOURCE, KEYS, BuiltinSettings, Ranks
from .config import (
    HostTierConfig,
    LmdbTierConfig,
    MooncakeStoreTierConfig,
    StoreConfig,
    default_cache_dir,
    tier_kind,
)
from .config_text import parse_config
from .errors import ConfigError

MIN_SEGMENT = 16 << 20  # Mooncake's smallest segment (our mooncake_store tier refuses less)
# A parsed JSON value's type in JSON's words, for errors.
_JSON_TYPES = {type(None): "null", bool: "boolean", int: "number", float: "number", list: "array",
               dict: "object", str: "string"}


@dataclass(frozen=True)
class Translation:
    """Our config for a built-in one, what changed nothing, and the wait ``check_server`` asks for."""
    config: StoreConfig
    settings: BuiltinSettings
    notes: tuple[str, ...] = ()
    check_server_url: str | None = None


def _device(settings: BuiltinSettings, ranks: Ranks, key: str, notes: list[str]) -> str:
    """``device_name``: NIC names, or a JSON object of them by TP rank (the built-in's form)."""
    device = settings.device_name
    if not device.strip().startswith("{"):
        return device
    try:
        by_rank = json.loads(device)
        if not isinstance(by_rank, dict):
            raise ValueError("not an object")
    except ValueError as e:
        # SGLang logs a warning and auto-discovers; a NIC map that cannot be read is a mistake.
        raise ConfigError(f"device_name looks like a JSON object of NICs by TP rank but does not "
                          f"parse ({e}); write it as {{\"0\": \"mlx5_0\", \"1\": \"mlx5_1\"}}",
                          key=key, source=settings.source) from None
    # Every entry, not only this rank's: a map wrong for one rank is wrong for the deployment.
    bad = next(((rank, nics) for rank, nics in by_rank.items() if not isinstance(nics, str)), None)
    if bad is not None:
        raise ConfigError(f"device_name entry {bad[0]!r} is a JSON {_JSON_TYPES[type(bad[1])]}, not a "
                          f"string of NIC names; write it as {{\"{bad[0]}\": \"mlx5_0,mlx5_1\"}} (\"\" to "
                          "auto-discover)", key=key, source=settings.source)
    chosen = by_rank.get(str(ranks.tp_rank), "")
    if not chosen:
        notes.append(f"device_name has no entry for TP rank {ranks.tp_rank}: NICs auto-discovered")
    return chosen


def _env_or_key(settings: BuiltinSettings, key: str) -> str:
    return (KEYS[key].env or key) if settings.form == "env" else key


def translate(settings: BuiltinSettings, ranks: Ranks = Ranks(),
              own: Mapping[str, Any] | None = None) -> Translation:
    """Our ``StoreConfig`` for the built-in's config: our embedded default's host tier over a
    ``mooncake_store`` tier, and our LMDB tier when ``enable_ssd_offload`` is on.

    Args:
        settings: what ``read_*`` produced.
        ranks: this process's TP/PP coordinates (segment split, per-rank NIC).
        own: our keys that stood beside the built-in's in extra-config (``policy``,
            ``namespace_tag``).

    Raises:
        ConfigError: naming the built-in key (or variable) that has no equivalent here, and why.
    """
    def name(key: str) -> str:
        return _env_or_key(settings, key)

    src = settings.source
    notes = list(settings.notes)
    if settings.standalone_storage:
        raise ConfigError(
            "standalone_storage (SGLang's dummy client over the wheel's standalone mooncake_client) "
            "is not supported: that client reaches only memory shared with it through Mooncake's own "
            "allocator, and our tiers move pages from SGLang's host pool and our own host tier. Keep "
            "the mooncake_client running as a store server (it contributes its segment to the "
            "cluster) and point this instance at its master with master_server_address, "
            "standalone_storage false",
            key=name("standalone_storage"), source=src)
    if settings.master_server_address is None:
        raise ConfigError("client_server_address is only used with standalone_storage, which is not "
                          "supported; give master_server_address (the mooncake_master's host:port)",
                          key=name("client_server_address"), source=src)
    if not settings.master_server_address.strip():
        raise ConfigError("master_server_address is empty: give the mooncake_master's host:port",
                          key=name("master_server_address"), source=src)
    if settings.client_server_address is not None:
        notes.append(f"{name('client_server_address')} not used: only standalone_storage reads it "
                     "(as in the built-in)")
    if settings.protocol not in ("tcp", "rdma"):
        raise ConfigError(f"protocol {settings.protocol!r} is not supported by the mooncake_store "
                          "tier: it speaks tcp and rdma", key=name("protocol"), source=src)
    scale = max(1, ranks.tp_size) * max(1, ranks.pp_size)
    per_rank = settings.global_segment_size // scale
    if 0 < per_rank < MIN_SEGMENT:
        raise ConfigError(
            f"global_segment_size {settings.global_segment_size} bytes split over tp_size x pp_size = "
            f"{scale} ranks (as the built-in splits it) is {per_rank} bytes per rank, below Mooncake's "
            f"smallest segment of 16MiB; give at least {MIN_SEGMENT * scale} bytes or 0 (contribute "
            "nothing)", key=name("global_segment_size"), source=src)
    device = _device(settings, ranks, name("device_name"), notes)
    store_tier: dict[str, Any] = {
        "kind": "mooncake_store", "master": settings.master_server_address,
        "metadata_server": settings.metadata_server, "protocol": settings.protocol,
        "device": device, "local_hostname": settings.local_hostname, "segment_size": per_rank,
        "tenant_id": settings.tenant_id,
    }
    if settings.local_buffer_size is not None:
        notes.append(f"{'MOONCAKE_LOCAL_BUFFER_SIZE' if settings.form == 'env' else 'local_buffer_size'} "
                     "not used: SGLang 0.5.23 ignores it too; pages move zero copy from registered "
                     "host memory and our staging buffer is the tier's buffer_size (256MiB)")
    tiers: list[dict[str, Any]] = [{"kind": "host"}, store_tier]
    ssd_path = settings.ssd_offload_path
    if settings.enable_ssd_offload:
        # Mooncake's own offload spills its segment to its own files; our LMDB tier is the SSD tier
        # under the Mooncake Store instead (one folder per rank, as the built-in gives each rank).
        tiers.append({"kind": "lmdb", "path": ssd_path or ""})
    elif ssd_path is not None:
        notes.append(f"{name('ssd_offload_path')} {ssd_path!r} not used: enable_ssd_offload is off "
                     "(set it to put our SSD tier there)")
    if settings.master_metrics_port != KEYS["master_metrics_port"].default and not settings.check_server:
        notes.append(f"{name('master_metrics_port')} not used: only check_server reads it")
    check_url = None
    if settings.check_server:
        if "://" in settings.master_server_address:
            raise ConfigError("check_server needs a plain host:port master_server_address (it asks the "
                              "master's metrics port for its segments), not an HA address",
                              key=name("check_server"), source=src)
        host = settings.master_server_address.split(":")[0]
        check_url = f"http://{host}:{settings.master_metrics_port}/get_all_segments"
    if settings.enable_group_semantics:
        notes.append("enable_group_semantics: already so within a rank (each page is one Mooncake "
                     "object holding its K, V and every layer, written, leased and evicted as one); "
                     "the pages of different TP ranks are separate objects, evicted independently")
    data: dict[str, Any] = {"tiers": tiers}
    own = dict(own or {})
    if settings.extra_backend_tag is not None:
        if own.get("namespace_tag"):
            raise ConfigError("give either extra_backend_tag (the built-in's) or namespace_tag (ours), "
                              "not both: both tag every key", key="namespace_tag", source=EXTRA_SOURCE)
        own["namespace_tag"] = settings.extra_backend_tag
    data.update(own)
    config = parse_config(data, f"the translation of SGLang's built-in Mooncake config in {src}")
    return Translation(config=config, settings=settings, notes=tuple(notes), check_server_url=check_url)


def describe_tiers(config: StoreConfig) -> str:
    """One-line summary of a config's tiers (``host 4GiB, mooncake_store 127.0.0.1:50051 ...``)."""

    def size(n: int) -> str:
        for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if n >= 1 << shift:
                return f"{round(n / (1 << shift), 2):g}{unit}"
        return f"{n}B"

    parts = []
    for t in config.tiers:
        kind = tier_kind(t)
        if isinstance(t, MooncakeStoreTierConfig):
            parts.append(f"{kind} (master {t.master}, metadata {t.metadata_server}, {t.protocol}"
                         f"{', device ' + t.device if t.device else ''}, host {t.local_hostname}, "
                         f"segment {size(t.segment_size)}"
                         f"{', tenant ' + t.tenant_id if t.tenant_id != DEFAULT_TENANT else ''})")
        elif isinstance(t, LmdbTierConfig):
            parts.append(f"{kind} {size(t.capacity)} at {t.path or default_cache_dir() / 'lmdb'}")
        elif isinstance(t, HostTierConfig) or hasattr(t, "capacity"):
            cap = getattr(t, "capacity", 0)
            parts.append(f"{kind} {size(cap)}" if isinstance(cap, int) and cap else kind)
        else:
            parts.append(kind)
    tag = f"; namespace_tag {config.namespace_tag!r}" if config.namespace_tag else ""
    return f"tiers {', '.join(parts)}; policy {config.policy.name}{tag}"
