"""The wheel carries what a serving host needs: no module of it imports the dev tools or a package
that only the ``bench`` extra installs, and the CPU-host adaptations are not in it."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import tomllib

import mooncake_sgl

PACKAGE = Path(mooncake_sgl.__file__).resolve().parent
ROOT = PACKAGE.parent


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _bench_only() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {r.split(">")[0].split("=")[0].split("[")[0].strip().lower().replace("-", "_")
             for r in meta["optional-dependencies"]["bench"]}
    core = {r.split(">")[0].split("=")[0].strip().lower().replace("-", "_") for r in meta["dependencies"]}
    return names - core


def test_no_module_of_the_package_imports_dev_tools_or_bench_only_packages() -> None:
    forbidden = _bench_only() | {"devtools", "pytest"}
    assert "tqdm" in forbidden  # a progress bar is no serving dependency
    offenders = {str(p.relative_to(ROOT)): sorted(_imported_roots(p) & forbidden)
                 for p in sorted(PACKAGE.rglob("*.py"))}
    assert {p: names for p, names in offenders.items() if names} == {}


def test_benchmarks_and_test_helpers_live_outside_the_package() -> None:
    assert not [d for d in ("bench", "e2e", "testing") if (PACKAGE / d).exists()]
    assert not (PACKAGE / "hicache" / "hybrid_pools.py").exists()
    assert (ROOT / "devtools" / "testing" / "mooncake_master.py").is_file()


def test_the_server_subprocess_helpers_live_outside_the_package() -> None:
    # Ports and life cycle of the servers tests start, and the pool server in a subprocess: test and
    # benchmark helpers, so devtools/testing/ holds them (issue 52).
    assert not (PACKAGE / "procs.py").exists()
    assert not (PACKAGE / "pool" / "process.py").exists()
    assert (ROOT / "devtools" / "testing" / "procs.py").is_file()
    assert (ROOT / "devtools" / "testing" / "pool_process.py").is_file()
    assert importlib.util.find_spec("mooncake_sgl.procs") is None
    assert importlib.util.find_spec("mooncake_sgl.pool.process") is None


def test_the_cpu_host_adaptations_are_a_distribution_of_their_own() -> None:
    # The wheel's one entry point is its plug-in: tests/hicache/test_touch_points.py checks it.
    assert not (PACKAGE / "hicache" / "cpu").exists()
    assert [p for p in sorted(PACKAGE.rglob("*.py")) if "mooncake_sgl_cpu" in _imported_roots(p)] == []
    assert (ROOT / "cpu_host" / "pyproject.toml").is_file()
