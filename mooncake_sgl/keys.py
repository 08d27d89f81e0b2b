"""Page keys: the one place a ``PageKey`` is derived.

A key is ``namespace digest (16 bytes) || kind byte || page hash``. The namespace covers everything
that changes the bytes of a page for the same tokens — model, KV dtype, host layout, page size,
TP/PP/CP coordinates and a tenant tag — so two deployments that differ in any of them never read
each other's pages (SGLang #33268 left dtype out, #17265 left the tag out of ``exists``). MLA pages
are identical on every TP rank, so the TP rank is left out there and all ranks share the writer's
pages. The digest is BLAKE2b of a canonical string, never Python's ``hash`` (salted per process).

Sidecar objects of hybrid models (Mamba state, sliding-window KV, DSA indexer, DeepSeek V4
compressed pools, draft KV) live in their own namespace: the KV namespace plus the pool name, the
pool's own dtype, layout, page size and segment sizes, and whether the pool is rank-replicated
(MLA-derived sidecars are shared by all TP ranks, as MLA KV is; Mamba state is TP-sharded). A
sidecar object larger than the store's page unit is kept as ``chunk``-byte parts, each its own key
(``part``), so the chunk size is part of the namespace too. The KV namespace's describe string is
unchanged by these fields, so KV keys written before sidecars existed stay readable.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

from .api import PageKey

NAMESPACE_DIGEST_BYTES = 16
KV_POOL = "kv"
_HEX_HASH = b"h"  # page hash given as hex (SGLang's SHA-256 chain): stored as raw bytes
_TEXT_HASH = b"s"  # any other page hash: stored as UTF-8
_PART = b"#"  # sidecar keys: the part number follows as 4 big-endian bytes


@dataclass(frozen=True)
class KeyNamespace:
    model: str
    dtype: str
    layout: str
    page_size: int
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    rank_replicated: bool = False  # MLA: every TP rank holds the same page
    tag: str = ""
    pool: str = KV_POOL  # SGLang's ``PoolName`` value of the objects in this namespace
    segments: tuple[int, ...] = ()  # sidecars: bytes of each zero-copy segment of one page
    chunk: int = 0  # sidecars: bytes per stored part (0: one part per page)
    weights: str = ""  # fingerprint of the checkpoint ("": not known, as before fingerprints)
    digest: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hashlib.blake2b(
            self.describe().encode(), digest_size=NAMESPACE_DIGEST_BYTES).digest())

    def describe(self) -> str:
        """Readable, canonical form of the namespace (what the digest is taken over)."""
        tp = "tp*" if self.rank_replicated else f"tp{self.tp_rank}/{self.tp_size}"
        return (f"v1|tag={self.tag}|model={self.model}|dtype={self.dtype}|layout={self.layout}"
                f"|page={self.page_size}|{tp}|pp{self.pp_rank}/{self.pp_size}"
                f"|cp{self.cp_rank}/{self.cp_size}" + self._sidecar_part()
                + (f"|weights={self.weights}" if self.weights else ""))

    def head_groups(self, split: int) -> tuple[KeyNamespace, ...]:
        """The namespaces of this rank's ``split`` head groups: the lcm-grid ranks
        ``tp_rank * split ... tp_rank * split + split - 1`` of grid size ``tp_size * split``.

        Raises:
            ValueError: ``split`` below 1, or a rank-replicated namespace (its pages are whole on
                every rank; SGLang never splits them).
        """
        if split < 1 or (self.rank_replicated and split > 1):
            raise ValueError(f"head groups: split {split} of a "
                             f"{'rank-replicated' if self.rank_replicated else 'per-rank'} namespace; "
                             "split is a positive count, and only per-rank (MHA) pages split")
        return tuple(replace(self, tp_rank=self.tp_rank * split + i, tp_size=self.tp_size * split)
                     for i in range(split))

    def _sidecar_part(self) -> str:
        if self.pool == KV_POOL:
            return ""
        segments = ",".join(str(n) for n in self.segments)
        return f"|pool={self.pool}|segments={segments}|chunk={self.chunk}"


def page_key(namespace: KeyNamespace, page_hash: str, part: int | None = None) -> PageKey:
    """The key of one page (or of part ``part`` of a chunked sidecar object). Deterministic
    across processes, hosts and restarts.

    Raises:
        ValueError: ``part`` given for a KV namespace, or negative.
    """
    if part is None:
        return namespace.digest + page_hash_part(page_hash)
    if namespace.pool == KV_POOL or part < 0:
        raise ValueError(f"part {part} of a page in pool {namespace.pool!r}: parts are for sidecar "
                         "namespaces and start at 0")
    return namespace.digest + page_hash_part(page_hash) + _PART + part.to_bytes(4, "big")


def page_hash_part(page_hash: str) -> bytes:
    """The namespace-free tail of a page key: what identifies the page within any namespace (the
    policy matches configured pins on it)."""
    if len(page_hash) == 64:
        try:
            return _HEX_HASH + bytes.fromhex(page_hash)
        except ValueError:
            pass
    return _TEXT_HASH + page_hash.encode()


_BOARD_PREFIX = hashlib.blake2b(b"mooncake_sgl namespace board v1",
                                digest_size=NAMESPACE_DIGEST_BYTES).digest() + b"b"


def board_key(slot: int) -> PageKey:
    """The key of slot ``slot`` of the namespace board (``hicache.namespace_board``): a digest no
    namespace's describe string produces, so it never names a page.

    Raises:
        ValueError: ``slot`` outside 0..255.
    """
    if not 0 <= slot < 256:
        raise ValueError(f"namespace board slot {slot}: slots are 0..255")
    return _BOARD_PREFIX + bytes([slot])


def is_board_key(key: PageKey) -> bool:
    """Whether ``key`` names a namespace board slot rather than a page (the pool never evicts a
    page to make room for one)."""
    return len(key) == len(_BOARD_PREFIX) + 1 and key.startswith(_BOARD_PREFIX)


def event_hash(key: PageKey) -> int | None:
    """The block hash SGLang's KV events give the page ``key`` names, when no ``extra_key`` or
    ``cache_salt`` namespaced it: the first 16 hex digits of its page hash as a signed 64-bit
    integer (``sglang.srt.mem_cache.utils.hash_str_to_int64``). ``None`` for a key whose page
    hash is not SGLang's 64-hex-digit one."""
    start = NAMESPACE_DIGEST_BYTES
    if len(key) != start + 33 or key[start:start + 1] != _HEX_HASH:
        return None
    return int.from_bytes(key[start + 1:start + 9], "big", signed=True)


def namespace_of(key: PageKey) -> bytes:
    """The namespace digest a page key was built under."""
    return key[:NAMESPACE_DIGEST_BYTES]


def hash_part_of(key: PageKey) -> bytes:
    """The ``page_hash_part`` a page key was built from (the namespace digest stripped): the one
    place besides ``page_key`` that knows the key layout."""
    return key[NAMESPACE_DIGEST_BYTES:]
