"""``CurveProcess``: a store's capacity curves (``curve.TierCurves``) run in a child process, so the
serving process pays only for handing each lookup's keys over.

Why a process: a miniature of ``heat`` or ``adaptive`` does the policy's own work on every sampled
page, seven sizes over: 40-1,000 us per looked-up page on a small tier (docs/capacity_curves.md).
In the store that work ran under the residency lock, which SGLang's storage threads take too, and
under the scheduler's GIL. Here the serving side only queues a reference to the keys (about a
microsecond per lookup, ``busy_seconds``); a sender thread encodes them and writes them to the
child's stdin, blocked in ``write`` without the GIL when the child is behind; the child runs the
same ``TierCurves`` at a lower scheduling priority and sends its points back.

Bounds: at most ``max_pending_pages`` keys wait in this process; past that whole lookups are left
out and counted (``dropped_pages``): the curve then covers less than the stream, which ``stats``
shows. The child holds what ``TierCurves`` holds (bounded per tier: ``policy/curve.py`` says how).

Failure: the child dying (killed, out of memory) ends the curves: the last points stay, one warning
is logged, and ``stopped`` says why. Nothing reaches the store's callers: every method here returns
what it has. The child exits when its stdin closes or its parent goes away.

Wire: frames of a 4-byte big-endian length and a msgpack body, one of the tagged structs below;
the child answers a ``Sync`` with a ``State`` carrying its ``seq``, and sends one unasked at most
every ``PUSH_INTERVAL`` while it has news, so reading the points never waits for the child.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import BinaryIO, Union

import msgspec

from ..api import PageKey
from ..config import PolicyConfig
from .curve import CurvePoint, TierCurves

log = logging.getLogger(__name__)

# Keys waiting for the child, at most: about 20 MiB of queue (a reference each, and the key it
# keeps alive: 70-100 bytes for SGLang's 32-64-byte page hashes). Minutes of lookups for a child
# that keeps up with thousands of pages a second; past it, whole lookups are left out.
MAX_PENDING_PAGES = 1 << 18
# Seconds between unasked state reports while the child has processed something new.
PUSH_INTERVAL = 0.5
# The child's niceness: the curves yield the CPU to the serving processes on a busy host.
CHILD_NICE = 10
_LEN = struct.Struct(">I")
# The child imports this very package (not whatever ``mooncake_sgl`` its working folder has).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHILD = ("import sys; sys.path.insert(0, {root!r}); "
          "from mooncake_sgl.policy.curve_process import main; main()")
# A frame larger than this is a broken stream, not a message.
MAX_FRAME = 1 << 30


class Start(msgspec.Struct, tag="start", frozen=True):
    capacities: list[Union[int, None]]
    policy: str
    config: Union[PolicyConfig, None]
    page_bytes: int


class Lookups(msgspec.Struct, tag="lookups", frozen=True):
    keys: list[list[bytes]]


class Sync(msgspec.Struct, tag="sync", frozen=True):
    seq: int


class State(msgspec.Struct, tag="state", frozen=True):
    seq: int  # the last ``Sync`` answered (0 before any)
    points: list[list[CurvePoint]]
    entries: int
    cpu_seconds: float  # the child's own CPU time so far


_to_child = msgspec.msgpack.Decoder(Union[Start, Lookups, Sync])
_from_child = msgspec.msgpack.Decoder(State)
_encode = msgspec.msgpack.Encoder().encode


def write_frame(out: BinaryIO, message: msgspec.Struct) -> None:
    body = _encode(message)
    out.write(_LEN.pack(len(body)) + body)
    out.flush()


def _read_exactly(src: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes, fewer only at the end of the stream (an unbuffered pipe returns what it
    has, not what was asked)."""
    parts, got = [], 0
    while got < n:
        part = src.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def read_frame(src: BinaryIO) -> bytes | None:
    """One frame's body; ``None`` at a clean end of stream.

    Raises: ``EOFError`` for a stream cut inside a frame, ``ValueError`` for an impossible length.
    """
    head = _read_exactly(src, _LEN.size)
    if not head:
        return None
    if len(head) < _LEN.size:
        raise EOFError(f"curve process stream cut inside a frame header ({len(head)} of 4 bytes)")
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"curve process frame of {n} bytes, more than the {MAX_FRAME} allowed")
    body = _read_exactly(src, n)
    if len(body) < n:
        raise EOFError(f"curve process stream cut inside a frame ({len(body)} of {n} bytes)")
    return body


class CurveProcess:
    """``TierCurves(capacities, policy_name, config)`` in a child process (see the module docstring).

    Quacks like ``TierCurves`` where the store feeds and reads one (``start``, ``on_lookup``,
    ``points``, ``entries``, ``busy_seconds``), plus what the process costs and loses
    (``process_seconds``, ``dropped_pages``, ``stopped``) and ``close``.
    """

    def __init__(self, capacities: Sequence[int | None], policy_name: str,
                 config: PolicyConfig | None = None, *, max_pending_pages: int = MAX_PENDING_PAGES):
        self._capacities = list(capacities)
        self._policy = policy_name
        self._config = config
        self._max_pending = max_pending_pages
        self._cond = threading.Condition()
        # Lookups (key lists) and sync requests (ints), in order; owned by ``_cond``.
        self._queue: deque[list[PageKey] | int] = deque()
        self._pending_pages = 0
        self._sent_seq = 0
        self._state = State(0, [[] for _ in self._capacities], 0, 0.0)
        self._proc: subprocess.Popen[bytes] | None = None
        self._closing = False
        self._active = False  # started with a curve to keep
        self.page_bytes = 0
        self.busy_seconds = 0.0  # the serving side's time: queueing keys
        self.dropped_pages = 0
        self.stopped: str | None = None

    # ------------------------------------------------------------------ the serving side

    def start(self, page_bytes: int) -> None:
        """Start the child for pages of ``page_bytes`` (the first page stored); once."""
        with self._cond:
            if self.page_bytes or page_bytes <= 0 or self._closing:
                return
            self.page_bytes = page_bytes
            if all(c is None for c in self._capacities):
                return  # every tier evicts on its own: no curve to keep, no process to start
            self._active = True
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD.format(root=_PACKAGE_ROOT)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=None, close_fds=True)
        except OSError as e:
            self._stop(f"could not start ({e})")
            return
        first = Start(self._capacities, self._policy, self._config, page_bytes)
        threading.Thread(target=self._send, args=(first,), name="mooncake-sgl-curves-send",
                         daemon=True).start()
        threading.Thread(target=self._receive, name="mooncake-sgl-curves-recv", daemon=True).start()

    def on_lookup(self, keys: Sequence[PageKey]) -> None:
        if not keys or not self._active or self.stopped is not None:
            return
        t0 = time.perf_counter()
        with self._cond:
            if self._pending_pages + len(keys) > self._max_pending:
                self.dropped_pages += len(keys)
            else:
                self._queue.append(list(keys))
                self._pending_pages += len(keys)
                self._cond.notify()
        self.busy_seconds += time.perf_counter() - t0

    def points(self) -> list[list[CurvePoint]]:
        """Per tier, its curve as the child last reported it: at most ``PUSH_INTERVAL`` behind what
        it has processed (``sync`` waits for the lookups handed over so far)."""
        return self._state.points

    def entries(self) -> int:
        return self._state.entries

    @property
    def process_seconds(self) -> float:
        """The child's CPU time, as it last reported it."""
        return self._state.cpu_seconds

    def sync(self, timeout: float) -> bool:
        """Wait until the child has processed every lookup handed over so far; ``False`` when it
        did not within ``timeout`` seconds (or is not running)."""
        with self._cond:
            if self._proc is None or self.stopped is not None:
                return False
            self._sent_seq += 1
            seq = self._sent_seq
            self._queue.append(seq)
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._state.seq >= seq or self.stopped is not None,
                                       timeout) and self.stopped is None

    def close(self) -> None:
        """Stop the child (its curves end here)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        proc = self._proc
        if proc is None:
            return
        # Killed, not asked: it keeps nothing worth a goodbye, and a stalled one would leave the
        # sender blocked in ``write`` holding its pipe's lock, so closing the pipe first could hang.
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass  # the sender's last write failing on the dead pipe, closed under it

    # ------------------------------------------------------------------ threads

    def _send(self, first: Start) -> None:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            write_frame(proc.stdin, first)
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._queue or self._closing)
                    if self._closing:
                        return
                    items = list(self._queue)
                    self._queue.clear()
                    self._pending_pages = 0
                batch: list[list[PageKey]] = []
                for item in items:
                    if isinstance(item, int):
                        if batch:
                            write_frame(proc.stdin, Lookups(batch))
                            batch = []
                        write_frame(proc.stdin, Sync(item))
                    else:
                        batch.append(item)
                if batch:
                    write_frame(proc.stdin, Lookups(batch))
        except (OSError, ValueError) as e:  # a closed or broken pipe: the child is gone
            if not self._closing:
                self._stop(f"its input closed ({e})")

    def _receive(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        why = ""
        try:
            while (body := read_frame(proc.stdout)) is not None:
                state = _from_child.decode(body)
                with self._cond:
                    self._state = state
                    self._cond.notify_all()
        except (OSError, EOFError, ValueError, msgspec.DecodeError) as e:
            why = f": {e}"
        if self._closing:
            return
        code = proc.wait()
        self._stop(f"exited with status {code}{why}" if code >= 0 else f"killed by signal {-code}{why}")

    def _stop(self, why: str) -> None:
        with self._cond:
            if self.stopped is not None:
                return
            self.stopped = why
            self._queue.clear()
            self._pending_pages = 0
            self._cond.notify_all()
        log.warning("capacity curves stopped: their process %s; the curves keep the points they had",
                    why)


# ---------------------------------------------------------------------- the child


def serve(src: BinaryIO, out: BinaryIO, parent: int | None = None) -> None:
    """The child's loop: ``Start`` first, then lookups fed to ``TierCurves``, syncs answered."""
    body = read_frame(src)
    if body is None:
        return
    first = _to_child.decode(body)
    if not isinstance(first, Start):
        raise ValueError(f"curve process: the first message must be start, not {type(first).__name__}")
    curves = TierCurves(first.capacities, first.policy, first.config)
    curves.start(first.page_bytes)
    seq, dirty, pushed = 0, False, time.monotonic()

    def report() -> None:
        write_frame(out, State(seq, curves.points(), curves.entries(), time.process_time()))

    fd = src.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], PUSH_INTERVAL)
        if not ready:
            if parent is not None and os.getppid() != parent:
                return  # the parent is gone while something else holds our stdin open
            if dirty:
                report()
                dirty, pushed = False, time.monotonic()
            continue
        body = read_frame(src)
        if body is None:
            return
        msg = _to_child.decode(body)
        if isinstance(msg, Lookups):
            for keys in msg.keys:
                curves.on_lookup(keys)
            dirty = True
        elif isinstance(msg, Sync):
            seq = msg.seq
            dirty = True
        else:
            raise ValueError("curve process: a second start message")
        if dirty and (isinstance(msg, Sync) or time.monotonic() - pushed >= PUSH_INTERVAL):
            report()
            dirty, pushed = False, time.monotonic()


def main() -> None:
    try:
        os.nice(CHILD_NICE)
    except OSError:
        pass  # not allowed here: run at the parent's priority
    # Unbuffered binary stdin: ``select`` on its descriptor must see every byte not yet read.
    src = os.fdopen(sys.stdin.fileno(), "rb", buffering=0)
    # The frames get a descriptor of their own; descriptor 1 becomes stderr, so a stray print (of
    # this package or a library) lands in the server's log instead of corrupting the stream.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(src, out, os.getppid())


if __name__ == "__main__":
    main()
