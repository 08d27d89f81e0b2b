"""``BackgroundMover``: where the store's placement work (promotion, demotion, eviction) runs in the
product. ``Mover`` is what the store's parts ask of it, so they take either mover.

It is one daemon thread fed by a bounded queue, so placement I/O leaves SGLang's
prefetch and backup threads:

- ``submit`` never blocks: a full queue refuses the task (``False``) and the caller drops it
  (a promotion is an optimisation; the next hit asks again). That bound is the back-pressure for
  work nobody waits for.
- ``call`` runs a task the caller needs done (room in a full tier before a write) and waits for its
  result up to a timeout; when the queue is full the caller waits for a place in it, up to the same
  timeout. That is the back-pressure on writers that outrun eviction.
- ``drain`` lets the tasks queued so far run (a detach keeps the demotions it queued).
- ``close`` stops taking tasks, lets the running one finish, cancels the queued ones (a waiting
  ``call`` gets its ``default``), joins the thread and says how many it dropped.

``inline_mover.InlineMover`` is the same ``Mover`` on the calling thread (simulator, baselines).

A task that raises is logged and counted; it never kills the mover thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from ..tally import Tally
from .stats import MoverStats

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Arbitrary: tasks waiting for the mover. A promotion task is one looked-up batch; 256 batches of
# backlog means the mover is far behind and new promotions are better dropped than queued.
QUEUE_TASKS = 256


def _barrier() -> None:
    """``drain``'s marker task: once it has run, so has everything queued before it."""


class Mover(Protocol):
    """Where placement work runs: ``BackgroundMover`` (its own thread) or ``InlineMover`` (the
    caller's). ``background`` tells a caller whether a task it hands over runs later."""

    background: bool
    counters: Tally[MoverStats]

    def submit(self, fn: Callable[..., Any], *args: Any, urgent: bool = False) -> bool: ...

    def call(self, fn: Callable[..., T], *args: Any, default: T, timeout: float) -> T: ...

    def on_mover_thread(self) -> bool: ...

    def yield_now(self) -> None: ...

    def drain(self, timeout: float = 30.0) -> bool: ...

    def close(self) -> int: ...


class BackgroundMover:
    """One thread running placement tasks from a bounded queue (see the module docstring). Tasks a
    caller waits for (``call``) run before queued ones: a write waiting for room must not queue
    behind a backlog of promotions."""

    background = True

    def __init__(self, name: str = "mooncake-sgl-mover", capacity: int = QUEUE_TASKS) -> None:
        self.counters = Tally(MoverStats)
        self._capacity = capacity
        self._cond = threading.Condition()
        self._urgent: deque[tuple[Callable[..., Any], tuple, Future | None]] = deque()
        self._queued: deque[tuple[Callable[..., Any], tuple, Future | None]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, urgent: bool = False) -> bool:
        """Queue ``fn(*args)``; ``False`` (dropped) when the queue is full or the mover closed.
        ``urgent`` tasks (few, coalesced by the caller) run before the others."""
        with self._cond:
            if self._closed or (not urgent and len(self._queued) >= self._capacity):
                full = not self._closed
            else:
                (self._urgent if urgent else self._queued).append((fn, args, None))
                self._cond.notify()
                full = None
        if full is None:
            self.counters.add(submitted=1)
            return True
        if full:
            self.counters.add(dropped=1)
        return False

    def call(self, fn: Callable[..., T], *args: Any, default: T, timeout: float) -> T:
        """Run ``fn(*args)`` on the mover ahead of queued tasks and wait for its result; ``default``
        when it fails, the mover is closed, or ``timeout`` seconds pass (the task may still run)."""
        if self.on_mover_thread():  # a task asking for more work (a demotion needing room)
            try:
                return fn(*args)
            except Exception:
                logger.exception("placement task %s failed", getattr(fn, "__name__", fn))
                self.counters.add(failed=1)
                return default
        done: Future = Future()
        with self._cond:
            if self._closed:
                return default
            self._urgent.append((fn, args, done))
            self._cond.notify()
        self.counters.add(submitted=1, waits=1)
        try:
            return done.result(timeout=timeout)
        except TimeoutError:
            self.counters.add(timeouts=1)
            return default
        except Exception:  # cancelled at close, or the task raised (already logged)
            return default

    def on_mover_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def yield_now(self) -> None:
        """On the mover, between the steps of a move: let a request thread waiting for the GIL have
        it now, rather than after the interpreter's switch interval (5 ms), the wait a busy mover
        adds to SGLang's calls."""
        time.sleep(0)

    def drain(self, timeout: float = 30.0) -> bool:
        """Let every task queued before this call run; ``False`` on timeout."""
        if self.on_mover_thread():
            return True
        done: Future = Future()
        with self._cond:
            if self._closed:
                return True
            self._queued.append((_barrier, (), done))  # may exceed the bound by one
            self._cond.notify()
        try:
            done.result(timeout=timeout)
        except Exception:
            return False
        return True

    def close(self) -> int:
        """Stop: the running task finishes, queued ones are cancelled, the thread is joined. Returns
        how many queued tasks were dropped (a timed-out ``drain``'s barrier is no task)."""
        with self._cond:
            if self._closed:
                return 0
            self._closed = True
            pending = [*self._urgent, *self._queued]
            self._urgent.clear()
            self._queued.clear()
            self._cond.notify()
        for _fn, _args, done in pending:
            if done is not None:
                done.cancel()
        dropped = sum(fn is not _barrier for fn, _args, _done in pending)
        self.counters.add(dropped=dropped)
        self._thread.join()
        return dropped

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._urgent or self._queued or self._closed):
                    self._cond.wait()
                if self._urgent:
                    fn, args, done = self._urgent.popleft()
                elif self._queued:
                    fn, args, done = self._queued.popleft()
                else:
                    return
            if done is not None and not done.set_running_or_notify_cancel():
                continue
            try:
                out = fn(*args)
            except Exception as e:
                logger.exception("placement task %s failed", getattr(fn, "__name__", fn))
                self.counters.add(failed=1)
                if done is not None:
                    done.set_exception(e)
                continue
            self.counters.add(completed=1)
            if done is not None:
                done.set_result(out)
            # Hand the GIL over between tasks: a request thread waiting for it would otherwise
            # wait out the interpreter's switch interval (5 ms) behind a busy mover.
            time.sleep(0)
