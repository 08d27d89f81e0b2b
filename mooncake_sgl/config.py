"""The typed configuration: parsed once, frozen, validated with the key path and source in every error.

Which source a process's config comes from is ``config_sources``'s; this module is the schema.

Sizes are bytes or strings like ``64GiB``/``512MB``; durations are seconds or ``250ms``/``5s``/``2m``.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any, Literal, Union

import msgspec

from . import envs
from .errors import ConfigError
from .units import parse_duration, parse_size

# Tier kinds by speed, fastest first; kinds of one speed share a number. The one statement of the
# order: a store config must list its tiers in it, and the stats views sort by it.
TIER_SPEED = {"hbm": 0, "host": 1, "pool": 2, "mooncake_store": 2, "lmdb": 3}


def _speed_order() -> str:
    return ", ".join("/".join(k for k, s in TIER_SPEED.items() if s == speed)
                     for speed in sorted(set(TIER_SPEED.values())))


# A value the config prints in place of a secret (``config show``, logs).
REDACTED = "<redacted>"


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``"10.0.0.5:7480"`` → ``("10.0.0.5", 7480)``; ``[::1]:7480`` for IPv6. ``ValueError``
    names what is missing."""
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint must be host:port, got {endpoint!r}")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"endpoint port must be 1..65535, got {endpoint!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def default_cache_dir() -> Path:
    base = envs.XDG_CACHE_HOME.get() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mooncake_sgl"


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: frozen, unknown keys rejected, secrets kept out of reprs
    (a config that lands in a log or a traceback never shows one)."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={REDACTED if name == 'secret' and value else value!r}"
                           for name in self.__struct_fields__
                           for value in (getattr(self, name),))
        return f"{type(self).__name__}({fields})"

    def _normalise(self, **converters: Any) -> None:
        # Sizes and durations arrive as int-or-str; store them as numbers once.
        for name, conv in converters.items():
            try:
                value = conv(getattr(self, name))
            except ValueError as e:
                raise ValueError(f"`{name}`: {e}") from None
            msgspec.structs.force_setattr(self, name, value)


# ---------------------------------------------------------------------------------------- tiers

class HostTierConfig(_Section, tag="host", tag_field="kind"):
    """Host DRAM: one preallocated buffer carved into fixed-size slots."""
    capacity: Union[int, str] = "4GiB"
    # Largest page the tier takes; slots are this size. ``auto``: the first page written sets it.
    slot_size: Union[int, str] = "auto"
    # Pin (page-lock) the buffer when CUDA is present, for fast H2D/D2H copies.
    pin_memory: bool = True

    def __post_init__(self) -> None:
        self._normalise(capacity=parse_size)
        if self.slot_size != "auto":
            self._normalise(slot_size=parse_size)
        if self.capacity <= 0:
            raise ValueError("`capacity`: the host tier needs a positive capacity")
        if self.slot_size != "auto" and self.slot_size <= 0:
            raise ValueError("`slot_size`: must be positive")


class HbmTierConfig(_Section, tag="hbm", tag_field="kind"):
    """Spare GPU memory. Give ``capacity`` or ``fraction_of_free`` (of free HBM at start)."""
    capacity: Union[int, str] = 0
    fraction_of_free: float = 0.0
    device: str = "cuda"
    slot_size: Union[int, str] = "auto"

    def __post_init__(self) -> None:
        self._normalise(capacity=parse_size)
        if self.slot_size != "auto":
            self._normalise(slot_size=parse_size)
        if self.slot_size != "auto" and self.slot_size <= 0:
            raise ValueError("`slot_size`: must be positive")
        if not 0.0 <= self.fraction_of_free <= 0.95:
            raise ValueError("`fraction_of_free`: must be between 0 and 0.95")
        if not self.capacity and not self.fraction_of_free:
            raise ValueError("`capacity`: the hbm tier needs capacity or fraction_of_free")


class LmdbTierConfig(_Section, tag="lmdb", tag_field="kind"):
    """LMDB on local SSD: checksummed pages that survive restarts."""
    path: str = ""  # default: <cache dir>/lmdb
    # Budget for page bytes in the extent file (rounded up to 4 KiB each; preallocated as it fills).
    capacity: Union[int, str] = "64GiB"
    # fsync the page bytes, then the index, at every batch commit. Off (the default, as SGLang's own
    # file backend never fsyncs): a killed process loses nothing; a machine crash may lose recent
    # pages (they fail their checksum) or damage the index, which the tier then moves aside and
    # starts empty (it is a cache).
    sync: bool = False
    # LMDB ``writemap`` for the index (key -> extent, size, checksum); page bytes never pass
    # through LMDB's map. Damage either way is caught by the checksums and the open-time probe.
    writemap: bool = True
    # How page bytes reach the disk: "auto" writes through the page cache while the kernel takes
    # them faster than the disk would (the put returns at memory speed, reads of them are warm)
    # and with O_DIRECT once the kernel throttles the writer, as measured per batch
    # (``tiers/ssd/write_route``: the disk's own speed, no writeback in between);
    # "direct" always uses O_DIRECT, "buffered" never. O_DIRECT needs 4 KiB-aligned segments
    # (SGLang's host pool has them) and a file system that has it (tmpfs does not); other pages are
    # written through the page cache whatever this says.
    direct_io: Literal["auto", "direct", "buffered"] = "auto"
    max_readers: int = 256

    def __post_init__(self) -> None:
        # Expanded here, the one place the path is parsed: the tier, ``config check`` and the
        # built-in's ``ssd_offload_path`` all see the directory the tier will write, not ``./~``.
        self._normalise(capacity=parse_size, path=os.path.expanduser)
        if self.capacity < (1 << 20):
            raise ValueError("`capacity`: must be at least 1MiB")
        if not 1 <= self.max_readers <= 65536:  # LMDB's lock file has a slot per reader
            raise ValueError(f"`max_readers`: must be between 1 and 65536, got {self.max_readers}")


class PoolTierConfig(_Section, tag="pool", tag_field="kind"):
    """Our pooled DRAM store (``mooncake-sgl pool``), one or more endpoints."""
    endpoints: list[str] = msgspec.field(default_factory=lambda: ["127.0.0.1:7480"])
    transport: Literal["auto", "shm", "tcp", "rdma"] = "auto"
    # The tenant this deployment is on a multi-tenant pool ("" = the pool's single tenant), and
    # that tenant's secret.
    tenant: str = ""
    secret: str = ""
    connections: int = 4
    timeout: Union[float, str] = "5s"
    # A stopped (not dead) pool accepts connections but never answers, and a resolver whose DNS
    # is down takes its own time: resolving, connecting and the handshake must finish within
    # ``connect_timeout``, and a read's reply must start within ``first_byte_timeout``, or the
    # endpoint is skipped for ``retry_after``.
    connect_timeout: Union[float, str] = "1s"
    first_byte_timeout: Union[float, str] = "1s"
    retry_after: Union[float, str] = "2s"  # how long a dead endpoint is skipped before a retry

    def __post_init__(self) -> None:
        self._normalise(timeout=parse_duration, retry_after=parse_duration,
                        connect_timeout=parse_duration, first_byte_timeout=parse_duration)
        if not self.endpoints:
            raise ValueError("`endpoints`: the pool tier needs at least one endpoint")
        for ep in self.endpoints:
            try:
                parse_endpoint(ep)
            except ValueError as e:
                raise ValueError(f"`endpoints`: {e}") from None
        if not 1 <= self.connections <= 64:
            raise ValueError("`connections`: must be between 1 and 64")
        for name in ("timeout", "connect_timeout", "first_byte_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}`: must be longer than 0")


class MooncakeStoreTierConfig(_Section, tag="mooncake_store", tag_field="kind"):
    """The real Mooncake Store (master + transfer engine) as the remote tier."""
    # ``host:port`` of the master, or ``etcd://h1:2379;h2:2379`` to follow the leader of an HA set.
    master: str = "127.0.0.1:50051"
    # Transfer-engine metadata: P2PHANDSHAKE, http://master:8080/metadata, etcd://..., redis://...
    metadata_server: str = "P2PHANDSHAKE"
    protocol: Literal["tcp", "rdma"] = "tcp"
    device: str = ""  # RDMA NICs, e.g. "mlx5_0,mlx5_1"; empty: auto-discover
    local_hostname: str = "127.0.0.1"  # this node's address as the other nodes reach it
    # What this process contributes to the cluster's pool: 0 (a pure client) or at least 16MiB.
    segment_size: Union[int, str] = "4GiB"
    # Registered staging buffer for pages outside registered memory; also the largest such page.
    buffer_size: Union[int, str] = "256MiB"
    replicas: int = 1
    # Mooncake tenant (``setup(tenant_id=...)``): on a master with ``--enable_multi_tenants`` each
    # tenant sees only its own objects and has its own quota.
    tenant_id: str = "default"
    soft_pin_ttl: Union[float, str] = 0.0  # for pinned prefixes; 0 = never soft pin
    put_retry_window: Union[float, str] = "2s"  # back-off window on "no space" before giving up
    # Once the master's endpoint answers again: how long the client may take to recover by itself
    # before a fresh setup (which freezes the process for Mooncake's 2-7 s close; see the guide).
    reconnect_after: Union[float, str] = "10s"

    def __post_init__(self) -> None:
        self._normalise(segment_size=parse_size, buffer_size=parse_size,
                        soft_pin_ttl=parse_duration, put_retry_window=parse_duration,
                        reconnect_after=parse_duration)
        if self.replicas < 1:
            raise ValueError("`replicas`: must be at least 1")
        if not self.tenant_id.strip():
            raise ValueError("`tenant_id`: must not be empty (Mooncake's own is `default`)")
        if 0 < self.segment_size < (16 << 20):
            raise ValueError("`segment_size`: must be 0 (contribute nothing) or at least 16MiB "
                             "(Mooncake's smallest segment)")
        if self.buffer_size < (1 << 20):
            raise ValueError("`buffer_size`: must be at least 1MiB")


def tier_kind(config: msgspec.Struct) -> str:
    """The ``kind`` a tier section was tagged with in YAML (``host``, ``lmdb``, ...)."""
    return config.__struct_config__.tag


TierConfig = Union[HbmTierConfig, HostTierConfig, PoolTierConfig, MooncakeStoreTierConfig,
                   LmdbTierConfig]


# --------------------------------------------------------------------------------------- policy

class PinConfig(_Section):
    """Keep the pages of a prefix (e.g. a system prompt) in fast tiers for ``ttl``."""
    prefix_hash: str  # SGLang page hash of the first page of the pinned prefix
    ttl: Union[float, str] = "1h"

    def __post_init__(self) -> None:
        self._normalise(ttl=parse_duration)


# Knobs only the heat policy reads: set with another policy they would be silently ignored.
HEAT_ONLY = ("sketch", "half_life", "admission_min_hits", "admission_min_reuse", "demotion_min_hits",
             "promotion_min_hits", "probation_fraction")


class PolicyConfig(_Section):
    """Placement policy: ``adaptive`` (the default: evicts as whichever of LRU/ARC/LIRS/LFU-DA its
    shadow caches rate best, per tier), ``heat`` (decayed frequency, prefix-aware, admission filter
    for slow tiers) or the ``lru`` baseline. docs/replay_hit_ratio.md compares them."""
    name: Literal["adaptive", "heat", "lru"] = "adaptive"
    # Heat estimator: ``count_min`` (count-min sketch of byte counters saturating at 15, halved
    # every 10 accesses per page of capacity, so its memory horizon follows the cache size) or
    # ``decay`` (exponentially decayed counters with ``half_life``). Both are fixed-size;
    # docs/replay_hit_ratio.md compares them.
    sketch: Literal["count_min", "decay"] = "count_min"
    # Half-life of access heat in logical seconds; only the ``decay`` sketch has one (10m when
    # unset), and setting it for ``count_min`` is an error rather than a silently ignored key.
    half_life: Union[float, str, None] = None
    # Heat a page needs before it is written to a slower tier (DRAM pool, SSD); 1 = write-through.
    admission_min_hits: int = 2
    # Colder pages are written to a slower tier anyway while at least this share of them is looked
    # up again within that tier's residence time (measured online); 1.0 = never, 0.0 = always.
    admission_min_reuse: float = 0.1
    # Heat a victim of a tier needs to be moved down a tier instead of dropped.
    demotion_min_hits: int = 2
    # Heat a page found in a slower tier needs to be copied back into tier 0.
    promotion_min_hits: int = 2
    # Starting share of each tier for newcomers not yet reused; it then adapts to the workload.
    probation_fraction: float = 0.1
    pins: list[PinConfig] = msgspec.field(default_factory=list)
    # A capacity curve per bounded tier: the hit ratio it would have had at 1/8x to 8x its size
    # (``policy/curve.py``; ``/metrics``, ``mooncake-sgl stats``). Off by default: its cost per
    # looked-up page (22-57 us under lru and heat, 0.3-0.7 ms under adaptive, in the thread that
    # feeds the policy) is measured in docs/capacity_curves.md and not yet small.
    capacity_curves: bool = False

    def __post_init__(self) -> None:
        if self.name != "heat":
            defaults = {f.name: f.default for f in msgspec.structs.fields(PolicyConfig)}
            stray = [k for k in HEAT_ONLY if getattr(self, k) != defaults[k]]
            if stray:
                raise ValueError(f"{', '.join(f'`{k}`' for k in stray)}: only the heat policy uses "
                                 f"{'this' if len(stray) == 1 else 'these'}, and the policy is "
                                 f"`{self.name}`; add `name: heat` to the policy section, or remove "
                                 f"{'it' if len(stray) == 1 else 'them'}")
        if self.pins and self.name == "lru":
            raise ValueError("`pins`: the lru policy keeps no pins, so they would be silently ignored; "
                             "use `name: adaptive` or `name: heat`, or remove them")
        if self.half_life is not None and self.sketch != "decay":
            raise ValueError("`half_life`: only the decay sketch has a half-life; remove it or set "
                             "`sketch: decay`")
        if self.sketch == "decay":
            self._normalise(half_life=lambda v: parse_duration("10m" if v is None else v))
            if self.half_life <= 0:
                raise ValueError("`half_life`: must be positive")
        for name in ("admission_min_hits", "demotion_min_hits", "promotion_min_hits"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0.0 <= self.admission_min_reuse <= 1.0:
            raise ValueError("admission_min_reuse must be between 0 and 1")
        if not 0.0 < self.probation_fraction < 1.0:
            raise ValueError("probation_fraction must be between 0 and 1 (exclusive)")


# ---------------------------------------------------------------------------------------- store

def _default_tiers() -> list[TierConfig]:
    return [HostTierConfig(), LmdbTierConfig()]


class StoreConfig(_Section):
    """What ``--hicache-storage-backend-extra-config`` holds."""
    tiers: list[TierConfig] = msgspec.field(default_factory=_default_tiers)
    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    # Tenant tag in every key: deployments with different tags never share pages.
    namespace_tag: str = ""

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("`tiers`: at least one tier is required")
        kinds = [tier_kind(t) for t in self.tiers]
        for kind in set(kinds):
            if kinds.count(kind) > 1 and kind != "pool":
                raise ValueError(f"tier kind '{kind}' is configured more than once")
        ranks = [TIER_SPEED[k] for k in kinds]
        if ranks != sorted(ranks):
            raise ValueError(f"tiers must be listed fastest first ({_speed_order()}); got {kinds}")


# --------------------------------------------------------------------------------------- loading

_MERGE_TAG = "tag:yaml.org,2002:merge"


def _not_a_name(key: Any, raw: str) -> str:
    # Every key we read is a field name; YAML 1.1 turns some bare words into other types.
    if isinstance(key, (list, dict, set, tuple)):
        shape = "list" if isinstance(key, (list, tuple)) else "map"
        return f"a key must be a name like `capacity`, not a {shape} (a `[...]`, `{{...}}` or `? ` key)"
    if key is None:
        return "a key is empty (null); keys are names like `capacity`"
    kind = "true/false" if isinstance(key, bool) else "number" if isinstance(key, (int, float)) \
        else type(key).__name__
    return (f"key {raw!r} reads as a {kind}, not a name; keys are names like `capacity` "
            "(quote it if you mean the word)")


@functools.cache
def _strict_loader() -> type:
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """Keys must be names and given once per mapping (PyYAML silently keeps the last, and a
        list or map as a key is a TypeError deep inside it); text must be valid Unicode."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[str] = set()
            if isinstance(node, yaml.MappingNode):
                for key_node, _ in node.value:
                    if key_node.tag == _MERGE_TAG:  # ``<<: *base``; the merged keys are checked below
                        continue
                    key = self.construct_object(key_node, deep=True)
                    if not isinstance(key, str):
                        raise yaml.constructor.ConstructorError(
                            None, None, _not_a_name(key, getattr(key_node, "value", "")),
                            key_node.start_mark)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (given twice in one mapping)",
                            key_node.start_mark)
                    seen.add(key)
            mapping = super().construct_mapping(node, deep)
            stray = next((k for k in mapping if not isinstance(k, str)), _MERGE_TAG)
            if stray is not _MERGE_TAG:  # a non-name key that came in through a ``<<`` merge
                raise yaml.constructor.ConstructorError(None, None, _not_a_name(stray, str(stray)),
                                                        node.start_mark)
            return mapping

        def construct_text(self, node: Any) -> str:
            value = self.construct_scalar(node)
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "text holds a lone surrogate escape (\\ud800..\\udfff), which is "
                    "not a character", node.start_mark) from None
            return value

    StrictLoader.add_constructor("tag:yaml.org,2002:str", StrictLoader.construct_text)
    return StrictLoader


def _yaml_load(text: str, source: str) -> Any:
    """Plain data from YAML text; every problem is a ``ConfigError`` naming ``source`` and the line."""
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where, problem = f" line {mark.line + 1} column {mark.column + 1}", e.problem
        elif isinstance(e, yaml.reader.ReaderError):  # a control character: it knows only an offset
            where = f" line {text.count(chr(10), 0, e.position) + 1}"
            problem = f"character {ord(e.character) if isinstance(e.character, str) else e.character:#06x} " \
                      "is not allowed in YAML"
        else:
            where, problem = "", str(e)
        raise ConfigError(f"malformed YAML{where}: {problem}", source=source) from None
    except RecursionError:
        raise ConfigError("nested too deeply to parse (a config is a few levels deep)",
                          source=source) from None


def _line_of_key(text: str, key: str) -> int | None:
    """The 1-based line of the node at ``key`` (``tiers[0].capacity``) in YAML or JSON ``text``,
    or of the deepest part of that path the text has (a missing field: its parent)."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None
    line = None
    for part in re.findall(r"\[(\d+)\]|([^.\[\]]+)", key):
        index, name = part
        if index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            node = node.value[int(index)]
        elif name and isinstance(node, yaml.MappingNode):
            hits = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == name]
            if not hits:
                break
            key_node, node = hits[-1]
            line = key_node.start_mark.line + 1
            continue
        else:
            break
        line = node.start_mark.line + 1
    return line


def _key_from_msgspec(message: str) -> tuple[str, str | None]:
    # msgspec says e.g. "Object contains unknown field `foo` - at `$.tiers[0]`".
    m = re.search(r" - at `\$\.?(.*)`$", message)
    path = m.group(1) if m else ""
    body = message[: m.start()] if m else message
    # Name the field itself when the message is about one (unknown key, or a value we rejected).
    field_m = re.search(r"unknown field `([^`]+)`", body) or re.match(r"`([^`]+)`: ", body)
    if field_m:
        path = f"{path}.{field_m.group(1)}" if path else field_m.group(1)
        if body.startswith("`"):
            body = body[field_m.end():]
    if path.endswith(".kind") and body.startswith("Invalid value"):
        body += " (tier kinds: hbm, host, pool, mooncake_store, lmdb)"
    return body, path or None


def _holds_lone_surrogate(data: Any) -> bool:
    # Iterative, and each container once: YAML aliases share containers and may form a cycle.
    todo, seen = [data], set()
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, (dict, list)) and id(item) not in seen:
            seen.add(id(item))
            todo.extend(item.items() if isinstance(item, dict) else item)
        elif isinstance(item, tuple):
            todo.extend(item)
    return False


def parse_config(data: Any, source: str = "<dict>", cls: type = StoreConfig, *,
                 text: str | None = None) -> Any:
    """Build a frozen config from plain data; ``ConfigError`` names the key and the source (and,
    given the ``text`` the data was read from, the line of that key)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    if _holds_lone_surrogate(data):  # JSON and SGLang's dict may carry "\\ud800"; keys would break
        raise ConfigError("text holds a lone surrogate escape (\\ud800..\\udfff), which is not a "
                          "character", source=source)
    try:
        return msgspec.convert(data, cls, strict=False)
    except msgspec.ValidationError as e:
        body, key = _key_from_msgspec(str(e))
        line = _line_of_key(text, key) if text is not None and key else None
        raise ConfigError(body, key=key, source=f"{source} line {line}" if line else source) from None
    except RecursionError:
        raise ConfigError("nested too deeply (a config is a few levels deep)", source=source) from None


def load_config_file(path: str | os.PathLike[str], cls: type = StoreConfig) -> Any:
    data, text, source = read_config_file(path)
    return parse_config(data, source, cls, text=text)


def read_config_file(path: str | os.PathLike[str]) -> tuple[Any, str, str]:
    """(the file's data as plain builtins, its text, its path as errors name it), unvalidated.

    Raises: ``ConfigError`` for a file that cannot be read, is not UTF-8 or does not parse.
    """
    p = Path(path).expanduser()
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file: {e.strerror}", source=str(p)) from None
    except UnicodeDecodeError as e:
        line = p.read_bytes()[:e.start].count(b"\n") + 1
        raise ConfigError(f"not UTF-8 text: byte 0x{e.object[e.start]:02x} on line {line} "
                          "(save the file as UTF-8)", source=str(p)) from None
    if p.suffix == ".json":
        import json

        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"malformed JSON line {e.lineno} column {e.colno}: {e.msg}",
                              source=str(p)) from None
        except RecursionError:
            raise ConfigError("nested too deeply to parse (a config is a few levels deep)",
                              source=str(p)) from None
    else:
        data = _yaml_load(text, str(p))
    return data, text, str(p)


def redact(data: Any) -> Any:
    """``data`` (plain builtins) with every non-empty ``secret`` value replaced by ``REDACTED``."""
    if isinstance(data, dict):
        return {k: REDACTED if k == "secret" and v else redact(v) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


def dump_config(config: Any) -> str:
    """The effective config as YAML (defaults filled in, secrets redacted)."""
    import yaml

    return yaml.safe_dump(redact(msgspec.to_builtins(config)), sort_keys=False)
