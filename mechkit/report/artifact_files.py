"""Reading a run's figure back from its directory: only the run's own PNG file, never what a link points to.

A run directory can come from anyone (a shared drive, a download). Its ``report.json`` names its
artifacts, but the files under those names may be a symlink to a private file, a FIFO that blocks the
read, a multi-gigabyte file or something that is not an image. A figure is embedded in a page or a
notebook only when it is a regular file directly in the run directory, at most :data:`MAX_IMAGE_BYTES`,
starting with the PNG signature.
"""

from __future__ import annotations

import os
from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_IMAGE_BYTES = 8 * 2**20  # a run's figure is tens of kB; anything this large is not one


def plain_png_name(name: object) -> bool:
    """Whether ``name`` is a plain ``*.png`` file name (no folder part)."""
    return isinstance(name, str) and name.lower().endswith(".png") and "/" not in name and "\\" not in name \
        and name not in (".", "..") and "\x00" not in name


def own_png(path: str | os.PathLike[str]) -> bytes | None:
    """The bytes of the PNG file at ``path`` when it is the run's own (see the module doc), else ``None``.

    Opened without following a symlink and without blocking (a FIFO or a device is never read).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.png").write_bytes(PNG_MAGIC + b"data")
    >>> (d / "b.png").symlink_to(d / "a.png")
    >>> _ = (d / "c.png").write_text("not an image")
    >>> [own_png(d / n) is not None for n in ("a.png", "b.png", "c.png", "missing.png")]
    [True, False, False, False]
    """
    from mechkit.io.read import read_regular

    data = read_regular(path, MAX_IMAGE_BYTES)
    return data if data is not None and data.startswith(PNG_MAGIC) else None


def own_pngs(run_dir: str | os.PathLike[str], names: object) -> dict[str, bytes]:
    """``{name: bytes}`` of the artifacts ``names`` that are the run's own PNG files (others are skipped)."""
    if not isinstance(names, list):
        return {}
    found = {}
    for name in names:
        if plain_png_name(name):
            data = own_png(Path(run_dir) / name)
            if data is not None:
                found[name] = data
    return found
