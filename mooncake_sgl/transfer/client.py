"""``PoolClient``: batch put/get/exists against one pool endpoint over the best transport.

Transport choice (``transport="auto"``): connect over TCP and read the server's hello; if the
server offers a Unix socket and we can reach it and receive the segment's descriptor, we are on the
same host and use shared memory; else RDMA if both sides have a device; else TCP. ``"shm"``,
``"rdma"`` and ``"tcp"`` force one (``TierUnavailable`` explains why a forced one is impossible).

Batches: TCP sends a batch as one PUT frame (pages straight from the caller's memory) and reads a
GET reply straight into the caller's segments; a large batch is split into byte-balanced chunks
that run on up to ``connections`` connections at once. Shared memory and RDMA make two control
round trips per batch (RESERVE/COMMIT, LEASE/RELEASE — the release is one-way and rides ahead of
the next request) and move the bytes client-side.

Failures: any socket or protocol failure closes every connection and mapping of the endpoint and
raises ``TierUnavailable``; the next call reconnects (so a restarted server is found again). A
server that accepts but does not answer (stopped, not dead) fails fast: the handshake must finish
within ``connect_timeout`` and a read's reply must start within ``first_byte_timeout``, so a read
costs that, not the full ``timeout``. An idle connection the server closed is noticed before use
and replaced, not reported as a failure.

Holds. A one-sided batch is cut to half the bytes the server lets one process hold (HELLO_OK), and
pages are copied only while their reservation or lease is younger than half the server's
``hold_timeout``: a client stopped in the middle copies nothing into a slot the server may have
reused, and a read that took too long is a miss rather than bytes of uncertain age.

Thread-safe: each call borrows its own connection(s).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..api import PageKey, PageView, PutResult, page_nbytes
from ..config import parse_endpoint
from ..errors import AuthError, ProtocolError, TierClosed, TierUnavailable
from . import protocol as P
from .shm import SharedMapping
from .tcp import FramedConnection, open_connection, recv_exact_into

T = TypeVar("T")

# Below this many bytes a batch goes on one connection: splitting costs a round trip per chunk and
# a thread hand-off, which only pays for itself once the copy dominates. Arbitrary, measured.
SPLIT_BYTES = 32 << 20
# Shared-memory batches at least this large are copied by ``copy_threads`` threads (numpy releases
# the GIL for the copy); below it the hand-off costs more than it saves. Arbitrary, measured.
PARALLEL_COPY_BYTES = 32 << 20


def _per_key(values: Sequence[object], n: int, op: str) -> Sequence[object]:
    """A reply's per-key part, checked to have one entry per key sent (else the stream is not
    what we think: ``ProtocolError`` closes it)."""
    if len(values) != n:
        raise ProtocolError(f"{op} reply has {len(values)} entries for {n} keys")
    return values


def _put_codes(flags: bytes, n: int, op: str) -> list[int]:
    """A PUT or COMMIT reply's per-key bytes: 0 refused, 1 written, ``P.PUT_PRESENT`` already
    stored; any other byte means the stream is not what we think."""
    if any(f > P.PUT_PRESENT for f in _per_key(flags, n, op)):
        raise ProtocolError(f"{op} reply has a per-key result other than 0, 1 or {P.PUT_PRESENT}")
    return list(flags)


def _in_segment(offsets: Sequence[int], sizes: Sequence[int], segment_size: int) -> None:
    """Offsets a server handed out must lie inside the segment we mapped: never copy elsewhere."""
    for off, n in zip(offsets, sizes):
        if off < 0 or off + n > segment_size:
            raise ProtocolError(f"server offset {off} (+{n} bytes) is outside its segment of "
                                f"{segment_size} bytes")


@dataclass
class _Attempt:
    """A first contact in progress, and how it ended once ``done`` is set."""
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


@dataclass(frozen=True)
class _State:
    """What first contact found: the transport and the connection it made."""
    mode: str
    hello: P.ServerHello
    ok: P.HelloOk
    idle: list[FramedConnection]
    mapping: SharedMapping | None = None
    rdma: Any = None


@dataclass(frozen=True)
class _Link:
    """A borrowed connection and the transport state of the generation it belongs to."""
    conn: FramedConnection
    mode: str
    mapping: SharedMapping | None
    rdma: Any


class PoolClient:
    def __init__(self, endpoint: str, *, transport: str = "auto", secret: str = "",
                 tenant: str = "", connections: int = 4, timeout: float = 5.0,
                 connect_timeout: float | None = None, first_byte_timeout: float | None = None,
                 name: str = "", split_bytes: int = SPLIT_BYTES, copy_threads: int = 2):
        if transport not in ("auto", "shm", "tcp", "rdma"):
            raise ValueError(f"transport must be auto, shm, tcp or rdma, got {transport!r}")
        self.endpoint = endpoint
        self.address = parse_endpoint(endpoint)
        self.transport = transport
        self._secret = secret
        self._tenant = tenant
        self._timeout = timeout
        self._connect_timeout = connect_timeout or timeout
        self._first_byte = first_byte_timeout
        self._name = name or socket.gethostname()
        self._nconn = connections
        self._split = split_bytes
        self._lock = threading.Lock()
        # RDMA: only the connection that set up the queue pair may RESERVE and LEASE, so calls
        # take turns on it (one RC queue pair serialises transfers anyway).
        self._idle_back = threading.Condition(self._lock)
        self._slots = threading.BoundedSemaphore(connections)
        self._idle: list[FramedConnection] = []
        self._mode: str | None = None  # "shm" / "tcp" / "rdma" once connected
        self._hello: P.ServerHello | None = None
        self._ok: P.HelloOk | None = None
        self._mapping: SharedMapping | None = None
        self._rdma: object | None = None
        self._gen = 0
        self._closed = False
        self._attempt: _Attempt | None = None  # first contact in progress (``_connect_once``)
        self._pool: ThreadPoolExecutor | None = None
        self._copy_threads = copy_threads
        self._copier: ThreadPoolExecutor | None = None

    @property
    def mode(self) -> str | None:
        """The transport in use, or ``None`` while disconnected."""
        return self._mode

    # ------------------------------------------------------------------------------ connection

    def _open(self, address: tuple[str, int] | str, want_shm: bool = False) -> FramedConnection:
        return open_connection(address, secret=self._secret, timeout=self._timeout,
                               want_shm=want_shm, client=self._name, tenant=self._tenant,
                               connect_timeout=self._connect_timeout)

    def _connect_once(self) -> None:
        """First contact, made once for every caller that needs it meanwhile: the first caller
        makes it off ``_lock`` and the others wait for its outcome, at most ``connect_timeout``,
        and share a failure (no caller queues behind another's timeout)."""
        with self._lock:
            attempt, mine = self._attempt, self._attempt is None
            if mine:
                attempt = self._attempt = _Attempt()
        assert attempt is not None
        if not mine:
            self._await(attempt)
            return
        try:
            self._install(self._establish())
        except BaseException as e:
            attempt.error = e
            raise
        finally:
            with self._lock:
                self._attempt = None
            attempt.done.set()

    def _await(self, attempt: _Attempt) -> None:
        """Wait for another caller's first contact; its failure is this caller's too."""
        if not attempt.done.wait(self._connect_timeout):
            raise TimeoutError(f"still connecting after connect_timeout ({self._connect_timeout:g}s)")
        if isinstance(attempt.error, AuthError):
            raise AuthError(str(attempt.error))
        if attempt.error is not None:
            raise TierUnavailable(f"pool {self.endpoint} unreachable: {attempt.error}")

    def _install(self, state: _State) -> None:
        with self._lock:
            if self._closed:
                for c in state.idle:
                    c.close()
                raise TierClosed(f"pool client for {self.endpoint} is closed")
            self._mode, self._hello, self._ok, self._idle = state.mode, state.hello, state.ok, state.idle
            self._mapping, self._rdma = state.mapping, state.rdma

    def _establish(self) -> _State:
        """First contact: pick the transport."""
        first = self._open(self.address)
        hello = first.hello
        why_not_shm = "the server offers no Unix socket (shared_memory: false)"
        if self.transport in ("auto", "shm") and hello.unix_name:
            conn = None
            try:
                conn = self._open(hello.unix_name, want_shm=True)
                mapping = SharedMapping(conn.segment_fd, conn.segment_size)
                first.close()
                return _State("shm", hello, conn.ok, [conn], mapping=mapping)
            except (OSError, ProtocolError) as e:
                if conn is not None:
                    conn.close()
                why_not_shm = f"the server's Unix socket is not reachable from here ({e})"
        if self.transport == "shm":
            first.close()
            raise TierUnavailable(f"pool {self.endpoint}: shared memory impossible: {why_not_shm}")
        if self.transport in ("auto", "rdma"):
            from . import rdma

            reason = None if hello.rdma else "the server offers no RDMA"
            reason = reason or rdma.unavailable_reason()
            if reason is None:
                return _State("rdma", hello, first.ok, [first], rdma=rdma.ClientSide(first))
            if self.transport == "rdma":
                first.close()
                raise TierUnavailable(f"pool {self.endpoint}: RDMA impossible: {reason}")
        return _State("tcp", hello, first.ok, [first])

    def _reset(self, gen: int) -> None:
        with self._lock:
            if gen != self._gen:
                return
            self._gen += 1
            self._idle_back.notify_all()
            for c in self._idle:
                c.close()
            self._idle = []
            # Only drop references: a call still in flight holds its own (its offsets belong to
            # this generation's segment); the mapping is unmapped when the last one lets go.
            self._mode = self._mapping = self._rdma = None

    @contextmanager
    def _borrow(self) -> Iterator[_Link]:
        if not self._slots.acquire(timeout=self._timeout * 4):
            raise TierUnavailable(f"pool {self.endpoint}: no free connection")
        gen: int | None = None
        try:
            try:
                with self._lock:
                    if self._closed:
                        raise TierClosed(f"pool client for {self.endpoint} is closed")
                    connected = self._mode is not None
                if not connected:
                    self._connect_once()
                with self._lock:
                    if self._mode is None:  # reset again meanwhile by a failing call
                        raise TierUnavailable(f"pool {self.endpoint}: connection reset")
                    gen, mode, mapping, rdma = self._gen, self._mode, self._mapping, self._rdma
                    hello = self._hello
                    while mode == "rdma" and not self._idle:
                        if not self._idle_back.wait(self._timeout) or gen != self._gen:
                            raise TierUnavailable(f"pool {self.endpoint}: RDMA connection busy "
                                                  "or reset")
                    conn = self._idle.pop() if self._idle else None
                if conn is not None and mode != "rdma" and conn.stale():
                    conn.close()  # the server closed it while idle (its idle_timeout): no failure
                    conn = None
                if conn is None:
                    assert hello is not None
                    # A shared-memory connection asks for the segment again: the server lets
                    # only connections it handed the segment to RESERVE and LEASE.
                    conn = self._open(hello.unix_name if mode == "shm" else self.address,
                                      want_shm=mode == "shm")
                    conn.drop_segment_fd()  # this generation's mapping is already there
            except (OSError, ProtocolError) as e:
                if gen is not None:
                    # This generation's server is gone (a restart has a new Unix socket and
                    # segment): the next call must start over, not retry the old address.
                    self._reset(gen)
                if isinstance(e, AuthError):
                    raise
                raise TierUnavailable(f"pool {self.endpoint} unreachable: {e}") from e
            try:
                yield _Link(conn, mode, mapping, rdma)  # type: ignore[arg-type]
            except (OSError, ProtocolError) as e:
                conn.close()
                self._reset(gen)
                if isinstance(e, AuthError):
                    raise
                raise TierUnavailable(f"pool {self.endpoint}: {e}") from e
            except BaseException:
                conn.close()  # an interrupted exchange leaves the stream mid-frame
                self._reset(gen)
                raise
            with self._lock:
                if gen == self._gen and not self._closed:
                    self._idle.append(conn)
                    self._idle_back.notify()
                else:
                    conn.close()
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._reset(self._gen)
        for ex in (self._pool, self._copier):
            if ex is not None:
                ex.shutdown(wait=True)

    # ----------------------------------------------------------------------------------- batches

    def _chunks(self, sizes: Sequence[int]) -> list[tuple[int, int]]:
        """Split a batch into [start, end) ranges within the server's limits, byte-balanced over
        up to ``connections`` parallel chunks once it is large enough."""
        hello = self._hello
        max_batch = hello.max_batch if hello else P.DEFAULT_MAX_BATCH
        max_data = hello.max_data if hello else P.DEFAULT_MAX_DATA_BYTES
        if self._mode != "tcp" and self._ok is not None:
            max_data = min(max_data, self._ok.max_hold_bytes // 2)
        total = sum(sizes)
        parts = max(1, min(self._nconn, total // self._split)) if self._mode == "tcp" else 1
        target = max(1, -(-total // parts))
        out: list[tuple[int, int]] = []
        start, acc = 0, 0
        for i, n in enumerate(sizes):
            if i > start and (i - start >= max_batch or acc + n > max_data or acc >= target):
                out.append((start, i))
                start, acc = i, 0
            acc += n
        if start < len(sizes) or not out:
            out.append((start, len(sizes)))
        return out

    def _run_chunks(self, n: int, sizes: Sequence[int], fn: Callable[[int, int], list[T]]) -> list[T]:
        if n == 0:
            return []
        if self._hello is None:
            with self._borrow():  # connect first: the chunking needs the server's limits
                pass
        chunks = self._chunks(sizes)
        if len(chunks) == 1:
            return fn(0, n)
        if self._mode != "tcp":
            # One after the other: one-sided chunks are cut to what this process may hold at once.
            return [r for a, b in chunks for r in fn(a, b)]
        if self._pool is None:
            with self._lock:
                self._pool = self._pool or ThreadPoolExecutor(self._nconn, "pool-client")
        futures = [self._pool.submit(fn, a, b) for a, b in chunks]
        out: list[T] = []
        err: BaseException | None = None
        for f in futures:
            try:
                out.extend(f.result())
            except BaseException as e:  # wait for every chunk before raising
                err = err or e
        if err is not None:
            raise err
        return out

    def put_batch(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> PutResult:
        """Store pages; ``ok`` per key: readable now (not ``ok`` when no room). ``present`` says
        which were already stored (nothing written), so a caller counts only new pages as written."""
        sizes = [page_nbytes(p) for p in pages]
        codes = self._run_chunks(len(keys), sizes, lambda a, b: self._put(keys[a:b], pages[a:b], sizes[a:b]))
        return PutResult(tuple(c != 0 for c in codes), tuple(c == P.PUT_PRESENT for c in codes))

    def get_batch(self, keys: Sequence[PageKey], pages: Sequence[PageView]) -> list[bool]:
        """Read pages into their segments; False for absent or different-size pages."""
        sizes = [page_nbytes(p) for p in pages]
        return self._run_chunks(len(keys), sizes, lambda a, b: self._get(keys[a:b], pages[a:b], sizes[a:b]))

    def exists_batch(self, keys: Sequence[PageKey]) -> list[bool]:
        if keys and self._hello is None:
            with self._borrow():  # connect first: the batch limit is the server's
                pass
        out: list[bool] = []
        step = self._hello.max_batch if self._hello else P.DEFAULT_MAX_BATCH
        for i in range(0, len(keys), step):
            with self._borrow() as link:
                reply = link.conn.call(P.Op.EXISTS, P.Keys(list(keys[i:i + step])), P.Flags,
                                       self._first_byte)
                out.extend(map(bool, _per_key(reply.flags, len(keys[i:i + step]), "EXISTS")))
        return out

    def remove(self, keys: Sequence[PageKey]) -> int:
        if keys and self._hello is None:
            with self._borrow():
                pass
        n = 0
        step = self._hello.max_batch if self._hello else P.DEFAULT_MAX_BATCH
        for i in range(0, len(keys), step):
            with self._borrow() as link:
                n += link.conn.call(P.Op.REMOVE, P.Keys(list(keys[i:i + step])), P.Count).n
        return n

    def clear(self) -> int:
        with self._borrow() as link:
            return link.conn.call(P.Op.CLEAR, P.Empty(), P.Count).n

    def stats(self) -> dict[str, float]:
        with self._borrow() as link:
            return dict(link.conn.call(P.Op.STATS, P.Empty(), P.Stats, self._first_byte).stats)

    # -------------------------------------------------------------------------------- internals

    def _copy(self, fn: Callable[[int, PageView], None], offsets: list[int],
              pages: list[PageView], deadline: float) -> list[bool]:
        """Run ``fn(offset, page)`` for every page, on ``copy_threads`` threads for big batches;
        a page whose turn comes after ``deadline`` is skipped (False)."""
        n = len(pages)
        done = [False] * n

        def run(a: int, b: int) -> None:
            for i in range(a, b):
                if time.monotonic() >= deadline:
                    return
                fn(offsets[i], pages[i])
                done[i] = True

        if self._copy_threads < 2 or n < 2 or sum(map(page_nbytes, pages)) < PARALLEL_COPY_BYTES:
            run(0, n)
            return done
        if self._copier is None:
            with self._lock:
                self._copier = self._copier or ThreadPoolExecutor(self._copy_threads, "pool-copy")
        step = -(-n // self._copy_threads)
        for f in [self._copier.submit(run, a, min(n, a + step)) for a in range(0, n, step)]:
            f.result()
        return done

    def _put(self, keys: Sequence[PageKey], pages: Sequence[PageView], sizes: list[int]) -> list[int]:
        """Per key: 0 refused, 1 written, ``P.PUT_PRESENT`` already stored."""
        with self._borrow() as link:
            c = link.conn
            if link.mode == "tcp":
                segs = [seg for page in pages for seg in page]
                c.send(P.Op.PUT, P.KeysSizes(list(keys), sizes), segs, sum(sizes))
                flags, _ = c.reply(P.Op.PUT, P.Flags)
                return _put_codes(flags.flags, len(keys), "PUT")
            deadline = time.monotonic() + c.ok.hold_timeout / 2
            res = c.call(P.Op.RESERVE, P.KeysSizes(list(keys), sizes), P.Reservation)
            _per_key(res.status, len(keys), "RESERVE")
            todo = [i for i, s in enumerate(res.status) if s == P.RESERVE_WRITE]
            _in_segment([res.offsets[i] for i in todo], [sizes[i] for i in todo], c.segment_size)
            offsets = [res.offsets[i] for i in todo]
            if link.mapping is not None:
                done = self._copy(link.mapping.write_page, offsets, [pages[i] for i in todo], deadline)
            else:
                link.rdma.write_pages(offsets, [pages[i] for i in todo])
                done = [time.monotonic() < deadline] * len(todo)
            written = bytearray(len(res.status))
            for i, ok in zip(todo, done):
                written[i] = ok
            flags = c.call(P.Op.COMMIT, P.CommitReq(res.ticket, bytes(written)), P.Flags).flags
            return [P.PUT_PRESENT if s == P.RESERVE_PRESENT else int(bool(f))
                    for s, f in zip(res.status, _per_key(flags, len(keys), "COMMIT"))]

    def _get(self, keys: Sequence[PageKey], pages: Sequence[PageView], sizes: list[int]) -> list[bool]:
        with self._borrow() as link:
            c = link.conn
            if link.mode == "tcp":
                c.send(P.Op.GET, P.KeysSizes(list(keys), sizes))
                reply, data_len = c.reply(P.Op.GET, P.GetReply, self._first_byte)
                _per_key(reply.sizes, len(keys), "GET")
                if any(n not in (-1, want) for n, want in zip(reply.sizes, sizes)):
                    raise ProtocolError("GET reply has a page of a size that was not asked for")
                if data_len != sum(s for s in reply.sizes if s > 0):
                    raise ProtocolError("GET reply sizes disagree with its data length")
                for page, n in zip(pages, reply.sizes):
                    if n >= 0:
                        for seg in page:
                            recv_exact_into(c.sock, seg.cast("B") if seg.format != "B" else seg)
                return [n >= 0 for n in reply.sizes]
            deadline = time.monotonic() + c.ok.hold_timeout / 2
            lease = c.call(P.Op.LEASE, P.KeysSizes(list(keys), sizes), P.Lease, self._first_byte)
            try:
                _per_key(lease.sizes, len(keys), "LEASE")
                hits = [i for i, n in enumerate(lease.sizes) if n >= 0]
                if any(lease.sizes[i] != sizes[i] for i in hits):
                    raise ProtocolError("LEASE reply has a page of a size that was not asked for")
                _in_segment([lease.offsets[i] for i in hits], [sizes[i] for i in hits],
                            c.segment_size)
                offsets, dsts = [lease.offsets[i] for i in hits], [pages[i] for i in hits]
                if link.mapping is not None:
                    self._copy(link.mapping.read_page, offsets, dsts, deadline)
                else:
                    link.rdma.read_pages(offsets, dsts)
                # Checked after the copy: bytes read from a lease the server may have voided
                # (this process was stopped meanwhile) are of uncertain age, so all are misses.
                in_time = time.monotonic() < deadline
            finally:
                # One-way: the server handles it before anything we send next on this connection.
                c.send(P.Op.RELEASE, P.ReleaseReq(lease.lease), flags=P.FLAG_NO_REPLY)
            return [n >= 0 and in_time for n in lease.sizes]
