"""The server's side of one-sided transfers (shared memory, RDMA): RESERVE/COMMIT for puts,
LEASE/RELEASE for gets, each a ``Hold`` on its connection, charged to its client process in the
``HoldLedger`` and voided past ``hold_timeout`` (see ``conn`` for why and how).

Only connections that reach the segment themselves may use these ops: over plain TCP a COMMIT
would publish a slot nobody wrote, serving whatever an earlier page left there.
"""

from __future__ import annotations

import itertools
import time

from ..errors import ProtocolError
from ..tally import Tally
from ..transfer import protocol as P
from .conn import Conn, Hold, HoldLedger
from .index import PRESENT, Entry

# Reservations or leases one connection may hold open at once. A client keeps one of each per
# request in flight; more means it forgot to COMMIT/RELEASE and would pin the pool. Arbitrary.
MAX_OPEN_PER_CONNECTION = 64


class OneSided:
    def __init__(self, holds: HoldLedger, hold_timeout: float, counters: Tally):
        self.holds = holds
        self.hold_timeout = hold_timeout
        self._counters = counters
        self._ids = itertools.count(1)

    @staticmethod
    def check(c: Conn, op: int, table: dict | None = None, what: str = "") -> None:
        """``ProtocolError`` unless ``c`` may use ``op`` (and ``table`` has room for one more)."""
        if not c.one_sided:
            raise ProtocolError(f"{P.Op(op).name} is for clients that write or read the segment "
                                "themselves (shared memory, RDMA); this connection has neither, "
                                "use PUT and GET")
        if table is not None and len(table) >= MAX_OPEN_PER_CONNECTION:
            raise ProtocolError(f"more than {MAX_OPEN_PER_CONNECTION} open {what} on one connection")

    def reserve(self, c: Conn, keys: list[bytes], sizes: list[int]) -> P.Reservation:
        assert c.tenant is not None
        n = self.holds.take(c.holder, sizes, c.tenant.max_hold_bytes)
        res: list[object] = [*c.tenant.index.reserve(keys[:n], sizes[:n]), *[None] * (len(keys) - n)]
        status = bytes(P.RESERVE_WRITE if isinstance(r, Entry) else
                       P.RESERVE_PRESENT if r is PRESENT else P.RESERVE_NO_ROOM for r in res)
        ticket = next(self._ids)
        c.tickets[ticket] = Hold([r for r in res if isinstance(r, Entry)], sum(sizes[:n]), res=res)
        return P.Reservation(ticket, status, [r.offset if isinstance(r, Entry) else 0 for r in res])

    def commit(self, c: Conn, ticket: int, written: bytes) -> bytes:
        assert c.tenant is not None
        index = c.tenant.index
        hold = c.tickets.pop(ticket, None)
        if hold is None:
            raise ProtocolError(f"COMMIT of unknown reservation {ticket}")
        self.holds.give_back(c.holder, hold.nbytes)
        res, entries = hold.res or [], [e for e in hold.entries if e is not None]
        if len(written) != len(res):
            index.abort(entries)
            raise ProtocolError(f"COMMIT names {len(written)} pages, the reservation has {len(res)}")
        if time.monotonic() - hold.since > self.hold_timeout:
            index.abort(entries)  # void: the client may have been stopped mid-copy
            return bytes(r is PRESENT for r in res)
        ok = [bool(written[i]) for i, r in enumerate(res) if isinstance(r, Entry)]
        index.commit(entries, ok)
        self._counters.add(bytes_in=sum(e.size for e, w in zip(entries, ok) if w))
        return bytes(bool(written[i]) if isinstance(r, Entry) else r is PRESENT
                     for i, r in enumerate(res))

    def lease(self, c: Conn, keys: list[bytes], sizes: list[int]) -> P.Lease:
        assert c.tenant is not None
        n = self.holds.take(c.holder, sizes, c.tenant.max_hold_bytes)
        entries = [*c.tenant.index.lease(keys[:n], sizes[:n]), *[None] * (len(keys) - n)]
        held = sum(e.size for e in entries if e is not None)
        self.holds.give_back(c.holder, sum(sizes[:n]) - held)  # misses hold nothing
        lease = next(self._ids)
        c.leases[lease] = Hold(entries, held)
        return P.Lease(lease, [e.offset if e else 0 for e in entries],
                       [e.size if e else -1 for e in entries])

    def release(self, c: Conn, lease: int) -> None:
        assert c.tenant is not None
        hold = c.leases.pop(lease, None)
        if hold is not None:
            c.tenant.index.release(hold.entries)
            self.holds.give_back(c.holder, hold.nbytes)

    def drop_all(self, c: Conn, expired: bool) -> None:
        """A connection ended: abort its reservations and release its leases. Reservations a
        same-host client may still be copying into (voided, not abandoned) go to quarantine."""
        if c.tenant is not None:
            index = c.tenant.index
            for hold in c.tickets.values():
                entries = [e for e in hold.entries if e is not None]
                if expired and c.unix and c.one_sided:
                    self.holds.quarantine(c.pid, index, entries, self.hold_timeout)
                else:
                    index.abort(entries)
                self.holds.give_back(c.holder, hold.nbytes)
            for hold in c.leases.values():
                index.release(hold.entries)
                self.holds.give_back(c.holder, hold.nbytes)
        c.tickets.clear()
        c.leases.clear()
