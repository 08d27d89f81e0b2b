"""``ServerProcess``: the life cycle shared by the server subprocesses we start (our pool server,
the real ``mooncake_master``): a private work folder with the log, graceful stop with a SIGKILL
fallback, a crash-like kill, the log's tail for error messages, and use as a context manager.
Subclasses set ``_proc`` in ``start()`` and may keep other files in ``workdir``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from typing import Any


class ServerProcess:
    def __init__(self, prefix: str, log_name: str) -> None:
        self.workdir = tempfile.mkdtemp(prefix=prefix)
        self.log_path = os.path.join(self.workdir, log_name)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (clean shutdown), SIGKILL after ``timeout``."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, mid-request if one is in flight."""
        self._signal(signal.SIGKILL, 10.0)

    def _signal(self, sig: signal.Signals, timeout: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def log_tail(self, nbytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - nbytes))
                return f.read().decode(errors="replace")
        except OSError:
            return "(no log)"

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
