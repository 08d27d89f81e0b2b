"""A live ``sglang.launch_server`` with our backend, as users run it (``scripts/serve_cpu.sh``).

The check that matters: a prompt served from our storage tiers gives the same greedy tokens and
bit-identical logprobs as computing it. ``test_corrupted_loads_change_the_output`` proves that this
comparison would catch wrong bytes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from .conftest import Servers, write_tiers
from .probe import LiveClient, prompt, reusable, storage_hit

PROMPT_TOKENS = 2048


def host_lmdb(tmp_path: Path) -> Path:
    return write_tiers(tmp_path / "tiers.yaml", f"""
tiers:
  - {{kind: host, capacity: 64MiB}}
  - {{kind: lmdb, path: "{tmp_path / 'lmdb'}", capacity: 1GiB}}
""")


def test_storage_hit_is_identical_to_recompute_and_survives_a_restart(servers: Servers,
                                                                       tmp_path: Path) -> None:
    tiers = host_lmdb(tmp_path)
    ids = prompt(PROMPT_TOKENS, seed=1)
    first = servers.start("first", tiers)
    client = LiveClient(first.url)
    cold = client.generate(ids)
    assert cold.storage_tokens == 0 and len(cold.output_ids) == 8

    hit = storage_hit(client, ids)
    assert hit.storage_backend == "MooncakeSglStorage"
    assert hit.storage_tokens == reusable(PROMPT_TOKENS)
    assert hit.same_as(cold), (hit, cold)

    # What a user does to stop it: SIGTERM to the process group; nothing it started may remain.
    group = os.getpgid(first.proc.pid)
    members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == group]
    assert len(members) >= 3  # the launcher, sglang's main process, its scheduler (and more)
    os.killpg(group, signal.SIGTERM)
    gone, alive = psutil.wait_procs(members, timeout=30)
    assert not alive, f"still running 30 s after SIGTERM to the group: {alive}"

    # A new server on the same tiers: the host tier starts empty, so the hit comes from LMDB. It
    # starts as on a fresh machine or container, without SGLang's page-hash extension built: its
    # first request must still read what is stored (that build used to be paid by this lookup).
    fresh = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "fresh-extensions")}
    again = LiveClient(servers.start("restarted", tiers, env=fresh).url)
    restored = again.generate(ids)
    assert restored.storage_tokens == reusable(PROMPT_TOKENS), restored
    assert restored.same_as(cold), (restored, cold)


def test_corrupted_loads_change_the_output(servers: Servers, tmp_path: Path) -> None:
    """Negative control: the same comparison, with every page zeroed after it is loaded."""
    tiers = host_lmdb(tmp_path)
    extra = ("--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config",
             '{"backend_name": "corrupting", "module_path": "tests.live.corrupting_backend", '
             f'"class_name": "CorruptingStorage", "interface_v1": 1, "config_file": "{tiers}"}}')
    server = servers.start("corrupting", tiers, extra)
    client = LiveClient(server.url)
    ids = prompt(PROMPT_TOKENS, seed=2)
    cold = client.generate(ids)
    hit = storage_hit(client, ids)
    assert hit.storage_tokens == reusable(PROMPT_TOKENS)
    assert not hit.same_as(cold), "zeroed KV gave the same output: the comparison detects nothing"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_serve_cpu_refuses_bad_arguments(tiny_model: Path, tmp_path: Path) -> None:
    import subprocess

    from .conftest import SERVE

    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers: [{kind: host, capacity: 12XB}]\n")
    started = time.monotonic()
    for args, message in (([], "usage"), (["http", str(tiny_model), str(bad)], "PORT"),
                          (["30000", str(tmp_path), str(bad)], "no config.json"),
                          (["30000", str(tiny_model), str(bad)], "tiers[0].capacity")):
        out = subprocess.run(["bash", str(SERVE), *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
    assert time.monotonic() - started < 120  # refused before any server starts
