"""The SSD tier's index records: what LMDB stores per page, and the helpers that read them.

A record is 32 bytes:

    magic "MSGX" | version u8 | flags u8 | reserved u16 | offset u64 | length u64 | xxh3_64 u64

The checksum is of the page bytes, seeded with the key, so bytes that reach the wrong key (a
flipped key or offset in the index) fail the check too.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import lmdb
import xxhash

from ...api import PageKey

RECORD = struct.Struct("<4sBBHQQQ")
# Segments from this size on are hashed by the streaming digest (the same value), which releases the
# GIL while it runs; the one-shot digest holds it for the whole segment (2 ms for 8 MiB), and the
# tier's I/O threads cannot take their next request meanwhile (``page_io``).
_STREAMED = 1 << 20
RECORD_BYTES = RECORD.size
MAGIC = b"MSGX"
VERSION = 2


def pack_record(offset: int, length: int, digest: int) -> bytes:
    return RECORD.pack(MAGIC, VERSION, 0, 0, offset, length, digest)


def checksum(key: PageKey, page: Sequence[memoryview]) -> int:
    """xxh3 of the page bytes, seeded by the key: bytes that reach the wrong key (a flipped key or
    offset in the index) fail the check too."""
    seed = xxhash.xxh3_64_intdigest(key)
    if len(page) == 1 and page[0].nbytes < _STREAMED:
        return xxhash.xxh3_64_intdigest(page[0], seed)
    h = xxhash.xxh3_64(seed=seed)
    for seg in page:
        h.update(seg)
    return h.intdigest()


def parse_record(value: bytes | memoryview) -> tuple[int, int, int] | None:
    """``(offset, length, checksum)`` of an index record, or ``None`` if it is not ours/intact."""
    if len(value) != RECORD_BYTES:
        return None
    magic, version, _, _, offset, length, digest = RECORD.unpack_from(value)
    if magic != MAGIC or version != VERSION:
        return None
    return offset, length, digest


def oldest_reader(env: lmdb.Environment) -> int | None:
    """Oldest snapshot any live reader of the environment holds, in any process. LMDB keeps this
    in its reader table; its text listing is the one way py-lmdb shows it."""
    oldest = None
    for line in env.readers().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            txn = int(parts[2])
            oldest = txn if oldest is None else min(oldest, txn)
    return oldest


class IndexFull(Exception):
    """The index map filled at item ``at`` of a write batch."""

    def __init__(self, at: int) -> None:
        super().__init__(at)
        self.at = at

