"""``MasterLink``: a Mooncake Store client's link to its master, kept up by a watcher thread.

The link owns the ``MooncakeDistributedStore`` client and whether it may be used (up/down). Calls
borrow the client through ``session()``: ``None`` while the master is down, so the tier answers
misses without touching Mooncake (an RPC to a dead master blocks ~4.4 s). A call whose return codes
say the master is gone (``check``) marks the link down at once; the watcher notices a lost master
before a caller does (client health check, plus, once a second, a probe that a plain master
answers: a stopped one still has its connections accepted by the kernel), and brings the link
back: first it gives the client's own reconnect a chance, then, ``reconnect_after`` after the
master answers again, a fresh client setup (retried with doubling back-off; an HA client is left
to follow the new leader). Mooncake's ``setup`` and ``close`` hold the GIL for their whole run
(4.5 s against a dead master, 2-7 s), freezing every thread of the process, so neither is tried
while the master refuses connections or does not answer.

What a fresh client needs besides setup (registered memory, the staging buffer) is replayed by the
tier's ``on_connect`` callback, under the link's lock, before the client is handed out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..api import TierReport
from ..config import MooncakeStoreTierConfig
from ..errors import TierClosed
from ..tally import Tally
from ..transfer.resolve import connect_within

logger = logging.getLogger(__name__)

OK, ILLEGAL_CLIENT = 0, -601
RPC_FAIL, RPC_TIMEOUT, UNAVAILABLE = -900, -901, -1010
MASTER_LOST = frozenset({RPC_FAIL, RPC_TIMEOUT, ILLEGAL_CLIENT, UNAVAILABLE})

# Mooncake's own local buffer only serves its bytes API, which the tier never uses.
_MOONCAKE_LOCAL_BUFFER = 16 << 20
_WATCH_INTERVAL = 0.25  # how often the watcher looks at the link (cheap: no master RPC when up)
# While up, the master's port is also probed: the client's own heartbeat takes seconds to notice
# a dead master, and a call in that window blocks ~4.4 s. Once a second per node is cheap.
_UP_PROBE_INTERVAL = 1.0
_MAX_SETUP_BACKOFF = 60.0
RPC_TIMEOUT_MS = 3000  # the Mooncake client's MC_RPC_TIMEOUT_MS unless the operator set one


def endpoints(master: str) -> list[tuple[str, int]]:
    """TCP endpoints to probe for a master address: the master itself (``host:port``), or the
    etcd/redis endpoints an HA set elects its leader through (``etcd://h1:2379;h2:2379``)."""
    out = []
    for part in master.split("://", 1)[-1].split(";"):
        host, _, port = part.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host, int(port)))
    return out


def reachable(eps: list[tuple[str, int]]) -> bool | None:
    """Does any endpoint accept a TCP connection (``None``: nothing to probe)."""
    if not eps:
        return None
    for ep in eps:
        try:
            with connect_within(ep, timeout=0.5):  # a DNS outage costs the probe 0.5 s, not 10+
                return True
        except OSError:
            pass
    return False


# Not a coro_rpc request header: a live master closes such a connection at once, without a log
# line (measured with the 0.3.13 wheel). A stopped master (SIGSTOP, a frozen VM) or a hung one still has the
# kernel accept the connection, so only an answer tells it apart from a running one.
_NOT_RPC = bytes(32)


def answers(ep: tuple[str, int], timeout: float = 1.0) -> bool:
    """Does the master at ``ep`` react (close or reply) to bytes within ``timeout`` seconds."""
    try:
        with connect_within(ep, timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_NOT_RPC)
            sock.recv(1)
            return True
    except ConnectionError:  # reset: the master's process reacted
        return True
    except OSError:  # refused, or no reaction in time
        return False


@dataclass(frozen=True)
class MasterLinkStats:
    """A link's counts (in its tier's ``stats()``)."""

    master_lost: int = 0  # times the link went down
    reconnects: int = 0  # times it came back, by the client's own reconnect or a fresh setup
    setups: int = 0  # client setups tried, the first included


@dataclass(frozen=True)
class MasterLinkReport(TierReport):
    """A link's ``stats()``: its counts and whether it is up (part of its tier's report)."""

    counts: MasterLinkStats
    connected: float  # 1.0 while the link is up, else 0.0 (a 0/1 gauge, as exported)


class MasterLink:
    """The client of one tier and its up/down state (see the module docstring).

    Args:
        name: the tier's name, for logs.
        config: the tier's config (master, metadata server, protocol, back-off).
        ms: the ``mooncake.store`` module.
        on_connect: called with a freshly set-up client, under the link's lock, before use.
        probe_key: an object name whose existence check proves the master answers.
    """

    def __init__(self, name: str, config: MooncakeStoreTierConfig, ms: Any,
                 on_connect: Callable[[Any], None], probe_key: str) -> None:
        self.name = name
        self.config = config
        self._ms = ms
        self._on_connect = on_connect
        self._probe_key = probe_key
        self._probe_endpoints = endpoints(config.master)
        # While up, only a plain master address is probed: an HA set's leader is not at a fixed one.
        self._direct = "://" not in config.master
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._client: Any = None
        self._up = False
        self._closed = False
        self._inflight = 0
        self._reachable_since: float | None = None
        self._counters = Tally(MasterLinkStats)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def up(self) -> bool:
        return self._up

    def start(self) -> int | None:
        """Connect (unless the master's endpoint refuses connections) and start the watcher.
        Returns setup's code, or ``None`` when no setup was tried."""
        rc = None
        if self._master_answers() is False:
            # Mooncake's setup would block (GIL held) and fail; the watcher connects later.
            logger.warning("%s: master %s unreachable at start; answering misses until it answers",
                           self.name, self.config.master)
        else:
            rc = self._connect()
        self._watcher = threading.Thread(target=self._watch, name=f"{self.name}-watcher", daemon=True)
        self._watcher.start()
        return rc

    @contextmanager
    def session(self) -> Iterator[Any]:
        """The client to use, or ``None`` while the master is down (the caller answers misses).
        Raises ``TierClosed`` once closed."""
        with self._lock:
            self._raise_if_closed()
            client = self._client if self._up else None
            if client is not None:
                self._inflight += 1
        if client is None:
            yield None
            return
        try:
            yield client
        finally:
            with self._lock:
                self._inflight -= 1
                if not self._inflight:
                    self._idle.notify_all()

    @contextmanager
    def locked_client(self) -> Iterator[Any]:
        """The current client (up or not, possibly ``None``) with the link's lock held, so nothing
        replaces it meanwhile (registrations)."""
        with self._lock:
            self._raise_if_closed()
            yield self._client

    def check(self, codes: Sequence[int]) -> None:
        """Mark the link down when Mooncake's return codes say the master is gone."""
        lost = MASTER_LOST.intersection(codes)  # C speed: this runs on every batch
        if lost:
            self.mark_down(f"Mooncake returned {min(lost)}")

    def mark_down(self, why: str) -> None:
        with self._lock:
            if not self._up:
                return
            self._up = False
            self._reachable_since = None
            self._counters.add(master_lost=1)
        logger.warning("%s: master %s unreachable (%s); answering misses until it is back",
                       self.name, self.config.master, why)

    def stats(self) -> MasterLinkReport:
        with self._lock:  # the watcher counts a reconnect as it marks the link up
            return MasterLinkReport(self._counters.snapshot(), float(self._up))

    def close(self) -> None:
        """Stop the watcher, wait for calls in flight, close the client. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._up = False
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()
        with self._lock:
            while self._inflight:
                self._idle.wait()
            client, self._client = self._client, None
        if client is not None:
            client.close()  # unmounts this node's segment: 2-7 s, holding the GIL

    # ------------------------------------------------------------------ internals

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise TierClosed(f"tier {self.name} is closed")

    def _connect(self) -> int:
        """A fresh client: setup (outside the lock: ~4.5 s against a dead master), then replay
        registrations and install it. Returns setup's code (0: connected)."""
        c = self.config
        client = self._ms.MooncakeDistributedStore()
        self._counters.add(setups=1)
        # tenant_id only when asked for: Mooncake wheels before tenants take no such argument.
        tenant = {"tenant_id": c.tenant_id} if c.tenant_id != "default" else {}
        rc = client.setup(c.local_hostname, c.metadata_server, c.segment_size, _MOONCAKE_LOCAL_BUFFER,
                          c.protocol, c.device, c.master, **tenant)
        if rc != OK:
            logger.warning("%s: setup against master %s (metadata %s, protocol %s) failed with %d; "
                           "retrying every %.1fs", self.name, c.master, c.metadata_server, c.protocol,
                           rc, c.reconnect_after)
            client.close()
            return rc
        with self._lock:
            if self._closed:
                client.close()
                return OK
            self._on_connect(client)
            self._client = client
            self._up = True
        return OK

    def _master_answers(self) -> bool | None:
        """A plain master: does it answer (not merely accept a connection); an HA set: does any
        of its etcd/redis endpoints accept a connection. ``None``: nothing to probe."""
        if self._direct and self._probe_endpoints:
            return answers(self._probe_endpoints[0])
        return reachable(self._probe_endpoints)

    def _watch(self) -> None:
        last_setup = last_probe = time.monotonic()
        backoff = self.config.reconnect_after
        while not self._stop.wait(_WATCH_INTERVAL):
            now = time.monotonic()
            if self._up:
                backoff = self.config.reconnect_after
                probe = self._direct and now - last_probe >= _UP_PROBE_INTERVAL
                last_probe = now if probe else last_probe
                if self._client.health_check() == 2:
                    self.mark_down("health check")
                elif probe and self._master_answers() is False:
                    self.mark_down("it does not answer")
                continue
            if self._master_answers() is False:
                # Refused, or stopped: a setup or close now would freeze the process (GIL held)
                # for the whole RPC timeout, several times over.
                self._reachable_since = None
                continue
            if self._reachable_since is None:
                self._reachable_since = now
            client = self._client
            if (client is not None and client.health_check() == 0
                    and all(c >= 0 for c in client.batch_is_exist([self._probe_key]))):
                with self._lock:
                    if not self._closed:
                        self._up = True
                        self._counters.add(reconnects=1)
                logger.warning("%s: master %s is back", self.name, self.config.master)
                continue
            # An HA client follows the new leader by itself (~10 s); closing it after a fail-over
            # was seen to take 40 s with the GIL held, so it is only replaced for a plain master.
            replaceable = client is None or self._direct
            if replaceable and now - max(self._reachable_since, last_setup) >= backoff:
                self._fresh_setup()
                last_setup = time.monotonic()
                backoff = min(backoff * 2, _MAX_SETUP_BACKOFF)

    def _fresh_setup(self) -> None:
        with self._lock:
            while self._inflight:  # calls that started before the master was lost
                self._idle.wait()
            if self._closed:
                return
            old, self._client = self._client, None
        if old is not None:
            old.close()
        if self._connect() == OK and self._up:
            self._counters.add(reconnects=1)
            logger.warning("%s: reconnected to master %s with a fresh client", self.name,
                           self.config.master)
