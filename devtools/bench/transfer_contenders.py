"""The contenders of ``scripts/bench_transfer.py``: each a store that puts and gets batches of
pages across processes (or in this one), behind the same five calls, and ``CONTENDERS``, the one
line each adds.

A contender has ``put_batch(keys, pages)``, ``get_batch(keys, pages)``, ``exists_batch(keys)``
(or ``None`` when it has none), ``remove(keys)`` and ``close()``; its constructor takes a ``Ctx``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from devtools.testing.pool_process import PoolProcess
from mooncake_sgl.config import HostTierConfig
from mooncake_sgl.tiers.host import HostTier
from mooncake_sgl.transfer.client import PoolClient
from mooncake_sgl.transfer.tcp import recv_exact_into, send_buffers, tune

if TYPE_CHECKING:
    from devtools.testing.mooncake_master import MooncakeMaster


def page_aligned(nbytes: int) -> np.ndarray:
    """A buffer starting on a 4 KiB boundary, as SGLang's pinned host KV pool does. numpy's own
    large arrays start 16 bytes past one, and glibc's memcpy from page-aligned memory into such a
    destination runs ~5x slower on our AMD EPYC VMs (measured 1.8 vs 12 GB/s): an artefact of the
    buffer, not of the store being measured."""
    raw = np.empty(nbytes + 4096, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start:start + nbytes]


@dataclass
class Ctx:
    """What every contender is built from: one run's sizes and its two page buffers."""
    capacity: int  # bytes a contender's store must hold (one batch of the largest size, plus slack)
    max_batch_bytes: int
    src: np.ndarray  # the source pages of the largest batch, back to back
    dst: np.ndarray


# ---------------------------------------------------------------------------------- contenders

class PoolContender:
    def __init__(self, ctx: Ctx, transport: str):
        self.proc = PoolProcess(capacity=ctx.capacity, slab_size="32MiB", log_level="WARNING").start()
        self.client = PoolClient(self.proc.endpoint, transport=transport)
        self.get_batch = self.client.get_batch
        self.exists_batch = self.client.exists_batch
        self.remove = self.client.remove

    def put_batch(self, keys: list[bytes], pages: list) -> tuple[bool, ...]:
        return self.client.put_batch(keys, pages).ok

    def close(self) -> None:
        self.client.close()
        self.proc.close()


_MOONCAKE_STORAGE = textwrap.dedent("""
    import sys, time
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", sys.argv[1], int(sys.argv[2]), 16 << 20, "tcp", "", sys.argv[3])
    print("READY" if rc == 0 else f"FAILED {rc}", flush=True)
    sys.stdin.read()  # serve the segment until the benchmark closes our stdin
""")


def start_storage(master: MooncakeMaster, segment: int) -> subprocess.Popen:
    """A process owning a Mooncake segment of ``segment`` bytes, so that this one can be a pure
    client; served until ``stop_storage``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _MOONCAKE_STORAGE, master.metadata_url, str(segment), master.rpc_address],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=dict(os.environ, GLOG_minloglevel="2"))
    line = proc.stdout.readline().decode().strip()
    if line != "READY":
        raise RuntimeError(f"mooncake storage process: {line or 'exited'}")
    return proc


def stop_storage(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.terminate()
    proc.wait(10)


class MooncakeContender:
    """The real Mooncake Store, protocol tcp, zero-copy API on registered buffers."""

    def __init__(self, ctx: Ctx, in_process: bool):
        from mooncake.store import MooncakeDistributedStore

        from devtools.testing.mooncake_master import MooncakeMaster

        self.master = MooncakeMaster().start()
        self.storage = None
        segment = ctx.capacity
        if not in_process:
            self.storage = start_storage(self.master, segment)
            segment = 0
        self.store = MooncakeDistributedStore()
        rc = self.store.setup("127.0.0.1", self.master.metadata_url, segment, 64 << 20, "tcp", "",
                              self.master.rpc_address)
        if rc:
            raise RuntimeError(f"MooncakeDistributedStore.setup returned {rc}")
        for arr in (ctx.src, ctx.dst):
            if self.store.register_buffer(arr.ctypes.data, arr.nbytes):
                raise RuntimeError("register_buffer failed")

    @staticmethod
    def _ptrs(pages: list) -> tuple[list[int], list[int]]:
        ptrs = [np.frombuffer(p[0], dtype=np.uint8).ctypes.data for p in pages]
        return ptrs, [p[0].nbytes for p in pages]

    def put_batch(self, keys: list[bytes], pages: list) -> list[bool]:
        ptrs, sizes = self._ptrs(pages)
        return [r == 0 for r in self.store.batch_put_from([k.decode() for k in keys], ptrs, sizes)]

    def get_batch(self, keys: list[bytes], pages: list) -> list[bool]:
        ptrs, sizes = self._ptrs(pages)
        res = self.store.batch_get_into([k.decode() for k in keys], ptrs, sizes)
        return [r == n for r, n in zip(res, sizes)]

    def exists_batch(self, keys: list[bytes]) -> list[bool]:
        return [r == 1 for r in self.store.batch_is_exist([k.decode() for k in keys])]

    def remove(self, keys: list[bytes]) -> None:
        self.store.batch_remove([k.decode() for k in keys], True)

    def close(self) -> None:
        self.store.close()
        if self.storage is not None:
            stop_storage(self.storage)
        self.master.close()


def _sink(port_pipe: mp.connection.Connection, nbytes: int) -> None:
    """Raw-socket peer: one connection; 'P' len -> receive len bytes, ack; 'G' len -> send len."""
    buf = page_aligned(nbytes)
    buf.fill(1)  # touched: no page faults while timed
    view = memoryview(buf)
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port_pipe.send(ls.getsockname()[1])
    conn, _ = ls.accept()
    tune(conn)
    hdr = bytearray(9)
    while True:
        try:
            recv_exact_into(conn, memoryview(hdr))
        except Exception:
            return
        op, n = struct.unpack("<cQ", hdr)
        if op == b"P":
            recv_exact_into(conn, view[:n])
            conn.sendall(b"k")
        else:
            send_buffers(conn, [view[:n]])


class MooncakeTierContender:
    """Our ``MooncakeStoreTier`` as a pure client of the same master + storage-process setup as
    ``mooncake-tcp``, on the same registered pages: what the tier adds over Mooncake used directly."""

    def __init__(self, ctx: Ctx):
        from devtools.testing.mooncake_master import MooncakeMaster
        from mooncake_sgl.config import MooncakeStoreTierConfig
        from mooncake_sgl.tiers.mooncake_store import MooncakeStoreTier

        self.master = MooncakeMaster().start()
        self.storage = start_storage(self.master, ctx.capacity)
        self.tier = MooncakeStoreTier(MooncakeStoreTierConfig(
            master=self.master.rpc_address, metadata_server=self.master.metadata_url,
            segment_size=0, buffer_size="64MiB"))
        for arr in (ctx.src, ctx.dst):
            self.tier.register_memory(arr.ctypes.data, arr.nbytes)
        self.get_batch = self.tier.get_into
        self.exists_batch = self.tier.contains
        self.remove = self.tier.remove

    def put_batch(self, keys: list[bytes], pages: list) -> tuple[bool, ...]:
        return self.tier.put_from(keys, pages).ok

    def close(self) -> None:
        self.tier.close()
        stop_storage(self.storage)
        self.master.close()


class RawSocketContender:
    def __init__(self, ctx: Ctx):
        ctxmp = mp.get_context("fork")
        a, b = ctxmp.Pipe()
        self.proc = ctxmp.Process(target=_sink, args=(b, ctx.max_batch_bytes), daemon=True)
        self.proc.start()
        self.sock = socket.create_connection(("127.0.0.1", a.recv()))
        tune(self.sock)

    def put_batch(self, keys: list[bytes], pages: list) -> list[bool]:
        n = sum(s.nbytes for p in pages for s in p)
        send_buffers(self.sock, [struct.pack("<cQ", b"P", n), *(s for p in pages for s in p)])
        recv_exact_into(self.sock, memoryview(bytearray(1)))
        return [True] * len(keys)

    def get_batch(self, keys: list[bytes], pages: list) -> list[bool]:
        n = sum(s.nbytes for p in pages for s in p)
        self.sock.sendall(struct.pack("<cQ", b"G", n))
        for p in pages:
            for s in p:
                recv_exact_into(self.sock, s)
        return [True] * len(keys)

    exists_batch = None
    verify = False  # the peer holds one buffer, not pages by key

    def remove(self, keys: list[bytes]) -> None:
        pass

    def close(self) -> None:
        self.sock.close()
        self.proc.join(5)


class MemcpyContender:
    def __init__(self, ctx: Ctx):
        self.store = page_aligned(ctx.max_batch_bytes)
        self.store.fill(1)
        self.offsets: dict[bytes, int] = {}

    def put_batch(self, keys: list[bytes], pages: list) -> list[bool]:
        off = 0
        for k, p in zip(keys, pages):
            self.offsets[k] = off
            for s in p:
                np.copyto(self.store[off:off + s.nbytes], np.frombuffer(s, dtype=np.uint8))
                off += s.nbytes
        return [True] * len(keys)

    def get_batch(self, keys: list[bytes], pages: list) -> list[bool]:
        for k, p in zip(keys, pages):
            off = self.offsets[k]
            for s in p:
                np.copyto(np.frombuffer(s, dtype=np.uint8), self.store[off:off + s.nbytes])
                off += s.nbytes
        return [True] * len(keys)

    exists_batch = None

    def remove(self, keys: list[bytes]) -> None:
        self.offsets.clear()

    def close(self) -> None:
        pass


class HostTierContender:
    """Slot size is fixed by the first page, so the tier is rebuilt when the page size changes."""

    def __init__(self, ctx: Ctx):
        self.capacity = ctx.capacity
        self.tier: HostTier | None = None
        self.page = 0

    def _tier(self, pages: list) -> HostTier:
        size = sum(s.nbytes for s in pages[0])
        if self.tier is None or size != self.page:
            self.close()
            self.tier = HostTier(HostTierConfig(capacity=self.capacity, pin_memory=False))
            self.page = size
        return self.tier

    def put_batch(self, keys: list[bytes], pages: list) -> tuple[bool, ...]:
        return self._tier(pages).put_from(keys, pages).ok

    def get_batch(self, keys: list[bytes], pages: list) -> list[bool]:
        return self._tier(pages).get_into(keys, pages)

    def exists_batch(self, keys: list[bytes]) -> list[bool]:
        assert self.tier is not None
        return self.tier.contains(keys)

    def remove(self, keys: list[bytes]) -> None:
        if self.tier is not None:
            self.tier.remove(keys)

    def close(self) -> None:
        if self.tier is not None:
            self.tier.close()
            self.tier = None


# One line per contender: name -> (constructor, role). Role "ours", "baseline" or "limit".
CONTENDERS: dict[str, tuple[Callable[[Ctx], object], str]] = {
    "pool-shm": (lambda c: PoolContender(c, "shm"), "ours"),
    "pool-tcp": (lambda c: PoolContender(c, "tcp"), "ours"),
    "mooncake-tcp": (lambda c: MooncakeContender(c, in_process=False), "baseline"),
    "mooncake-tier": (MooncakeTierContender, "ours"),
    "raw-socket": (RawSocketContender, "limit"),
    "memcpy": (MemcpyContender, "limit"),
    "mooncake-inproc": (lambda c: MooncakeContender(c, in_process=True), "baseline"),
    "host-tier": (HostTierContender, "ours"),
}
