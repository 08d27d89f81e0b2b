"""SGLang's built-in Mooncake backend configuration, read as SGLang 0.5.23 reads it, and the wait
for a store server its ``check_server`` asks for.

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

What this module touches: the extra-config mapping, the JSON file and the environment mapping it
is handed (``os.environ`` when none: these variables are the built-in's contract, read here as the
built-in reads them rather than through ``envs``), and, for ``check_server``, the master's metrics
port over HTTP. It builds nothing of ours: ``builtin_translate`` turns a ``BuiltinSettings`` into
our tiers, and ``config_sources.resolve_config`` decides which form applies (ours come first).
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

from .config_text import MAX_CONFIG_BYTES
from .errors import ConfigError, TierError
from .files import read_regular_file

FILE_ENV = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"
EXTRA_SOURCE = "--hicache-storage-backend-extra-config"
ENV_SOURCE = "the MOONCAKE_* environment"
DEFAULT_TENANT = "default"
# The built-in's wait for a store server (``check_server``): SGLang's SETUP_TIMEOUT, its poll step.
CHECK_SERVER_TIMEOUT_S = 600.0
CHECK_SERVER_INTERVAL_S = 3.0


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
    raw = read_regular_file(p, limit=MAX_CONFIG_BYTES,
                            what=f"SGLang's Mooncake config file (named by ${FILE_ENV})")
    try:
        data = json.loads(raw.decode("utf-8"))
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


# ------------------------------------------------------------------------------ check_server

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
