"""The checkpoint fingerprint in the key namespace: the same checkpoint keeps its pages (across a
restart, another process, a copy on another host), replaced weights, config or KV scales do not."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.tiny_model import TinyLlama, write_tiny_llama
from mooncake_sgl.hicache import fingerprint as fp
from mooncake_sgl.hicache.backend import MooncakeSglStorage

from . import pools

SPEC = TinyLlama(layers=1, hidden=64, heads=2, kv_heads=2, intermediate=64, vocab=256)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "model", SPEC)


def digest(path: Path, **args: str) -> str:
    return fp.fingerprint(fp.ModelSource(model_path=str(path), **args)).digest


def test_same_checkpoint_same_fingerprint_in_another_process_and_in_a_copy(model: Path,
                                                                           tmp_path: Path) -> None:
    code = ("import sys; from mooncake_sgl.hicache import fingerprint as fp;"
            "print(fp.fingerprint(fp.ModelSource(model_path=sys.argv[1])).digest)")
    other = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "7"})
    assert other.stdout.strip() == digest(model)
    # A copy made later (another host's download: other file times) is the same checkpoint.
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    for f in copy.iterdir():
        os.utime(f, (1_000_000, 1_000_000))
    assert digest(copy) == digest(model)


def test_replaced_weights_config_or_kv_scales_change_the_fingerprint(model: Path, tmp_path: Path) -> None:
    before = digest(model)
    other = write_tiny_llama(tmp_path / "other", dataclasses.replace(SPEC, seed=1))
    shutil.copy(other / "model.safetensors", model / "model.safetensors")  # weights rewritten in place
    assert digest(model) != before

    config = json.loads((model / "config.json").read_text())
    reweighted = digest(model)
    (model / "config.json").write_text(json.dumps({**config, "rope_theta": 10000.0}))
    assert digest(model) != reweighted

    scales = tmp_path / "kv_scales.json"
    scales.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": 0.5}}}}')
    with_scales = digest(model, quantization_param_path=str(scales))
    scales.write_text('{"kv_cache": {"scaling_factor": {"0": {"0": 0.25}}}}')
    assert digest(model, quantization_param_path=str(scales)) != with_scales


@pytest.mark.parametrize("arg", [{"revision": "v2"}, {"quantization": "fp8"}, {"kv_cache_dtype": "fp8_e4m3"},
                                 {"load_format": "dummy"}, {"json_model_override_args": '{"rope_theta": 1}'},
                                 {"dtype": "float16"}])
def test_the_loading_arguments_are_in_the_fingerprint(model: Path, arg: dict[str, str]) -> None:
    assert digest(model, **arg) != digest(model)


def test_override_args_are_compared_as_json(model: Path) -> None:
    a = digest(model, json_model_override_args='{"a": 1, "b": 2}')
    assert a == digest(model, json_model_override_args='{ "b": 2,  "a": 1 }')


def test_a_changed_tensor_deep_in_a_file_changes_it(model: Path) -> None:
    # One tensor rewritten (a fine-tuned layer), every other byte and the header alike.
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(model / "model.safetensors"), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    before = digest(model)
    name = "model.layers.0.self_attn.k_proj.weight"
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, str(model / "model.safetensors"))
    assert digest(model) != before


def test_a_gguf_file_or_an_unknown_hub_id_is_still_fingerprinted(tmp_path: Path, caplog) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(os.urandom(200_000))
    first = digest(gguf)
    data = bytearray(gguf.read_bytes())
    data[-10] ^= 0xFF  # the last sample covers the file's end
    gguf.write_bytes(bytes(data))
    assert digest(gguf) != first

    with caplog.at_level("WARNING", logger="mooncake_sgl.hicache.fingerprint"):
        unknown = fp.fingerprint(fp.ModelSource(model_path="no-such-org/no-such-model", revision="abc"))
    assert unknown.digest and "not identified" in caplog.text and "no-such-org/no-such-model" in caplog.text


def test_outside_a_server_without_a_local_path_there_is_no_fingerprint() -> None:
    assert fp.checkpoint_fingerprint(pools.MODEL).digest == ""  # "toy-org/toy-model"


def _store_and_probe(model: Path, root: Path, write: bool) -> int:
    """One backend "server" on ``model`` over an LMDB tier under ``root``: optionally store 4 pages,
    then answer how many of them it finds. Closed before returning (a restart)."""
    pool = pools.build_pool("mha", "page_first")
    cfg = pools.storage_config("mha", "page_first", root, model=str(model))
    backend = MooncakeSglStorage(cfg, pool)
    try:
        hashes = pools.page_hashes(4, seed=5)
        if write:
            idx = pool.alloc(4 * pools.PAGE)
            pools.fill_random(pool, idx, seed=6)
            assert backend.batch_set_v1(hashes, idx) == [True] * 4
        return backend.batch_exists(hashes)
    finally:
        backend.close()


def test_same_model_hits_after_a_restart_and_replaced_weights_miss(model: Path, tmp_path: Path) -> None:
    root = tmp_path / "tiers"
    assert _store_and_probe(model, root, write=True) == 4
    assert _store_and_probe(model, root, write=False) == 4  # restarted on the same checkpoint
    other = write_tiny_llama(tmp_path / "other", dataclasses.replace(SPEC, seed=2))
    shutil.copy(other / "model.safetensors", model / "model.safetensors")
    assert _store_and_probe(model, root, write=False) == 0  # same path and name, other weights
