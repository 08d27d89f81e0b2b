"""``read_regular_file``: a path a user names is read only as a regular file of bounded size; a
device, FIFO, directory or socket, or a file over the bound, is a ``ConfigError`` naming the path,
what it is and the bound, at once and without reading it."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from mooncake_sgl.errors import ConfigError
from mooncake_sgl.files import read_regular_file


def test_a_regular_file_up_to_the_limit_is_read_whole_through_a_symlink(tmp_path: Path) -> None:
    f = tmp_path / "tiers.yaml"
    f.write_bytes(b"x" * 100)
    (tmp_path / "link.yaml").symlink_to(f)  # as a Kubernetes ConfigMap mounts its files
    assert read_regular_file(tmp_path / "link.yaml", limit=100, what="config file") == b"x" * 100


def test_a_file_over_the_limit_is_refused_naming_its_size_and_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "huge.yaml"
    with open(f, "wb") as out:
        out.truncate(1 << 30)  # sparse: a GiB that takes no disk, and must not be read
    with pytest.raises(ConfigError, match=rf"config file: it holds {1 << 30} bytes, over the limit "
                                          rf"of 4096 bytes \(in {f}\)"):
        read_regular_file(f, limit=4096, what="config file")


def test_a_file_whose_size_says_less_than_it_holds_is_cut_at_the_limit_and_refused() -> None:
    # A /proc file is regular and says 0 bytes: only the bounded read finds it too large.
    with pytest.raises(ConfigError, match=r"it holds more than the limit of 16 bytes \(in "
                                          r"/proc/self/status\)"):
        read_regular_file("/proc/self/status", limit=16, what="config file")


def test_a_fifo_is_refused_at_once_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "tiers.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(read_regular_file(fifo, limit=4096, what="config file"))
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked in open(): a writer that closes at once lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("reading a FIFO blocked until a writer came")
    assert isinstance(outcome[0], ConfigError), outcome
    assert str(outcome[0]) == (f"cannot read config file: it is a FIFO (named pipe), not a regular "
                               f"file (in {fifo})")


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"),
                                        ("/dev/null", "a character device"),
                                        ("/", "a directory")])
def test_a_device_or_directory_is_refused_naming_what_it_is(path: str, kind: str) -> None:
    with pytest.raises(ConfigError, match=rf"cannot read config file: it is {kind}, not a regular "
                                          rf"file \(in {path}\)"):
        read_regular_file(path, limit=4096, what="config file")


def test_a_unix_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(ConfigError, match="it is a socket, not a regular file"):
            read_regular_file(path, limit=4096, what="config file")


def test_a_missing_file_or_a_path_with_a_nul_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"cannot read tiers: No such file .*{tmp_path}/nope"):
        read_regular_file(tmp_path / "nope", limit=4096, what="tiers")
    with pytest.raises(ConfigError, match="the path holds a NUL character"):
        read_regular_file("tiers\0.yaml", limit=4096, what="tiers")
