"""Taking connections in: which are open and which still unauthenticated (``Admission``), and
keeping an accept loop alive through failures that cost one connection (``AcceptFailures``).

Admission. At most ``max_connections`` are open and ``max_handshakes`` unauthenticated; a new one
over either limit pushes out the oldest unauthenticated connection, and is refused when every open
one is authenticated.

Failures. An ``accept()`` that fails with ``EMFILE``, ``ENFILE``, ``ENOBUFS`` or ``ENOMEM`` leaves the
connection in the backlog, so the next one fails at once until a descriptor or memory is freed:
the loop backs off (doubling from ``MIN_BACKOFF_S`` to ``MAX_BACKOFF_S``) rather than spin. Other
errors (``ECONNABORTED``, ``EPROTO``, a firewall's ``EPERM``) belong to that one connection and are
retried at once. A connection whose thread cannot start (a container's pids limit) is closed, and
the loop backs off the same way. Every failure is counted; the log gets at most one line per kind
per ``LOG_INTERVAL_S``, with the count since its last line. A loop that ended instead would leave
the process up and every SGLang instance using the pool reading misses until someone restarts it.
"""

from __future__ import annotations

import errno
import logging
import resource
import threading
import time
from collections.abc import Callable

from .conn import Conn

RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
MIN_BACKOFF_S = 0.01  # arbitrary: a descriptor is often freed within milliseconds
MAX_BACKOFF_S = 1.0  # arbitrary: a client's connect_timeout (1 s) still sees most of its tries
LOG_INTERVAL_S = 30.0  # arbitrary: as failure_log, one line per kind per half minute
# Descriptors the server holds besides its connections: listeners, segments, logs, the refused
# connections waiting for their error frame, /metrics' connections. Arbitrary, generous.
SPARE_DESCRIPTORS = 256


def fit_descriptor_limit(max_connections: int, log: logging.Logger) -> int:
    """Raise this process's soft descriptor limit (``ulimit -n``) so that ``max_connections``
    fit, up to the hard limit; warn where even that is too low. Returns the soft limit now.

    A soft limit of 1024, common and the default of many containers, ran out at about 1,016
    clients under the default ``max_connections`` of 1024; raising it to the hard limit is what
    the limit's owner allows without asking."""
    need = max_connections + SPARE_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        want = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError) as e:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, want, e)
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning("max_connections=%d needs about %d descriptors but this process may open %d "
                    "(ulimit -n, hard limit %s): connections past about %d will wait for a "
                    "descriptor to be freed. Raise the limit or lower max_connections",
                    max_connections, need, soft, hard, max(0, soft - SPARE_DESCRIPTORS))
    return soft


class AcceptFailures:
    """What an accept loop does after a failure: count it, log it (rate-limited), back off.

    ``clock`` is injectable so the rate limit is testable without sleeping.
    """

    def __init__(self, where: str, log: logging.Logger, stop: threading.Event,
                 interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._where = where
        self._log = log
        self._stop = stop
        self._interval = interval_s
        self._clock = clock
        self._backoff = 0.0
        self._last: dict[str, float] = {}
        self._held_back: dict[str, int] = {}

    def failed(self, what: str, e: BaseException) -> float:
        """Account for a failed ``what`` (``"accept"``, ``"thread start"``); returns the seconds
        to wait before the next accept (0 for a failure of the one connection)."""
        resource = not isinstance(e, OSError) or e.errno in RESOURCE_ERRNOS
        self._backoff = min(MAX_BACKOFF_S, max(MIN_BACKOFF_S, self._backoff * 2)) if resource else 0.0
        now = self._clock()
        last = self._last.get(what)
        if last is not None and now - last < self._interval:
            self._held_back[what] = self._held_back.get(what, 0) + 1
        else:
            self._last[what] = now
            held = self._held_back.pop(what, 0)
            self._log.error("%s: %s failed (%s: %s; %d more since the last report); %s", self._where,
                            what, type(e).__name__, e, held,
                            f"backing off {self._backoff:g}s" if resource else "accepting the next")
        return self._backoff

    def wait(self, what: str, e: BaseException) -> None:
        """``failed``, then the back-off (cut short by ``stop``)."""
        delay = self.failed(what, e)
        if delay:
            self._stop.wait(delay)

    def succeeded(self) -> None:
        self._backoff = 0.0


class Admission:
    """The open connections, the unauthenticated ones oldest first, and the rule that admits a new
    one. Thread-safe."""

    def __init__(self, max_connections: int, max_handshakes: int) -> None:
        self._max_connections = max_connections
        self._max_handshakes = max_handshakes
        self._lock = threading.Lock()
        self._conns: set[Conn] = set()
        self._pending: dict[Conn, None] = {}

    def admit(self, c: Conn) -> tuple[bool, Conn | None]:
        """Whether ``c`` is in (else it is to be refused), and the connection it pushed out, whose
        socket the caller shuts down."""
        with self._lock:
            victim = None
            full = len(self._conns) >= self._max_connections
            if (full or len(self._pending) >= self._max_handshakes) and self._pending:
                victim = next(iter(self._pending))
                del self._pending[victim]
                self._conns.discard(victim)
                full = False
            if not full:
                self._conns.add(c)
                self._pending[c] = None
            return not full, victim

    def authenticated(self, c: Conn) -> None:
        """``c`` proved its secret: no new connection can push it out from now on."""
        with self._lock:
            self._pending.pop(c, None)

    def discard(self, c: Conn) -> None:
        with self._lock:
            self._conns.discard(c)
            self._pending.pop(c, None)

    def open(self) -> list[Conn]:
        with self._lock:
            return list(self._conns)

    def __len__(self) -> int:
        with self._lock:
            return len(self._conns)
