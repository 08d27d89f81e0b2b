"""The pool's ``/metrics`` endpoint: a small HTTP/1.0 server on one thread that no peer can take over.

prometheus_client's ``start_http_server`` keeps a thread and a descriptor per connection, with no
timeout and no limit: about a thousand idle connections to it used up the pool process's
descriptors, and then the pool's own accept failed. Here one thread serves every connection through
a selector. At most ``max_connections`` are open (a new one closes the oldest, so a scrape always
gets in), each must send its request and take the reply within ``timeout`` of its accept, and a
request head is at most ``MAX_HEAD`` bytes. The reply is prometheus_client's own WSGI app's
(content negotiation, gzip, ``name[]``), so the output is what ``start_http_server`` served.

    http = MetricsHttp("127.0.0.1", 0, make_wsgi_app(registry))   # port 0: a free one, http.port
    http.close()
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from .accept import AcceptFailures

log = logging.getLogger("mooncake_sgl.pool.metrics")

MAX_CONNECTIONS = 16  # arbitrary: a few scrapers and curls; any more push out the oldest
TIMEOUT_S = 10.0  # Prometheus's default scrape timeout
MAX_HEAD = 16 << 10  # request line and headers; a scrape sends a few hundred bytes
_REASONS = {400: "Bad Request", 431: "Request Header Fields Too Large", 500: "Internal Server Error"}

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass
class _Peer:
    sock: socket.socket
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    reply: memoryview | None = None


class MetricsHttp:
    """A running ``/metrics`` endpoint on ``host:port`` serving ``app``.

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, host: str, port: int, app: WsgiApp, *, max_connections: int = MAX_CONNECTIONS,
                 timeout: float = TIMEOUT_S) -> None:
        self.host = host
        self._app = app
        self._max = max_connections
        self._timeout = timeout
        self._stop = threading.Event()
        self._listener = socket.create_server((host, port), backlog=64)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._peers: dict[socket.socket, _Peer] = {}  # oldest first
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._paused_until = 0.0  # accept backs off after EMFILE and the like
        self._failures = AcceptFailures(f"metrics endpoint {host}:{self.port}", log, self._stop)
        self._thread = threading.Thread(target=self._run, daemon=True, name="pool-metrics-http")
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # -------------------------------------------------------------------------------- the loop

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(self._wait()):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj in self._peers:
                        self._step(self._peers[key.fileobj])  # type: ignore[index]
                self._expire()
        finally:
            for peer in list(self._peers.values()):
                self._drop(peer)
            self._sel.close()
            self._listener.close()

    def _wait(self) -> float:
        """Seconds until the next deadline, a paused accept's resumption, or a look at ``stop``."""
        now = time.monotonic()
        due = [p.deadline for p in self._peers.values()]
        if self._paused_until:
            due.append(self._paused_until)
        return max(0.0, min([now + 0.1, *due]) - now)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        except OSError as e:
            delay = self._failures.failed("accept", e)
            if delay:  # unregistered meanwhile: a listener that stays readable must not spin
                self._sel.unregister(self._listener)
                self._paused_until = time.monotonic() + delay
            return
        self._failures.succeeded()
        if len(self._peers) >= self._max:
            self._drop(next(iter(self._peers.values())))  # the oldest: a new scrape always gets in
        sock.setblocking(False)
        self._peers[sock] = _Peer(sock, time.monotonic() + self._timeout)
        self._sel.register(sock, selectors.EVENT_READ)

    def _expire(self) -> None:
        now = time.monotonic()
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ)
        for peer in [p for p in self._peers.values() if p.deadline <= now]:
            self._drop(peer)

    def _drop(self, peer: _Peer) -> None:
        self._peers.pop(peer.sock, None)
        self._sel.unregister(peer.sock)
        peer.sock.close()

    def _step(self, peer: _Peer) -> None:
        """Read more of the request, or send more of the reply; drop the peer when it is done."""
        try:
            if peer.reply is None:
                data = peer.sock.recv(1 << 16)
                if not data:
                    self._drop(peer)
                    return
                peer.head += data
                end = peer.head.find(b"\r\n\r\n")
                if end < 0 and len(peer.head) <= MAX_HEAD:
                    return
                whole = 0 <= end <= MAX_HEAD
                peer.reply = memoryview(self._respond(bytes(peer.head[:end]) if whole else None))
                self._sel.modify(peer.sock, selectors.EVENT_WRITE)
            sent = peer.sock.send(peer.reply)
            peer.reply = peer.reply[sent:]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(peer)
            return
        if not peer.reply:
            self._drop(peer)

    # ------------------------------------------------------------------------------------ HTTP

    def _respond(self, head: bytes | None) -> bytes:
        """The whole reply to a request ``head`` (``None``: longer than ``MAX_HEAD``)."""
        if head is None:
            return _reply(431, [], b"")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _reply(400, [], b"")
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        path, _, query = target.partition("?")
        environ = {"REQUEST_METHOD": method, "PATH_INFO": unquote(path), "QUERY_STRING": query,
                   "HTTP_ACCEPT": headers.get("accept"),
                   "HTTP_ACCEPT_ENCODING": headers.get("accept-encoding")}
        status: list[Any] = []
        try:
            body = b"".join(self._app(environ, lambda s, h, exc_info=None: status.extend((s, h))))
        except Exception:  # a collector's bug: this scrape fails, the endpoint stays
            log.exception("/metrics: the scrape failed")
            return _reply(500, [], b"")
        code, _, reason = status[0].partition(" ")
        return _reply(int(code), status[1], body, reason)


def _reply(code: int, headers: list[tuple[str, str]], body: bytes, reason: str = "") -> bytes:
    lines = [f"HTTP/1.0 {code} {reason or _REASONS.get(code, '')}",
             *(f"{k}: {v}" for k, v in headers),
             f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body
