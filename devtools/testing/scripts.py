"""``load_script``: a file of ``scripts/`` imported as a module, for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py``, executed as the module ``<name>_script`` (registered in
    ``sys.modules``: dataclasses resolve their string annotations through it)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no script {name!r} in {SCRIPTS}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
