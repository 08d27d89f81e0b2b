"""Every environment variable mooncake_sgl reads or sets, declared once (SGLang's ``envs`` pattern).

The CPU-host distribution (``cpu_host/``, ``mooncake_sgl_cpu``) reads and sets its variables
through this registry too, so that the repository has one: ``MOONCAKE_SGL_CPU_ADAPTATIONS``,
``MOONCAKE_SGL_HOST_RESERVE`` and ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP`` are its.

Read one as ``envs.MOONCAKE_SGL_CONFIG.get()``, or ``.get(environ)`` with a mapping that stands in
for ``os.environ`` (tests, ``config_sources.resolve_config``). Unset or empty gives the declared default; a
malformed value raises ``EnvError`` naming the variable and what it expects, never a silently used
default. Variables we set for libraries we drive are declared here too (``set_default``: a value the
operator set wins).

Variables only the test and benchmark tools read live with them (``devtools/testing/tool_envs.py``).

Not declared here, on purpose: SGLang's built-in Mooncake backend's own variables
(``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``, ``MOONCAKE_MASTER``, ``MOONCAKE_PROTOCOL`` and the rest of
``builtin_config.BUILTIN_ENV``). They are the built-in's contract, read in ``builtin_config``
exactly as the built-in reads them (its precedence, its per-node hostname rule), so that a
deployment moving over keeps its environment; declaring them twice would give them two owners.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from .units import parse_size

T = TypeVar("T")

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class EnvError(ValueError):
    """An environment variable holds a value its reader cannot use."""


def _flag(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")


class EnvVar(Generic[T]):
    """One variable: its name, its default, and the parser that types its value."""

    def __init__(self, name: str, default: T, parse: Callable[[str], T], doc: str) -> None:
        self.name = name
        self.default = default
        self._parse = parse
        self.doc = doc

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The typed value (``os.environ`` when ``environ`` is ``None``); ``EnvError`` if malformed."""
        raw = (os.environ if environ is None else environ).get(self.name, "")
        if not raw.strip():
            return self.default
        try:
            return self._parse(raw.strip())
        except ValueError as e:
            raise EnvError(f"${self.name}={raw!r}: {e} ({self.doc})") from None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return bool((os.environ if environ is None else environ).get(self.name, "").strip())

    def set_default(self, value: object) -> None:
        """Set the variable for this process and its children unless the operator already did.

        ``value`` is written as the library that reads it expects (``1``/``0`` for a flag). An empty
        value counts as unset, as in ``get`` and ``is_set``: left empty, a flag we turn on would stay
        off while we logged it on."""
        if not self.is_set():
            os.environ[self.name] = str(value)


def _str(name: str, doc: str, default: str = "") -> EnvVar[str]:
    return EnvVar(name, default, str, doc)


def _int(name: str, doc: str, default: int) -> EnvVar[int]:
    return EnvVar(name, default, int, doc)


def _bool(name: str, doc: str) -> EnvVar[bool]:
    return EnvVar(name, False, _flag, doc)


# --------------------------------------------------------------------------- read by mooncake_sgl
MOONCAKE_SGL_CONFIG = _str("MOONCAKE_SGL_CONFIG", "YAML store config, when extra-config names none")
XDG_CACHE_HOME = _str("XDG_CACHE_HOME", "base of the default LMDB directory (~/.cache when unset)")
MOONCAKE_SGL_POOL_SECRET = _str("MOONCAKE_SGL_POOL_SECRET", "the pool's shared secret, for "
                                "`mooncake-sgl pool` when neither --secret nor the config gives one")
MOONCAKE_SGL_HOST_RESERVE: EnvVar[int | None] = EnvVar(
    "MOONCAKE_SGL_HOST_RESERVE", None, parse_size,
    "bytes SGLang keeps back from a HiCache host pool's size check, e.g. 512MiB")
MOONCAKE_SGL_CPU_ADAPTATIONS = _bool(
    "MOONCAKE_SGL_CPU_ADAPTATIONS", "adapt SGLang to serve HiCache on a host without an accelerator "
    "(the mooncake-sgl-cpu distribution, cpu_host/; off, it changes nothing in SGLang)")


# ------------------------------------------------------------- set by mooncake_sgl for its libraries
SGLANG_HICACHE_MOONCAKE_REUSE_TE = _bool(
    "SGLANG_HICACHE_MOONCAKE_REUSE_TE", "SGLang's shared transfer engine for its built-in backend "
    "(set off: nothing of ours uses it, and it fails the start on hosts without RDMA)")
MC_STORE_CLIENT_SETUP_RETRIES = _int("MC_STORE_CLIENT_SETUP_RETRIES",
                                     "Mooncake client setup retries against a dead master", 20)
SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP = _bool(
    "SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP", "SGLang sends a prefill's results before the next "
    "prefill batch runs (set on by the CPU-host distribution, when asked for)")
MC_RPC_TIMEOUT_MS = _int("MC_RPC_TIMEOUT_MS", "Mooncake client RPC timeout, milliseconds", 30000)

REGISTRY: tuple[EnvVar, ...] = tuple(v for v in list(globals().values()) if isinstance(v, EnvVar))
