"""The files a plugin's run reads, recorded as its process opens them, so a resumed step is one they still make.

The resume key reads a plugin's source (:mod:`mechkit.plugin_key`), and a source cannot tell all that its run
reads: a data file (``open("notes.txt")``), code run through an alias (``run = exec``) or ``builtins.__dict__``,
a module whose name is computed. What the process opens it cannot hide: an audit hook (PEP 578) sees every
``open``, ``io.open_code`` and import. While a run is recorded (:func:`recording`), each file of the user's it
opens is noted; a step is kept with what those files held then (:meth:`Reads.signatures`), and a resumed run
takes the step only while they still hold it (:func:`changed`): an edited notes file starts the step afresh.
Environment variables the run reads through ``os.environ`` (``os.getenv`` too) are recorded the same way, with
the value each had, but those that only say how a terminal shows output (:data:`DISPLAY`); once the run sets one
itself, the value it was given before is what counts (:func:`given`).

Folders the run lists (``os.listdir``, ``os.scandir``, and ``glob``, ``os.walk`` and ``pathlib`` through them) are
recorded by the names they hold, and a file by the path it was opened by (a link repointed later counts; ``..``
taken after the links before it, as the system takes it; a ``dir_fd`` open by its folder's path and the name).
Not recorded: the standard library, installed packages and mechkit (their versions are in the key), the places
the runner names (the model, mechkit's cache, ``--out``), ``/proc``, ``/sys`` and ``/dev``, and files the run
itself wrote; a file's existence or size asked without opening it (``os.path.exists``, ``os.stat``). Files read in another process (a Ray worker) or by native code that opens them itself (a tokenizer's
Rust, a C library) are not seen.

>>> import pathlib, tempfile
>>> notes = pathlib.Path(tempfile.mkdtemp()) / "notes.txt"
>>> _ = notes.write_text("alpha")
>>> with recording() as reads:
...     _ = notes.read_text()
>>> kept = reads.signatures()
>>> changed(kept) is None
True
>>> _ = notes.write_text("beta")
>>> changed(kept) == str(notes)
True
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

MAX_READS = 10_000  # files a run's step keeps the state of: past it, the step is never resumed
TOO_MANY = "*"  # the path of the one entry a step past MAX_READS keeps
BLIND = "?dir_fd"  # the one entry of a step after a file no path names (opened with dir_fd): never resumed
DISPLAY = frozenset({  # how a terminal shows output (rich, tqdm and shutil read them as a bar draws): no result
    "TERM", "COLORTERM", "COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION", "JUPYTER_COLUMNS", "JUPYTER_LINES", "TTY_COMPATIBLE", "TTY_INTERACTIVE"})
LISTED = "#"  # what leads a listed folder's entry
CWD = "%"  # the entry of a working directory relative paths were read from
ENV = "$"  # what leads an environment variable's entry (a path read is absolute: it starts with "/")
SET_ENV = "$="  # what leads the entry of a variable read and then set by the run's own code (no name holds "=")
LEFT_ENV = "$>"  # what leads the entry of the value the run's code last gave such a variable
PROCESS = "@"  # the entry naming the process a step was kept in: what a run left in a variable is its process's
_PROCESS_TOKEN = f"{os.getpid()}-{os.urandom(8).hex()}"
HASH_LIMIT = 64 * 2**20  # a file larger than this counts by its size and times, as the resume key counts one
_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
_SYSTEM = ("/proc/", "/sys/", "/dev/")

_ACTIVE: list[Reads] = []
_GUARD = threading.Lock()
_HOOKED = False


class Reads:
    """What one recorded run read: the files it opened for reading (by the path it opened, in order), the folders
    it listed, the environment variables it read, and the files it wrote (by real path, never counted as read)."""

    def __init__(self, skip: Iterable[str | os.PathLike[str]] = ()) -> None:
        places = [*library_dirs(), *(os.path.realpath(p) for p in skip if p is not None)]
        self.skip = tuple(p.rstrip(os.sep) + os.sep for p in places)
        self.read: dict[str, str] = {}  # path opened -> its real path then (a link repointed later: the path counts)
        self.listed: dict[str, None] = {}
        self.written: set[str] = set()
        self.env: dict[str, str | None] = {}  # variables read, with the value first seen (None: unset)
        self.env_set: set[str] = set()  # variables the run set or removed itself: its code decides them
        self.prior: dict[str, str | None] = {}  # each of those -> the value it had before the run set it
        self.set_to: dict[str, str | None] = {}  # each of those -> the value the run last gave it (None: removed)
        self.cwds: dict[str, None] = {}  # the working directories relative paths were opened or listed from
        self.blind = False  # a file was opened that cannot be named (relative to a folder descriptor)

    def take(self, other: Reads) -> None:
        """Add what ``other`` (the same run's record before its model loaded: its option checks) read."""
        for path, real in other.read.items():
            if not real.startswith(self.skip):
                self.read.setdefault(path, real)
        for path in other.listed:
            self.listed.setdefault(path)
        for name, value in other.env.items():
            self.env.setdefault(name, value)
        for cwd in other.cwds:
            self.cwds.setdefault(cwd)
        for name, value in other.prior.items():
            self.prior.setdefault(name, value)
        self.set_to.update(other.set_to)
        self.env_set |= other.env_set

    def note_env(self, name: str, value: str | None) -> None:
        if name not in DISPLAY and name not in self.env_set and len(self.env) <= MAX_READS:
            self.env.setdefault(name, value)

    def note(self, path: str, writes: bool) -> None:
        real = os.path.realpath(path)
        if real.startswith(self.skip):
            return
        if writes:
            self.written.add(real)
        elif real not in self.written and len(self.read) <= MAX_READS:
            source = _source_of(path)
            self.read.setdefault(source, real if source == path else os.path.realpath(source))

    def note_listing(self, path: str) -> None:
        if not os.path.realpath(path).startswith(self.skip) and len(self.listed) <= MAX_READS:
            self.listed.setdefault(path)

    def signatures(self) -> list[list[str]]:
        """``[path, what it holds]`` for each file read and folder listed so far, and ``[$NAME, value]`` for each
        variable, as a step keeps them; past :data:`MAX_READS` of one kind one entry saying so, which no rerun
        takes (a step is computed again rather than checked in part)."""
        paths = [path for path, real in list(self.read.items()) if real not in self.written]
        if max(len(paths), len(self.listed), len(self.env)) > MAX_READS:
            return [[TOO_MANY, f"more than {MAX_READS} files"]]
        if self.blind:
            return [[BLIND, "a file opened relative to a folder descriptor"]]
        return ([[path, signature(path)] for path in paths] + [[LISTED + p, listing(p)] for p in list(self.listed)]
                + [[(SET_ENV if k in self.env_set else ENV) + k, v] for k, v in list(self.env.items())]
                + [[LEFT_ENV + k, v] for k, v in list(self.set_to.items()) if k in self.env]
                + ([[PROCESS, _PROCESS_TOKEN]] if any(k in self.env for k in list(self.set_to)) else [])
                + [[CWD, c] for c in list(self.cwds)])


def _source_of(path: str) -> str:
    """A module's cached bytecode stands for its source: a source edited after the run is seen before Python
    compiles it again (``pkg/__pycache__/m.cpython-311.pyc`` is ``pkg/m.py``)."""
    folder, name = os.path.split(path)
    if os.path.basename(folder) == "__pycache__" and name.endswith(".pyc"):
        source = os.path.join(os.path.dirname(folder), name.split(".", 1)[0] + ".py")
        if os.path.isfile(source):
            return source
    return path


@functools.lru_cache(maxsize=1)
def library_dirs() -> tuple[str, ...]:
    """The folders whose files are not the user's own: the standard library, site-packages (their versions are
    in the resume key) and mechkit's package (its code is keyed whole), symlinked parts of a development
    checkout included."""
    import site
    import sysconfig

    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {*site.getsitepackages(), site.getusersitepackages()}
    for root in getattr(sys.modules.get("mechkit"), "__path__", []):
        dirs.add(root)
        with contextlib.suppress(OSError):
            dirs |= {str(child) for child in Path(root).iterdir() if child.is_symlink()}
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


_MEMO: dict[tuple, str] = {}


def signature(path: str) -> str:
    """What the file at ``path`` holds: its sha256, by size and modification time past :data:`HASH_LIMIT`,
    else ``missing`` or the kind of thing there; hashed once per process while its stat is unchanged."""
    try:
        info = os.stat(path)
    except OSError:
        return "missing"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_size > HASH_LIMIT:
        return f"size {info.st_size} modified {info.st_mtime_ns}"
    memo = (path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if memo not in _MEMO:
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(2**20), b""):
                    digest.update(block)
        except OSError:
            return "unreadable"
        _MEMO[memo] = digest.hexdigest()
    return _MEMO[memo]


def listing(path: str) -> str:
    """What the folder at ``path`` lists: the sha256 of its sorted names, else ``missing`` or ``unreadable``."""
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "unreadable"
    return hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()


def changed(kept: object) -> str | None:
    """The first file of ``kept`` (:meth:`Reads.signatures`) that no longer holds what it held, else ``None``;
    a list that is not one mechkit wrote counts as changed (``"?"``), one of too many files too (:data:`TOO_MANY`)."""
    if not isinstance(kept, list):
        return "?"
    here = [PROCESS, _PROCESS_TOKEN] in kept  # the value a run left is only this process's environment's
    left = {item[0][len(LEFT_ENV):]: item[1] for item in kept if here and isinstance(item, list) and len(item) == 2
            and isinstance(item[0], str) and item[0].startswith(LEFT_ENV)}
    for item in kept:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and (isinstance(item[1], str) or (item[1] is None and item[0].startswith(ENV)))):
            return "?"
        if item[0].startswith(LEFT_ENV) or item[0] == PROCESS:
            continue
        if item[0] == CWD:  # "notes.txt" read in another folder is another file, unchanged as it may be
            if _cwd() != item[1]:
                return CWD + item[1]
        elif item[0].startswith(SET_ENV):
            name = item[0][len(SET_ENV):]
            value = given(name, left)
            if value is not True and value != item[1]:
                return ENV + name
        elif item[0].startswith(ENV):
            if _get(os.environ, item[0][len(ENV):]) != item[1]:
                return item[0]
        elif item[0].startswith(LISTED):
            if listing(item[0][len(LISTED):]) != item[1]:
                return item[0]
        elif item[0] in (TOO_MANY, BLIND) or signature(item[0]) != item[1]:
            return item[0]
    return None


def current() -> Reads | None:
    """The record of the run now recorded in this process, else ``None``."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def recording(skip: Iterable[str | os.PathLike[str]] = (), before: Reads | None = None) -> Iterator[Reads]:
    """Record the files this process opens until the block ends, but those under ``skip`` and the libraries',
    after what ``before`` holds (what the same run read in its option checks, before its model loaded)."""
    _hook_once()
    reads = Reads(skip)
    if before is not None:
        reads.take(before)
    environ = type(os.environ)
    with _GUARD:
        if not _ACTIVE:
            environ.__getitem__ = _environ_item  # type: ignore[method-assign]
            environ.__iter__ = _environ_iter  # type: ignore[method-assign]
        _ACTIVE.append(reads)
    try:
        yield reads
    finally:
        with _GUARD:
            _ACTIVE.remove(reads)
            if not _ACTIVE:
                environ.__getitem__, environ.__iter__ = _ORIGINAL[1], _ORIGINAL[4]  # type: ignore[method-assign]
                _WALK.last = None


def _get(environ: object, name: str) -> str | None:
    """``os.environ``'s value of ``name`` (``None`` where unset), read without recording it."""
    try:
        return _ORIGINAL[1](environ, name)
    except KeyError:
        return None


_ORIGINAL = (_get, type(os.environ).__getitem__, type(os.environ).__setitem__, type(os.environ).__delitem__,
             type(os.environ).__iter__)


def _in_walk(frame: Any, name: Any) -> bool:
    """Whether ``os.environ[name]`` is read in a walk over all of the environment, not for a variable its caller
    named: ``.items()`` and ``.values()`` (``collections.abc``'s ``__iter__``), and ``os.environ.copy()``,
    ``{**os.environ}`` and ``dict(os.environ)``, which list every name first (:func:`_environ_iter`) and then read
    each in that order from the same instruction. Those recorded every variable (tqdm's import, a subprocess's
    ``env=``), and a rerun with any other one changed (``$OLDPWD``) was refused. Anything else, ``format_map``
    and ``operator.itemgetter`` included, is a read by name."""
    if frame is None:
        return False
    if frame.f_code.co_name == "__iter__" and frame.f_globals.get("__name__") in _ABC:
        return True
    if getattr(_WALK, "now", None) == name:  # the name a listing still going has just given
        return True
    walk = getattr(_WALK, "last", None)
    if walk is None or walk[0] is not frame or walk[1] != frame.f_lasti or not walk[2] or walk[2][0] != name:
        _WALK.last = None
        return False
    walk[2].popleft()
    return True


_ABC = ("_collections_abc", "collections.abc")
_WALK = threading.local()  # the names the last full listing of os.environ gave, with the frame and instruction


def _environ_iter(environ: object) -> Iterator[Any]:
    """``iter(os.environ)``, keeping the names it lists for :func:`_in_walk`: the frame that asked (past
    ``collections.abc``'s views) and the instruction it is at."""
    import collections

    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _ABC:
        frame = frame.f_back
    names: collections.deque = collections.deque()
    try:
        for name in _ORIGINAL[4](environ):
            names.append(name)
            _WALK.now = name  # read while the listing is still going: a loop over it (ChainMap, `values()`)
            yield name
            _WALK.now = None
        _WALK.last = (frame, getattr(frame, "f_lasti", None), names)
    finally:
        _WALK.now = None


def _set_here(name: object, value: Any) -> None:
    """Note that a recorded run's code sets ``name`` to ``value`` (``None``: removes it), as sklearn's import sets
    KMP_DUPLICATE_LIB_OK: its later reads in that run see its code's value and are not recorded, and what the
    variable held before and the value the run left are kept (:attr:`Reads.prior`, :attr:`Reads.set_to`). A value
    read before the set stays recorded, as read and then set (:data:`SET_ENV`): ``os.environ.setdefault("X",
    "1")`` reads the user's ``X``, and :func:`given` says what that is on a rerun."""
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not isinstance(name, str):
        return
    if not _ACTIVE:  # the user's own set, between runs: what a run left is no longer there, even if equal
        _LEFT_BY_RUN.pop(name, None)
        return
    _LEFT_BY_RUN[name] = os.fsdecode(value) if isinstance(value, bytes) else value if isinstance(value, str) else None
    before = _get(os.environ, name)  # os.environb's names too: the two are one environment
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    for reads in list(_ACTIVE):
        reads.prior.setdefault(name, before)
        reads.set_to[name] = value if isinstance(value, str) else None
        reads.env_set.add(name)


def given(name: str, left: dict[str, str | None]) -> str | None | bool:
    """What the variable ``name`` holds as the user gave it, for an entry the kept run read and then set (its
    value before that set is what was kept): before the rerun now recorded set it, where it did; ``True`` where it
    still holds what the kept run's own code ``left`` in it, in this very process (a rerun in the same notebook,
    sklearn imported by the first attempt): unchanged; else as it is (another run, a notebook or the user gave it
    since; in a fresh process, what the user gives it now)."""
    reads = current()
    if reads is not None and name in reads.prior:
        return reads.prior[name]
    now = _get(os.environ, name)
    still = name in left and name in _LEFT_BY_RUN and _LEFT_BY_RUN[name] == left[name] == now
    return True if still else now


_LEFT_BY_RUN: dict[str, str | None] = {}  # each variable a recorded run's code set -> the value it gave it last


def _environ_set(environ: object, name: Any, value: Any) -> None:
    _set_here(name, value)
    _ORIGINAL[2](environ, name, value)


def _environ_del(environ: object, name: Any) -> None:
    _set_here(name, None)
    _ORIGINAL[3](environ, name)


def _environ_item(environ: object, name: str) -> str:
    """``os.environ[name]`` (behind ``os.getenv`` and ``os.environ.get`` too), recorded while a run is: a variable
    the plugin reads decides its steps as a file does (a kill, ``SCALE=2``, a rerun: steps of both mixed)."""
    value = _get(environ, name)
    if _in_walk(sys._getframe(1), name):  # a walk over the environment: its values are read as its names are
        pass
    elif environ is os.environ and isinstance(name, str):
        for reads in list(_ACTIVE):
            reads.note_env(name, value)
    elif environ is getattr(os, "environb", None) and isinstance(name, bytes):  # os.getenvb, os.environb[b"X"]
        for reads in list(_ACTIVE):
            reads.note_env(os.fsdecode(name), None if value is None else os.fsdecode(value))
    if value is None:
        raise KeyError(name)
    return value


def _hook_once() -> None:
    """The audit hook, ``os.environ``'s setters and ``os.open``, which stay (they do nothing while no run is
    recorded): the hook cannot be removed, and a setter or ``os.open`` a library took a reference to meanwhile
    would be the unrecorded one."""
    global _HOOKED
    with _GUARD:
        if not _HOOKED:
            sys.addaudithook(_audit)  # never removed (Python cannot): it returns at once while nothing records
            environ = type(os.environ)
            environ.__setitem__ = _environ_set  # type: ignore[method-assign]
            environ.__delitem__ = _environ_del  # type: ignore[method-assign]
            os.open = _open_at  # os.fwalk's and shutil's too: they call os.open by name
            if _OS_OPEN in os.supports_dir_fd:
                os.supports_dir_fd.add(_open_at)
            _HOOKED = True


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def _writes_only(mode: object, flags: object, path: str) -> bool:
    """Whether an open only writes: write-only, or truncating, or creating a file not there before (the audit
    event comes before the open). "r+", "a+" and O_RDWR on an existing file read what it holds (np.memmap's
    default "r+" too): recorded as reads, whatever the run then writes."""
    if isinstance(flags, int):
        access = flags & os.O_ACCMODE
        if access == os.O_WRONLY or flags & os.O_TRUNC:
            return True
        return access == os.O_RDWR and not os.path.lexists(path)
    text = mode if isinstance(mode, str) else ""
    return "w" in text or ("+" not in text and "r" not in text) or not os.path.lexists(path)


def _audit(event: str, args: tuple) -> None:
    if not _ACTIVE or event not in _EVENTS:
        return
    try:  # an exception here would be raised in the plugin's own open()
        path = args[0]
        if isinstance(path, int):  # a folder listed by its descriptor (os.fwalk, os.listdir(fd)): named by /proc
            if event == "open":
                return
            path = os.readlink(f"/proc/self/fd/{path}")
        at = getattr(_AT, "name", None) if event == "open" else None  # os.open(name, dir_fd=...): that folder's
        if at is BLIND:
            for reads in list(_ACTIVE):
                reads.blind = True
            return
        raw = os.fsdecode("." if path is None else path) if at is None else at
        path = _named(raw)
        if path.startswith(_SYSTEM):
            return
        if not os.path.isabs(raw):  # relative: the same name in another working directory is another file
            cwd = _cwd()
            for reads in list(_ACTIVE):
                if cwd is not None and not path.startswith(reads.skip):
                    reads.cwds.setdefault(cwd)
        if event == "open":
            writes = _writes_only(args[1], args[2], path)
            for reads in list(_ACTIVE):
                reads.note(path, writes)
        elif not _importing(sys._getframe(1)):  # a listing; not the import system's caches
            for reads in list(_ACTIVE):
                reads.note_listing(path)
    except Exception:  # noqa: BLE001 - a file the hook cannot place is one it does not record
        return


def _named(raw: str) -> str:
    """The absolute path of the file the system opens for ``raw``: ``..`` taken after the links before it, as the
    system takes it (``x/link/../data.txt`` is the file beside the link's target, which ``abspath`` made
    ``x/data.txt``, a file never read), the last part kept as named (a link repointed later still counts)."""
    if ".." not in Path(raw).parts:
        return os.path.abspath(raw)
    joined = os.path.join(_cwd() or "", raw)
    head, last = os.path.split(joined)
    return os.path.realpath(joined) if last in ("..", "") else os.path.join(os.path.realpath(head), last)


def _importing(frame: Any) -> bool:
    """Whether the code listing a folder is the import system's (its path caches), by the module it is in: a
    user's helper whose file path held "importlib" had its listings dropped."""
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "importlib" or name.startswith(("importlib.", "_frozen_importlib"))


_AT = threading.local()  # the file an os.open relative to a folder descriptor opens, named, while it opens it


def _open_at(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
    """``os.open``, naming for the record the file a ``dir_fd`` open reaches (the folder's path by /proc and the
    name): the audit event carries the name alone, which was taken as the working directory's file of that name
    (a decoy there was recorded, the real file not), or, where none was there, made the step never resume."""
    if dir_fd is None or not _ACTIVE:
        return _OS_OPEN(path, flags, mode, dir_fd=dir_fd)
    try:
        raw = os.fsdecode(path)
        _AT.name = raw if os.path.isabs(raw) else os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), raw)
    except (OSError, TypeError, ValueError):  # no /proc to name the folder by: which file it is cannot be known
        _AT.name = BLIND
    try:
        return _OS_OPEN(path, flags, mode, dir_fd=dir_fd)
    finally:
        _AT.name = None


_OS_OPEN = os.open


__all__ = ["BLIND", "CWD", "DISPLAY", "ENV", "LEFT_ENV", "SET_ENV", "LISTED", "listing", "HASH_LIMIT", "MAX_READS", "TOO_MANY", "Reads", "changed", "current", "library_dirs", "recording", "signature"]
