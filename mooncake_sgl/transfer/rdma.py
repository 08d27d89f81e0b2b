"""RDMA transport through pyverbs: one-sided READ/WRITE into the pool's registered segment.

NEVER RUN ON RDMA HARDWARE. No machine this was developed on has an RDMA device; what ran is the
import guard and the "no RDMA device" report (tests/transfer/test_rdma_guard.py). The code follows
the verbs model below but every line that touches a device is untested: treat it as a starting
point to validate on a real NIC, not as a working transport.

Model. The server registers its whole segment once (REMOTE_READ | REMOTE_WRITE). A client creates
an RC queue pair and exchanges (QP number, LID, GID, PSN, MTU) with the server over the
authenticated TCP control connection (RDMA_CONNECT); the server answers with its own QP and the
segment's address and rkey. Data then moves with the same control flow as shared memory —
RESERVE / write / COMMIT and LEASE / read / RELEASE — except that the client posts RDMA WRITE or
READ work requests against ``segment address + offset`` from a registered staging buffer.
(Registering the caller's host KV pool once instead would make it zero-copy; not done.)

pyverbs: Debian's ``python3-pyverbs`` installs for the system interpreter; when the package is not
importable from this interpreter we look for it there (same CPython ABI only).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ..api import PageView
from ..buffers import gather, scatter, view_at
from ..errors import TierUnavailable
from . import protocol as P

_SYSTEM_DIST = "/usr/lib/python3/dist-packages"
STAGING_BYTES = 64 << 20  # staging buffer per client; arbitrary, a few 8 MiB pages
MAX_SEND_WR = 256  # work requests in flight per queue pair; a group never posts more
_PORT = 1
_GID_INDEX = 0


def _pyverbs() -> Any:
    """The pyverbs package, or ``ImportError`` saying how to get it."""
    try:
        return importlib.import_module("pyverbs")
    except ImportError:
        pass
    if os.path.isdir(os.path.join(_SYSTEM_DIST, "pyverbs")):
        sys.path.append(_SYSTEM_DIST)
        try:
            return importlib.import_module("pyverbs")
        except ImportError:
            pass
        finally:
            sys.path.remove(_SYSTEM_DIST)
    raise ImportError("pyverbs is not installed (Debian/Ubuntu: apt-get install python3-pyverbs, "
                      "for the same Python version as this interpreter)")


def _devices() -> list[str]:
    _pyverbs()
    from pyverbs.device import get_device_list

    try:
        return [d.name.decode() if isinstance(d.name, bytes) else d.name for d in get_device_list()]
    except Exception:  # pyverbs raises PyverbsRDMAError when the kernel lists no device
        return []


def unavailable_reason(device: str = "") -> str | None:
    """``None`` when RDMA can be used here, else why not (for logs and ``TierUnavailable``)."""
    try:
        _pyverbs()
    except ImportError as e:
        return str(e)
    names = _devices()
    if not names:
        return "no RDMA device (pyverbs found no ibv device on this host)"
    if device and device not in names:
        return f"RDMA device {device!r} not found (have {', '.join(names)})"
    return None


class _Verbs:
    """Context, protection domain, completion queue and port facts of one device."""

    def __init__(self, device: str = ""):
        reason = unavailable_reason(device)
        if reason:
            raise TierUnavailable(reason)
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.pd import PD

        name = device or _devices()[0]
        self.ctx = Context(name=name)
        self.name = name
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 1024)
        port = self.ctx.query_port(_PORT)
        self.lid = port.lid
        self.mtu = port.active_mtu
        self.gid = self.ctx.query_gid(_PORT, _GID_INDEX)

    def new_qp(self) -> Any:
        import pyverbs.enums as e
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=MAX_SEND_WR, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
        return QP(self.pd, init, QPAttr(port_num=_PORT))  # returned in INIT

    def endpoint(self, qp: Any, psn: int, addr: int = 0, rkey: int = 0) -> P.RdmaEndpoint:
        return P.RdmaEndpoint(qp.qp_num, self.lid, bytes(str(self.gid.gid), "ascii"), psn,
                              int(self.mtu), addr, rkey)

    def connect_qp(self, qp: Any, local_psn: int, remote: P.RdmaEndpoint) -> None:
        import pyverbs.enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        attr = QPAttr(port_num=_PORT)
        attr.path_mtu = min(int(self.mtu), remote.mtu)
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn = remote.psn
        attr.sq_psn = local_psn
        attr.max_dest_rd_atomic = 16
        attr.max_rd_atomic = 16
        # Usual RC values (ibv_rc_pingpong's): ~67 ms ack timeout, 7 retries, 7 RNR retries.
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.min_rnr_timer = 12
        attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
                                | e.IBV_ACCESS_REMOTE_WRITE)
        gr = GlobalRoute(dgid=GID(remote.gid.decode()), sgid_index=_GID_INDEX)
        attr.ah_attr = AHAttr(port_num=_PORT, dlid=remote.lid, is_global=1, gr=gr)
        qp.to_rts(attr)

    def close(self) -> None:
        for obj in (self.cq, self.pd, self.ctx):
            obj.close()


class _ServerSide:
    """The segment registered once; one queue pair per connected client."""

    def __init__(self, segment: Any, device: str):
        import pyverbs.enums as e
        from pyverbs.mr import MR

        self.verbs = _Verbs(device)
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
        self.mr = MR(self.verbs.pd, segment.size, access, address=segment.address)
        self.addr = segment.address

    def describe(self) -> str:
        return f"device {self.verbs.name}, segment registered (rkey {self.mr.rkey})"

    def connect(self, remote: P.RdmaEndpoint) -> tuple[Any, P.RdmaEndpoint]:
        qp = self.verbs.new_qp()
        psn = int.from_bytes(os.urandom(3), "little")
        self.verbs.connect_qp(qp, psn, remote)
        return qp, self.verbs.endpoint(qp, psn, self.addr, self.mr.rkey)


def open_server_side(segment: Any, device: str) -> _ServerSide | None:
    """The server's RDMA side, or ``None`` (logged by the caller) when there is no device."""
    if unavailable_reason(device):
        return None
    return _ServerSide(segment, device)


class ClientSide:
    """A client's queue pair to one pool, with a registered staging buffer. Thread-safe (one
    transfer at a time: a single RC queue pair serialises anyway)."""

    def __init__(self, conn: Any):
        import pyverbs.enums as e
        from pyverbs.mr import MR

        self._e = e
        self.verbs = _Verbs()
        self.qp = self.verbs.new_qp()
        psn = int.from_bytes(os.urandom(3), "little")
        self.staging = MR(self.verbs.pd, STAGING_BYTES, e.IBV_ACCESS_LOCAL_WRITE)
        self._stage = view_at(self.staging.buf, STAGING_BYTES)
        remote = conn.call(P.Op.RDMA_CONNECT, self.verbs.endpoint(self.qp, psn), P.RdmaEndpoint)
        self.verbs.connect_qp(self.qp, psn, remote)
        self.remote_addr, self.rkey = remote.addr, remote.rkey
        self._lock = threading.Lock()

    def _post(self, opcode: int, items: list[tuple[int, int, int]]) -> None:
        """Post (staging offset, remote offset, length) work requests; wait for all of them."""
        from pyverbs.wr import SGE, SendWR

        e = self._e
        for i, (local, remote, n) in enumerate(items):
            sge = SGE(self.staging.buf + local, n, self.staging.lkey)
            wr = SendWR(wr_id=i, opcode=opcode, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(self.rkey, self.remote_addr + remote)
            self.qp.post_send(wr)
        done = 0
        while done < len(items):
            n, wcs = self.verbs.cq.poll(len(items) - done)
            for wc in wcs[:n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    raise TierUnavailable(f"RDMA work request failed with status {wc.status}")
            done += n

    def _batches(self, offsets: Sequence[int], pages: Sequence[PageView]):  # noqa: ANN202
        """Group pages so each group fits the staging buffer and the send queue."""
        group: list[tuple[int, int, PageView]] = []
        used = 0
        for off, page in zip(offsets, pages):
            n = sum(s.nbytes for s in page)
            if n > STAGING_BYTES:
                raise TierUnavailable(f"page of {n} bytes exceeds the RDMA staging buffer")
            if used + n > STAGING_BYTES or len(group) == MAX_SEND_WR:
                yield group
                group, used = [], 0
            group.append((used, off, page))
            used += n
        if group:
            yield group

    def write_pages(self, offsets: Sequence[int], pages: Sequence[PageView]) -> None:
        with self._lock:
            for group in self._batches(offsets, pages):
                for local, _, page in group:
                    n = sum(s.nbytes for s in page)
                    gather(page, self._stage[local:local + n])
                self._post(self._e.IBV_WR_RDMA_WRITE,
                           [(lo, ro, sum(s.nbytes for s in pg)) for lo, ro, pg in group])

    def read_pages(self, offsets: Sequence[int], pages: Sequence[PageView]) -> None:
        with self._lock:
            for group in self._batches(offsets, pages):
                self._post(self._e.IBV_WR_RDMA_READ,
                           [(lo, ro, sum(s.nbytes for s in pg)) for lo, ro, pg in group])
                for local, _, page in group:
                    n = sum(s.nbytes for s in page)
                    scatter(self._stage[local:local + n], page)

    def close(self) -> None:
        for obj in (self.qp, self.staging):
            obj.close()
        self.verbs.close()
