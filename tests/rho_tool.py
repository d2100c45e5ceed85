"""``tools/taskselect_rho.py`` loaded as a module: it is a script, not part of the package, and six test files
drive its checks and its ``main`` directly (one copy of the loading, not one per file)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).resolve().parents[1] / "tools" / "taskselect_rho.py"


def rho_tool() -> ModuleType:
    """A fresh module of the tool (a test may monkeypatch it without touching another's)."""
    spec = importlib.util.spec_from_file_location("taskselect_rho", PATH)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool
