"""Host names resolved within a deadline, never on the caller's thread.

``getaddrinfo`` has no timeout of its own: during a DNS outage it takes the resolver's (5 s a try,
times the tries and servers of ``resolv.conf``), and a ``connect`` given a name resolves inside, so
a 1 s ``connect_timeout`` meant 10 s and more. Here a name is resolved on a helper thread while the
caller waits at most until its deadline. Callers of one name share the resolution in flight (an
outage costs one thread per name, not one per call). Once a name has resolved, callers get its
last answer at once while a fresh one is fetched behind them, so an outage that comes later costs
no call any time; an address that moved meanwhile is a connect failure, a miss like any other. A
numeric address is used as it is.

    family, sockaddr = resolve("pool-a.internal", 7480, deadline=time.monotonic() + 1.0)
    sock = connect_within(("pool-a.internal", 7480), timeout=1.0)   # a connected socket
"""

from __future__ import annotations

import socket
import threading
import time


class _Lookup:
    """One ``getaddrinfo`` in flight and, once done, its answer or error."""

    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.answer: tuple[int, tuple] | None = None
        self.error: OSError | None = None
        self._host, self._port = host, port

    def run(self) -> None:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(self._host, self._port, socket.AF_INET,
                                                           socket.SOCK_STREAM)[0]
            self.answer = (family, sockaddr)
        except OSError as e:
            self.error = e
        finally:
            self.done.set()


class Resolver:
    """Names to IPv4 socket addresses, as ``resolve`` describes. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, int], _Lookup] = {}
        self._last: dict[tuple[str, int], tuple[int, tuple]] = {}

    def resolve(self, host: str, port: int, deadline: float) -> tuple[int, tuple]:
        """``(family, sockaddr)`` for ``host:port``.

        Raises:
            TimeoutError: no answer by ``deadline`` and none known before.
            OSError: the name does not resolve (``socket.gaierror``) and was never known.
        """
        if _numeric(host):
            return socket.AF_INET, (host, port)
        name = (host, port)
        with self._lock:
            last = self._last.get(name)
            lookup = self._inflight.get(name)
            if lookup is None:
                lookup = self._inflight[name] = _Lookup(host, port)
                try:
                    threading.Thread(target=self._run, args=(name, lookup), daemon=True,
                                     name=f"resolve-{host}").start()
                except RuntimeError as e:  # no thread to be had (a pids limit): no lookup either
                    del self._inflight[name]
                    if last is None:
                        raise OSError(f"cannot resolve {host!r}: no thread for the lookup ({e})") from e
        if last is not None:
            return last
        if not lookup.done.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"resolving {host!r} took longer than the connect timeout")
        if lookup.answer is None:
            raise lookup.error or OSError(f"resolving {host!r} failed")
        return lookup.answer

    def _run(self, name: tuple[str, int], lookup: _Lookup) -> None:
        lookup.run()
        with self._lock:
            self._inflight.pop(name, None)
            if lookup.answer is not None:
                self._last[name] = lookup.answer


def _numeric(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET, host)
        return True
    except OSError:
        return False


_RESOLVER = Resolver()


def resolve(host: str, port: int, deadline: float) -> tuple[int, tuple]:
    """``Resolver.resolve`` on the process's one resolver."""
    return _RESOLVER.resolve(host, port, deadline)


def connect_within(address: tuple[str, int], timeout: float) -> socket.socket:
    """A TCP socket connected to ``address`` (a name or an IPv4 address), resolving and
    connecting within ``timeout`` together; ``socket.create_connection`` without its unbounded
    resolution. Raises ``OSError`` (``TimeoutError`` past the deadline)."""
    deadline = time.monotonic() + timeout
    family, sockaddr = resolve(address[0], address[1], deadline)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.connect(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock
