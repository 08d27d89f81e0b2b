#!/usr/bin/env python3
"""GPU host check: the HBM tier, the pinned host tier and our device<->host copies on a CUDA device.

Written on a machine without a GPU and NOT yet run on one: only ``--self-test-on-cpu`` has run.

What it checks (sized for well under 8 minutes on one GPU; not yet timed on one):
  a. ``tests/tiers/test_hbm_tier.py`` in a pytest subprocess, whose ``TestHbmOnCuda`` class (the
     tier conformance suite on ``device: cuda``) must have run and passed, not been skipped;
  b. the host tier with ``pin_memory: true``: its conformance suite on pinned buffers
     (``TestHostPinnedConformance``, pytest), then a focused check here: the buffer is page-locked,
     pages are byte-exact through it and through a store with an HBM tier above it;
  c. our copy paths between device and host (``HbmTier.put_from``/``get_into`` of page-locked pages,
     and the store's staged promote/demote between the host and HBM tiers) against torch's
     ``copy_(non_blocking=True)`` + synchronize of the same segments: GB/s for 64 KiB, 1 MiB and
     8 MiB pages, the median of several rounds run A B B A, ours/torch from the same run;
  d. one verdict line; exit 1 if any step failed.

Needs: Python with PyTorch (CUDA), numpy, pytest and xxhash (all on the GPU host we test on), and
this package's msgspec (imported by ``mooncake_sgl.config``) and lmdb (not imported by the check,
carried so the package's dependencies are complete). Nothing here imports sglang or mooncake: the
package is used from this checkout, not installed. The device is the first visible one: choose
another with ``CUDA_VISIBLE_DEVICES`` (the pytest steps inherit it).

Prepare (on a machine with network; the wheels are well under 1 MiB, the host takes 64 MiB):
  python scripts/gpu_check.py --download-wheels wheels/
Run on the GPU host (from the repository root, with wheels/ carried along):
  pip install --no-index --no-deps --target /tmp/site wheels/*.whl
  PYTHONPATH=/tmp/site python scripts/gpu_check.py --json gpu_check.json
Exercise this script's own steps b and c here, on the CPU (says plainly it is not a GPU run):
  python scripts/gpu_check.py --self-test-on-cpu --json self_test.json

Exit codes: 0 passed, 1 a step failed, 2 refused (no CUDA device, or a module it needs is missing).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

REFUSED = 2
CARRY_LIMIT_BYTES = 64 << 20  # what the GPU host takes along with the repository tree
# The distributions the GPU host we test on has (besides Python 3.12 and PyTorch 2.11, CUDA 13).
GPU_HOST_HAS = frozenset({"torch", "numpy", "pytest", "pyyaml", "prometheus-client", "xxhash", "psutil"})
# What pyproject's dependencies need beyond GPU_HOST_HAS, pinned to the versions tested here.
WHEEL_PINS = ("lmdb==3.0.0", "msgspec==0.23.0")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# (module, where it comes from) for what the check imports; torch last: it is the slow one.
NEEDED = (("numpy", "the host"), ("xxhash", "the host"), ("msgspec", "the carried wheels"),
          ("torch", "the host"))
NEEDED_FOR_PYTEST = (("pytest", "the host"),)
GPU_PAGE_SIZES = (64 << 10, 1 << 20, 8 << 20)
CPU_PAGE_SIZES = (16 << 10, 64 << 10, 256 << 10)  # tiny: the self-test only exercises the code


@dataclasses.dataclass(frozen=True)
class StepResult:
    step: str
    ok: bool
    seconds: float
    detail: str


@dataclasses.dataclass(frozen=True)
class ClassRun:
    passed: int
    failed: int  # failures and errors
    skipped: int


def dist_name(requirement: str) -> str:
    """``"prometheus_client>=0.20"`` -> ``"prometheus-client"`` (PEP 503 normalised)."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def pyproject_dependencies(path: Path = REPO / "pyproject.toml") -> list[str]:
    import tomllib  # Python 3.11+; only --download-wheels and the tests read pyproject

    with open(path, "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def missing_on_gpu_host(dependencies: list[str], host_has: frozenset[str] = GPU_HOST_HAS) -> list[str]:
    return sorted({dist_name(d) for d in dependencies} - host_has)


def pip_download_command(dest: Path, pins: tuple[str, ...] = WHEEL_PINS,
                         python: str = sys.executable) -> list[str]:
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    # Binary wheels for the host's interpreter only: it has no compiler and no network.
    return [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *platforms, "-d", str(dest), *pins]


def download_wheels(dest: Path) -> int:
    missing = missing_on_gpu_host(pyproject_dependencies())
    pinned = sorted(dist_name(p) for p in WHEEL_PINS)
    if missing != pinned:
        print(f"gpu_check: pyproject's dependencies missing on the GPU host are {missing}, but WHEEL_PINS "
              f"pins {pinned}: update WHEEL_PINS in {__file__}", file=sys.stderr)
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    if subprocess.run(pip_download_command(dest)).returncode:
        return 1
    wheels = sorted(dest.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"  {w.stat().st_size / 1e6:6.2f} MB  {w.name}")
    print(f"gpu_check: {len(wheels)} wheels, {total / (1 << 20):.2f} MiB in all "
          f"(the host takes {CARRY_LIMIT_BYTES >> 20} MiB with the tree)")
    print(f"on the GPU host: pip install --no-index --no-deps --target /tmp/site {dest}/*.whl\n"
          "                 PYTHONPATH=/tmp/site python scripts/gpu_check.py --json gpu_check.json")
    return 0 if total < CARRY_LIMIT_BYTES // 4 else 1


def missing_modules(needed: tuple[tuple[str, str], ...]) -> list[str]:
    """Each needed module that does not import, as ``"name (from where; the error)"``."""
    out = []
    for name, source in needed:
        try:
            if name == "torch":  # found, not imported: importing it costs seconds, done once later
                if importlib.util.find_spec(name) is None:
                    raise ImportError(f"No module named {name!r}")
            else:
                importlib.import_module(name)
        except ImportError as e:
            out.append(f"{name} (from {source}; {e})")
    return out


def junit_class_run(path: Path, cls: str) -> ClassRun:
    """What pytest did with the test class named ``cls`` (its last dotted part) in a JUnit XML file."""
    passed = failed = skipped = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("classname", "").split(".")[-1] != cls:
            continue
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            failed += 1
        elif "skipped" in tags:
            skipped += 1
        else:
            passed += 1
    return ClassRun(passed, failed, skipped)


def pytest_step(step: str, targets: list[str], must_run: str, timeout_s: float) -> StepResult:
    """pytest on ``targets`` in a subprocess (environment inherited: CUDA_VISIBLE_DEVICES,
    PYTHONPATH to the carried wheels); fails unless all passed and class ``must_run`` ran."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit2",
               f"--junitxml={xml}", *targets]
        print(f"gpu_check: {step}: {' '.join(cmd[1:])}", flush=True)
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return StepResult(step, False, time.monotonic() - t0, f"pytest ran past {timeout_s:.0f} s")
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["(no output)"]
        run = junit_class_run(xml, must_run) if xml.exists() else ClassRun(0, 0, 0)
    ok = proc.returncode == 0 and run.passed > 0 and not run.failed and not run.skipped
    if not ok:
        print(proc.stdout[-6000:] + proc.stderr[-2000:], flush=True)
    detail = (f"{must_run}: {run.passed} passed, {run.failed} failed, {run.skipped} skipped; "
              f"pytest: {tail[0]}")
    return StepResult(step, ok, time.monotonic() - t0, detail)


def guarded(step: str, fn: Any) -> tuple[StepResult, Any]:
    """Run ``fn``; an exception fails the step (with its traceback printed), never the whole check."""
    t0 = time.monotonic()
    try:
        value = fn()
    except Exception as e:
        traceback.print_exc()
        return StepResult(step, False, time.monotonic() - t0, f"{type(e).__name__}: {e}"), None
    return StepResult(step, True, time.monotonic() - t0, ""), value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--download-wheels", metavar="DIR", type=Path,
                    help="download the wheels the GPU host lacks into DIR and exit")
    ap.add_argument("--self-test-on-cpu", action="store_true",
                    help="run steps b and c on device cpu at tiny sizes (NOT a GPU run)")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--rounds", type=int, help="timed rounds per path and page size (default 9; CPU 3)")
    ap.add_argument("--batch-mib", type=float, help="bytes moved per timed batch (default 64; CPU 1)")
    args = ap.parse_args(argv)
    if args.download_wheels:
        return download_wheels(args.download_wheels)

    cpu = args.self_test_on_cpu
    missing = missing_modules(NEEDED + (() if cpu else NEEDED_FOR_PYTEST))
    if missing:
        if any("carried wheels" in m for m in missing):
            fix = ("lmdb and msgspec travel as wheels: run `python scripts/gpu_check.py --download-wheels "
                   "DIR` where there is network, carry DIR, then `pip install --no-index --no-deps --target "
                   "/tmp/site DIR/*.whl` and run with PYTHONPATH=/tmp/site")
        else:
            fix = "use a Python environment that has them (the GPU host we test on does)"
        print(f"gpu_check: cannot run: missing {'; '.join(missing)}. {fix}", file=sys.stderr)
        return REFUSED
    try:
        import torch
    except ImportError as e:
        print(f"gpu_check: cannot run: torch does not import ({e})", file=sys.stderr)
        return REFUSED
    if not cpu and not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(f"gpu_check: cannot run: no CUDA device is visible (torch {torch.__version__}, {build}, "
              f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}); this check "
              "is for GPU hosts (here: --self-test-on-cpu exercises its own code)", file=sys.stderr)
        return REFUSED
    from devtools import gpu_check as gc

    device = torch.device("cpu" if cpu else "cuda")
    if cpu:
        # On a CPU "device" torch splits copies over its intra-op threads; on a busy machine waking
        # them costs ~50 ms a batch. The self-test measures nothing worth reading: keep it quick.
        torch.set_num_threads(1)
    name = "CPU SELF-TEST (not a GPU run)" if cpu else torch.cuda.get_device_name(device)
    print(f"gpu_check: {name}; torch {torch.__version__} (built for CUDA {torch.version.cuda}), Python "
          f"{platform.python_version()}", flush=True)
    rounds = args.rounds or (3 if cpu else 9)
    batch = int((args.batch_mib or (1 if cpu else 64)) * (1 << 20))
    sizes = list(CPU_PAGE_SIZES if cpu else GPU_PAGE_SIZES)
    t_start = time.monotonic()
    steps: list[StepResult] = []
    if not cpu:
        steps.append(pytest_step("a HBM conformance on cuda", ["tests/tiers/test_hbm_tier.py"],
                                 "TestHbmOnCuda", 240))
        steps.append(pytest_step("b pinned host conformance",
                                 ["tests/tiers/test_host_tier.py::TestHostPinnedConformance"],
                                 "TestHostPinnedConformance", 120))
    print("gpu_check: b focused check of the pinned host tier", flush=True)
    step_b, pinned = guarded("b pinned host tier", lambda: gc.check_pinned_host(device))
    if pinned is not None:
        detail = (f"pinned={pinned.pinned} (expected {pinned.expected_pinned}), "
                  f"byte-exact={pinned.byte_exact}, store hits {pinned.store_hits}, "
                  f"store byte-exact={pinned.store_byte_exact}")
        step_b = dataclasses.replace(step_b, ok=pinned.ok, detail=detail)
    steps.append(step_b)
    print(f"gpu_check: c copies: {len(gc.PATHS)} paths x {len(sizes)} page sizes, {batch >> 10} KiB "
          f"per batch, {rounds} rounds A B B A", flush=True)
    step_c, copies = guarded("c copies vs torch", lambda: gc.measure_copies(device, sizes, batch, rounds))
    if copies:
        print(gc.format_table(copies))
        worst = min(copies, key=lambda r: r.ratio)
        step_c = dataclasses.replace(step_c, detail=f"lowest ours/torch {worst.ratio:.2f} "
                                                    f"({worst.path}, {worst.page_bytes >> 10} KiB)")
    steps.append(step_c)

    for s in steps:
        print(f"gpu_check: {'ok  ' if s.ok else 'FAIL'} {s.step} ({s.seconds:.1f} s): {s.detail}")
    failed = [s.step for s in steps if not s.ok]
    elapsed = time.monotonic() - t_start
    if cpu:
        verdict = (f"gpu_check: CPU SELF-TEST {'FAILED: ' + ', '.join(failed) if failed else 'passed'} in "
                   f"{elapsed:.0f} s: steps b and c on device cpu at tiny sizes; this was NOT a GPU run "
                   "(nothing ran on CUDA; step a and the pytest half of b need a GPU)")
    else:
        verdict = (f"gpu_check: {'FAIL: ' + ', '.join(failed) if failed else 'PASS'} on {name} in "
                   f"{elapsed:.0f} s")
    print(verdict)
    if args.json:
        args.json.write_text(json.dumps({
            "mode": "cpu-self-test" if cpu else "gpu", "device": name, "torch": torch.__version__,
            "torch_built_for_cuda": torch.version.cuda, "python": platform.python_version(), "ok": not failed,
            "verdict": verdict, "steps": [dataclasses.asdict(s) for s in steps],
            "pinned_host": dataclasses.asdict(pinned) if pinned else None,
            "copies": [dataclasses.asdict(r) for r in copies or []]}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
