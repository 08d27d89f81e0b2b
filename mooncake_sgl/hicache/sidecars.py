"""Hybrid-model pools (SGLang's v2 storage API): how a sidecar pool is stored, and which prefixes a
lookup may restore.

A hybrid model registers, beside its KV pool, sidecar host pools (``PoolName``): Mamba state,
sliding-window KV, the DSA indexer, DeepSeek V4's compressed pools, draft KV. SGLang moves KV pages
through ``batch_*_v1`` and sidecars through ``batch_*_v2`` in separate calls (a backup writes the
sidecars first, a prefetch reads KV first), and asks ``batch_exists_v2`` which prefixes can be
restored. Here each sidecar pool becomes a ``page_objects.PoolObjects``: its namespace (derived from
the KV namespace, see ``keys.py``), its page geometry, and how a page is cut into stored parts; its
pages then move like the KV pool's (``page_objects.move_pages``).

Parts: the store's host tiers keep fixed slots of one KV page (``slot_size: auto``), and a Mamba
state is often many KV pages large. So a sidecar page larger than the KV page is stored as
KV-page-sized parts, each its own key; a page counts as present only when all its parts are.

Consistency rule (kept consistent, not one unit): KV pages and sidecar objects are separate keys
with the same access events, and a prefix is offered only when every object it needs is present,
checked at lookup (``resolve``) and again by SGLang's own clamps on the reads. Why not one unit:
SGLang writes and reads the pools in separate calls, trailing sidecars (Mamba, SWA) exist only at
node ends, not at every page, and a KV page is shared by every longer prefix while a trailing state
belongs to one; tying them into one object would need a multi-call transaction and would evict a
KV page that longer prefixes still use. The lookup feeds the policy the objects it will read (the
KV chain, each all-pages sidecar chain, the trailing window it picked), so heat and admission treat
a page and its sidecars alike and they age together.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang.srt.mem_cache.hicache_storage import (
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from ..store.tiered_store import TieredStore
from . import layout
from .page_objects import PoolObjects, part_key
from .sglang_config import StorageRank
from .sglang_pool import HostPool

logger = logging.getLogger(__name__)

# Sidecars that SGLang shards by TP rank even when the model's KV is replicated (MLA): Kimi-K3's
# Mamba/KDA state. SGLang's own backend keys these per rank too.
_TP_SHARDED_POOLS = frozenset({PoolName.MAMBA.value})


def is_rank_replicated(cfg: StorageRank, name: str, pool: HostPool) -> bool:
    """Do all TP ranks hold the same bytes for this pool's pages (so they share its keys)?

    As MLA KV: the sidecars of a rank-replicated model are replicated (DSA indexer, DeepSeek V4
    compressed pools, an MLA draft), except pools SGLang shards by TP rank anyway: Mamba state and
    MHA-layout pools (an MHA draft or SWA pool splits heads across ranks).
    """
    if not layout.is_rank_replicated(cfg) or name in _TP_SHARDED_POOLS:
        return False
    return pool.kind != "mha"


def sidecar_objects(cfg: StorageRank, kv: PoolObjects, name: str, pool: HostPool) -> PoolObjects:
    """A sidecar pool in the namespace derived from the KV pool's; parts of one KV page each."""
    geometry = layout.pool_geometry(pool)
    chunk = kv.object_nbytes or geometry.page_nbytes
    namespace = dataclasses.replace(
        kv.namespace, dtype=geometry.dtype, layout=geometry.layout, page_size=geometry.page_size,
        rank_replicated=is_rank_replicated(cfg, name, pool), pool=name,
        segments=geometry.segment_sizes, chunk=chunk)
    return PoolObjects(name=name, pool=pool, geometry=geometry, namespace=namespace, chunk=chunk)


def pool_name(name: Any) -> str:
    """The plain value of a ``PoolName`` (or of the string SGLang passed)."""
    return str(name.value if isinstance(name, PoolName) else name)


def trailing_window(keys: Sequence[str] | None) -> int:
    """Pages a trailing-pages pool needs before a stop point, as SGLang's backends count it."""
    return max(1, len(keys) if keys else 1)


def block_group_pages(present: Sequence[bool], block_pages: int, group_pages: int, span: int) -> int:
    """Pages covered by the leading complete key groups of a ``BLOCK_GROUPS`` pool.

    Group ``g`` is keys ``[g * group_pages, (g + 1) * group_pages)`` and stands for the ``g``-th
    block of ``block_pages`` FULL pages from the span start; a partial trailing group is not
    complete. The verdict is capped at the span.

    Raises:
        ValueError: a non-positive block or group size.
    """
    if block_pages <= 0 or group_pages <= 0:
        raise ValueError(f"BLOCK_GROUPS transfer needs block_pages > 0 and group_pages > 0, got "
                         f"{block_pages} and {group_pages}")
    groups = 0
    while (groups + 1) * group_pages <= len(present) and all(
            present[groups * group_pages:(groups + 1) * group_pages]):
        groups += 1
    return min(groups * block_pages, span)


@dataclass(frozen=True)
class PoolEvidence:
    """What a lookup found for one transfer: per page of the span, is its object present."""

    name: Any  # the transfer's name, as SGLang passed it (reported back under it)
    policy: PoolHitPolicy
    present: list[bool]
    window: int = 1  # TRAILING_PAGES
    block_pages: int = 0  # BLOCK_GROUPS
    group_pages: int = 0


def resolve(kv_pages: int, pools: Sequence[PoolEvidence]) -> PoolTransferResult:
    """Which prefixes are restorable, from the KV run and each pool's evidence.

    Follows ``HiCacheStorage.batch_exists_v2``: every KV prefix length ``1..kv_pages`` starts
    restorable; an all-pages pool keeps those up to its first missing page; a trailing-pages pool
    keeps a length when the window of pages ending there is complete (holes allowed, so the set is
    returned for the ranks to intersect); a block-groups pool reports its own verdict and never
    gates. Once nothing is restorable later pools are not consulted.
    """
    hit_count: dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
    restorable = set(range(1, kv_pages + 1))
    for ev in pools:
        if not restorable:
            break
        present = ev.present[:kv_pages] + [False] * (kv_pages - len(ev.present))
        if ev.policy == PoolHitPolicy.ALL_PAGES:
            boundary = present.index(False) if False in present else kv_pages
            keep = set(range(1, boundary + 1))
        elif ev.policy == PoolHitPolicy.TRAILING_PAGES:
            keep = {n for n in range(1, kv_pages + 1) if all(present[max(0, n - ev.window):n])}
            boundary = max(keep, default=0)
        elif ev.policy == PoolHitPolicy.BLOCK_GROUPS:
            boundary = block_group_pages(ev.present, ev.block_pages, ev.group_pages, kv_pages)
            keep = restorable
        else:
            raise ValueError(f"unknown pool hit policy {ev.policy!r} for pool {ev.name}")
        if boundary:
            hit_count[ev.name] = boundary
        restorable &= keep
    ordered = sorted(restorable)
    return PoolTransferResult(ordered[-1] if ordered else 0, hit_count, ordered)


def refuse_session_id(extra_info: Any) -> bool:
    """Say that a session id given with stored pages goes nowhere, and why; ``True`` once said.

    In SGLang 0.5.23 only the unified-cache external linker passes one
    (``--enable-unified-cache-external-linker``), and it builds SGLang's own ``MooncakeStore``,
    never a ``--hicache-storage-backend``; that backend hands it to Mooncake as
    ``ReplicateConfig.session_ids`` so that Mooncake's stored-KV events name the session. We
    write our own objects and emit no stored-KV events, and the installed Mooncake client's
    ``ReplicateConfig`` may not have the field at all. The pages are stored as usual.
    """
    # SGLang passes a ``HiCacheStorageExtraInfo`` or None; the getattr keeps a caller's other
    # object from failing the whole write at the boundary over a log line.
    session = (getattr(extra_info, "extra_info", None) or {}).get("session_id")
    if session is None:
        return False
    logger.warning("mooncake_sgl: refused: the session id %r given with stored pages is not "
                   "published: this backend emits no stored-KV events (the pages are stored; "
                   "SGLang's HiCache controller never passes one, only its unified-cache "
                   "external linker, which uses SGLang's own MooncakeStore)", session)
    return True


# ---------------------------------------------------------------------------------- store calls
# ``store`` is the backend's ``TieredStore``; these raise on a broken call and the backend turns
# that into the pool's miss.

def evidence(store: TieredStore, objects: PoolObjects, transfer: PoolTransfer, keys: Sequence[str],
             kv_pages: int, prior: str | None) -> PoolEvidence:
    """What the store holds of one transfer's pool over the KV hit (``batch_exists_v2``).

    All-pages and block-groups pools are asked as a chain (``exists_prefix``: the access event
    the policy learns heat from); a trailing-pages pool may have holes, so every page is asked.
    """
    policy = PoolHitPolicy(transfer.hit_policy)
    if policy == PoolHitPolicy.TRAILING_PAGES:
        present = objects.present_pages(store.contains(objects.keys(keys[:kv_pages])))
    else:
        span = list(transfer.keys or keys) if policy == PoolHitPolicy.BLOCK_GROUPS else list(keys[:kv_pages])
        run = int(store.exists_prefix(objects.keys(span), part_key(objects, prior)))
        present = [i < run // objects.parts for i in range(len(span))]
    return PoolEvidence(name=transfer.name, policy=policy, present=present,
                        window=trailing_window(transfer.keys), block_pages=int(transfer.block_pages),
                        group_pages=int(transfer.group_pages))


def heat_trailing(store: TieredStore, looked_up: Sequence[tuple[PoolObjects, PoolTransfer]],
                  found: Sequence[PoolEvidence], keys: Sequence[str], hit: int) -> None:
    """A prefetch of ``hit`` pages loads each trailing pool's window ending there: look those
    objects up as an access, so they heat with their KV pages (``contains`` teaches nothing)."""
    for (objects, _), ev in zip(looked_up, found):
        if ev.policy == PoolHitPolicy.TRAILING_PAGES and hit:
            store.exists_prefix(objects.keys(keys[max(0, hit - ev.window):hit]))


