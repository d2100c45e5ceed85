"""The content of the files a run's options name, for its resume key.

A resume key holding only ``--vectors a.safetensors,b.safetensors`` would let a rerun pick up the
finished steps of a killed run although ``a.safetensors`` was replaced in between, and mix both into
one report. Every option that names input files (``Option(files=True)``, or a parser such as
:class:`~mechkit.options.parsers.Paths` that declares ``reads_files``) is fingerprinted here by what the
files hold.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mechkit.plugin import Plugin

_CHUNK = 1 << 20


def names_files(option: Any) -> bool:
    """Whether the option's value names input files."""
    return bool(getattr(option, "files", False) or getattr(option.parse, "reads_files", False))


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes; for a directory (a run directory given as ``--from``), of its
    ``report.json`` and the name, size and modification time of every file directly in it."""
    digest = hashlib.sha256()
    try:
        if path.is_dir():
            for child in sorted(path.iterdir()):
                if child.is_file():
                    stat = child.stat()
                    digest.update(f"{child.name}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
            path = path / "report.json"
            if not path.is_file():
                return digest.hexdigest()
        _digest_regular(path, digest)
    except OSError as err:  # unreadable now: the plugin says so when it reads it; the key just differs
        digest.update(f"unreadable: {err.strerror}".encode())
    return digest.hexdigest()


def _digest_regular(path: Path, digest) -> None:
    """Add ``path``'s bytes to ``digest`` where it is a regular file. Opened without blocking and checked on
    the descriptor: a FIFO named as ``--from`` hung the run here, before the plugin could refuse it, and a
    device (``/dev/zero``) never ended. Such a file adds only its kind; the plugin then says what is wrong."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            digest.update(b"not a regular file")
            return
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    finally:
        os.close(fd)


def _paths(value: Any) -> Iterable[str]:
    if isinstance(value, (str, Path)):
        return [str(value)]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if isinstance(v, (str, Path))]
    return []


def input_digests(cls: type[Plugin], parsed: dict) -> dict[str, list[str]]:
    """``{option: [digest of each file it names]}`` for the plugin's file-naming options that are set."""
    out = {}
    for option in cls.options:
        if names_files(option) and parsed.get(option.name) is not None:
            out[option.name] = [file_digest(Path(p).expanduser()) for p in _paths(parsed[option.name])]
    return out


def input_paths(cls: type[Plugin], parsed: dict) -> tuple[Path, ...]:
    """The existing files and directories the plugin's file-naming options name (``--from``, ``--vectors``),
    which a run's ``--out`` must not be or hold: ``attention --from d --out d --force`` read the detect report
    in ``d``, then replaced it with its own (:func:`mechkit.io.out.check_out`'s ``inputs``)."""
    found = []
    for option in cls.options:
        if names_files(option) and parsed.get(option.name) is not None:
            found += [Path(p).expanduser() for p in _paths(parsed[option.name]) if Path(p).expanduser().exists()]
    return tuple(found)
