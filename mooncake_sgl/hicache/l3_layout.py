"""What our stored objects look like, for SGLang's ``/get_hicache_l3_cache_layout``.

SGLang's scheduler asks the built-in Mooncake backend for its object layout, so that external KV
routers can compute object keys and look them up in Mooncake. Ours cannot be computed from the
built-in's formula, so the reply says so (``enabled: false``) and describes our keys instead, from
the very functions that build them (``keys.page_key``, ``tiers.mooncake_store.object_name``).
"""

from __future__ import annotations

import abc
import logging
import pkgutil
from collections.abc import Sequence
from typing import Any

from ..config import tier_kind
from ..keys import KeyNamespace, page_key
from ..store import TieredStore
from ..tiers.mooncake_store import object_name
from .layout import PoolGeometry
from .plugin import BACKEND_CLASS, BACKEND_MODULE
from .touch_points import BUILTIN_STORE, TouchPoint

logger = logging.getLogger(__name__)


def describe(ns: KeyNamespace, geometry: PoolGeometry, store: TieredStore, tier_configs: Sequence[Any],
             sidecar_pools: Sequence[str], page_size: int | None,
             router_events: str = "off") -> dict[str, Any]:
    """The reply to ``describe_l3_object_layout`` for a backend keyed by ``ns``, over ``store``
    (tiers configured by ``tier_configs``) with ``sidecar_pools`` registered.

    Always ``enabled: false``: external KV routers compute the built-in backend's object keys
    (``{key_prefix}_{page_hash}{suffix}``) and look them up in Mooncake; ours are a namespace
    digest and the raw page hash, which that formula cannot produce, so an ``enabled`` reply would
    send routers after keys that never exist. ``hicache_object_layout.mooncake_sgl`` says what our
    keys are instead (formats, namespace, page bytes, tiers), identical on every rank because SGLang
    merges the ranks' replies and refuses ones that differ.
    """
    ours = {
        "namespace": _rank_template(ns),
        "namespace_digest": f"BLAKE2b-{8 * len(ns.digest)} of the namespace, this rank's "
                            "{tp_rank}, {pp_rank}, {cp_rank} filled in",
        "page_key": "namespace_digest bytes, b'h', the page hash's 32 bytes (its 64 hex digits)",
        "object_key": {"pool": "page_key", "lmdb": "page_key",
                       "mooncake_store": _object_key_template(ns)},
        "page_bytes": geometry.page_nbytes,
        "page_segments": list(geometry.segment_sizes),
        "tiers": [{"kind": tier_kind(cfg), "name": name, "shared": tier.capabilities.shared}
                  for cfg, name, tier in zip(tier_configs, store.names, store.tiers, strict=True)],
        "sidecar_pools": sorted(sidecar_pools),
        "router_events": _router_events(router_events, store, bool(sidecar_pools)),
    }
    return {
        "enabled": False,
        "backend": "mooncake",
        "page_size": page_size,
        "reason": "mooncake_sgl object keys are a namespace digest and the page hash, not the "
                  "built-in backend's '{key_prefix}_{page_hash}{suffix}' that external routers "
                  "compute; see hicache_object_layout.mooncake_sgl",
        "hicache_object_layout": {"pools": [], "is_mla_backend": ns.rank_replicated,
                                  "pp_rank": ns.pp_rank, "pp_size": ns.pp_size,
                                  "mooncake_sgl": ours},
    }


def _router_events(mode: str, store: TieredStore, hybrid: bool) -> dict[str, Any]:
    """What this backend announces on SGLang's KV event stream (``router_events``, docs/routing.md)."""
    if mode == "off":
        return {"mode": "off"}
    return {
        "mode": mode,
        "medium": "DISK",
        "tiers": [name for name, tier in zip(store.names, store.tiers) if not tier.capabilities.shared],
        "block_hash": "SGLang's own: the first 16 hex digits of the page hash as a signed 64-bit "
                      "integer; tokens and parent learned from SGLang's BlockStored events",
        "announced": "no pages: a hybrid model's KV pages are no hit without their sidecars" if hybrid
                     else "pages of requests without a LoRA adapter or cache_salt, once SGLang has "
                          "published their hash",
        "not_announced": "shared tiers (pool, Mooncake Store): every instance on them reads them",
    }


def _rank_template(ns: KeyNamespace) -> str:
    """``ns.describe()`` with this process's TP/PP/CP ranks as ``{tp_rank}``-style placeholders.

    Raises: ``ValueError`` if the namespace string no longer shows a rank where expected (the
    template would not fill back to this rank's namespace).
    """
    text, ranks = ns.describe(), {}
    for axis, rank, size in (("tp", ns.tp_rank, ns.tp_size), ("pp", ns.pp_rank, ns.pp_size),
                             ("cp", ns.cp_rank, ns.cp_size)):
        if axis == "tp" and ns.rank_replicated:
            continue  # MLA: one namespace for every TP rank
        token = f"|{axis}{rank}/{size}|" if axis != "cp" else f"|{axis}{rank}/{size}"
        if token not in text:
            raise ValueError(f"namespace {text!r} shows no {token!r}")
        text = text.replace(token, token.replace(f"{axis}{rank}/", f"{axis}{{{axis}_rank}}/"), 1)
        ranks[f"{{{axis}_rank}}"] = str(rank)
    filled = text
    for placeholder, rank in ranks.items():
        filled = filled.replace(placeholder, rank, 1)
    if filled != ns.describe():
        raise ValueError(f"namespace template {text!r} does not fill back to {ns.describe()!r}")
    return text


def _object_key_template(ns: KeyNamespace) -> str:
    """The Mooncake Store object key of a page, from the functions that build it."""
    probe = "f" * 64
    name = object_name(page_key(ns, probe))
    digest = ns.digest.hex()
    if digest not in name or not name.endswith(probe):
        raise ValueError(f"Mooncake object key {name!r} is not built from the namespace digest "
                         "and the page hash")
    return name[:-len(probe)].replace(digest, "{namespace_digest}", 1) + "{page_hash}"


def builtin_store_imports() -> bool:
    """True where SGLang's own ``MooncakeStore`` imports (another sglang, or a host without CUDA and
    without the CPU distribution's ``sgl_kernel`` stand-in: its scheduler then answers for us)."""
    try:
        pkgutil.resolve_name(BUILTIN_STORE)
    except Exception as e:
        logger.info("mooncake_sgl: SGLang's MooncakeStore is not importable (%s); "
                    "/get_hicache_l3_cache_layout will not reach this backend", e)
        return False
    return True


def serve_layout_queries(point: TouchPoint) -> bool:
    """Let SGLang's scheduler ask us for our L3 layout: our backend becomes a virtual subclass of
    ``point.target`` (SGLang's ``MooncakeStore``). True if registered now.

    ``Scheduler._hicache_l3_layout`` (its startup info and ``GET /get_hicache_l3_cache_layout``)
    calls ``describe_l3_object_layout`` only on instances of the built-in ``MooncakeStore``; any
    other backend under the name ``mooncake`` is answered "Mooncake storage is not attached",
    which is false. A virtual subclass (``ABCMeta.register``) passes that check without
    inheriting any of the built-in's code; nothing else in sglang 0.5.23 tests for the class.
    Runs while ``backend.py`` is being imported, whose class is defined by then.
    """
    builtin = pkgutil.resolve_name(point.target)
    ours = pkgutil.resolve_name(f"{BACKEND_MODULE}:{BACKEND_CLASS}")
    if issubclass(ours, builtin):
        return False
    abc.ABCMeta.register(builtin, ours)
    return True
