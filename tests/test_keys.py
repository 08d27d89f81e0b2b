"""Page keys: deterministic across processes, different whenever the page bytes could differ."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from mooncake_sgl.keys import KeyNamespace, page_key

NS = KeyNamespace(model="meta-llama/Llama-3-8B", dtype="bfloat16", layout="page_first", page_size=64,
                  tp_rank=1, tp_size=2)
HASH = "9f" * 32


def test_same_inputs_same_key_in_another_process() -> None:
    code = ("from mooncake_sgl.keys import KeyNamespace, page_key;"
            "ns=KeyNamespace(model='meta-llama/Llama-3-8B', dtype='bfloat16', layout='page_first',"
            " page_size=64, tp_rank=1, tp_size=2);"
            f"print(page_key(ns, '{HASH}').hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == page_key(NS, HASH).hex()


@pytest.mark.parametrize("change", [
    {"model": "other"}, {"dtype": "float8_e4m3fn"}, {"layout": "layer_first"}, {"page_size": 32},
    {"tp_rank": 0}, {"tp_size": 4}, {"pp_rank": 1}, {"pp_size": 2}, {"cp_rank": 1}, {"tag": "tenant-b"},
])
def test_any_namespace_change_changes_the_key(change: dict) -> None:
    assert page_key(dataclasses.replace(NS, **change), HASH) != page_key(NS, HASH)


def test_rank_replicated_pages_are_shared_by_all_tp_ranks() -> None:
    mla = dataclasses.replace(NS, rank_replicated=True)
    assert page_key(mla, HASH) == page_key(dataclasses.replace(mla, tp_rank=0), HASH)


def test_distinct_hashes_distinct_keys_and_text_hashes_do_not_collide_with_hex() -> None:
    assert page_key(NS, HASH) != page_key(NS, "8f" + HASH[2:])
    assert page_key(NS, "abc") != page_key(NS, "abd")
    assert page_key(NS, HASH) != page_key(NS, HASH.upper() + "x")


def test_kv_keys_are_unchanged_by_the_sidecar_fields() -> None:
    # Pages stored before hybrid support (LMDB survives upgrades) must keep their keys.
    assert NS.describe() == ("v1|tag=|model=meta-llama/Llama-3-8B|dtype=bfloat16|layout=page_first"
                             "|page=64|tp1/2|pp0/1|cp0/1")


SIDE = dataclasses.replace(NS, pool="mamba", dtype="float32", page_size=1, segments=(6144, 576),
                           chunk=4096)


@pytest.mark.parametrize("change", [
    {"pool": "swa"}, {"segments": (6144, 577)}, {"chunk": 8192}, {"dtype": "bfloat16"},
    {"tp_rank": 0}, {"page_size": 2},
])
def test_any_sidecar_namespace_change_changes_the_key(change: dict) -> None:
    assert page_key(dataclasses.replace(SIDE, **change), HASH, 0) != page_key(SIDE, HASH, 0)


def test_sidecar_parts_are_distinct_keys_apart_from_the_kv_page() -> None:
    parts = {page_key(SIDE, HASH, i) for i in range(3)}
    assert len(parts) == 3
    assert page_key(NS, HASH) not in parts


def test_replicated_sidecars_are_shared_by_tp_ranks() -> None:
    indexer = dataclasses.replace(SIDE, pool="indexer", rank_replicated=True)
    assert page_key(indexer, HASH, 0) == page_key(dataclasses.replace(indexer, tp_rank=0), HASH, 0)


@pytest.mark.parametrize(("namespace", "part"), [(NS, 0), (SIDE, -1)])
def test_a_part_of_a_kv_page_or_a_negative_part_is_refused(namespace: KeyNamespace, part: int) -> None:
    with pytest.raises(ValueError, match="part"):
        page_key(namespace, HASH, part)


def test_head_groups_are_the_namespaces_of_the_lcm_grid_ranks() -> None:
    # TP=2 rank 1 with tp_lcm_size 4 holds the heads of grid ranks 2 and 3: the pages a TP=4
    # server's ranks 2 and 3 store whole.
    groups = NS.head_groups(2)
    tp4 = [dataclasses.replace(NS, tp_rank=r, tp_size=4) for r in (2, 3)]
    assert [page_key(g, HASH) for g in groups] == [page_key(ns, HASH) for ns in tp4]
    assert NS.head_groups(1) == (NS,)


@pytest.mark.parametrize("split", [0, 2])
def test_head_groups_of_replicated_pages_or_no_groups_are_refused(split: int) -> None:
    ns = dataclasses.replace(NS, rank_replicated=split == 2)
    with pytest.raises(ValueError, match="split"):
        ns.head_groups(split)


def test_the_checkpoint_fingerprint_is_in_the_key_and_absent_leaves_old_keys() -> None:
    assert page_key(dataclasses.replace(NS, weights="ab" * 16), HASH) != page_key(NS, HASH)
    assert "weights" not in NS.describe()
