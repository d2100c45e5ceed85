"""Plugin discovery through the ``mechkit.plugins`` entry-point group — the built-ins included.

Listing reads package metadata only; a plugin module is imported when its command is used (or
its options are shown). A plugin that fails to import is recorded with its error and never
breaks the other commands.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import os
import sys
from dataclasses import dataclass

from mechkit.errors import PluginError

GROUP = "mechkit.plugins"


@dataclass
class PluginEntry:
    """One discovered plugin, loaded lazily."""

    name: str
    value: str
    dist: str
    dist_version: str
    _cls: type | None = None
    error: str | None = None

    def load(self) -> type:
        if self._cls is None and self.error is None:
            try:
                cls = md.EntryPoint(self.name, self.value, GROUP).load()
                _check(cls, self.name)
                self._cls = cls
            except Exception as err:  # a broken third-party plugin must not crash mechkit
                self.error = f"{type(err).__name__}: {err}".splitlines()[0]
        if self.error is not None:
            raise PluginError(f"plugin {self.name!r} ({self.dist}) failed to load: {self.error}",
                              f"fix or uninstall `{self.dist}`; `mechkit plugins list` shows all plugins")
        return self._cls


def _check(cls: type, name: str) -> None:
    missing = [a for a in ("name", "version", "summary", "options", "run") if not hasattr(cls, a)]
    if missing:
        raise TypeError(f"{cls!r} is not a mechkit plugin (missing {', '.join(missing)})")


_FOUND: tuple[tuple, dict[str, PluginEntry]] | None = None  # (where packages live, as of when; what was found)


def _where_packages_live() -> tuple:
    """``sys.path`` with each entry's modification time: installing or removing a distribution adds or
    removes a ``*.dist-info`` folder there, which changes its folder's time."""
    stamp = []
    for entry in sys.path:
        try:
            stamp.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            stamp.append((entry, None))
    return tuple(stamp)


def entries() -> dict[str, PluginEntry]:
    """Every installed plugin by name, without importing any of them.

    Reading the entry points parses every installed distribution's metadata (0.03–0.07 s with this
    environment's ~250 packages), and a command asks several times; the answer is kept until a package
    is installed or removed on ``sys.path``."""
    global _FOUND
    key = _where_packages_live()
    if _FOUND is not None and _FOUND[0] == key:
        return dict(_FOUND[1])
    found: dict[str, PluginEntry] = {}
    for ep in md.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        found.setdefault(ep.name, PluginEntry(
            name=ep.name, value=ep.value,
            dist=dist.metadata["Name"] if dist else "?", dist_version=dist.version if dist else "?",
        ))
    _FOUND = (key, dict(sorted(found.items())))
    return dict(_FOUND[1])


def get(name: str) -> type:
    """The plugin class registered as ``name``."""
    found = entries()
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise PluginError(f"unknown plugin {name!r}", f"{hint}`mechkit plugins list` shows the installed plugins")
    return found[name].load()
