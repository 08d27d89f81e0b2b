"""One request of an authenticated pool connection: its batch limits, the operation on the
tenant's index and segment, and the reply.

What this module touches: the connection it is handed (its socket for this request's data and
reply, its tenant's index and segment, its holds through ``OneSided``) and the server's counters.
It never closes a connection nor decides how long one lives: a ``ProtocolError`` raised here ends
the connection in ``server``, which owns the listeners, the handshake and the wait between
requests.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ProtocolError
from ..tally import Tally
from ..transfer import protocol as P
from ..transfer.tcp import discard, recv_exact_into, send_buffers
from .config import PoolServerConfig
from .conn import Conn
from .index import PRESENT, Entry
from .onesided import OneSided

# Slowest data rate a request's deadline allows for (16 MiB/s): a 1 GiB batch gets 64 s on top
# of request_timeout. Arbitrary, far below any link the pool is meant for.
MIN_RATE = 16 << 20


class Requests:
    """The request handling of one server, shared by its connections (no state between requests)."""

    def __init__(self, config: PoolServerConfig, counters: Tally, one_sided: OneSided,
                 rdma: dict[str, object], stats: Callable[[str | None], dict[str, float]]) -> None:
        self._config = config
        self._counters = counters
        self._one_sided = one_sided
        # The server's own dict, not a copy: it fills it at start, after this is built.
        self._rdma = rdma
        self._stats = stats

    def _check_batch(self, keys: list[bytes], sizes: list[int] | None = None) -> None:
        if len(keys) > self._config.max_batch:
            raise ProtocolError(f"batch of {len(keys)} keys exceeds max_batch={self._config.max_batch}")
        long = next((i for i, k in enumerate(keys) if len(k) > P.MAX_KEY_BYTES), None)
        if long is not None:
            raise ProtocolError(f"key #{long} is {len(keys[long])} bytes long; keys are at most "
                                f"{P.MAX_KEY_BYTES} bytes")
        if sizes is not None:
            if len(sizes) != len(keys):
                raise ProtocolError(f"{len(keys)} keys but {len(sizes)} sizes")
            bad = next((i for i, n in enumerate(sizes) if n < 0), None)
            if bad is not None:
                raise ProtocolError(f"page size {sizes[bad]} of key #{bad} is negative")

    def _reply(self, c: Conn, op: int, msg: object, deadline: float,
               data: list[memoryview] | None = None) -> None:
        n = sum(v.nbytes for v in data) if data else 0
        send_buffers(c.sock, [P.frame(op | P.REPLY_BIT, msg, n), *(data or [])],  # type: ignore[arg-type]
                     deadline + n / MIN_RATE)
        self._counters.add(bytes_out=n)

    def handle(self, c: Conn, header: P.Header, meta: bytearray, deadline: float) -> None:
        """Serve the request whose header and meta have arrived on ``c``: read its data, act, reply,
        all by ``deadline``. Raises ``ProtocolError`` for a request ``c`` may not make."""
        op = header.op
        msg = P.decode(meta, P.request_type(op))
        assert c.tenant is not None
        index, view, one = c.tenant.index, c.tenant.segment.view, self._one_sided
        if header.data_len and op != P.Op.PUT:
            raise ProtocolError(f"op {P.Op(op).name} carries no data, got {header.data_len} bytes")
        if op == P.Op.PUT:
            self._check_batch(msg.keys, msg.sizes)
            if sum(msg.sizes) != header.data_len:
                raise ProtocolError(f"PUT sizes add up to {sum(msg.sizes)} bytes but the frame carries "
                                    f"{header.data_len}")
            self._reply(c, op, P.Flags(self._put(c, msg.keys, msg.sizes, deadline)), deadline)
        elif op == P.Op.GET:
            self._check_batch(msg.keys, msg.sizes)
            if sum(msg.sizes) > self._config.max_frame_bytes:
                # The reply is a frame too; bounding it bounds how long its pages stay leased.
                raise ProtocolError(f"GET of {sum(msg.sizes)} bytes exceeds the limit of "
                                    f"{self._config.max_frame_bytes} bytes (max_frame_bytes)")
            entries = index.lease(msg.keys, msg.sizes)
            try:
                self._reply(c, op, P.GetReply([e.size if e else -1 for e in entries]), deadline,
                            [view[e.offset:e.offset + e.size] for e in entries if e is not None])
            finally:
                index.release(entries)
        elif op == P.Op.EXISTS:
            self._check_batch(msg.keys)
            self._reply(c, op, P.Flags(index.contains(msg.keys)), deadline)
        elif op == P.Op.REMOVE:
            self._check_batch(msg.keys)
            self._reply(c, op, P.Count(index.remove(msg.keys)), deadline)
        elif op == P.Op.CLEAR:
            self._reply(c, op, P.Count(index.clear()), deadline)
        elif op == P.Op.STATS:
            self._reply(c, op, P.Stats(self._stats(c.tenant.name)), deadline)
        elif op == P.Op.RESERVE:
            one.check(c, op, c.tickets, "reservations (RESERVE without COMMIT)")
            self._check_batch(msg.keys, msg.sizes)
            self._reply(c, op, one.reserve(c, msg.keys, msg.sizes), deadline)
        elif op == P.Op.COMMIT:
            one.check(c, op)
            self._reply(c, op, P.Flags(one.commit(c, msg.ticket, msg.written)), deadline)
        elif op == P.Op.LEASE:
            one.check(c, op, c.leases, "leases (LEASE without RELEASE)")
            self._check_batch(msg.keys, msg.sizes)
            self._reply(c, op, one.lease(c, msg.keys, msg.sizes), deadline)
        elif op == P.Op.RELEASE:
            one.check(c, op)
            one.release(c, msg.lease)
        elif op == P.Op.RDMA_CONNECT:
            side = self._rdma.get(c.tenant.name)
            if side is None:
                raise ProtocolError("this pool offers no RDMA (no device, or rdma_device: off)")
            c.rdma, reply = side.connect(msg)  # type: ignore[attr-defined]
            c.one_sided = True
            self._reply(c, op, reply, deadline)
        else:
            raise ProtocolError(f"op {op} is not a request")

    def _put(self, c: Conn, keys: list[bytes], sizes: list[int], deadline: float) -> bytes:
        assert c.tenant is not None
        index, view = c.tenant.index, c.tenant.segment.view
        res = index.reserve(keys, sizes)
        entries = [r for r in res if isinstance(r, Entry)]
        try:
            for r, size in zip(res, sizes):
                if isinstance(r, Entry):
                    recv_exact_into(c.sock, view[r.offset:r.offset + size], deadline)
                else:
                    discard(c.sock, size, deadline)
        except BaseException:
            index.abort(entries)  # a truncated PUT leaves nothing readable
            raise
        self._counters.add(bytes_in=sum(sizes))
        index.commit(entries, [True] * len(entries))
        return bytes(P.PUT_PRESENT if r is PRESENT else int(isinstance(r, Entry)) for r in res)
