"""A live hybrid model on the CPU server: a tiny sliding-window model (SGLang's Mellum architecture:
three sliding-window layers and one full-attention layer, seeded random weights), so SGLang's
HiCache runs a SWA sidecar pool and calls our v2 API from its real scheduler threads.

Checked: after ``/flush_cache`` the whole reusable prefix comes back from our storage, the SWA
window at the hit's end is loaded by ``batch_get_v2`` (every page found) and every sidecar backup
by ``batch_set_v2`` was stored.

Not checked, on purpose: that the output equals recompute. On CPU the ``torch_native`` attention
backend reads a sliding-window layer's KV with full-pool token locations
(``sglang/srt/layers/attention/torch_native_backend.py:139-141``, called from ``forward_extend`` at
``:313-317``) while it writes at SWA locations (``:298-300``), so those layers attend to whatever
stale bytes sit at the full locations, loaded or not: zeroing the loaded SWA pages leaves the output
unchanged, and another prompt run in between changes it. The comparison cannot be made on CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.tiny_model import TinyLlama, write_tiny_llama
from tests.hicache.recording_backend import MARK

from .conftest import Servers, write_tiers
from .probe import LiveClient, prompt, reusable, storage_hit

PROMPT_TOKENS = 2048
PAGE = 64
WINDOW_PAGES = 2  # the model's 128-token window, in 64-token pages


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    model = write_tiny_llama(tmp_path / "model", TinyLlama(layers=4, swa_window=WINDOW_PAGES * PAGE))
    made = Servers(model, tmp_path / "logs")
    yield made
    for server in made.started:
        server.stop()


def _recorded(log: str) -> list[tuple[str, str, str]]:
    return [tuple(line.split(MARK, 1)[1].split()) for line in log.splitlines() if MARK in line]


def test_live_hybrid_swa_model_round_trips_its_sidecar_through_v2(servers: Servers, tmp_path: Path) -> None:
    tiers = write_tiers(tmp_path / "tiers.yaml", f"""
tiers:
  - {{kind: host, capacity: 64MiB}}
  - {{kind: lmdb, path: "{tmp_path / 'lmdb'}", capacity: 1GiB}}
""")
    recording = ("--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config",
                 json.dumps({"backend_name": "recording", "interface_v1": 1, "config_file": str(tiers),
                             "module_path": "tests.hicache.recording_backend",
                             "class_name": "RecordingStorage"}))
    server = servers.start("hybrid", tiers, recording)
    client = LiveClient(server.url)
    ids = prompt(PROMPT_TOKENS, seed=3)
    cold = client.generate(ids)
    assert cold.storage_tokens == 0
    hit = storage_hit(client, ids)
    assert hit.storage_backend == "RecordingStorage"
    assert hit.storage_tokens == reusable(PROMPT_TOKENS), hit

    log = (tmp_path / "logs" / "hybrid.log").read_text()
    assert "hybrid_swa=True" in log and "mooncake_sgl: pool swa:" in log
    calls = _recorded(log)
    sets = [ok for op, pool, ok in calls if op == "set" and pool == "swa"]
    gets = [ok for op, pool, ok in calls if op == "get" and pool == "swa"]
    assert sets and all(set(ok) == {"1"} for ok in sets), calls
    assert "1" * WINDOW_PAGES in gets, calls  # the window at the hit's end, every page found
