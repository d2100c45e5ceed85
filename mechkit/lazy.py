"""Package attributes imported on first use.

A package whose modules import torch lists its public names in its ``__init__`` and imports the module
holding one only when that name is first read, so importing the package (to render a report's tables,
or for ``mechkit --help``) stays cheap. The first read is remembered in the package's namespace.

>>> ns = {}
>>> getattr_, dir_ = lazy_attributes("json", {"JSONEncoder": "encoder"}, ns)
>>> getattr_("JSONEncoder")().encode({"a": 1}), "JSONEncoder" in ns, "JSONEncoder" in dir_()
('{"a": 1}', True, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, where: dict[str, str], namespace: dict[str, Any]
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: name ``n`` is read from ``package.<where[n]>``."""

    def __getattr__(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
