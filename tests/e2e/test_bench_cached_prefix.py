"""The pure parts of ``scripts/bench_cached_prefix.py``: which sizes it measures and what its table
says (the live run is the benchmark's own)."""

from __future__ import annotations

import pytest

from devtools.testing.scripts import load_script


def test_the_baseline_is_always_measured_first_and_each_size_once() -> None:
    assert load_script("bench_cached_prefix").prefix_sizes("2048, 64,64", 4096) == [0, 64, 2048]


@pytest.mark.parametrize("text", ["4096", "-1", "64,5000"])
def test_a_prefix_not_shorter_than_the_document_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match=r"--prefixes \[.*\].*below --doc-tokens 4096"):
        load_script("bench_cached_prefix").prefix_sizes(text, 4096)


def test_each_size_is_read_against_nothing_cached() -> None:
    rounds = {0: [(0.05, 0), (0.07, 0)], 64: [(0.12, 64), (0.10, 64)]}
    text, rows = load_script("bench_cached_prefix").table(rounds, 4096)
    assert [r["x_nothing_cached"] for r in rows] == pytest.approx([1.0, 11 / 6])
    assert "1.83x" in text and "4032" in text
