"""The SSD tier (``kind: lmdb``): checksummed KV pages on local disk that survive crashes and restarts.

Design. One directory per rank holding an LMDB environment, the *index* (``data.mdb``,
``lock.mdb``), and an extent file with the page bytes (``pages.bin``, see ``extents``). The
index maps ``PageKey -> record`` (offset, length, checksum; 32 bytes, see ``records``).

Why each choice:

- *Disk speed.* Page bytes never pass through LMDB's memory map: a put writes the caller's
  segments into preallocated extents from writer threads while it checksums them, through the page
  cache or with ``O_DIRECT``, whichever the batches measured faster (a fresh tier's first large
  batch times both first; ``O_DIRECT`` from any memory, through a bounce buffer where it is not
  aligned); a get reads into the destination's segments and hashes them as they land, from the page
  cache where the pages are in it and, for a large batch, with ``O_DIRECT`` requests in flight where
  they are not (``page_io``, ``direct``). ``scripts/bench_tiers.py --modes disk-speed`` measures one
  batch of a fresh tier against ``dd`` on the same disk.
  Measured the way a user meets the tier (writer process, page cache dropped, new reader
  process), values kept in LMDB read 1.4-2.3x slower and were written 2-7x slower at 64 KiB and
  8 MiB than this; ``scripts/bench_tiers.py --modes user-view`` compares it with SGLang's
  ``HiCacheFile`` and the disk's ``O_DIRECT`` limit; ``extents`` says what each option gave.
- *Warm restart.* The index is LMDB's B-tree: whatever a committed transaction wrote is found by a
  new process (``scan`` yields it for the store to seed its policy). A page's bytes are written
  before the transaction naming them commits (and ``fdatasync``-ed first with ``sync``), so a
  process killed mid-batch leaves only unnamed bytes in free extents; the allocator is rebuilt
  from the index at open, so they are simply free again.
- *Damage never kills the opener.* A truncated or damaged ``data.mdb`` makes LMDB abort or die of
  SIGBUS, so a child process walks the index first (``probe``); a damaged environment is
  moved aside (its page file deleted, only the newest few kept: ``aside``) and the tier
  starts empty. Records naming bytes past the end of ``pages.bin`` are
  dropped at open; a short read later is a miss.
- *A failing disk never kills the reader.* LMDB reads its index through a map, where a page the
  kernel must read back from a disk that answers with an I/O error is SIGBUS. The maps are kept
  read in and locked in memory, each growth read in by a call that returns the error instead
  (``resident``); a failing disk is then misses, one log line, and reads again once it does.
- *Integrity.* The checksum is verified on every read, over the bytes as they landed in the
  destination; a mismatch is a miss, counted, and the page is deleted, so corrupt KV is never
  handed to the model (Mooncake #2236, SGLang #27504 show what silently wrong KV does).
- *Batched writes.* One write transaction per ``put_from`` batch: one commit (one fsync of each
  file with ``sync``) for up to 128 pages.
- *Capacity* is a budget on the extent file: page bytes rounded up to 4 KiB. A page that does not
  fit is a per-key ``False``, which the store answers by evicting. Freed extents are reused once
  no reader can still see the page they held (LMDB's own rule, applied to our extents).
- *A full disk refuses, never crashes.* Page bytes: the extent file grows only by
  ``posix_fallocate``, so a page that finds no disk is a ``False``, and its space goes back to the
  top rather than becoming a free extent past the end of the file. Index: LMDB grows ``data.mdb``
  by writing into it, which on a full file system is SIGBUS through the map or ENOSPC at commit,
  so its disk is allocated ahead of every write transaction (``index.room``); removals then still
  commit, and the space they free takes new pages. ``usage().room_bytes`` says what the disk still
  holds, so the store evicts here to keep writing rather than every write being refused while the
  oldest pages stay (``tests/adversarial/test_lmdb_full_disk.py``).
- *True means readable.* A key already present at the same size is ``True`` without a rewrite (the
  first value is kept); at a different size the page is replaced, so a read at the size just
  acknowledged hits.

Thread context: reads run in parallel (LMDB readers never block; ``preadv`` takes no lock); writes
take one in-process lock so a write transaction stays on one thread, and LMDB's own lock serialises
writers across processes.

Several processes on one directory (the TP ranks of an MLA model by design, two servers on one
host, a restart overlapping the old process's exit; ``tests/adversarial/test_ssd_shared_dir_stress.py``
kills them at random):

- LMDB tells live processes from dead ones, and the first opener from later ones, by POSIX locks
  on ``lock.mdb``, which closing *any* descriptor of it drops: ours stays open as long as the
  environment (py-lmdb refuses a second environment on a directory the process has open).
- Extents are allocated only inside a write transaction (one process at a time). A process whose
  expected transaction id is not the one it got rebuilds its allocator from the index first; at
  open the sweep and the rebuild read one write transaction, so no commit falls in between.
- Which extents each commit freed is kept in the index (a free log, pruned once no reader is
  older), so a rebuilt allocator reuses old free space at once and waits only for what readers
  of any process may still see.
- Reader slots of processes that died reading are freed when an allocation finds no reusable
  space, and every ``_READER_CHECK_S``.
- Records past this process's capacity are another process's (or a lowered capacity's) pages:
  kept and counted as used, never allocated over.
"""

from .records import RECORD_BYTES, parse_record
from .tier import LmdbTier, default_lmdb_path

__all__ = ["RECORD_BYTES", "LmdbTier", "default_lmdb_path", "parse_record"]
