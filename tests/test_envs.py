"""The environment registry: one declaration per variable, typed values, malformed values named."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from devtools.testing import tool_envs
from mooncake_sgl import envs
from mooncake_sgl.config import default_cache_dir
from mooncake_sgl.config_sources import resolve_config

PACKAGE = Path(envs.__file__).resolve().parent
# The built-in backend's variables are its contract, read where the built-in's rules live.
BUILTIN_READER = PACKAGE / "builtin_config.py"


def _reads_os_environ(node: ast.AST) -> bool:
    # os.environ.get(...), os.environ[...], os.environ.setdefault(...), os.getenv(...); copying the
    # whole environment for a child (dict(os.environ), {**os.environ}) reads no variable.
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        if f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os":
            return True
        return f.attr in ("get", "setdefault", "pop") and _is_os_environ(f.value)
    return isinstance(node, ast.Subscript) and _is_os_environ(node.value)


def _is_os_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def test_no_module_but_the_registry_reads_a_variable() -> None:
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in (PACKAGE / "envs.py", BUILTIN_READER):
            continue
        tree = ast.parse(path.read_text(), str(path))
        readers += [f"{path.relative_to(PACKAGE)}:{n.lineno}" for n in ast.walk(tree) if _reads_os_environ(n)]
    assert readers == []


def test_unset_or_empty_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOONCAKE_SGL_STOP_GRACE", raising=False)
    assert tool_envs.MOONCAKE_SGL_STOP_GRACE.get() == 5.0
    monkeypatch.setenv("MOONCAKE_SGL_STOP_GRACE", " ")
    assert tool_envs.MOONCAKE_SGL_STOP_GRACE.get() == 5.0
    assert envs.MOONCAKE_SGL_HOST_RESERVE.get({}) is None


def test_values_are_typed() -> None:
    assert tool_envs.MOONCAKE_SGL_STOP_GRACE.get({"MOONCAKE_SGL_STOP_GRACE": "250ms"}) == 0.25
    assert envs.MOONCAKE_SGL_HOST_RESERVE.get({"MOONCAKE_SGL_HOST_RESERVE": "512MiB"}) == 512 << 20
    assert envs.MOONCAKE_SGL_CPU_ADAPTATIONS.get({"MOONCAKE_SGL_CPU_ADAPTATIONS": "1"}) is True
    # "0" was true while flags were tested for a non-empty string.
    assert envs.MOONCAKE_SGL_CPU_ADAPTATIONS.get({"MOONCAKE_SGL_CPU_ADAPTATIONS": "0"}) is False


@pytest.mark.parametrize(("var", "value", "words"), [
    (envs.MOONCAKE_SGL_HOST_RESERVE, "lots", "expected a size"),
    (tool_envs.MOONCAKE_SGL_STOP_GRACE, "soon", "expected a duration"),
    (envs.MOONCAKE_SGL_CPU_ADAPTATIONS, "maybe", "expected one of"),
    (envs.MC_RPC_TIMEOUT_MS, "3s", "invalid literal"),
])
def test_a_malformed_value_is_an_error_naming_the_variable(var: envs.EnvVar, value: str, words: str) -> None:
    with pytest.raises(envs.EnvError) as info:
        var.get({var.name: value})
    assert f"${var.name}={value!r}" in str(info.value)
    assert words in str(info.value)


def test_set_default_leaves_the_operators_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MC_RPC_TIMEOUT_MS", "9000")
    envs.MC_RPC_TIMEOUT_MS.set_default(3000)
    assert envs.MC_RPC_TIMEOUT_MS.get() == 9000
    monkeypatch.delenv("MC_RPC_TIMEOUT_MS")
    envs.MC_RPC_TIMEOUT_MS.set_default(3000)
    assert envs.MC_RPC_TIMEOUT_MS.get() == 3000


def test_set_default_fills_a_variable_set_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MC_RPC_TIMEOUT_MS", "")  # unset, for get() and is_set() alike
    envs.MC_RPC_TIMEOUT_MS.set_default(3000)
    assert envs.MC_RPC_TIMEOUT_MS.get() == 3000


def test_each_variable_is_declared_once() -> None:
    names = [v.name for v in envs.REGISTRY]
    assert len(names) == len(set(names)) and "MOONCAKE_SGL_CONFIG" in names


def test_the_config_reads_through_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "mooncake_sgl"
    cfg = tmp_path / "tiers.yaml"
    cfg.write_text("tiers: [{kind: host, capacity: 1GiB}]\n")
    resolved = resolve_config({}, None, environ={"MOONCAKE_SGL_CONFIG": f" {cfg} "})
    assert resolved.config.tiers[0].capacity == 1 << 30
