"""Which source the config of an SGLang process comes from, and the config it becomes.

Sources, first that applies wins (``resolve_config``):
1. the dict SGLang passes as ``storage_config.extra_config`` (from
   ``--hicache-storage-backend-extra-config @tiers.yaml`` or inline JSON): our keys, or SGLang's
   built-in Mooncake keys (``master_server_address`` ...; ``builtin_config``), never both kinds of
   tiers;
2. the YAML file named by ``$MOONCAKE_SGL_CONFIG``;
3. SGLang's built-in Mooncake JSON file named by ``$SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``;
4. SGLang's built-in ``MOONCAKE_*`` variables (with ``$MOONCAKE_MASTER`` set);
5. the embedded default: a host DRAM tier plus LMDB under the user's cache directory.
Forms 1 (built-in keys), 3 and 4 are SGLang's own, in its own order, translated into our tiers.

The schema is ``config``'s and reading config text into it ``config_text``'s; the built-in's forms
are read by ``builtin_config`` and translated by ``builtin_translate``, which builds on ``config``;
this module sits above them all, so ``config`` never imports the built-in's modules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import builtin_config as bc
from . import envs
from .builtin_translate import describe_tiers, translate
from .config import StoreConfig
from .config_text import parse_config, read_config_file
from .errors import ConfigError

CONFIG_ENV = envs.MOONCAKE_SGL_CONFIG.name

# Keys SGLang itself reads from extra_config (or the dynamic-backend loader does); we ignore them.
SGLANG_OWN_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "interface_v2", "tp_lcm_size",
    "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys", "file_storage_path",
})


@dataclass(frozen=True)
class ResolvedConfig:
    """The config an SGLang process runs on, which form it came from, and what it left unread."""
    config: StoreConfig
    source: str  # in words, for the attach log line
    notes: tuple[str, ...] = ()  # things given that change nothing here, and why
    # SGLang's built-in ``check_server``: wait for a store server at this URL before attaching.
    check_server_url: str | None = None

    def describe(self) -> str:
        """One line: the source, the tiers it became, and the notes."""
        notes = f"; note: {'; '.join(self.notes)}" if self.notes else ""
        return f"config from {self.source} -> {describe_tiers(self.config)}{notes}"


def _not_read(environ: Mapping[str, str], *names: str) -> list[str]:
    """Notes for later sources that are set too, so a shadowed one is never a silent surprise."""
    return [f"${var} is set but not read (an earlier source applies; see "
            "docs/configuration.md, where the config comes from)" for var in names if var in environ]


def resolve_config(extra_config: Mapping[str, Any] | None = None, storage_config: Any = None,
                   environ: Mapping[str, str] | None = None) -> ResolvedConfig:
    """The store config for an SGLang process (module docstring: the order of sources).

    Args:
        extra_config: ``storage_config.extra_config`` as SGLang passes it.
        storage_config: SGLang's ``HiCacheStorageConfig`` (TP/PP ranks for a built-in config,
            whose segment is split over the ranks); ``None``: one rank.
        environ: the process environment (``os.environ`` when ``None``).

    Raises:
        ConfigError: naming the key (or variable) and the source.
    """
    environ = os.environ if environ is None else environ
    # A null master or client address is absent to the built-in (``.get(...) is not None``).
    extra = {k: v for k, v in (extra_config or {}).items() if k not in SGLANG_OWN_KEYS
             and not (v is None and k in ("master_server_address", "client_server_address"))}
    theirs = sorted(set(extra) & bc.BUILTIN_KEYS)
    ours = sorted(set(extra) - bc.BUILTIN_KEYS)
    later_builtin = (bc.FILE_ENV, "MOONCAKE_MASTER", "MOONCAKE_CLIENT")
    if theirs:
        return _resolve_builtin(extra, theirs, ours, storage_config, environ)
    if "config_file" in extra:
        path = extra.pop("config_file")
        if not isinstance(path, str) or not path:  # JSON may give any value; Path() takes no number
            raise ConfigError(f"expected the path of a config file, got {path!r}",
                              key="config_file", source="extra_config")
        if extra:
            raise ConfigError("give either config_file or inline keys, not both",
                              key=sorted(extra)[0], source="extra_config")
        config, notes = our_file(path, "config_file")
        return ResolvedConfig(config, f"config_file {path}",
                              (*notes, *_not_read(environ, CONFIG_ENV, *later_builtin)))
    if extra:
        return ResolvedConfig(parse_config(extra, bc.EXTRA_SOURCE), bc.EXTRA_SOURCE,
                              tuple(_not_read(environ, CONFIG_ENV, *later_builtin)))
    path = envs.MOONCAKE_SGL_CONFIG.get(environ)
    if path:
        config, notes = our_file(path, f"${CONFIG_ENV}")
        return ResolvedConfig(config, f"${CONFIG_ENV}={path}", (*notes, *_not_read(environ, *later_builtin)))
    if bc.FILE_ENV in environ or "MOONCAKE_MASTER" in environ or "MOONCAKE_CLIENT" in environ:
        return _resolve_builtin(extra, [], [], storage_config, environ)
    stray = [v for v in bc.BUILTIN_ENV if v in environ and v != "LOCAL_HOSTNAME"]
    notes = [f"{', '.join('$' + v for v in stray)} set but not read: SGLang's built-in reads its "
             "MOONCAKE_* variables only with $MOONCAKE_MASTER set"] if stray else []
    return ResolvedConfig(StoreConfig(), "the embedded default", tuple(notes))


def our_file(path: str | os.PathLike[str], how: str | None = None) -> tuple[StoreConfig, tuple[str, ...]]:
    """Our config file and notes on what in it changes nothing; ``how`` names where it was given
    (config_file, a variable), ``None`` for SGLang's ``@FILE`` form. One in the built-in's JSON form
    gets an error that says where it goes.

    SGLang's own keys (``prefetch_threshold`` ...) in the file are left to SGLang: it reads them
    from the ``@FILE`` form, so one file serves every form; named any other way, the file's copy
    is noted as changing nothing.

    Raises: ``ConfigError`` naming the key and the file.
    """
    data, text, source = read_config_file(path)
    theirs = sorted(set(data) & SGLANG_OWN_KEYS) if isinstance(data, dict) else []
    notes = (f"{', '.join(theirs)} in {path} is SGLang's to read, which it does only from the "
             f"@FILE form or the extra-config JSON; named by {how}, the file's copy changes nothing",
             ) if theirs and how else ()
    try:
        return parse_config({k: v for k, v in data.items() if k not in theirs} if theirs else data,
                            source, StoreConfig, text=text), notes
    except ConfigError as e:
        if e.key not in bc.BUILTIN_KEYS:
            raise
        raise ConfigError(f"`{e.key}` is a key of SGLang's built-in Mooncake config, not ours: name "
                          f"that JSON file by ${bc.FILE_ENV}, or see `mooncake-sgl config show {path}` "
                          "for it in our form", key=e.key, source=e.source) from None


def _resolve_builtin(extra: dict[str, Any], theirs: list[str], ours: list[str], storage_config: Any,
                     environ: Mapping[str, str]) -> ResolvedConfig:
    """A config in SGLang's built-in form: extra-config keys, else its JSON file, else its
    variables (its own order), with our ``policy`` / ``namespace_tag`` allowed beside."""
    own_fields = set(StoreConfig.__struct_fields__) | {"config_file"}
    clash = [k for k in ours if k not in bc.COMPATIBLE_OWN_KEYS]
    if clash:
        k = clash[0]
        if k in own_fields:
            raise ConfigError(f"`{k}` is ours and {', '.join(theirs)} SGLang's built-in Mooncake "
                              "backend's: give the tiers in one form, ours (a mooncake_store tier "
                              "takes master, metadata_server, protocol ...) or the built-in's, not both",
                              key=k, source=bc.EXTRA_SOURCE)
        raise ConfigError(f"unknown key `{k}`: neither ours ({', '.join(sorted(own_fields))}) nor "
                          f"SGLang's built-in Mooncake backend's ({', '.join(sorted(bc.BUILTIN_KEYS))})",
                          key=k, source=bc.EXTRA_SOURCE)
    own = {k: extra[k] for k in ours}
    if bc.has_builtin_form(extra):
        settings = bc.read_extra_config(extra, environ)
        shadowed = _not_read(environ, CONFIG_ENV, bc.FILE_ENV)
    else:
        shadowed = []  # the file and env forms say which variables they leave unread themselves
        stray = [k for k in theirs if k not in bc.EXTRA_ONLY_KEYS]
        if stray:
            raise ConfigError(f"`{stray[0]}` is a key of SGLang's built-in Mooncake config, which reads "
                              "its extra-config keys only beside master_server_address (or "
                              "client_server_address) and would ignore it here: add "
                              "master_server_address", key=stray[0], source=bc.EXTRA_SOURCE)
        if theirs and envs.MOONCAKE_SGL_CONFIG.is_set(environ):
            raise ConfigError(f"`{theirs[0]}` applies to SGLang's built-in Mooncake config, but "
                              f"${CONFIG_ENV} names ours, which comes first; use namespace_tag there",
                              key=theirs[0], source=bc.EXTRA_SOURCE)
        if bc.FILE_ENV in environ:
            settings = bc.read_file(environ[bc.FILE_ENV], environ, extra)
        elif "MOONCAKE_MASTER" in environ or "MOONCAKE_CLIENT" in environ:
            settings = bc.read_env(environ, extra)
        else:
            raise ConfigError(f"`{theirs[0]}` is a key of SGLang's built-in Mooncake config, but none "
                              "was given (master_server_address here, "
                              f"${bc.FILE_ENV} or $MOONCAKE_MASTER); with our tiers use namespace_tag",
                              key=theirs[0], source=bc.EXTRA_SOURCE)
    translation = translate(settings, bc.Ranks.of(storage_config), own)
    source = f"SGLang's built-in Mooncake config in {settings.source}"
    return ResolvedConfig(translation.config, source, (*translation.notes, *shadowed),
                          translation.check_server_url)


def load_config(extra_config: dict[str, Any] | None = None) -> StoreConfig:
    """The store config for an SGLang process of one rank (``resolve_config``)."""
    return resolve_config(extra_config).config
