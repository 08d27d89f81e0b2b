"""A registered host pool as stored objects, and the one path that moves its pages through the store.

Every page SGLang moves, whatever its API, goes ``move_pages``' way: hashes become keys in the pool's
namespace (``PoolObjects.keys``), whole pages (zero-copy views of host slots, or the legacy path's
flat page tensors) become views of their stored objects (``objects_of``), the store reads or
writes the objects, and a page counts only when all of its objects moved (``present_pages``).
The KV pool (``batch_*_v1``, legacy ``batch_get``/``batch_set``) and each sidecar pool
(``batch_*_v2``) differ only in their ``PoolObjects``: how a page is cut (whole, head groups, or
KV-page-sized parts) and its namespace.

This module touches the store through ``get_into``/``get_into_within``/``put_from`` only; which
sidecars a hybrid model has and which prefixes they restore are ``sidecars``' business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..api import PageKey, PageView
from ..keys import KV_POOL, KeyNamespace, page_key
from ..store.tiered_store import TieredStore
from . import layout
from .sglang_pool import HostPool


@dataclass(frozen=True)
class PoolObjects:
    """One registered host pool as stored objects: keys, views and parts of its pages."""

    name: str  # the ``PoolName`` value
    pool: HostPool
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
        return self.pool.logical

    def keys(self, hashes: Sequence[str]) -> list[PageKey]:
        """Keys of every stored object of ``hashes``' pages, page by page, parts in order."""
        if self.head_groups:
            return [page_key(ns, h) for h in hashes for ns in self.head_groups]
        if not self.chunk:
            return [page_key(self.namespace, h) for h in hashes]
        n = self.parts
        return [page_key(self.namespace, h, part) for h in hashes for part in range(n)]

    def pages(self, host_indices: torch.Tensor, npages: int) -> list[PageView]:
        """Zero-copy views of the whole pages at ``host_indices``.

        Raises:
            ValueError: indices outside the pool or not ``npages`` whole pages.
        """
        if self.logical:
            return []  # indices only: nothing to view, and ``move_pages`` moves nothing
        return layout.page_views(self.pool, self.geometry, host_indices, npages)

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


def kv_objects(pool: HostPool, geometry: layout.PoolGeometry, namespace: KeyNamespace, split: int = 1
               ) -> PoolObjects:
    """The KV pool's objects: whole pages, or ``split`` head groups per page (split heads).

    Raises:
        ValueError: ``split`` > 1 for a rank-replicated namespace.
    """
    groups = namespace.head_groups(split) if split > 1 else ()
    return PoolObjects(name=KV_POOL, pool=pool, geometry=geometry, namespace=namespace, chunk=0,
                       head_groups=groups)


def part_key(objects: PoolObjects, prior: str | None) -> PageKey | None:
    """The last stored object of the page before a chain (the policy's parent), if any."""
    return objects.keys([prior])[-1] if prior is not None and not objects.logical else None


def move_pages(store: TieredStore, objects: PoolObjects, hashes: Sequence[str],
               pages: Sequence[PageView], prior: str | None, write: bool) -> list[bool]:
    """Store (``write``) or load the whole ``pages`` of ``hashes`` (one page each); one bool per
    page, ``True`` when every object of it moved (or, for a write, was already there).
    ``prior``: the page hash before the chain, the policy's parent on a write.
    """
    if objects.logical:
        return [True] * len(hashes)  # indices only: the sidecars carry the page
    keys = objects.keys(hashes)
    views = objects.objects_of(pages)
    if write:
        ok = store.put_from(keys, views, part_key(objects, prior))
    else:
        ok = store.get_into(keys, views)
    return _pages_moved(objects, ok, len(keys))


def read_within(store: TieredStore, objects: PoolObjects, hashes: Sequence[str],
                pages: Sequence[PageView], seconds: float) -> list[bool] | None:
    """``move_pages``' read, given up after ``seconds`` (``None``: nothing was written into
    ``pages``, and nothing will be)."""
    if objects.logical:
        return [True] * len(hashes)
    keys = objects.keys(hashes)
    ok = store.get_into_within(keys, objects.objects_of(pages), seconds)
    return None if ok is None else _pages_moved(objects, ok, len(keys))


def _pages_moved(objects: PoolObjects, ok: Sequence[bool] | None, nkeys: int) -> list[bool]:
    """Per page, whether every object of it moved, from the store's answer per object."""
    moved = [bool(x) for x in (ok or [])][:nkeys]
    return objects.present_pages(moved + [False] * (nkeys - len(moved)))
