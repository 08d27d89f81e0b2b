"""Other weights must never be served the old weights' KV: a checkpoint replaced in place (issue 22,
defect 1) or weights updated at run time (issue 35, defect 1).

Server A caches a prompt into host + LMDB tiers and stops. The model directory is rewritten with
other weights (same architecture, same path, same served name), and server B starts on the same
tiers: it must take nothing from storage and answer as the new model does, which a storage hit of
its own then reproduces. Then B is sent ``/update_weights_from_disk`` with a copy of A's checkpoint
in another directory: the same prompt must now answer exactly as A did, never from B's own pages
(the old weights' for B); taken from storage, it can only be A's pages, which the copy's fingerprint
names again.
"""

from __future__ import annotations

from pathlib import Path

from devtools.bench.server import stop_all
from devtools.tiny_model import TinyLlama, write_tiny_llama

from .conftest import Servers
from .probe import LiveClient, prompt, reusable, storage_hit
from .test_live_serving import host_lmdb

PROMPT_TOKENS = 768
# An explicit ratio: SGLang's auto-sizing refuses to start when this shared machine's free memory
# is below its 10 GiB reserve, which says nothing about this test.
FLAGS = ("--hicache-ratio", "2")


def test_replaced_weights_under_the_same_path_miss_and_answer_as_the_new_model(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "model", TinyLlama(seed=0))
    servers = Servers(model, tmp_path / "logs")
    try:
        tiers = host_lmdb(tmp_path)
        ids = prompt(PROMPT_TOKENS, seed=11)
        a = servers.start("a", tiers, FLAGS)
        old_client = LiveClient(a.url)
        old = old_client.generate(ids)
        assert storage_hit(old_client, ids).storage_tokens == reusable(PROMPT_TOKENS)  # stored
        a.stop()

        write_tiny_llama(model, TinyLlama(seed=1))  # in place: same path, same served name
        b = servers.start("b", tiers, FLAGS)
        new_client = LiveClient(b.url)
        new = new_client.generate(ids)
        assert new.storage_tokens == 0, new
        assert not new.same_as(old), "the two checkpoints answer alike: the test proves nothing"
        again = storage_hit(new_client, ids)  # the new model's own pages do hit
        assert again.same_as(new), (again, new)
        log = b.log_path.read_text(errors="replace")
        assert "model fingerprint" in log and "1 weight file(s)" in log

        copy = write_tiny_llama(tmp_path / "copy-of-a", TinyLlama(seed=0))
        reply = new_client.update_weights_from_disk(str(copy))
        assert reply["success"], reply
        updated = storage_hit(new_client, ids)  # A's pages, found again under the copy's fingerprint
        assert updated.same_as(old), (updated, old)
        assert updated.storage_tokens == reusable(PROMPT_TOKENS), updated
        assert "weights updated (update_weights_from_disk, succeeded)" in b.log_path.read_text(
            errors="replace")
    finally:
        stop_all(servers.started)
