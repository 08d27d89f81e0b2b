"""The pure parts of ``scripts/bench_cached_prefix.py``: which sizes it measures and what its table
says (the live run is the benchmark's own)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_cached_prefix.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_cached_prefix_script", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_baseline_is_always_measured_first_and_each_size_once() -> None:
    assert _load().prefix_sizes("2048, 64,64", 4096) == [0, 64, 2048]


@pytest.mark.parametrize("text", ["4096", "-1", "64,5000"])
def test_a_prefix_not_shorter_than_the_document_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=r"--prefixes \[.*\].*below --doc-tokens 4096"):
        _load().prefix_sizes(text, 4096)


def test_each_size_is_read_against_nothing_cached() -> None:
    text, rows = _load().table({0: [(0.05, 0), (0.07, 0)], 64: [(0.12, 64), (0.10, 64)]}, 4096)
    assert [r["x_nothing_cached"] for r in rows] == pytest.approx([1.0, 11 / 6])
    assert "1.83x" in text and "4032" in text
