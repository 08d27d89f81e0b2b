"""Hybrid models, differentially: our backend and SGLang's own Mooncake Store backend (a real
``mooncake_master`` on 127.0.0.1) driven by the same calls of SGLang's own ``HybridCacheController``
storage-thread code (backup, hit query, prefetch transfer) must give the same ``batch_exists_v2``
answers and byte-identical restores of the KV pages and of the sidecar pool.

Each setup stores two chained nodes (each with its sidecar at the node end, as the radix tree backs
them up), then damages the chain the same way on both backends and asks again:
- a third node whose sidecar write is left out (trailing pools: a hole in the restorable set);
- a KV-derived sidecar missing for two pages (all-pages pools: the prefix stops there).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo, PoolTransfer

from devtools.testing import MooncakeMaster
from mooncake_sgl.hicache.backend import MooncakeSglStorage

from . import hybrid, pools
from .hybrid import SETUPS

NODE = 4  # pages per radix node
LAYOUTS = ("page_first", "page_first_direct")  # the zero-copy host layouts SGLang offers storage


@pytest.fixture
def master() -> Iterator[MooncakeMaster]:
    # One master per test: a finished client's segment stays mounted in a master and later puts
    # placed on it would fail.
    with MooncakeMaster() as m:
        yield m


class Side:
    """One backend with its own copy of the setup's host pools and a controller over them."""

    def __init__(self, name: str, backend_factory: Any, layout: str = "page_first") -> None:
        self.setup = hybrid.build(name, hybrid.Shape(layout=layout))
        self.backend = backend_factory(self.setup)
        self.ctl = hybrid.controller(self.setup, self.backend)

    def store_node(self, tokens: list[int], seed: int, prior: str | None, prefix: list[str] | None,
                   with_sidecar: bool = True) -> tuple[Any, Any]:
        """Back one node up through the controller; returns (KV slots, sidecar slots)."""
        s = self.setup
        kv_idx = s.kv.alloc(len(tokens))
        hybrid.fill(s.kv, kv_idx, seed)
        hashes = s.hashes(tokens, prior)
        transfer, side_idx = s.backup_transfer(hashes)
        if s.kv_derived:
            hybrid.fill(s.side, kv_idx, seed + 1)
        else:
            hybrid.fill(s.side, side_idx, seed + 1)
        if with_sidecar:
            op = hybrid.backup(self.ctl, s, tokens, kv_idx, transfer, prior, prefix)
            assert op.completed_tokens == len(tokens)
        else:
            info = HiCacheStorageExtraInfo(prefix_keys=prefix)
            assert self.backend.batch_set_v1(hashes, kv_idx, info) == [True] * len(hashes)
        return kv_idx, side_idx

    def store_kv_only(self, tokens: list[int], seed: int, prior: str | None, prefix: list[str]) -> None:
        """KV pages whose sidecar was never written."""
        s = self.setup
        kv_idx = s.kv.alloc(len(tokens))
        hybrid.fill(s.kv, kv_idx, seed)
        info = HiCacheStorageExtraInfo(prefix_keys=prefix)
        hashes = s.hashes(tokens, prior)
        assert self.backend.batch_set_v1(hashes, kv_idx, info) == [True] * len(hashes)


@pytest.fixture
def theirs(master: MooncakeMaster) -> Iterator[Any]:
    """A factory of SGLang's own backends on ``master``; their Mooncake clients are destroyed
    (segments unmounted) before the master stops, or they would retry a dead master at exit."""
    made: list[Any] = []

    def make(setup: hybrid.Hybrid) -> Any:
        made.append(hybrid.builtin_backend(setup, master))
        return made[-1]

    yield make
    for backend in made:
        backend.close()
        del backend.store
    made.clear()
    gc.collect()


@pytest.fixture
def ours(tmp_path: Any) -> Iterator[Any]:
    """A factory of our backends over a setup's pools; each is closed at teardown."""
    made: list[Any] = []

    def make(setup: hybrid.Hybrid) -> Any:
        cfg = hybrid.storage_config(setup, pools.extra_config(tmp_path / setup.name))
        made.append(hybrid.attach(MooncakeSglStorage(cfg, setup.kv), setup))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def _answer(op: Any) -> tuple[Any, ...]:
    r = op.pool_storage_result
    return (op.storage_hit_count, r.kv_hit_pages, sorted(r.restorable_prefix_pages or []),
            {str(k): v for k, v in op.query_pool_hit_pages.items()})


def _restore(side: Side, tokens: list[int]) -> tuple[Any, ...]:
    """Query, then prefetch what the query found; the answer and the restored bytes."""
    s = side.setup
    op = hybrid.query(side.ctl, s, tokens)
    answer = _answer(op)
    if not op.hash_value:
        return answer, (0, {}), b"", b""
    kv_pages, pool_hits, kv_idx, side_idx = hybrid.prefetch(side.ctl, s, op)
    kv_bytes = hybrid.read(s.kv, kv_idx[:kv_pages * s.page])
    side_bytes = hybrid.read(s.side, kv_idx[:kv_pages * s.page] if s.kv_derived else side_idx)
    return answer, (kv_pages, {str(k): v for k, v in pool_hits.items()}), kv_bytes, side_bytes


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", SETUPS)
def test_same_answers_and_byte_identical_restores_as_sglangs_own_backend(
        name: str, layout: str, ours: Any, theirs: Any) -> None:
    ours = Side(name, ours, layout)
    builtin = Side(name, theirs, layout)
    page = ours.setup.page
    tokens = ours.setup.tokens(4 * NODE, seed=7)
    nodes = [tokens[i * NODE * page:(i + 1) * NODE * page] for i in range(4)]
    sources = {}
    for side, label in ((ours, "ours"), (builtin, "builtin")):
        h1 = side.setup.hashes(nodes[0])
        h2 = side.setup.hashes(nodes[1], h1[-1])
        first = side.store_node(nodes[0], seed=1, prior=None, prefix=None)
        second = side.store_node(nodes[1], seed=3, prior=h1[-1], prefix=h1)
        # Third node: KV only (its sidecar write failed or was never made).
        side.store_node(nodes[2], seed=5, prior=h2[-1], prefix=h1 + h2, with_sidecar=False)
        sources[label] = (first, second)

    # 1) the whole chain: the restorable sets, per-pool verdicts and hit counts agree.
    everything = tokens
    got = {label: _restore(side, everything) for side, label in ((ours, "ours"), (builtin, "builtin"))}
    assert got["ours"][0] == got["builtin"][0]
    assert got["ours"][1] == got["builtin"][1]
    assert got["ours"][2] == got["builtin"][2] and got["ours"][3] == got["builtin"][3]
    answer = got["ours"][0]
    if ours.setup.kv_derived:
        assert answer[1] == 2 * NODE and answer[2] == list(range(1, 2 * NODE + 1))
    else:
        assert answer[1] == 2 * NODE and answer[2] == [NODE, 2 * NODE]  # node ends only

    # 2) the restored bytes are the stored ones: KV of both nodes, the sidecar at the hit's end.
    for side, label in ((ours, "ours"), (builtin, "builtin")):
        (kv1, side1), (kv2, side2) = sources[label]
        s = side.setup
        assert got[label][2] == hybrid.read(s.kv, torch.cat([kv1, kv2]))
        expected_side = (hybrid.read(s.side, torch.cat([kv1, kv2])) if s.kv_derived
                         else hybrid.read(s.side, side2))
        assert got[label][3] == expected_side

    # 3) only the first node asked: its own end is restorable with its own sidecar.
    first_only = {label: _restore(side, nodes[0]) for side, label in ((ours, "ours"), (builtin, "builtin"))}
    assert first_only["ours"][:2] == first_only["builtin"][:2]
    assert first_only["ours"][2:] == first_only["builtin"][2:]
    assert first_only["ours"][0][1] == NODE


@pytest.mark.parametrize("name", ["mla+dsa", "mha+draft", "dsv4"])
def test_kv_without_its_all_pages_sidecar_is_not_offered(name: str, ours: Any, theirs: Any) -> None:
    ours = Side(name, ours)
    builtin = Side(name, theirs)
    tokens = ours.setup.tokens(2 * NODE, seed=9)
    first, second = tokens[:NODE * ours.setup.page], tokens[NODE * ours.setup.page:]
    answers = []
    for side in (ours, builtin):
        h1 = side.setup.hashes(first)
        side.store_node(first, seed=11, prior=None, prefix=None)
        side.store_kv_only(second, seed=13, prior=h1[-1], prefix=h1)  # no indexer for these
        keys = h1 + side.setup.hashes(second, h1[-1])
        r = side.backend.batch_exists_v2(keys, [PoolTransfer(name=side.setup.side_name)])
        answers.append((r.kv_hit_pages, r.restorable_prefix_pages,
                        {str(k): v for k, v in r.extra_pool_hit_pages.items()}))
    side = str(ours.setup.side_name)
    assert answers[0] == answers[1] == (NODE, list(range(1, NODE + 1)), {"kv": 2 * NODE, side: NODE})
