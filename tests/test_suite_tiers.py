"""The suite's tiers (tests/conftest.py): every rule names a path that exists, and a file's tier is
the one its folder promises, so ``--fast`` never picks up a live server by a file moved or renamed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import MARKERS, ROOT, SERVERS_GROUP, SLOW, TIERS, tier_of


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


def test_pytest_xdist_sends_each_group_to_one_worker() -> None:
    # pytest-xdist 3.8 groups by rewriting item._nodeid, which pytest 9 no longer reads: there every
    # group was silently ignored, and two live modules started their servers side by side. A real
    # two-worker run of a live-tier test and an in-process file shows the groups it scheduled by.
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "tests/live/test_launcher.py::test_pick_port_skips_a_port_in_use",
         "tests/test_suite_tiers.py::test_every_tier_rule_names_a_path_that_exists"],
        cwd=ROOT.parent, capture_output=True, text=True, timeout=300)
    out = run.stdout[-3000:] + run.stderr[-3000:]
    assert run.returncode == 0, out
    assert f"test_pick_port_skips_a_port_in_use@{SERVERS_GROUP}" in run.stdout, out
    assert "test_every_tier_rule_names_a_path_that_exists@test_suite_tiers.py" in run.stdout, out
