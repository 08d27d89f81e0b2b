"""SGLang is changed where the touch-point lists say and nowhere else.

Fresh SGLang processes record everything their start-up changes in SGLang (``sglang_state``: the
backend registry, the hook table, every attribute of every loaded sglang module and class by
identity, virtual subclasses, ``SGLANG_*`` variables, stand-in modules), with both of this
repository's distributions installed, and the change set must be exactly what the two lists
declare for the setting: without the CPU switch, with it, in a scheduler process, and with
``SGLANG_PLATFORM`` naming another platform. In each, ``--hicache-storage-backend mooncake`` builds
our backend.
"""

from __future__ import annotations

import logging
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import mooncake_sgl
from mooncake_sgl import envs
from mooncake_sgl.hicache import touch_points as product
from mooncake_sgl.hicache.touch_points import Condition, Kind, Phase, TouchPoint
from mooncake_sgl_cpu import touch_points as cpu

from . import sglang_state

REPO = Path(__file__).resolve().parents[2]
EVERY_POINT: tuple[TouchPoint, ...] = (*product.POINTS, *cpu.POINTS)
DISTS = ("mooncake-sgl", "mooncake-sgl-cpu")

# What the recording sees of each kind of change.
OBSERVED = {
    Kind.REGISTRY_ENTRY: ("registry",), Kind.ENV_DEFAULT: ("env",), Kind.SYS_MODULE: ("sys.modules",),
    Kind.HOOK_AROUND: ("hook around", "attribute"), Kind.HOOK_AFTER: ("hook after", "attribute"),
    Kind.VIRTUAL_SUBCLASS: ("virtual subclass",), Kind.WRAP: ("attribute",), Kind.REPLACE: ("attribute",),
    Kind.BIND: ("attribute",), Kind.SET: ("attribute",),
}
CPU_SWITCH = {envs.MOONCAKE_SGL_CPU_ADAPTATIONS.name: "1", envs.MOONCAKE_SGL_HOST_RESERVE.name: "1GiB"}


@dataclass(frozen=True)
class Setting:
    """A fresh SGLang process: its environment, whether it is a scheduler's, whether the stub
    platform distribution is installed, and the conditions that hold in it."""

    env: tuple[tuple[str, str], ...]
    scheduler: bool
    stub: bool
    holds: frozenset[Condition]


SETTINGS = {
    # Without sgl_kernel (no CPU stand-in) SGLang's MooncakeStore does not import on this host.
    "no CPU switch": Setting((), False, False, frozenset({product.EVERY_PROCESS})),
    "CPU switch": Setting(tuple(CPU_SWITCH.items()), False, False, frozenset(
        {product.EVERY_PROCESS, product.BUILTIN_STORE_IMPORTS, cpu.CPU_HOST})),
    "scheduler": Setting(tuple(CPU_SWITCH.items()), True, False, frozenset(
        {product.EVERY_PROCESS, product.SCHEDULER_PROCESS, product.BUILTIN_STORE_IMPORTS, cpu.CPU_HOST})),
    # SGLang calls neither entry point of a distribution offering an unselected platform: the CPU
    # distribution applies nothing, switch or not; the product offers none and is whole.
    "SGLANG_PLATFORM=stub": Setting(
        (*CPU_SWITCH.items(), ("SGLANG_PLATFORM", sglang_state.STUB_PLATFORM)), False, True,
        frozenset({product.EVERY_PROCESS})),
}


def declared(holds: frozenset[Condition]) -> set[tuple[str, str]]:
    """What the lists say SGLang's start-up changes where exactly ``holds`` hold."""
    return {(what, p.target) for p in EVERY_POINT if p.condition in holds for what in OBSERVED[p.kind]}


def module_of(target: str) -> str:
    """The module holding a dotted target: the part before its first capitalised name, or before
    its last name."""
    parts = target.split(".")
    first_capital = next((i for i, part in enumerate(parts) if i and part[:1].isupper()), len(parts) - 1)
    return ".".join(parts[:first_capital])


PATCHED_MODULES = sorted({module_of(p.target) for p in EVERY_POINT
                          if p.kind not in (Kind.ENV_DEFAULT, Kind.SYS_MODULE)})


@pytest.mark.parametrize("name", SETTINGS)
def test_sglang_changes_exactly_as_the_lists_declare(name: str, tmp_path: Path) -> None:
    setting = SETTINGS[name]
    # Importing the scheduler would make any process a scheduler's: only the scheduler setting does.
    imports = [m for m in PATCHED_MODULES if setting.scheduler or m != product.SCHEDULER_MODULE]
    state = sglang_state.record(tmp_path, dict(setting.env), dists=DISTS, scheduler=setting.scheduler,
                                stub=setting.stub, imports=imports)
    print(f"\n[{name}] platform {state['platform']}; SGLang changed:",
          *(f"  {what}: {target}" for what, target in state["changes"]), sep="\n")
    assert state["mooncake_sgl"] == mooncake_sgl.__file__  # the child ran this checkout
    assert state["registry_mooncake"] == ["mooncake_sgl.hicache.backend", "MooncakeSglStorage"]
    assert state["builds"] == "mooncake_sgl.hicache.backend.MooncakeSglStorage"
    assert not set(state["imported"]) & set(PATCHED_MODULES)  # every patched module was compared
    assert {tuple(change) for change in state["changes"]} == declared(setting.holds)


def test_the_settings_cover_every_point() -> None:
    covered = set().union(*(declared(s.holds) for s in SETTINGS.values()))
    assert covered == declared(frozenset(p.condition for p in EVERY_POINT))


def test_every_point_names_its_function_and_condition_and_no_target_twice() -> None:
    for point in EVERY_POINT:
        assert callable(pkgutil.resolve_name(point.apply)), point.target
        assert callable(pkgutil.resolve_name(point.condition.holds)), point.target
    targets = [p.target for p in EVERY_POINT]
    assert len(targets) == len(set(targets))


def test_the_product_offers_no_platform_and_declares_one_entry_point() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"] == {
        "sglang.srt.plugins": {"mooncake_sgl": "mooncake_sgl.hicache.plugin:register"}}
    assert all(not p.target.startswith("mooncake_sgl_cpu") and Phase.PLATFORM not in p.phases
               for p in product.POINTS)


def test_the_docs_quote_both_lists() -> None:
    page = (REPO / "docs" / "sglang-touch-points.md").read_text()
    assert product.table(product.POINTS) in page
    assert product.table(cpu.POINTS) in page


_applied: list[TouchPoint] = []


def _apply(point: TouchPoint) -> bool:
    _applied.append(point)
    return True


def test_a_gated_point_is_left_out_on_an_unchecked_sglang(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    (virtual,) = [p for p in product.POINTS if p.kind is Kind.VIRTUAL_SUBCLASS]
    assert virtual.sglang == product.CHECKED_SGLANG
    point = TouchPoint(virtual.target, virtual.kind, virtual.change, virtual.phases, product.EVERY_PROCESS,
                       virtual.sglang, virtual.why, f"{__name__}:_apply")
    monkeypatch.setattr(product, "sglang_version", lambda: "0.6.0")
    with caplog.at_level(logging.WARNING, logger=product.__name__):
        assert product.apply([point], Phase.BACKEND) == []
    assert _applied == []
    assert "sglang 0.6.0" in caplog.text and virtual.target in caplog.text
    monkeypatch.setattr(product, "sglang_version", lambda: "0.5.23")
    assert product.apply([point], Phase.BACKEND) == [point] == _applied
