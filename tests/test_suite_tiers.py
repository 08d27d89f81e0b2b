"""The suite's tiers (tests/conftest.py): every rule names a path that exists, and a file's tier is
the one its folder promises, so ``--fast`` never picks up a live server by a file moved or renamed."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import MARKERS, ROOT, SLOW, TIERS, tier_of


def test_every_tier_rule_names_a_path_that_exists() -> None:
    for prefix, tier in TIERS:
        assert tier in MARKERS, (prefix, tier)
        matches = [p for p in ROOT.rglob("test_*.py") if p.relative_to(ROOT).as_posix().startswith(prefix)]
        assert matches, f"tests/conftest.py names {prefix!r}, which matches no test file"


def test_every_slow_rule_names_a_test_that_exists() -> None:
    for rule in SLOW:
        file, _, name = rule.partition("::")
        assert (ROOT / file).is_file(), f"SLOW names {file}, which does not exist"
        assert not name or f"def {name}(" in (ROOT / file).read_text(), f"SLOW names {rule}: no such test"


@pytest.mark.parametrize(("path", "tier"), [
    ("live/test_live_serving.py", "live"),
    ("cluster/test_cluster_faults.py", "cluster"),
    ("tiers/test_bench_write_path.py", "bench"),
    ("hicache/test_backend.py", "sglang"),
    ("pool/test_server_processes.py", "service"),
    ("tiers/test_mooncake_store_tier.py", "service"),
    ("tiers/test_lmdb_tier.py", "unit"),
    ("test_config.py", "unit"),
])
def test_a_files_tier_follows_its_path(path: str, tier: str) -> None:
    assert tier_of(ROOT / path) == tier


def test_every_file_that_starts_a_live_server_is_in_a_tier_left_out_of_fast() -> None:
    # A live server costs 20-60 s to start: a test file that starts one outside live/ or cluster/
    # would land in --fast and blow its 3-minute budget.
    starters = ("servers.start", "start_many(", "LaunchedServer(", "cluster.sglang(", ".sglang(")
    fast = {"unit", "sglang", "service"}
    for path in ROOT.rglob("test_*.py"):
        text = path.read_text()
        if any(s in text for s in starters) and tier_of(path) in fast and path.name != Path(__file__).name:
            raise AssertionError(f"{path.relative_to(ROOT)} starts a live server but is in tier "
                                 f"{tier_of(path)!r}, which --fast runs")
