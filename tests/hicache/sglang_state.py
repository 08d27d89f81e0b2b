"""What SGLang's start-up hooks change in a fresh SGLang process, compared by identity.

Run as a script in a fresh interpreter (``record`` does: ``python sglang_state.py [--scheduler]
[--import MODULE]... --dist NAME...``), it does what every SGLang process does first, platform
discovery then ``load_plugins()``, then loads the class SGLang's factory builds for
``--hicache-storage-backend mooncake``, with SGLang seeing the plug-ins of the named distributions
only. It prints one JSON line: every change made within each platform entry point's call, within
``load_plugins()`` (our plug-ins and SGLang applying their hooks) and within the backend's load, to

- ``sys.modules``: entries added or replaced by a module no import made (no ``__spec__``; not
  counting those compiled extensions register for themselves);
- the ``SGLANG_*`` environment;
- ``StorageBackendFactory._registry`` and ``HookRegistry._hooks``;
- every attribute of every loaded ``sglang`` module and of every class those modules define,
  compared by identity, and every ABC's registry of virtual subclasses.

The modules given with ``--import`` are imported first where they import (they hold the patched
targets); those first loaded within a window, whose attributes had nothing to be compared with,
are listed (``imported``). ``--scheduler`` imports ``sglang.srt.managers.scheduler`` first, as
``run_scheduler_process`` has when it loads the plug-ins. Nothing of mooncake_sgl is imported but by
SGLang until the end, so the script records the parent commit's plug-in as well as this one's
(``mooncake_sgl`` in the output says which tree the child ran). ``stub_platform`` writes a platform
distribution that selects itself when ``SGLANG_PLATFORM`` names it.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import importlib
import importlib.machinery
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BACKEND_FACTORY = "sglang.srt.mem_cache.storage.backend_factory.StorageBackendFactory"
SCHEDULER = "sglang.srt.managers.scheduler"
# SGLang's own bookkeeping of the steps recorded, not a change anyone made to it.
SGLANGS_OWN = frozenset({"sglang.srt.plugins._plugins_loaded"})
PLATFORMS = "sglang.srt.platforms"
STUB_PLATFORM = "stub"
STUB_DIST = "stub-platform"
_ABSENT = object()
_EXTENSION_RUNTIME = re.compile(r"swig_runtime_data\d+|_cython_[\d_]+|cython_runtime")


def stub_platform(directory: Path) -> Path:
    """A platform plug-in distribution named ``stub-platform`` in ``directory`` (a dist-info folder
    and its module, found by ``importlib.metadata`` once ``directory`` is on the path): its entry
    point ``stub`` activates a CPU platform of its own class, ``StubPlatform``. The directory."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "stub_platform.py").write_text(
        "from sglang.srt.platforms.cpu import CpuSRTPlatform\n\n\n"
        "class StubPlatform(CpuSRTPlatform):\n    pass\n\n\n"
        "def activate() -> str:\n    return 'stub_platform.StubPlatform'\n")
    info = directory / "stub_platform-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {STUB_DIST}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[sglang.srt.platforms]\n{STUB_PLATFORM} = stub_platform:activate\n")
    return directory


def record(workdir: Path, env: Mapping[str, str], *, dists: Iterable[str], scheduler: bool = False,
           stub: bool = False, imports: Iterable[str] = ()) -> dict[str, Any]:
    """Run this script in a fresh interpreter whose ``SGLANG_*`` and ``MOONCAKE_SGL_*`` variables
    are only ``SGLANG_USE_CPU_ENGINE=1`` and ``env``, in ``workdir`` (not the checkout: its
    ``mooncake_sgl.egg-info`` would stand for the installed distribution), where SGLang sees the
    plug-ins of ``dists`` only; with ``stub``, the stub platform distribution too. Its JSON record."""
    child = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "MOONCAKE_SGL_"))}
    child["SGLANG_USE_CPU_ENGINE"] = "1"
    child.update(env)
    if stub:
        child["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(stub_platform(workdir / "stub")), os.environ.get("PYTHONPATH", "")) if p)
        dists = [*dists, STUB_DIST]
    args = [sys.executable, __file__, *(["--scheduler"] if scheduler else []),
            *(f"--import={name}" for name in imports), *(f"--dist={name}" for name in dists)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, env=child, cwd=workdir)
    if out.returncode != 0 or not out.stdout.strip():
        raise AssertionError(f"the recording process failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _normal(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _sglang_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("SGLANG_")}


def _attributes() -> tuple[dict[str, tuple[str, object]], dict[str, frozenset[type]]]:
    """Every attribute of every loaded ``sglang`` module and of the classes each defines, as
    ``{dotted path: (module, value)}`` (values held, so that identities stay valid), and each ABC's
    virtual subclasses."""
    import _abc

    attributes: dict[str, tuple[str, object]] = {}
    virtual: dict[str, frozenset[type]] = {}
    for name, module in list(sys.modules.items()):
        if not (name == "sglang" or name.startswith("sglang.")) or not isinstance(module, types.ModuleType):
            continue
        for attr, value in list(vars(module).items()):
            attributes[f"{name}.{attr}"] = (name, value)
            if isinstance(value, type) and value.__module__ == name and value.__qualname__ == attr:
                for cattr, cvalue in list(vars(value).items()):
                    attributes[f"{name}.{attr}.{cattr}"] = (name, cvalue)
                if isinstance(value, abc.ABCMeta):
                    virtual[f"{name}.{attr}"] = frozenset(
                        cls for cls in (ref() for ref in _abc._get_dump(value)[0]) if cls is not None)
    return attributes, virtual


def _registry() -> dict[str, tuple[str, str]] | None:
    factory = sys.modules.get(BACKEND_FACTORY.rsplit(".", 1)[0])
    if factory is None:
        return None
    return {k: (v.get("module_path"), v.get("class_name"))
            for k, v in factory.StorageBackendFactory._registry.items()}


def _hooks() -> dict[str, list[tuple[Any, ...]]]:
    registry = sys.modules.get("sglang.srt.plugins.hook_registry")
    return {} if registry is None else {t: list(h) for t, h in registry.HookRegistry._hooks.items()}


def _made_by_hand(name: str, module: object, modules: Mapping[str, object]) -> bool:
    """A ``sys.modules`` entry no import made (no ``__spec__``), other than those compiled extensions
    register for themselves: their runtime's registry (SWIG, Cython) and their own submodules."""
    if getattr(module, "__spec__", None) is not None or _EXTENSION_RUNTIME.fullmatch(name):
        return False
    parent = modules.get(name.rpartition(".")[0])
    origin = getattr(getattr(parent, "__spec__", None), "origin", None) or ""
    return not origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def _is_submodule_binding(key: str, value: object) -> bool:
    # Importing ``a.b`` binds ``b`` on the package ``a``: the import system's doing, not a patch.
    return isinstance(value, types.ModuleType) and value.__name__ == key


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class _State:
    """What the recorder compares, taken at one moment."""

    modules: dict[str, object]
    env: dict[str, str]
    registry: dict[str, tuple[str, str]] | None
    hooks: dict[str, list[tuple[Any, ...]]]
    attributes: dict[str, tuple[str, object]]
    virtual: dict[str, frozenset[type]]

    @classmethod
    def take(cls) -> _State:
        return cls(dict(sys.modules), _sglang_env(), _registry(), _hooks(), *_attributes())


@dataclass
class _Recorder:
    """The changes made within each window: the platform entry points' calls, ``load_plugins()`` and
    the backend's load. Nothing else runs in them but our distributions' code and SGLang's own
    plug-in machinery (SGLang's imports outside them create modules no import made as well)."""

    changes: set[tuple[str, str]] = field(default_factory=set)
    imported: set[str] = field(default_factory=set)
    registered: dict[str, list[str]] = field(default_factory=dict)

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        before = _State.take()
        try:
            yield
        finally:
            self._compare(before, _State.take())

    def _compare(self, before: _State, after: _State) -> None:
        for name, module in after.modules.items():
            if before.modules.get(name) is not module and _made_by_hand(name, module, after.modules):
                self.changes.add(("sys.modules", name))
        self.changes |= {("env", k) for k in before.env.keys() | after.env.keys()
                         if before.env.get(k) != after.env.get(k)}
        if before.registry is not None and after.registry is not None:
            self.changes |= {("registry", f"{BACKEND_FACTORY}._registry[{k!r}]")
                             for k in before.registry.keys() | after.registry.keys()
                             if before.registry.get(k) != after.registry.get(k)}
        for target, hooks in after.hooks.items():
            self.changes |= {(f"hook {hook_type.value}", target)
                             for hook_type, _, _ in hooks[len(before.hooks.get(target, [])):]}
        for key in before.attributes.keys() | after.attributes.keys():
            module, was = before.attributes.get(key, ("", _ABSENT))
            module, now = after.attributes.get(key, (module, _ABSENT))
            if key in SGLANGS_OWN or was is now:
                continue
            if was is _ABSENT and (module not in before.modules or _is_submodule_binding(key, now)):
                continue  # a module first loaded in the window (``imported``), or a submodule bound
            self.changes.add(("attribute", key))
        for key, subclasses in after.virtual.items():
            added = subclasses - before.virtual.get(key, frozenset())
            if added and key in before.virtual:
                self.changes.add(("virtual subclass", key))
                self.registered[key] = sorted(_qualname(cls) for cls in added)
        self.imported |= {n for n in after.modules.keys() - before.modules.keys()
                          if n == "sglang" or n.startswith("sglang.")}


class _RecordedEntryPoint:
    """A platform entry point whose call is a window of the recorder (SGLang reads ``name``,
    ``value`` and ``dist``, and calls what ``load`` returns)."""

    def __init__(self, entry_point: Any, recorder: _Recorder) -> None:
        self.name, self.value, self.dist = entry_point.name, entry_point.value, entry_point.dist
        self._entry_point, self._recorder = entry_point, recorder

    def load(self) -> Callable[[], Any]:
        hook = self._entry_point.load()

        def call() -> Any:
            with self._recorder.window():
                return hook()
        return call


def _only(dists: set[str], recorder: _Recorder) -> None:
    """SGLang sees the ``sglang.srt.*`` entry points of ``dists`` only: another installed plug-in
    (this venv has smg-grpc-servicer's, hooking ``ServerArgs.add_cli_args``) is not ours to count."""
    every = importlib.metadata.entry_points

    def entry_points(**params: Any) -> Any:
        found = every(**params)
        group = params.get("group", "")
        if not group.startswith("sglang.srt."):
            return found
        ours = [ep for ep in found if ep.dist is not None and _normal(ep.dist.name) in dists]
        return tuple(_RecordedEntryPoint(ep, recorder) for ep in ours) if group == PLATFORMS else tuple(ours)

    importlib.metadata.entry_points = entry_points


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", action="store_true")
    parser.add_argument("--import", dest="imports", action="append", default=[])
    parser.add_argument("--dist", dest="dists", action="append", default=[])
    args = parser.parse_args(argv)

    recorder = _Recorder()
    _only({_normal(d) for d in args.dists}, recorder)  # before SGLang binds entry_points
    from sglang.srt.plugins import load_plugins

    if args.scheduler:
        importlib.import_module(SCHEDULER)
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
    from sglang.srt.platforms import current_platform

    platform = type(current_platform).__name__
    for name in args.imports:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not importable in this setting: nothing there to patch
            pass
    with recorder.window():
        load_plugins()
    entry = StorageBackendFactory._registry.get("mooncake")
    with recorder.window():
        try:
            builds = _qualname(entry["loader"]()) if entry is not None else None
        except Exception as e:  # noqa: BLE001 - recorded: the factory would fail the same way
            builds = f"{type(e).__name__}: {e}"

    print(json.dumps({
        "changes": sorted(recorder.changes),
        "registry_mooncake": list(_registry().get("mooncake", ())),
        "builds": builds,
        "virtual_subclasses": recorder.registered,
        "imported": sorted(recorder.imported),
        "platform": platform,
        "mooncake_sgl": importlib.import_module("mooncake_sgl").__file__,
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
