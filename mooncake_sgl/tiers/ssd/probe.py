"""Is an LMDB environment safe to open? Asked of a child process, because the answer can be a crash.

LMDB trusts its file. A truncated ``data.mdb`` (a full file system, a machine crash) or damaged
B-tree pages make it abort on an assertion (``IS_LEAF(mp)``, rc 134) when ``writemap`` re-extends
the file with zeros, or die of SIGBUS (rc 135) reading past the end of the map without it. Either
kills the process that opened the file: for the SSD tier, SGLang's scheduler. No check in this
process can be sure to catch every such page before LMDB touches it, so a child opens the
environment, walks every key and value of every database (the index only: page bytes live in the
extent file) and tries a write that it aborts (LMDB's free list is only read when allocating). A
child that dies or reports an error means the environment is damaged.

Cost: one interpreter start plus the walk, about 0.1 s for an empty or small index and well under
a second for a million pages (``scripts/bench_tiers.py --restart``); paid once per open, and only
when a ``data.mdb`` exists.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys

import lmdb

from ...errors import TierError

logger = logging.getLogger(__name__)

# Arbitrary; a walk of a very large index on a slow disk must not be mistaken for damage.
_PROBE_TIMEOUT_S = 300.0
READ_ONLY = "is on a read-only file system"

# "opening" tells a damaged file apart from a probe that could not start.
_PROBE = """
import sys
sys.path.insert(0, sys.argv[3])
import lmdb
print("opening", flush=True)
env = lmdb.open(sys.argv[1], subdir=True, max_dbs=int(sys.argv[2]), map_size=int(sys.argv[4]),
                writemap=sys.argv[5] == "1", sync=False, metasync=False)
with env.begin(buffers=True) as txn:
    names = [bytes(k) for k, _ in txn.cursor()]
for name in names:
    try:
        db = env.open_db(name, create=False)
    except lmdb.Error:
        continue  # a plain key of an older layout, not a database
    with env.begin(db=db, buffers=True) as txn:
        for _ in txn.cursor():
            pass
# A write allocates pages through LMDB's free list, which no cursor walks; abort leaves the file
# as it was.
txn = env.begin(write=True)
txn.put(b"\\x00probe", b"\\x00" * 8192)
txn.abort()
print("intact", flush=True)
"""


def unwritable(path: str) -> str | None:
    """Why nothing may be written at ``path`` (``"is on a read-only file system"``, ``"is not
    writable by this process ..."``), or ``None``. Asked before the probe: LMDB opens its files
    for writing, so on such a file system the probe fails on an intact index, which is no damage."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return READ_ONLY
    except OSError:
        return None  # the open says what is wrong
    for p in (path, os.path.join(path, "data.mdb"), os.path.join(path, "lock.mdb")):
        if os.path.exists(p) and not os.access(p, os.W_OK):
            return f"is not writable by this process (no write permission on {p})"
    return None


def refuse_unwritable(path: str) -> None:
    """Raises ``TierError`` naming why, where nothing may be written at ``path``."""
    refused = unwritable(path)
    if refused is not None:
        raise TierError(_left_as_is(path, refused))


def open_failed(path: str, e: BaseException) -> TierError:
    """The error for an open of the tier at ``path`` that failed with ``e``."""
    refused = write_refusal(e)
    if refused is not None:
        return TierError(_left_as_is(path, refused))
    return TierError(f"cannot open LMDB tier at {path}: {e}. Check that the directory is writable "
                     "and on a local filesystem.")


def fix_for(refused: str) -> str:
    """What lets the tier write again, for what ``unwritable`` or ``write_refusal`` said."""
    return "mount it read-write" if refused == READ_ONLY else "give this user write permission there"


def _left_as_is(path: str, refused: str) -> str:
    # Its pages are intact: nothing to delete, only a disk to make writable.
    return (f"LMDB tier at {path} {refused}. Its files were left as they are (nothing is damaged): "
            f"{fix_for(refused)}, or point the tier's path at a writable disk.")


def write_refusal(e: BaseException) -> str | None:
    """The words for an open that failed because nothing may be written there, else ``None``.
    py-lmdb reports errno only in its message (``"<path>: Read-only file system"``)."""
    code, text = getattr(e, "errno", None), str(e)
    if code == errno.EROFS or text.endswith(os.strerror(errno.EROFS)):
        return READ_ONLY
    if code in (errno.EACCES, errno.EPERM) or text.endswith(os.strerror(errno.EACCES)):
        return f"is not writable by this process ({e})"
    return None


def damage_of(path: str, max_dbs: int, map_size: int, writemap: bool, empty_ok: bool = False
              ) -> str | None:
    """Why the environment at ``path`` cannot be opened safely, or ``None`` if it can (or there is
    nothing to open yet). The probe opens it as the tier will (``map_size``, ``writemap``), walks
    every key and value and tries one write it aborts. Never raises; a probe that cannot run at
    all is logged and passes.

    ``empty_ok``: an empty ``data.mdb`` is a fresh environment, not a lost one (nothing it should
    name exists yet). Another process creating the environment has it empty for a moment: taken
    for damage, the directory was moved aside under that process."""
    data = os.path.join(path, "data.mdb")
    try:
        if os.path.getsize(data) == 0:
            return None if empty_ok else "data.mdb is empty"
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"data.mdb cannot be read: {e}"
    try:
        where = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))
        child = subprocess.run([sys.executable, "-I", "-c", _PROBE, path, str(max_dbs), where,
                                str(map_size), "1" if writemap else "0"],
                               capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("could not check the LMDB index at %s before opening it (%s); opening it "
                       "unchecked", path, e)
        return None
    said = child.stdout.split()
    if child.returncode == 0 and said == ["opening", "intact"]:
        return None
    if "opening" not in said:
        logger.warning("could not check the LMDB index at %s before opening it (the probe failed "
                       "to start: %s); opening it unchecked", path, child.stderr.strip()[-500:])
        return None
    if child.returncode < 0:
        return f"opening it killed a probe process with signal {-child.returncode}"
    tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
    return f"a probe process exited with status {child.returncode}: {tail}"
