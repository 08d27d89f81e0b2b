"""``scripts/gpu_check.py`` without a GPU: it refuses cleanly, its CPU self-test runs its own
measuring code, and what it carries to the GPU host is exactly what that host lacks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from devtools.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


gpu_check = load_script("gpu_check")


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # No CUDA whatever this machine has: a test must never start the real GPU check.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_without_cuda_it_refuses_in_one_line_with_exit_2() -> None:
    proc = _run(str(SCRIPT))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device is visible" in lines[0], proc.stderr
    assert "--self-test-on-cpu" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_missing_module_is_refused_by_name_and_points_at_the_wheels() -> None:
    # sys.modules[name] = None makes every import of it fail, as on a host without the wheel.
    hide = ("import runpy, sys; sys.modules['msgspec'] = None; sys.argv = [sys.argv[1]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = _run("-c", hide, str(SCRIPT))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing msgspec" in lines[0], proc.stderr
    assert "--download-wheels" in lines[0] and "no CUDA" not in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_cpu_self_test_prints_its_table_and_json_and_says_it_was_not_a_gpu_run(tmp_path: Path) -> None:
    out = tmp_path / "self_test.json"
    proc = _run(str(SCRIPT), "--self-test-on-cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ours/torch" in proc.stdout and "gpu_check: c hbm.put_from H2D" in proc.stdout  # table, progress
    assert "CPU SELF-TEST passed" in proc.stdout and "NOT a GPU run" in proc.stdout.splitlines()[-1]
    data = json.loads(out.read_text())
    assert data["mode"] == "cpu-self-test" and data["ok"] and "NOT a GPU run" in data["verdict"]
    assert data["pinned_host"]["expected_pinned"] is False and data["pinned_host"]["byte_exact"]
    copies = data["copies"]
    assert {(c["path"], c["page_bytes"]) for c in copies} == {
        (p, s) for p in ("hbm.put_from H2D", "hbm.get_into D2H", "promote host->hbm", "demote hbm->host")
        for s in gpu_check.CPU_PAGE_SIZES}
    assert all(c["ours_gbps"] > 0 and c["torch_gbps"] > 0 and c["ratio"] > 0 for c in copies)
    assert [s["step"] for s in data["steps"]] == ["b pinned host tier", "c copies vs torch"]


def test_the_wheels_are_exactly_the_dependencies_the_gpu_host_lacks() -> None:
    deps = gpu_check.pyproject_dependencies()
    assert gpu_check.missing_on_gpu_host(deps) == ["lmdb", "msgspec"]
    assert sorted(gpu_check.dist_name(p) for p in gpu_check.WHEEL_PINS) == ["lmdb", "msgspec"]
    # Each pin satisfies pyproject's own bound for that package.
    bounds = {gpu_check.dist_name(d): Requirement(d).specifier for d in deps}
    for pin in gpu_check.WHEEL_PINS:
        name, version = pin.split("==")
        assert Version(version) in bounds[name], pin


def test_pip_download_asks_for_cp312_manylinux_binaries_without_dependencies() -> None:
    cmd = gpu_check.pip_download_command(Path("w"), ("msgspec==0.23.0",), python="py")
    assert cmd[:3] == ["py", "-m", "pip"] and cmd[3] == "download" and cmd[-1] == "msgspec==0.23.0"
    for flag in ("--no-deps", "--only-binary=:all:"):
        assert flag in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and cmd[cmd.index("--implementation") + 1] == "cp"
    assert cmd[cmd.index("-d") + 1] == "w"
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"] == [
        "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def test_download_wheels_stops_before_pip_when_the_pins_drift_from_pyproject(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(gpu_check, "WHEEL_PINS", ("msgspec==0.23.0",))
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert gpu_check.download_wheels(tmp_path / "w") == 1
    assert "update WHEEL_PINS" in capsys.readouterr().err


def test_what_the_check_imports_beyond_torch_and_pytest_is_on_the_gpu_host_or_carried() -> None:
    # The GPU host has no sglang, mooncake or bench extras: the check's import chain must not reach them.
    probe = ("import sys, importlib; sys.path.insert(0, '.'); import torch, pytest; "
             "roots = lambda: {m.split('.')[0] for m in sys.modules}; before = roots(); "
             "[importlib.import_module(m) for m in ('devtools.gpu_check', 'tests.tiers.test_hbm_tier', "
             "'tests.tiers.test_host_tier')]; "
             "print(' '.join(sorted(r for r in roots() - before if r not in sys.stdlib_module_names "
             "and not r.startswith('_'))))")
    proc = _run("-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) <= {"numpy", "xxhash", "msgspec", "mooncake_sgl", "devtools", "tests"}


def test_a_cuda_class_that_was_skipped_does_not_count_as_run(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.tiers.test_hbm_tier.TestHbmOnCuda" name="test_a">'
        '<skipped message="needs a CUDA device"/></testcase>'
        '<testcase classname="tests.tiers.test_hbm_tier.TestHbmOnCuda" name="test_b"><failure/></testcase>'
        '<testcase classname="tests.tiers.test_hbm_tier.TestHbmOnCpuTensor" name="test_a"/>'
        '</testsuite></testsuites>')
    assert gpu_check.junit_class_run(xml, "TestHbmOnCuda") == gpu_check.ClassRun(passed=0, failed=1,
                                                                                   skipped=1)
    assert gpu_check.junit_class_run(xml, "TestHbmOnCpuTensor") == gpu_check.ClassRun(1, 0, 0)


def test_the_hbm_step_fails_when_pytest_skipped_the_cuda_class(monkeypatch: pytest.MonkeyPatch) -> None:
    # A check whose subprocess saw no GPU must not pass by skipping: the real pytest run, real JUnit.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    step = gpu_check.pytest_step("a", ["tests/tiers/test_hbm_tier.py::TestHbmOnCuda"], "TestHbmOnCuda", 120)
    assert not step.ok
    assert re.match(r"TestHbmOnCuda: 0 passed, 0 failed, [1-9]\d* skipped", step.detail), step.detail
