"""SGLang's built-in Mooncake backend configuration, read as SGLang 0.5.23 reads it and translated
into our tiers.

A deployment set up for SGLang's own ``MooncakeStore`` gets this package under the same name
(``--hicache-storage-backend mooncake``), so its configuration must keep working. The built-in
takes it from one of three forms, the first that applies (``MooncakeBaseStore._load_config``):

1. ``--hicache-storage-backend-extra-config`` when it holds ``master_server_address`` or
   ``client_server_address``;
2. the JSON file named by ``$SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``;
3. the ``MOONCAKE_*`` environment variables (``MOONCAKE_MASTER`` or ``MOONCAKE_CLIENT`` required).

Forms 1 and 2 fill a missing key with the built-in's default, not with its variable, except
``protocol`` (``$MOONCAKE_PROTOCOL`` when set) and ``local_hostname`` (``$MOONCAKE_LOCAL_HOSTNAME``,
then ``$LOCAL_HOSTNAME``, override the config's value). ``extra_backend_tag`` and
``enable_group_semantics`` are read from extra-config whichever form gave the rest.

The translation (``translate``) is the host tier of our embedded default over a ``mooncake_store``
tier with that master, metadata server, protocol, device, hostname and per-rank segment, plus our
LMDB SSD tier where ``enable_ssd_offload`` asks for SSD. A key with no equivalent is an error that
names it and says why; a key that changes nothing here says so in ``Translation.notes``, which the
backend logs at attach. ``config_sources.resolve_config`` decides which form applies (ours come first).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import (
    HostTierConfig,
    LmdbTierConfig,
    StoreConfig,
    default_cache_dir,
    parse_config,
)
from .errors import ConfigError, TierError

FILE_ENV = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
EXTRA_SOURCE = "--hicache-storage-backend-extra-config"
ENV_SOURCE = "the MOONCAKE_* environment"
DEFAULT_TENANT = "default"
# The built-in's wait for a store server (``check_server``): SGLang's SETUP_TIMEOUT, its poll step.
CHECK_SERVER_TIMEOUT_S = 600.0
CHECK_SERVER_INTERVAL_S = 3.0
MIN_SEGMENT = 16 << 20  # Mooncake's smallest segment (our mooncake_store tier refuses less)


@dataclass(frozen=True)
class _Key:
    """One key of the built-in's ``MooncakeStoreConfig``: its variable and its default."""
    env: str | None
    default: Any


# Exactly the keys ``MooncakeStoreConfig.load_from_extra_config`` / ``from_file`` read, with the
# variables ``load_from_env`` reads for them and the defaults of ``sglang.srt.environ``.
KEYS: dict[str, _Key] = {
    "master_server_address": _Key("MOONCAKE_MASTER", None),
    "client_server_address": _Key("MOONCAKE_CLIENT", None),
    "local_hostname": _Key("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
    "metadata_server": _Key("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
    "global_segment_size": _Key("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb"),
    "protocol": _Key("MOONCAKE_PROTOCOL", "rdma"),
    "device_name": _Key("MOONCAKE_DEVICE", ""),
    "master_metrics_port": _Key("MOONCAKE_MASTER_METRICS_PORT", 9003),
    "check_server": _Key("MOONCAKE_CHECK_SERVER", False),
    "standalone_storage": _Key("MOONCAKE_STANDALONE_STORAGE", False),
    "enable_ssd_offload": _Key("MOONCAKE_ENABLE_SSD_OFFLOAD", False),
    "ssd_offload_path": _Key("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", None),
    "tenant_id": _Key("MOONCAKE_TENANT_ID", DEFAULT_TENANT),
}
# Read by the built-in from extra-config only (we take them from its JSON file too).
EXTRA_ONLY_KEYS: dict[str, Any] = {"extra_backend_tag": None, "enable_group_semantics": False}
# In Mooncake's and SGLang's guides (the store-service JSON) but read by no SGLang 0.5.23 code.
GUIDE_ONLY_KEYS: dict[str, _Key] = {"local_buffer_size": _Key("MOONCAKE_LOCAL_BUFFER_SIZE", None)}
BUILTIN_KEYS = frozenset(KEYS) | frozenset(EXTRA_ONLY_KEYS) | frozenset(GUIDE_ONLY_KEYS)
# The variables of the env form (plus the hostname fallback every form honours).
BUILTIN_ENV = tuple(k.env for k in (*KEYS.values(), *GUIDE_ONLY_KEYS.values()) if k.env) + ("LOCAL_HOSTNAME",)
# Our own keys that may stand beside the built-in's in extra-config (the tiers come from theirs).
COMPATIBLE_OWN_KEYS = frozenset({"policy", "namespace_tag"})
# A parsed JSON value's type in JSON's words, for errors.
_JSON_TYPES = {type(None): "null", bool: "boolean", int: "number", float: "number", list: "array",
               dict: "object", str: "string"}


@dataclass(frozen=True)
class Ranks:
    """What the translation needs of SGLang's ``HiCacheStorageConfig``: the built-in splits the
    segment over ``tp_size * pp_size`` and picks a per-rank NIC from a JSON ``device_name``."""
    tp_size: int = 1
    pp_size: int = 1
    tp_rank: int = 0

    @classmethod
    def of(cls, storage_config: Any) -> Ranks:
        if storage_config is None:
            return cls()
        return cls(tp_size=int(getattr(storage_config, "tp_size", 1) or 1),
                   pp_size=int(getattr(storage_config, "pp_size", 1) or 1),
                   tp_rank=int(getattr(storage_config, "tp_rank", 0) or 0))


@dataclass(frozen=True)
class BuiltinSettings:
    """The built-in's configuration as SGLang would hold it, with where it came from."""
    form: str  # "extra-config", "file" or "env"
    source: str  # the flag, the file, or the environment: for errors and the attach line
    master_server_address: str | None
    client_server_address: str | None
    local_hostname: str
    metadata_server: str
    global_segment_size: int
    protocol: str
    device_name: str
    master_metrics_port: int
    check_server: bool
    standalone_storage: bool
    enable_ssd_offload: bool
    ssd_offload_path: str | None
    tenant_id: str
    extra_backend_tag: str | None = None
    enable_group_semantics: bool = False
    local_buffer_size: int | None = None
    notes: tuple[str, ...] = ()  # things read that change nothing, said at attach


@dataclass(frozen=True)
class Translation:
    """Our config for a built-in one, what changed nothing, and the wait ``check_server`` asks for."""
    config: StoreConfig
    settings: BuiltinSettings
    notes: tuple[str, ...] = ()
    check_server_url: str | None = None


# ------------------------------------------------------------------------------------ values

def parse_segment_size(value: Any) -> int:
    """The built-in's ``global_segment_size``: bytes (an int or a digit string) or ``"<n>gb"``,
    which SGLang reads as n GiB. Binary units (``512MiB``) are accepted too. ``ValueError``
    names the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"expected bytes or a size like \"4gb\", got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*(gb|kib|mib|gib|tib|b)?\s*", value.lower())
        if not m:
            raise ValueError(f"expected bytes or a size like \"4gb\" (GiB, as SGLang reads it) or "
                             f"\"512MiB\", got {value!r}")
        unit = {None: 1, "b": 1, "gb": 1 << 30, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
                "tib": 1 << 40}[m.group(2)]
        size = int(m.group(1)) * unit
    else:
        raise ValueError(f"expected bytes or a size like \"4gb\", got {type(value).__name__} {value!r}")
    if size < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return size


def _bool(value: Any, from_env: bool) -> bool:
    if isinstance(value, bool):
        return value
    if from_env and isinstance(value, str):
        # sglang's EnvBool spellings; it falls back to the default on any other, we refuse it.
        low = value.strip().lower()
        if low in ("true", "1", "yes", "y"):
            return True
        if low in ("false", "0", "no", "n"):
            return False
    if not from_env and isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"expected true or false, got {value!r}")


def _str(value: Any, _from_env: bool) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__} {value!r}")
    return value


def _port(value: Any, from_env: bool) -> int:
    if from_env and isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"expected a port 1..65535, got {value!r}")
    return value


def _tenant(value: Any, _from_env: bool) -> str:
    # SGLang's _normalize_tenant_id: None or blank means the default tenant.
    return DEFAULT_TENANT if value is None else (str(value).strip() or DEFAULT_TENANT)


def _optional_str(value: Any, from_env: bool) -> str | None:
    return None if value is None else _str(value, from_env)


def _segment(value: Any, _from_env: bool) -> int:
    return parse_segment_size(value)


_PARSE: dict[str, Callable[[Any, bool], Any]] = {
    "master_server_address": _optional_str, "client_server_address": _optional_str,
    "local_hostname": _str, "metadata_server": _str, "global_segment_size": _segment,
    "protocol": _str, "device_name": _str, "master_metrics_port": _port, "check_server": _bool,
    "standalone_storage": _bool, "enable_ssd_offload": _bool, "ssd_offload_path": _optional_str,
    "tenant_id": _tenant, "enable_group_semantics": _bool,
    "extra_backend_tag": lambda v, _e: None if v is None else str(v),
    "local_buffer_size": lambda v, _e: None if v is None else parse_segment_size(v),
}


def _value(key: str, raw: Any, *, from_env: bool, name: str, source: str) -> Any:
    try:
        return _PARSE[key](raw, from_env)
    except ValueError as e:
        raise ConfigError(f"{e}", key=name, source=source) from None


# ------------------------------------------------------------------------------------- forms

def has_builtin_form(extra_config: Mapping[str, Any] | None) -> bool:
    """Does extra-config itself carry the built-in's config (as the built-in decides)?"""
    extra = extra_config or {}
    return extra.get("master_server_address") is not None or extra.get("client_server_address") is not None


def _hostname(data: Mapping[str, Any], environ: Mapping[str, str], source: str,
              notes: list[str]) -> str:
    """``local_hostname`` with the built-in's per-process precedence (so one shared attach payload
    serves every node): $MOONCAKE_LOCAL_HOSTNAME, $LOCAL_HOSTNAME, the config's, ``localhost``."""
    given = data.get("local_hostname")
    if given is not None:
        given = _value("local_hostname", given, from_env=False, name="local_hostname", source=source)
    for var in ("MOONCAKE_LOCAL_HOSTNAME", "LOCAL_HOSTNAME"):
        if var in environ and (var == "MOONCAKE_LOCAL_HOSTNAME" or environ[var]):
            if given and given != environ[var]:
                notes.append(f"local_hostname {given!r} from {source} is overridden by ${var}="
                             f"{environ[var]!r} (the built-in's per-node precedence)")
            return environ[var]
    return given or KEYS["local_hostname"].default


def _from_mapping(data: Mapping[str, Any], form: str, source: str,
                  environ: Mapping[str, str]) -> BuiltinSettings:
    """The extra-config and file forms: missing keys take the built-in's defaults."""
    notes: list[str] = []
    values: dict[str, Any] = {}
    for key, spec in KEYS.items():
        if key == "local_hostname":
            values[key] = _hostname(data, environ, source, notes)
        elif key == "protocol" and key not in data and spec.env in environ:
            # The built-in's one fallback to a variable here (an image that sets MOONCAKE_PROTOCOL).
            values[key] = _value(key, environ[spec.env], from_env=True, name=spec.env, source=ENV_SOURCE)
        else:
            values[key] = _value(key, data.get(key, spec.default), from_env=False, name=key, source=source)
    for key, default in EXTRA_ONLY_KEYS.items():
        values[key] = _value(key, data.get(key, default), from_env=False, name=key, source=source)
    values["local_buffer_size"] = _value("local_buffer_size", data.get("local_buffer_size"),
                                         from_env=False, name="local_buffer_size", source=source)
    unread = [k.env for name, k in KEYS.items()
              if k.env in environ and name not in ("protocol", "local_hostname")]
    if unread:
        notes.append(f"{', '.join('$' + v for v in unread)} not read: with the config in {source}, "
                     "missing keys take the built-in's defaults, not its variables (as SGLang does)")
    return BuiltinSettings(form=form, source=source, notes=tuple(notes), **values)


def read_extra_config(extra_config: Mapping[str, Any],
                      environ: Mapping[str, str] | None = None) -> BuiltinSettings:
    """The built-in's config from extra-config (which holds ``master_server_address`` or
    ``client_server_address``). Raises ``ConfigError`` naming a key of the wrong type or value."""
    environ = os.environ if environ is None else environ
    return _from_mapping(extra_config, "extra-config", EXTRA_SOURCE, environ)


def read_file(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None,
              extra_config: Mapping[str, Any] | None = None) -> BuiltinSettings:
    """The built-in's JSON config file (``$SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``). Its
    ``extra_backend_tag`` / ``enable_group_semantics`` may also come from extra-config, as the
    built-in reads them there. Raises ``ConfigError`` naming the file and the key."""
    environ = os.environ if environ is None else environ
    p = Path(path).expanduser()
    source = str(p)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read SGLang's Mooncake config file: {e.strerror} "
                          f"(named by ${FILE_ENV})", source=source) from None
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text (save the file as UTF-8)", source=source) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"malformed JSON line {e.lineno} column {e.colno}: {e.msg}",
                          source=source) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object, got {type(data).__name__}", source=source)
    unknown = sorted(set(data) - BUILTIN_KEYS)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}: not a key of SGLang's built-in Mooncake "
                          f"config ({', '.join(sorted(BUILTIN_KEYS))})", key=unknown[0], source=source)
    if data.get("master_server_address") is None and data.get("client_server_address") is None:
        raise ConfigError("either master_server_address or client_server_address is required "
                          "(as SGLang's built-in backend requires)", key="master_server_address",
                          source=source)
    settings = _from_mapping(data, "file", source, environ)
    return _with_extra_only(settings, extra_config)


def read_env(environ: Mapping[str, str] | None = None,
             extra_config: Mapping[str, Any] | None = None) -> BuiltinSettings:
    """The built-in's ``MOONCAKE_*`` variables (``MOONCAKE_MASTER`` or ``MOONCAKE_CLIENT`` set).
    Raises ``ConfigError`` naming the variable; SGLang would take the default for a value it
    cannot parse, we refuse it."""
    environ = os.environ if environ is None else environ
    if environ.get("MOONCAKE_MASTER") is None and environ.get("MOONCAKE_CLIENT") is None:
        raise ConfigError("either MOONCAKE_MASTER or MOONCAKE_CLIENT must be set", key="MOONCAKE_MASTER",
                          source=ENV_SOURCE)
    notes: list[str] = []
    values: dict[str, Any] = {}
    for key, spec in KEYS.items():
        if key == "local_hostname":
            values[key] = _hostname({}, environ, ENV_SOURCE, notes)
        elif spec.env in environ:
            values[key] = _value(key, environ[spec.env], from_env=True, name=spec.env, source=ENV_SOURCE)
        else:
            values[key] = _value(key, spec.default, from_env=False, name=spec.env, source=ENV_SOURCE)
    buf = GUIDE_ONLY_KEYS["local_buffer_size"].env
    values["local_buffer_size"] = _value("local_buffer_size", environ.get(buf), from_env=True, name=buf,
                                         source=ENV_SOURCE)
    settings = BuiltinSettings(form="env", source=ENV_SOURCE, notes=tuple(notes),
                               **values, **EXTRA_ONLY_KEYS)
    return _with_extra_only(settings, extra_config)


def _with_extra_only(settings: BuiltinSettings, extra_config: Mapping[str, Any] | None) -> BuiltinSettings:
    extra = extra_config or {}
    changes = {k: _value(k, extra[k], from_env=False, name=k, source=EXTRA_SOURCE)
               for k in EXTRA_ONLY_KEYS if k in extra}
    return dataclasses.replace(settings, **changes) if changes else settings


# ------------------------------------------------------------------------------- translation

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
    from .config import MooncakeStoreTierConfig, tier_kind

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


def wait_for_store_server(url: str, timeout_s: float = CHECK_SERVER_TIMEOUT_S,
                          interval_s: float = CHECK_SERVER_INTERVAL_S) -> float:
    """The built-in's ``check_server``: block until the master's ``/get_all_segments`` lists a
    segment (a store server has mounted memory). Returns the seconds waited.

    Raises: ``TierError`` when none appears within ``timeout_s``.
    """
    started = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                if r.read().strip():
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            raise TierError(f"check_server: no Mooncake store server mounted a segment within "
                            f"{math.ceil(timeout_s)} s ({url} listed none)")
        time.sleep(min(interval_s, left))
