"""Host names resolved within a deadline: a hanging resolver costs a caller its deadline only, one
lookup per name is in flight however many callers wait, and the last answer outlives an outage."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from mooncake_sgl.transfer.resolve import Resolver


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """``getaddrinfo`` answering 127.0.0.1 for any name, or hanging while ``hang`` is set."""
    state: dict[str, object] = {"calls": 0, "hang": threading.Event()}
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: int, *args: object) -> list:
        state["calls"] += 1  # type: ignore[operator]
        if state["hang"].is_set():  # type: ignore[attr-defined]
            time.sleep(2)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real("127.0.0.1", port, *args)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return state


def test_callers_of_a_hanging_name_share_one_lookup_and_each_waits_its_deadline_only(
        lookups: dict[str, object]) -> None:
    lookups["hang"].set()  # type: ignore[attr-defined]
    resolver, times = Resolver(), []

    def one() -> None:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="'pool.test'"):
            resolver.resolve("pool.test", 7480, time.monotonic() + 0.2)
        times.append(time.monotonic() - t0)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(times) == 10 and max(times) < 0.7 and lookups["calls"] == 1


def test_the_last_answer_is_used_at_once_during_an_outage(lookups: dict[str, object]) -> None:
    resolver = Resolver()
    assert resolver.resolve("pool.test", 7480, time.monotonic() + 1) == (socket.AF_INET, ("127.0.0.1", 7480))
    lookups["hang"].set()  # type: ignore[attr-defined]
    t0 = time.monotonic()
    assert resolver.resolve("pool.test", 7480, time.monotonic() + 1)[1] == ("127.0.0.1", 7480)
    assert time.monotonic() - t0 < 0.1


def test_a_numeric_address_is_never_looked_up(lookups: dict[str, object]) -> None:
    assert Resolver().resolve("10.1.2.3", 7480, time.monotonic()) == (socket.AF_INET, ("10.1.2.3", 7480))
    assert lookups["calls"] == 0


def test_a_name_that_does_not_resolve_is_an_oserror(monkeypatch: pytest.MonkeyPatch) -> None:
    def nxdomain(*_: object) -> list:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", nxdomain)
    with pytest.raises(OSError, match="not known"):
        Resolver().resolve("nowhere.test", 7480, time.monotonic() + 1)


def test_a_lookup_whose_thread_cannot_start_is_an_oserror_and_the_next_one_is_tried(
        lookups: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    real, left = threading.Thread.start, [1]

    def no_threads(thread: threading.Thread) -> None:
        if thread.name.startswith("resolve-") and left[0] > 0:
            left[0] -= 1
            raise RuntimeError("can't start new thread")
        real(thread)

    monkeypatch.setattr(threading.Thread, "start", no_threads)
    resolver = Resolver()
    with pytest.raises(OSError, match="no thread for the lookup"):
        resolver.resolve("pool.test", 7480, time.monotonic() + 1)
    assert resolver.resolve("pool.test", 7480, time.monotonic() + 1)[1] == ("127.0.0.1", 7480)
