"""The suite's tiers: every test gets one marker from where it lives, so a run can pick a tier.

| marker    | what its tests need                                              | in ``--fast`` |
|-----------|------------------------------------------------------------------|---------------|
| ``unit``    | nothing but this package and its Python dependencies           | yes           |
| ``sglang``  | real sglang 0.5.23 classes in this process (pools, controller) | yes           |
| ``service`` | processes of ours or Mooncake's on 127.0.0.1 (pool, master)    | yes           |
| ``live``    | live ``sglang.launch_server`` processes (20-60 s to start each)| no            |
| ``cluster`` | network namespaces (root) with live servers behind a router    | no            |
| ``bench``   | a benchmark script run end to end at its smallest setting      | no            |

Two more markers are set by the tests themselves: ``ha`` (Mooncake masters failing over through
etcd; in the whole suite, not in ``--fast``) and ``chaos`` (minutes of live traffic under faults;
opt-in, ``bash scripts/test.sh -m chaos``). ``scripts/test.sh`` turns these into ``-m`` expressions
(``docs/testing.md`` lists each tier's budget and measured time).

The tier of a file is the first rule of ``TIERS`` whose path prefix it starts with; a file no rule
names is ``unit``. Rules name files only where a folder mixes tiers.

The suite runs SGLang on this CPU host as an operator who opted in to the CPU adaptations would
(``MOONCAKE_SGL_CPU_ADAPTATIONS=1``, inherited by every process a test starts); the tests of that
switch start their own interpreters with it unset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mooncake_sgl import envs

ROOT = Path(__file__).resolve().parent

TIERS: tuple[tuple[str, str], ...] = (
    ("live/", "live"),
    ("cluster/", "cluster"),
    ("tiers/test_bench_write_path.py", "bench"),
    ("sim/test_replay_script.py", "bench"),
    ("hicache/", "sglang"),
    ("e2e/", "sglang"),
    ("pool/", "service"),
    ("adversarial/test_pool_", "service"),
    ("tiers/test_mooncake_store_tier.py", "service"),
    ("tiers/test_pool_tier.py", "service"),
    ("metrics/test_pool_metrics.py", "service"),
)

MARKERS = {
    "unit": "needs nothing but this package and its Python dependencies",
    "sglang": "real sglang classes in the test process",
    "service": "starts processes of ours or Mooncake's on 127.0.0.1",
    "live": "starts live sglang.launch_server processes",
    "cluster": "network namespaces with live servers behind a router (root)",
    "bench": "runs a benchmark script end to end at its smallest setting",
    "ha": "Mooncake masters failing over through etcd (about a minute)",
    "chaos": "minutes of live traffic under faults (opt-in: -m chaos)",
}

envs.MOONCAKE_SGL_CPU_ADAPTATIONS.set_default(1)


def tier_of(path: Path) -> str:
    """The tier marker of a test file, from its path under ``tests/``."""
    rel = path.resolve().relative_to(ROOT).as_posix()
    return next((tier for prefix, tier in TIERS if rel.startswith(prefix)), "unit")


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(Path(os.fspath(item.path))))
