"""Weights changed at run time never meet the old weights' pages (``hicache/weight_updates.py``):
while an update runs every call misses, afterwards the backend keys by the new weights, once
SGLang's caches are flushed. The live test (``tests/live/test_live_model_identity.py``) runs it
through a real ``/update_weights_from_disk``."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devtools.tiny_model import TinyLlama, write_tiny_llama
from mooncake_sgl.hicache import fingerprint as fp
from mooncake_sgl.hicache import weight_updates as wu
from mooncake_sgl.hicache.backend import MooncakeSglStorage

from . import pools

SPEC = TinyLlama(layers=1, hidden=64, heads=2, kv_heads=2, intermediate=64, vocab=256)
PAGES = 4


def _stored(tmp_path: Path, model: Path) -> tuple[MooncakeSglStorage, Any, list[str], Any]:
    """A backend on ``model`` that stored ``PAGES`` pages: (backend, pool, hashes, host indices)."""
    pool = pools.build_pool("mha", "page_first")
    backend = MooncakeSglStorage(pools.storage_config("mha", "page_first", tmp_path / "tiers",
                                                      model=str(model)), pool)
    hashes, idx = pools.page_hashes(PAGES, seed=5), pool.alloc(PAGES * pools.PAGE)
    pools.fill_random(pool, idx, seed=6)
    assert backend.batch_set_v1(hashes, idx) == [True] * PAGES
    assert backend.batch_exists(hashes) == PAGES
    return backend, pool, hashes, idx


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "model", SPEC)


def test_while_weights_change_every_call_misses_and_nothing_is_stored(tmp_path: Path, model: Path,
                                                                      caplog) -> None:
    backend, pool, hashes, idx = _stored(tmp_path, model)
    try:
        backend.weights_changing()
        with caplog.at_level("WARNING", logger="mooncake_sgl"):
            assert backend.batch_exists(hashes) == 0
            assert backend.batch_get_v1(hashes, idx) == [False] * PAGES
            assert backend.batch_set_v1(pools.page_hashes(PAGES, seed=9), idx) == [False] * PAGES
            assert backend.exists(hashes[0]) is False
        assert not caplog.records, "a miss while weights change is not a failure to log"

        backend.weights_changed(wu.WeightUpdate("tensor", version="step-2", succeeded=True, flushed=True))
        assert backend.batch_exists(hashes) == 0  # the old weights' pages: never again
        assert backend.batch_set_v1(hashes, idx) == [True] * PAGES  # the new weights' own
        assert backend.batch_exists(hashes) == PAGES
    finally:
        backend.close()


def test_without_a_flush_in_the_update_the_new_weights_take_effect_at_the_next_flush(
        tmp_path: Path, model: Path) -> None:
    backend, pool, hashes, idx = _stored(tmp_path, model)
    try:
        backend.weights_changing()
        backend.weights_changed(wu.WeightUpdate("distributed", version="v7", succeeded=True, flushed=False))
        # SGLang's device and host caches may still hold the old weights' KV: no backup of it may
        # land under the new weights' name, and none of the old pages may be read.
        assert backend.batch_set_v1(hashes, idx) == [False] * PAGES
        assert backend.batch_exists(hashes) == 0
        backend.cache_flushed()
        assert backend.batch_exists(hashes) == 0
        assert backend.batch_set_v1(hashes, idx) == [True] * PAGES
        assert backend.batch_exists(hashes) == PAGES
    finally:
        backend.close()


def test_an_update_supersedes_weights_loaded_but_not_yet_keyed(tmp_path: Path, model: Path) -> None:
    backend, pool, hashes, idx = _stored(tmp_path, model)
    try:
        backend.weights_changing()
        backend.weights_changed(wu.WeightUpdate("tensor", version="a", succeeded=True, flushed=False))
        backend.weights_changing()  # a second update before any flush
        backend.cache_flushed()  # the flush inside that update: still misses until it ends
        assert backend.batch_exists(hashes) == 0
        assert backend.batch_set_v1(hashes, idx) == [False] * PAGES
        backend.weights_changed(wu.WeightUpdate("tensor", version="b", succeeded=True, flushed=True))
        assert backend.batch_set_v1(hashes, idx) == [True] * PAGES
    finally:
        backend.close()


def test_a_disk_update_to_a_copy_of_the_first_checkpoint_reads_its_pages_again(tmp_path: Path,
                                                                                model: Path) -> None:
    other = write_tiny_llama(tmp_path / "other", dataclasses.replace(SPEC, seed=1))
    copy = write_tiny_llama(tmp_path / "copy", SPEC)
    backend, pool, hashes, idx = _stored(tmp_path, model)
    try:
        backend.weights_changing()
        backend.weights_changed(wu.WeightUpdate("disk", model_path=str(other), succeeded=True, flushed=True))
        assert backend.batch_exists(hashes) == 0
        backend.weights_changing()
        backend.weights_changed(wu.WeightUpdate("disk", model_path=str(copy), succeeded=True, flushed=True))
        assert backend.batch_exists(hashes) == PAGES  # the fingerprint is the content's
    finally:
        backend.close()


def test_a_weight_version_names_the_same_weights_everywhere_and_no_version_names_nothing(
        model: Path, tmp_path: Path) -> None:
    base = fp.fingerprint(fp.ModelSource(model_path=str(model)))
    source = fp.ModelSource(model_path=str(model))
    step = wu.WeightUpdate("tensor", version="step-3", succeeded=True, flushed=True)
    assert wu.next_weights(step, base, source) == wu.next_weights(step, base, None)
    assert wu.next_weights(step, base, source).digest != base.digest
    unnamed = dataclasses.replace(step, version=None)
    assert wu.next_weights(unnamed, base, source).digest != wu.next_weights(unnamed, base, source).digest
    drawn = dataclasses.replace(unnamed, epoch="e" * 32)  # every rank of one server drew the same
    assert wu.next_weights(drawn, base, source) == wu.next_weights(drawn, base, None)
    failed = dataclasses.replace(step, succeeded=False)  # which weights it left is not known
    assert wu.next_weights(failed, base, source).digest != wu.next_weights(failed, base, source).digest

    other = write_tiny_llama(tmp_path / "other", dataclasses.replace(SPEC, seed=1))
    disk = wu.WeightUpdate("disk", model_path=str(other), succeeded=True, flushed=True)
    # The digest: a fingerprint's summary also says how long it took, which differs between runs.
    assert wu.next_weights(disk, base, source).digest == \
        fp.fingerprint(fp.ModelSource(model_path=str(other))).digest
    assert wu.source_after(disk, source) == fp.ModelSource(model_path=str(other))
    assert wu.source_after(step, source) is None


class _Follower:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def weights_changing(self) -> None:
        self.calls.append("changing")

    def weights_changed(self, update: wu.WeightUpdate) -> None:
        self.calls.append(update)

    def cache_flushed(self) -> None:
        self.calls.append("flushed")


def test_the_update_hook_pauses_first_and_hands_over_the_update_even_when_sglang_raises() -> None:
    follower = _Follower()
    wu.follow(follower)
    hook = wu._around_update("disk")
    req = SimpleNamespace(model_path="/new", load_format=None, weight_version="v2", flush_cache=True)

    def update(manager: Any, recv_req: Any) -> Any:
        assert follower.calls == ["changing"]
        return SimpleNamespace(success=True)

    assert hook(update, object(), req).success
    epoch = follower.calls[1].epoch
    assert len(epoch) == 32  # drawn once for the update: a process alone keeps its own
    assert follower.calls[1] == wu.WeightUpdate("disk", "/new", None, "v2", succeeded=True, flushed=True,
                                                epoch=epoch)

    def broken(manager: Any, recv_req: Any) -> Any:
        raise RuntimeError("load failed")

    follower.calls.clear()
    with pytest.raises(RuntimeError, match="load failed"):
        hook(broken, object(), req)
    assert follower.calls[1] == wu.WeightUpdate("disk", "/new", None, "v2", succeeded=False, flushed=False,
                                                epoch=follower.calls[1].epoch)
    assert follower.calls[1].epoch != epoch

    follower.calls.clear()
    wu._after_flush(False, object())
    wu._after_flush(True, object())
    assert follower.calls == ["flushed"]


def test_in_a_scheduler_process_the_plugin_hooks_sglangs_weight_updates_and_flush() -> None:
    code = textwrap.dedent("""
        import sglang.srt.managers.scheduler as scheduler
        from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
        from sglang.srt.plugins import load_plugins
        load_plugins()
        wrapped = [getattr(SchedulerWeightUpdaterManager, "update_weights_from_" + k) for k in
                   ("disk", "tensor", "distributed", "ipc")] + [scheduler.Scheduler.flush_cache]
        print(all(hasattr(f, "__wrapped__") for f in wrapped))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-3000:]


def test_an_update_without_a_version_keys_every_mla_rank_alike(tmp_path: Path) -> None:
    """On MLA only TP rank 0 writes and every rank reads, and SGLang takes the least of the ranks'
    hits: an epoch drawn by each rank on its own made rank 1 find none of rank 0's new pages."""
    from devtools.testing.pool_process import PoolProcess
    from devtools.testing.procs import pick_port

    port = pick_port("127.0.0.1")
    with PoolProcess(capacity="32MiB") as pool:
        ranks = [subprocess.Popen([sys.executable, "-m", "tests.hicache.rank_epoch_worker", str(r), str(port),
                                   pool.endpoint], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=Path(__file__).resolve().parents[2])
                 for r in (0, 1)]
        outs = [p.communicate(timeout=300) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], "\n".join(err[-3000:] for _, err in outs)
    assert outs[1][0].strip().splitlines()[-1] == "FOUND 8"
