"""Hybrid-model pools (SGLang's v2 storage API): which objects a page has, their keys, their views,
and which prefixes a lookup may restore.

A hybrid model registers, beside its KV pool, sidecar host pools (``PoolName``): Mamba state,
sliding-window KV, the DSA indexer, DeepSeek V4's compressed pools, draft KV. SGLang moves KV pages
through ``batch_*_v1`` and sidecars through ``batch_*_v2`` in separate calls (a backup writes the
sidecars first, a prefetch reads KV first), and asks ``batch_exists_v2`` which prefixes can be
restored. Here each registered pool becomes a ``PoolObjects``: its namespace (derived from the KV
namespace, see ``keys.py``), its page geometry, and how a page is cut into stored parts.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from ..api import PageKey, PageView
from ..keys import KV_POOL, KeyNamespace, page_key
from . import layout

# Sidecars that SGLang shards by TP rank even when the model's KV is replicated (MLA): Kimi-K3's
# Mamba/KDA state. SGLang's own backend keys these per rank too.
_TP_SHARDED_POOLS = frozenset({PoolName.MAMBA.value})


@dataclass(frozen=True)
class PoolObjects:
    """One registered host pool as stored objects: keys, views and parts of its pages."""

    name: str  # the ``PoolName`` value
    pool: Any
    geometry: layout.PoolGeometry
    namespace: KeyNamespace
    chunk: int  # bytes per stored part; 0 = the page is one object (the KV pool itself)
    # Split heads (KV only): one namespace per head group of a page, each group its own object
    # (``layout.head_group_views``); empty when the page is stored whole.
    head_groups: tuple[KeyNamespace, ...] = ()

    @property
    def parts(self) -> int:
        """Stored objects per page."""
        if self.head_groups:
            return len(self.head_groups)
        if not self.chunk:
            return 1
        return max(1, -(-self.geometry.page_nbytes // self.chunk))

    @property
    def object_nbytes(self) -> int:
        """Bytes of the largest stored object of a page (what a host slot must hold)."""
        if self.head_groups:
            return self.geometry.page_nbytes // len(self.head_groups)
        return min(self.chunk, self.geometry.page_nbytes) if self.chunk else self.geometry.page_nbytes

    @property
    def logical(self) -> bool:
        """A pool that only hands out indices (DeepSeek V4's KV anchor): no bytes to move."""
        return not self.geometry.segment_sizes

    def keys(self, hashes: Sequence[str]) -> list[PageKey]:
        """Keys of every stored object of ``hashes``' pages, page by page, parts in order."""
        if self.head_groups:
            return [page_key(ns, h) for h in hashes for ns in self.head_groups]
        if not self.chunk:
            return [page_key(self.namespace, h) for h in hashes]
        n = self.parts
        return [page_key(self.namespace, h, part) for h in hashes for part in range(n)]

    def views(self, host_indices: torch.Tensor, npages: int) -> list[PageView]:
        """Views of every stored object of the pages at ``host_indices``, in ``keys`` order.

        Raises:
            ValueError: indices outside the pool or not ``npages`` whole pages.
        """
        return self.objects_of(layout.page_views(self.pool, self.geometry, host_indices, npages))

    def objects_of(self, pages: Sequence[PageView]) -> list[PageView]:
        """Whole pages (zero-copy or flat views) → the views of their stored objects, in ``keys``
        order."""
        if self.head_groups:
            split = len(self.head_groups)
            return [group for page in pages for group in layout.head_group_views(page, split)]
        if not self.chunk:
            return list(pages)
        return [part for page in pages for part in chunk_page(page, self.chunk)]

    def present_pages(self, found: Sequence[bool]) -> list[bool]:
        """Per page: are all its parts among ``found`` (one bool per object, ``keys`` order)."""
        n = self.parts
        return [all(found[i * n:(i + 1) * n]) for i in range(len(found) // n)]


def chunk_page(page: PageView, chunk: int) -> list[PageView]:
    """Cut a page's segments into consecutive parts of ``chunk`` bytes (the last may be shorter).
    The parts alias the page's memory."""
    parts: list[PageView] = []
    current: list[memoryview] = []
    room = chunk
    for seg in page:
        off = 0
        while off < seg.nbytes:
            take = min(room, seg.nbytes - off)
            current.append(seg[off:off + take])
            off += take
            room -= take
            if not room:
                parts.append(current)
                current, room = [], chunk
    if current:
        parts.append(current)
    return parts


def is_rank_replicated(cfg: Any, name: str, pool: Any) -> bool:
    """Do all TP ranks hold the same bytes for this pool's pages (so they share its keys)?

    As MLA KV: the sidecars of a rank-replicated model are replicated (DSA indexer, DeepSeek V4
    compressed pools, an MLA draft), except pools SGLang shards by TP rank anyway: Mamba state and
    MHA-layout pools (an MHA draft or SWA pool splits heads across ranks).
    """
    if not layout.is_rank_replicated(cfg) or name in _TP_SHARDED_POOLS:
        return False
    return not hasattr(pool, "v_buffer")


def kv_objects(pool: Any, geometry: layout.PoolGeometry, namespace: KeyNamespace, split: int = 1
               ) -> PoolObjects:
    """The KV pool's objects: whole pages, or ``split`` head groups per page (split heads).

    Raises:
        ValueError: ``split`` > 1 for a rank-replicated namespace.
    """
    groups = namespace.head_groups(split) if split > 1 else ()
    return PoolObjects(name=KV_POOL, pool=pool, geometry=geometry, namespace=namespace, chunk=0,
                       head_groups=groups)


def logical_geometry(pool: Any) -> layout.PoolGeometry:
    """Geometry of a pool with no buffer (``kv_buffer is None``): indices only, no segments."""
    return layout.PoolGeometry(page_size=layout.pool_page_size(pool),
                               layout=str(getattr(pool, "layout", "")), dtype="none",
                               segment_sizes=(), flat_order=())


def sidecar_objects(cfg: Any, kv: PoolObjects, name: str, pool: Any) -> PoolObjects:
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


# ---------------------------------------------------------------------------------- store calls
# ``store`` is the backend's ``TieredStore``; these raise on a broken call and the backend turns
# that into the pool's miss.

def part_key(objects: PoolObjects, prior: str | None) -> PageKey | None:
    """The last stored object of the page before a chain (the policy's parent), if any."""
    return objects.keys([prior])[-1] if prior is not None and not objects.logical else None


def evidence(store: Any, objects: PoolObjects, transfer: PoolTransfer, keys: Sequence[str],
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


def heat_trailing(store: Any, looked_up: Sequence[tuple[PoolObjects, PoolTransfer]],
                  found: Sequence[PoolEvidence], keys: Sequence[str], hit: int) -> None:
    """A prefetch of ``hit`` pages loads each trailing pool's window ending there: look those
    objects up as an access, so they heat with their KV pages (``contains`` teaches nothing)."""
    for (objects, _), ev in zip(looked_up, found):
        if ev.policy == PoolHitPolicy.TRAILING_PAGES and hit:
            store.exists_prefix(objects.keys(keys[max(0, hit - ev.window):hit]))


def move(store: Any, objects: PoolObjects, hashes: list[str], host_indices: Any, prior: str | None,
         write: bool) -> list[bool]:
    """Store (``write``) or load one pool's pages at ``host_indices``; one bool per page.

    Raises: ``ValueError`` for indices outside the pool or not one page per hash.
    """
    if objects.logical:
        return [True] * len(hashes)
    keys = objects.keys(hashes)
    views = objects.views(host_indices, len(hashes))
    if write:
        ok = store.put_from(keys, views, part_key(objects, prior))
    else:
        ok = store.get_into(keys, views)
    ok = [bool(x) for x in (ok or [])][:len(keys)]
    return objects.present_pages(ok + [False] * (len(keys) - len(ok)))
