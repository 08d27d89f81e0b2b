"""What the live-server benchmark scripts share: their common options (``devtools.bench.options``)
and the bar plot of their runs (``devtools.bench.plot``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from devtools.bench.options import add_run_options, progress, schedule, write_json
from devtools.bench.plot import Panel, bar_panels


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_run_options(p, workdir="out/x", json_help="numbers", plot_default="x.png")
    return p


def test_each_script_keeps_its_own_defaults() -> None:
    args = parser().parse_args([])
    assert (args.workdir, args.json, args.plot, args.health_timeout, args.no_progress) == \
        ("out/x", None, "x.png", 900.0, False)


def test_the_json_file_has_the_args_first_and_its_folder_is_made(tmp_path: Path) -> None:
    path = tmp_path / "new" / "run.json"
    args = parser().parse_args(["--json", str(path)])
    write_json(args, runs=[{"at": tmp_path}])
    body = json.loads(path.read_text())
    assert list(body) == ["args", "runs"] and body["args"]["json"] == str(path)
    assert body["runs"] == [{"at": str(tmp_path)}]  # what JSON has no type for, as text


def test_no_progress_gives_no_bar() -> None:
    with progress(parser().parse_args(["--no-progress"]), 10, "run") as bar:
        assert bar is None


def test_passes_run_forward_then_backward() -> None:
    assert [v for _, v, _ in schedule(["a", "b"], passes=2)] == ["a", "b", "b", "a"] * 2


def test_an_empty_stack_keeps_its_place_and_the_plot_is_written(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.png"
    panels = [Panel("tokens", [[("found", [1.0, 2.0])], []], legend_size=7),
              Panel("ms", [[("a", [3.0, 1.0]), ("b", [1.0, 1.0])]])]
    bar_panels(str(path), "title", ["1\nx", "2\ny"], panels, figsize=(6, 3), label_size=7)
    assert path.read_bytes().startswith(b"\x89PNG")
    assert f"plot written to {path}" in capsys.readouterr().err
