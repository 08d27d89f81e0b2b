"""Exceptions of mooncake_sgl. Per-page failures are values (``False``), not exceptions; these
are for a component that is broken, closed or misconfigured as a whole.

    MooncakeSglError
    ├── ConfigError            bad YAML, unknown key, bad size; names the key and the file
    ├── TierError              a tier as a whole cannot serve
    │   ├── TierUnavailable    unreachable peer, master down (callers turn it into misses)
    │   ├── TierClosed         used after close()
    │   └── TierFull           no room and nothing evictable (carries a hint)
    └── ProtocolError          a malformed, truncated, oversized or wrong-version frame
        └── AuthError          wrong or missing shared secret

Where they become misses: a tier's error (any exception from a tier call) becomes a miss in one
place, ``store.tier_calls.TierCalls``, so nothing above the store's tier calls sees one. The SGLang
adapter (``hicache/backend.py``) turns what the store itself raises (bad arguments, a bug) into a
miss as a last resort, since SGLang's storage threads must never see an exception. Both log through
``failure_log.FailureLog``: one WARNING per operation per interval, with the count held back.
"""

from __future__ import annotations


class MooncakeSglError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(MooncakeSglError, ValueError):
    """A configuration is invalid. The message names the key path and the source file."""

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None):
        where = " ".join(p for p in (f"at '{key}'" if key else "", f"in {source}" if source else "") if p)
        super().__init__(f"{message} ({where})" if where else message)
        self.key = key
        self.source = source


class TierError(MooncakeSglError):
    """A tier cannot serve requests."""


class TierUnavailable(TierError):
    """The tier's backing service or peer cannot be reached right now."""


class TierClosed(TierError):
    """The tier was closed."""


class TierFull(TierError):
    """No room for a page and nothing can be evicted."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(f"{message}. {hint}" if hint else message)
        self.hint = hint


class ProtocolError(MooncakeSglError):
    """A wire frame is malformed, truncated, too large, or of an unsupported version."""


class AuthError(ProtocolError):
    """The peer presented no or the wrong shared secret."""
