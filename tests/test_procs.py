"""``ServerProcess``: a frozen server answers nothing, from the moment ``freeze`` returns; ``close``
leaves no work directory behind."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from devtools.testing.procs import ServerProcess, _all_threads_stopped

# Eight threads spinning: on two cores most of them are runnable, not running, when SIGSTOP is sent.
_SPINNERS = """
import threading
def spin():
    while True:
        pass
for _ in range(8):
    threading.Thread(target=spin).start()
"""


class _Spinners(ServerProcess):
    def __init__(self) -> None:
        super().__init__("mcsgl-procs-", "spin.log")

    def start(self) -> Any:
        self._proc = subprocess.Popen([sys.executable, "-c", _SPINNERS])
        return self


def test_freeze_returns_only_once_every_thread_is_stopped_and_thaw_resumes_them() -> None:
    with _Spinners() as p:
        for _ in range(20):
            p.freeze()
            assert _all_threads_stopped(p.pid)
            p.thaw()
        assert p.pid is not None  # still alive, and stop() ends it below


def test_freeze_of_a_process_that_is_not_running_says_so() -> None:
    p = _Spinners()
    try:
        p.freeze()
    except RuntimeError as e:
        assert "not running" in str(e)
    else:
        raise AssertionError("freeze of a process never started returned")


def test_close_deletes_the_work_directory_and_stop_keeps_it() -> None:
    p = _Spinners().start()
    p.stop()
    assert os.path.isdir(p.workdir)  # a restart, or a look at the log, may follow a stop
    p.close()
    assert not os.path.exists(p.workdir)
    with _Spinners() as q:
        pass
    assert not os.path.exists(q.workdir)
