"""CPU end-to-end at CI size: SGLang's real HiCacheController, host pool and backend factory drive
our store through LMDB on disk; every count below follows from the workload, not from the run.

Workload (the ``ci`` preset of scripts/run_e2e_cpu.py): 3 documents of 16, 24 and 32 pages, 3
questions each (96 tokens: one full page plus a 32-token tail that no page covers), round-robin,
with a 40-page host pool, so a revisited document has always been pushed out of the host pool and
must come back from our tiers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from devtools.e2e import E2EConfig, KvShape, WorkloadSpec, run_e2e
from devtools.e2e.workload import PagePattern, doc_lengths, make_requests

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

DOC_PAGES = [16, 24, 32]
QUESTIONS = 3
PS = 64


def ci_config(tmp_path: Path) -> E2EConfig:
    return E2EConfig(shape=KvShape(layers=2),
                     workload=WorkloadSpec(docs=3, min_doc_tokens=1024, max_doc_tokens=2048,
                                           questions=QUESTIONS, question_tokens=96),
                     host_pool_pages=40, host_tier="8MiB", lmdb_capacity="1GiB", work_dir=str(tmp_path))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_e2e(ci_config(tmp_path_factory.mktemp("e2e")))


def test_it_ran_through_sglangs_real_controller_and_our_backend(report: dict) -> None:
    sg = report["sglang"]
    assert sg["controller"] == "HiCacheController"
    assert sg["host_pool"] == "MHATokenToKVPoolHost"
    assert sg["backend_class"] == "mooncake_sgl.hicache.backend.MooncakeSglStorage"
    assert report["config"]["page_bytes"] == 2 * 2 * 8 * 128 * 2 * PS  # K+V, 2 layers, bf16


def test_every_loaded_page_is_byte_exact_and_every_backup_succeeded(report: dict) -> None:
    assert report["verify_failures"] == 0
    assert report["backup_failures"] == 0


def test_hit_counts_per_round(report: dict) -> None:
    doc_tokens = sum(DOC_PAGES) * PS
    per_request_tail = PS + 32  # the question's own page (written, never reused) and its tail
    first, *later = report["rounds"]
    assert first["storage_tokens"] == 0 and first["host_tokens"] == 0
    assert first["computed_tokens"] == doc_tokens + 3 * per_request_tail
    assert len(later) == QUESTIONS - 1
    for r in later:
        assert r["host_tokens"] == 0, "the host pool is too small to keep a document for a round"
        assert r["storage_tokens"] == doc_tokens
        assert r["computed_tokens"] == 3 * per_request_tail
        assert r["requests_with_storage_hits"] == 3
        assert r["load_s_mean"] > 0


def test_bytes_moved_per_tier_add_up(report: dict) -> None:
    page = report["config"]["page_bytes"]
    loaded_pages = (QUESTIONS - 1) * sum(DOC_PAGES)
    backed_up_pages = sum(DOC_PAGES) + 3 * QUESTIONS  # documents once, plus one page per question
    tiers = report["tiers"]
    assert set(tiers) == {"host", "lmdb"}
    # Each loaded page was read from exactly one tier.
    assert sum(t["hits"] for t in tiers.values()) == loaded_pages
    assert sum(t["bytes_read"] for t in tiers.values()) == loaded_pages * page
    # LMDB is the tier everything lands in; it never evicts at this size.
    assert tiers["lmdb"]["writes"] == backed_up_pages
    assert tiers["lmdb"]["bytes_written"] == backed_up_pages * page
    assert tiers["lmdb"]["pages_now"] == backed_up_pages
    # The 8 MiB host tier holds 16 pages: most reads fall through to LMDB.
    assert tiers["host"]["pages_now"] <= 16 < tiers["lmdb"]["hits"]
    assert report["sglang"]["prefetch_pages"] == loaded_pages
    assert report["sglang"]["backup_pages"] == backed_up_pages


def test_recompute_time_uses_the_stated_prefill_rate(report: dict) -> None:
    tot = report["totals"]
    rate = report["config"]["prefill_tokens_per_s"]
    assert tot["recompute_s_total"] == pytest.approx(tot["storage_tokens"] / rate)
    assert tot["load_vs_recompute"] == pytest.approx(tot["load_s_total"] / tot["recompute_s_total"])


def test_workload_shape() -> None:
    spec = WorkloadSpec(docs=3, min_doc_tokens=1024, max_doc_tokens=2048, questions=QUESTIONS)
    assert doc_lengths(spec, PS) == [p * PS for p in DOC_PAGES]
    reqs = make_requests(spec, PS)
    assert [r.rid for r in reqs[:4]] == ["doc0-q0", "doc1-q0", "doc2-q0", "doc0-q1"]
    same_doc = [r for r in reqs if r.doc == 1]
    assert all(r.tokens[:r.doc_tokens] == same_doc[0].tokens[:r.doc_tokens] for r in same_doc)
    assert len({tuple(r.tokens[r.doc_tokens:]) for r in same_doc}) == QUESTIONS


def test_page_pattern_catches_a_wrong_or_torn_page() -> None:
    shape = KvShape(layers=2)
    pattern = PagePattern(shape)
    k = torch.empty(PS, 2, 8, 128, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    pattern.fill(k, v, "ab" * 32)
    assert pattern.matches(k, v, "ab" * 32)
    assert not pattern.matches(k, v, "cd" * 32)  # another page's bytes
    assert not pattern.matches(v, k, "ab" * 32)  # K and V swapped
    k.view(torch.int16)[-1, -1, -1, -1] ^= 1  # one flipped bit
    assert not pattern.matches(k, v, "ab" * 32)


def test_cli_at_ci_size_prints_the_per_tier_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                   ) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import run_e2e_cpu
    finally:
        sys.path.remove(str(SCRIPTS))
    assert run_e2e_cpu.PRESETS["default"].shape.page_bytes == 8 << 20  # Llama-3-8B pages outside CI
    cfg = run_e2e_cpu.config_from_args(run_e2e_cpu.parse_args(["--size", "ci", "--docs", "2"]))
    assert cfg.workload.docs == 2 and cfg.shape.layers == 2 and cfg.host_pool_pages == 40
    out_json = tmp_path / "r.json"
    rc = run_e2e_cpu.main(["--size", "ci", "--questions", "2", "--work-dir", str(tmp_path), "--no-progress",
                           "--json", str(out_json)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Per tier of our store" in out
    table = out.split("Per tier of our store", 1)[1].split("\n\n", 1)[0]
    tier_rows = [line.split() for line in table.splitlines()[3:]]
    assert [r[0] for r in tier_rows] == ["host", "lmdb"]
    assert "load/recompute" in out and "15,000 prefill tokens/s" in out
    assert json.loads(out_json.read_text())["totals"]["storage_tokens"] == sum(DOC_PAGES) * PS
