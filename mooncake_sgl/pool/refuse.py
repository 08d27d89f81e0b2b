"""Turning away connections over the limit without ever blocking the accept loop.

Each refused connection gets an ERROR frame with a non-blocking send, then its input is drained
(closing with unread input would reset the connection and could destroy the error before the peer
reads it) until the peer closes or ``REFUSE_LINGER`` passes. One thread serves every refused
connection at once with ``poll``, so a peer that keeps sending delays no one.
"""

from __future__ import annotations

import queue
import select
import socket
import threading
import time

from ..transfer import protocol as P

# Connections waiting for their ERROR frame; past it they are just closed. Arbitrary.
REFUSE_QUEUE = 64
# How long a turned-away connection is drained before it is closed. Arbitrary.
REFUSE_LINGER = 0.5


class Refuser:
    def __init__(self, message: str, stop: threading.Event):
        self._frame = P.frame(P.Op.ERROR, P.ErrorMsg("limit", message))
        self._stop = stop
        self._queue: queue.Queue[socket.socket] = queue.Queue(REFUSE_QUEUE)

    def refuse(self, sock: socket.socket) -> None:
        """Hand ``sock`` over (from the accept loop: returns at once)."""
        try:
            self._queue.put_nowait(sock)
        except queue.Full:
            sock.close()

    def run(self) -> None:
        """The refusing thread's body: until ``stop`` is set."""
        frame = self._frame
        lingering: dict[int, tuple[socket.socket, float]] = {}  # fd -> (socket, close at)
        poller = select.poll()
        while not self._stop.is_set():
            try:
                sock = self._queue.get_nowait() if lingering else self._queue.get(timeout=0.05)
            except queue.Empty:
                sock = None
            if sock is not None:
                try:
                    sock.setblocking(False)
                    sock.send(frame)  # a few dozen bytes: fits any empty send buffer
                    sock.shutdown(socket.SHUT_WR)
                    lingering[sock.fileno()] = (sock, time.monotonic() + REFUSE_LINGER)
                    poller.register(sock, select.POLLIN)
                except OSError:
                    sock.close()
            for fd, _ in poller.poll(20) if lingering else ():
                s = lingering[fd][0]
                try:
                    if s.recv(1 << 16):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                lingering[fd] = (s, 0.0)  # the peer closed (or broke): done
            now = time.monotonic()
            for fd in [fd for fd, (_, t) in lingering.items() if t <= now]:
                poller.unregister(fd)
                lingering.pop(fd)[0].close()
        for s, _ in lingering.values():
            s.close()
