"""A plugin's code as part of its resume key: what decides the steps it keeps, so an edit between an interrupt
and the rerun starts fresh instead of resuming on steps the old code computed.

A plugin in a file is keyed by that file, its package, the user's own modules it imports and mechkit's code; a
plugin with no source file (a notebook cell, ``exec``) by what its code reaches (:class:`Reach`), bounded.
The runner puts :func:`plugin_code` into the key beside the plugin's name, version, options, seed and model.

Three rooms: this one (the key of a plugin), :mod:`~mechkit.plugin_key.source` (what a source file names:
imports by string, files run by ``exec`` or a loader) and :mod:`~mechkit.plugin_key.reach` (the walk over
what code reaches).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from mechkit.plugin_key.reach import Reach

if TYPE_CHECKING:
    from mechkit.plugin import Plugin


def plugin_code(cls: type[Plugin]) -> str:
    """SHA-256 of the plugin's code: the file that defines it, every ``.py`` file of the top-level package it
    lives in (a plugin's helper module), the user's own modules it imports (:class:`Reach`: a single-file
    plugin's ``import myhelpers`` from its folder had no package to cover it) and mechkit's own code (which
    every plugin computes through: a third-party plugin's key covered only its own package, so mechkit edited
    under the same version between a kill and the rerun resumed on steps the old code computed). A plugin
    edited between a kill and the rerun without a version bump (a third-party one in development, say), in its
    own file or a module it imports, starts fresh instead of resuming on steps its old code computed; where the
    source cannot be read (a notebook cell), what its code reaches stands in (:func:`_compiled_code`)."""
    import inspect
    import sys

    try:
        own = Path(inspect.getsourcefile(cls) or "")
        digest = hashlib.sha256(own.read_bytes())
    except (OSError, TypeError):  # a class defined in a notebook cell or by exec: no file to read
        return _compiled_code(cls)
    top = sys.modules.get(cls.__module__.partition(".")[0])
    roots = [Path(p) for p in getattr(top, "__path__", [])] if top is not None else []
    if cls.__module__.partition(".")[0] == "mechkit":  # built-in plugins live beside mechkit's package
        roots.append(own.parent)
    mechkit_root = sys.modules.get("mechkit")  # a third-party plugin computes through mechkit's code too
    roots += [Path(p) for p in getattr(mechkit_root, "__path__", [])]
    digest.update(package_code(tuple(sorted({str(r) for r in roots}))).encode())
    Reach(digest).file(str(own), cls.__module__)  # the user's modules it imports (none for a built-in plugin)
    return digest.hexdigest()


def _compiled_code(cls: type[Plugin]) -> str:
    """SHA-256 of what a plugin class's code reaches, where its source file cannot be read (a notebook cell,
    exec), and of mechkit's own code: its key was the name and version alone, so a cell edited between an
    interrupt and the rerun resumed on steps the old code computed. The class's functions counted by their
    bytecode alone missed a default argument, a closure's value, a ``@property``'s body, and the cell's globals
    and helper functions the code reads: :class:`Reach` follows all of these."""
    import sys

    digest = hashlib.sha256()
    Reach(digest).plugin_class(cls)
    mechkit_root = sys.modules.get("mechkit")
    roots = tuple(sorted(str(p) for p in getattr(mechkit_root, "__path__", [])))
    digest.update(package_code(roots).encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def package_code(roots: tuple[str, ...]) -> str:
    """SHA-256 of every ``.py`` file under ``roots`` (names and bytes), read once per process: the code of a
    process does not change while it runs."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
            except OSError:
                continue
    return digest.hexdigest()


__all__ = ["package_code", "plugin_code"]
