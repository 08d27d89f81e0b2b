"""The Mooncake Store tier's probes of its master: bounded by their timeouts, name resolution too."""

from __future__ import annotations

import socket
import time

import pytest

from mooncake_sgl.tiers.mooncake_link import answers, reachable


def test_probing_a_master_by_name_during_a_dns_outage_takes_the_probe_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # create_connection resolved the name first, with no timeout: each probe took the resolver's
    # own (here 3 s), so the watcher noticed a lost master that much later.
    real = socket.getaddrinfo

    def dns_down(host: str, *args: object, **kwargs: object) -> list:
        if host.endswith(".dns.test"):
            time.sleep(3)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns_down)
    t0 = time.monotonic()
    assert answers(("master.dns.test", 50051), timeout=0.3) is False
    assert reachable([("etcd-a.dns.test", 2379)]) is False
    assert time.monotonic() - t0 < 1.5
