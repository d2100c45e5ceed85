"""Where mechkit keeps what it builds once and reuses: converted models, the toy model, run steps.

Layout under :func:`cache_root`::

    gguf/<stem>-<sha256[:16]>/   a GGUF file dequantized to safetensors (mechkit.model.sources.gguf), one per content
    gguf/.hashes/                memoised sha256 of GGUF files, keyed by path, size, mtime, ctime, inode
    toy/induction-<recipe>/      the self-trained toy induction model (mechkit.model.sources.toy)
    runs/<key>/                  finished steps of plugin runs, for resuming (mechkit.runner)
    embedded/                    the embedded model's older, format-1 cache (unused; listed so it can be cleared)

Nothing here imports torch: ``mechkit cache list`` and ``mechkit cache clear`` stay fast.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.leftovers import MODEL_FILE, dir_size, is_mechkit_temp, mount_inside, size_of
from mechkit.io.read import mount_points, not_regular, read_regular_text
from mechkit.io.remove import remove_beneath, remove_tree

GROUPS = ("gguf", "toy", "runs", "embedded")  # what `cache clear --all` removes, and nothing else


def cache_root() -> Path:
    """``$MECHKIT_CACHE``, else ``$XDG_CACHE_HOME/mechkit`` (an absolute one, as the XDG spec says), else
    ``~/.cache/mechkit``.

    A leading ``~`` is expanded: a value quoted in a shell or set in a ``.env`` file reaches mechkit
    unexpanded, and the cache then grew in a folder literally named ``~`` under the working directory
    (which ``rm -rf ~`` would then "clean"). A relative ``$MECHKIT_CACHE`` is taken from the working
    directory (made absolute here, so every message names the folder actually used).
    """
    if os.environ.get("MECHKIT_CACHE"):
        return _expanded("$MECHKIT_CACHE", os.environ["MECHKIT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not (base.startswith("~") or os.path.isabs(base)):  # unset, or relative: the XDG spec has it ignored (it grew
        base = Path.home() / ".cache"               # a cache in whatever directory a command ran from)
    return _expanded("$XDG_CACHE_HOME", base) / "mechkit"


def cache_dir_to_read(root: Path | None = None) -> Path:
    """The cache root for ``cache list`` and ``cache clear``, refused in one line where it is a file: a
    listing read it as an empty cache. (A run goes on without keeping its steps there, with a warning.)"""
    root = cache_root() if root is None else root
    if root.exists() and not root.is_dir():
        fix = "point $MECHKIT_CACHE at a directory" if os.environ.get("MECHKIT_CACHE") else \
            "move that file away, or set $MECHKIT_CACHE"
        raise MechkitError(f"the mechkit cache {root} is not a directory", fix)
    return root


def _expanded(variable: str, value: str | Path) -> Path:
    """``value`` absolute, its leading ``~`` or ``~user`` expanded; one line where it names a user with no home
    (``~nosuchuser/cache``): :meth:`Path.expanduser` raised RuntimeError, a traceback from every command."""
    try:
        return Path(value).expanduser().absolute()
    except RuntimeError:
        raise MechkitError(f"{variable} is {str(value)!r}, and {str(value).split('/')[0]!r} names no user with a "
                           "home directory", f"set {variable} to an absolute path such as /tmp/mechkit-cache") from None


@dataclass(frozen=True)
class CacheEntry:
    """One row of ``mechkit cache list``: ``name`` is what ``mechkit cache clear`` takes."""

    name: str
    kind: str
    source: str
    size: int
    made: datetime | None
    path: Path


def _read_json(path: Path) -> dict:
    """A metadata file as a dict; ``{}`` where it is damaged (listed as incomplete, not a traceback) or no plain
    file (a FIFO under the name blocked `cache list` for good)."""
    text = read_regular_text(path, 2**20)
    try:
        data = json.loads(text) if text is not None else {}
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    except OSError:
        return None


def _parse_time(text: object) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return None


_ENTRY = {  # the names mechkit gives the entries of each group; anything else in $MECHKIT_CACHE is the user's
    "gguf": re.compile(r"^[A-Za-z0-9._-]+-[0-9a-f]{16}$"),
    "toy": re.compile(r"^induction-[0-9a-f]{8,64}$"),
    "runs": re.compile(r"^[0-9a-f]{8,64}$"),  # a run key: hex (16 digits now)
}
_META = {"gguf": "mechkit-cache.json", "toy": "mechkit-toy.json", "embedded": "mechkit-cache.json"}
_ASIDE = re.compile(r"^\.[a-z]+\.old-\d+-[0-9a-f]{8}$")  # a group renamed aside by remove_dir (a user's .toy.old-mine is not)
_HASHES = re.compile(r"^[0-9a-f]{16}\.json$")  # gguf/.hashes/: memoised sha256 of GGUF files


def is_entry(group: str, path: Path) -> bool:
    """Whether ``path`` in ``group`` is an entry mechkit made: a directory (not a link) holding mechkit's
    metadata file, or named as mechkit names them and holding only what mechkit writes there (a run's step
    folder: :func:`run_contents`; a model entry built before its metadata file existed: model files,
    :func:`_holds_only_model_files`). A ``$MECHKIT_CACHE`` pointed at a project directory may hold a user's
    own ``runs/`` or ``toy/``; `cache clear` and a rebuild must never delete those. A folder with a mount
    point at it or anywhere inside is never an entry (removing it would delete through the mount)."""
    if path.name.startswith(".") or path.is_symlink() or not path.is_dir():
        return False
    points = mount_points()
    if group == "runs":  # only a folder mechkit marked when it made it (:func:`mark_run_dir`)
        if not _ENTRY["runs"].match(path.name) or not _is_plain_file(path / RUN_MARKER) or _mounted(path, points):
            return False
        _, _, theirs = run_contents(path, points)
        return not theirs
    if mount_inside(path, points) is not None:
        return False
    if group in _META and _is_plain_file(path / _META[group]):
        return True
    pattern = _ENTRY.get(group)
    return bool(pattern and pattern.match(path.name)) and _holds_only_model_files(path)


def _is_plain_file(path: Path) -> bool:
    return os.path.lexists(path) and not_regular(path) is None


def _mounted(path: Path, points: frozenset[str]) -> bool:
    """Whether the directory ``path`` is itself a mount point (a bind mount of the same disk included)."""
    return os.path.realpath(path) in points or os.path.ismount(path)


def _holds_only_model_files(path: Path) -> bool:
    """Whether a model entry's folder holds only files mechkit writes there (hidden leftovers aside). A user's
    ``toy/induction-deadbeef/notes.txt`` matched the entry name alone and was deleted by `cache clear --all`."""
    try:
        names = [p for p in path.iterdir() if not p.name.startswith(".")]
    except OSError:
        return False
    return all(p.is_file() and not p.is_symlink() and MODEL_FILE.match(p.name) for p in names)


def refuse_foreign_entry(group: str, path: Path) -> None:
    """Before a cache entry is built at ``path`` over something already there: one line unless that is an
    entry of mechkit's (a stale or damaged one, replaced), never a user's folder that happens to bear the name."""
    if (path.exists() or path.is_symlink()) and not is_entry(group, path):
        raise MechkitError(f"{path} is in the way of mechkit's cache entry and holds what mechkit did not write",
                           "move it out of $MECHKIT_CACHE, or point $MECHKIT_CACHE at another directory")


RUN_MARKER = "mechkit-run.json"  # written into every run-steps folder as mechkit makes it


def mark_run_dir(path: Path) -> None:
    """Make a run's steps folder (if missing) and mark it as mechkit's. Without the marker, a user's folder in
    ``runs/`` named like a run key and holding only ``.json`` files was taken for a run's steps and deleted by
    `cache clear`; now only marked folders are entries (:func:`mark_scratch` adds the scratch folders a run
    makes). Raises ``OSError`` where it cannot be written, or where something that is no plain file sits
    at its name: a FIFO there blocked the write, and the run, for good."""
    path.mkdir(parents=True, exist_ok=True)
    marker = path / RUN_MARKER
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        if not os.path.lexists(marker):  # created, never opened through what is there (a FIFO, a link)
            with os.fdopen(os.open(marker, flags, 0o644), "w", encoding="utf-8") as f:
                f.write('{"mechkit": "run steps"}\n')
    except FileExistsError:
        pass  # made meanwhile (another writer of the same run): checked below
    odd = not_regular(marker)
    if odd is not None:
        raise OSError(errno.EEXIST, f"{RUN_MARKER} there is {odd}, not the marker mechkit writes", str(marker))


def mark_scratch(path: Path, name: str) -> None:
    """Record in the run's marker that it made the scratch folder ``name``: only a recorded folder's
    checkpoints are removed when the run finishes (a user's ``mine/checkpoint.safetensors`` beside them was
    deleted, taken for one). Raises ``OSError`` where it cannot be written."""
    mark_run_dir(path)
    names = _recorded(path)
    if name not in names:  # written beside and renamed over it: a reader sees the old marker or the new one
        tmp = path / f".{RUN_MARKER}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.write_text(json.dumps({"mechkit": "run steps", "scratch": sorted({*names, name})}) + "\n", encoding="utf-8")
        os.replace(tmp, path / RUN_MARKER)


def scratch_names(path: Path) -> set[str]:
    """The scratch folders a run recorded in its marker. A marker with no ``scratch`` list (a run that made
    none yet, or one by a mechkit that did not record them) stands for the folders mechkit's own plugins make
    (:data:`LEGACY_SCRATCH`), nothing else; an unreadable marker, or one that is no plain file, for none."""
    data = _marker(path)
    return LEGACY_SCRATCH if data is not None and "scratch" not in data else _recorded(path)


LEGACY_SCRATCH = frozenset({"finetune", "finetunes"})  # what finetune and select-tasks name theirs (ctx.scratch)


def _marker(path: Path) -> dict | None:
    text = read_regular_text(path / RUN_MARKER, 2**20)  # never opened through a FIFO or a link
    try:
        data = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _recorded(path: Path) -> set[str]:
    names = (_marker(path) or {}).get("scratch")
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def unmarked_runs(root: Path | None = None) -> list[Path]:
    """Folders in ``runs/`` named like a run key that are no run's steps: without mechkit's marker (a user's, or
    made by a mechkit older than the marker), or marked but holding files no run writes (a user's beside it).
    `cache list` names them; `cache clear` leaves them alone."""
    group = cache_dir_to_read(root) / "runs"
    try:
        return sorted(p for p in group.iterdir() if _ENTRY["runs"].match(p.name) and p.is_dir()
                      and not p.is_symlink() and not is_entry("runs", p))
    except OSError:
        return []


STEP_FILE = re.compile(r"^[0-9a-f]{16}\.json$")  # a step's file: the first 16 hex digits of its key's sha256
CHECKPOINT_FILE = "checkpoint.safetensors"  # what a scratch folder holds (mechkit.taskarith.finetune.CHECKPOINT)


UNIT_DIR = re.compile(r"^(?:ft-[0-9a-f]{1,64}|[0-9a-f]{16})$")  # a unit's folder in a scratch folder (select-tasks)


def run_contents(path: Path, points: frozenset[str] | None = None) -> tuple[list[Path], list[Path], list[Path]]:
    """What a run keeps in its steps folder ``path``, as ``(files, folders, theirs)``: ``files`` are what runs
    write (the marker, the step files ``<16 hex>.json``, mechkit's temporary files; in each scratch folder the
    marker records, its direct ``checkpoint.safetensors`` and those of its unit folders ``ft-<hex>``);
    ``folders`` the scratch and unit folders holding them, deepest first; ``theirs`` everything else. Only
    plain files count (a FIFO or a folder under a step's name is not one), nothing behind a link or a mount
    point is looked into, and a user's folder inside a scratch folder is theirs whatever it holds: a finished
    run deleted ``finetune/mine/checkpoint.safetensors``. A run's end (:func:`finish_run_dir`) and `cache
    clear` (:func:`is_entry`) both go by it, so they agree on what is a run's."""
    points = mount_points() if points is None else points
    files: list[Path] = []
    folders: list[Path] = []
    theirs: list[Path] = []
    scratch = scratch_names(path)

    def walk(folder: Path, real: Path, level: int) -> None:  # level 0: the run's folder, 1: scratch, 2: a unit's
        try:
            device = os.lstat(folder).st_dev
            entries = sorted(folder.iterdir())
        except OSError:
            theirs.append(folder)
            return
        for p in entries:
            try:
                info = p.lstat()
            except FileNotFoundError:
                continue
            except OSError:
                theirs.append(p)
                continue
            mode = info.st_mode
            if stat.S_ISLNK(mode) or info.st_dev != device or str(real / p.name) in points:
                theirs.append(p)  # a link, or a mount point (of another disk, or a bind mount of this one)
            elif is_mechkit_temp(p.name):
                (theirs if mount_inside(p, points) else files).append(p)
            elif stat.S_ISREG(mode) and (p.name == CHECKPOINT_FILE if level else
                                         p.name == RUN_MARKER or STEP_FILE.match(p.name) is not None):
                files.append(p)
            elif stat.S_ISDIR(mode) and (p.name in scratch if level == 0 else level == 1 and UNIT_DIR.match(p.name)):
                walk(p, real / p.name, level + 1)
                folders.append(p)
            else:
                theirs.append(p)

    walk(path, Path(os.path.realpath(path)), 0)
    return files, folders, theirs


def _children(group: Path) -> list[Path]:
    """mechkit's entries in ``group`` (temporary and half-deleted ones start with a dot and are skipped)."""
    try:
        return sorted(p for p in group.iterdir() if is_entry(group.name, p))
    except OSError:
        return []


def _model_entry(group: str, path: Path, meta_name: str, fallback_kind: str) -> CacheEntry:
    meta = _read_json(path / meta_name)
    if group == "toy":
        kind = "toy model"
        source = (f"trained by mechkit (seed {meta['seed']}, {meta['steps']} steps)"
                  if {"seed", "steps"} <= meta.keys() else "incomplete (retrained on next use)")
        made = _mtime(path / meta_name)
    else:
        kind = fallback_kind if meta else f"{fallback_kind}, incomplete"
        source = str(meta.get("source", "?"))
        made = _parse_time(meta["converted_at"]) if "converted_at" in meta else _mtime(path)
    return CacheEntry(f"{group}/{path.name}", kind, source, dir_size(path), made, path)


def list_cache(root: Path | None = None) -> list[CacheEntry]:
    """Every cached model (one row each), the run-step cache (one row), then any old-layout entries."""
    root = cache_dir_to_read(root)
    entries = [_model_entry("gguf", p, "mechkit-cache.json", "gguf") for p in _children(root / "gguf")]
    entries += [_model_entry("toy", p, "mechkit-toy.json", "toy") for p in _children(root / "toy")]
    runs = _children(root / "runs")
    if runs:
        newest = max((m for m in map(_mtime, runs) if m is not None), default=None)
        entries.append(CacheEntry("runs", "run steps", f"{len(runs)} run(s), for resuming",
                                  sum(dir_size(p) for p in runs), newest, root / "runs"))
    entries += [_model_entry("embedded", p, "mechkit-cache.json", "old layout, unused")
                for p in _children(root / "embedded")]
    foreign = unmarked_runs(root)
    if foreign:
        entries.append(CacheEntry(FOREIGN, "not mechkit's", f"{len(foreign)} folder(s) left alone: "
                                  + ", ".join(p.name for p in foreign[:3]) + (" …" if len(foreign) > 3 else ""),
                                  sum(dir_size(p) for p in foreign), None, root / "runs"))
    stale = _leftovers(root)
    if stale:
        from mechkit.io.leftovers import stale_prepared

        tmp = len(stale_prepared())
        entries.append(CacheEntry(LEFTOVERS, "leftovers", f"{len(stale)} temporary dir(s) and lock file(s) of killed runs"
                                  + (f" ({tmp} in $TMPDIR {tempfile.gettempdir()})" if tmp else ""),
                                  sum(size_of(p) for p in stale), None, root))
    return entries


FOREIGN = "runs (unmarked)"  # the row `cache list` shows for look-alike folders it leaves alone
LEFTOVERS = "leftovers"  # the name `cache list` shows and `cache clear` takes for killed runs' leftovers


def _leftovers(root: Path) -> list[Path]:
    """Stale temporary directories, set-aside directories, lock files and journals in the cache, and the
    folders killed runs prepared in ``$TMPDIR`` (a pruned model each: :func:`mechkit.io.leftovers.stale_prepared`)."""
    from mechkit.io.leftovers import stale_leftovers, stale_prepared

    return [p for f in _leftover_folders(root) for p in stale_leftovers(f)] + stale_prepared()


def _leftover_folders(root: Path) -> list[Path]:
    """Where a killed write in the cache leaves its temporary files: the root, the groups, each run's step
    folder (a step is written atomically beside its name), the scratch folders inside it (a killed checkpoint's
    ``.checkpoint.safetensors.tmp-*`` in ``finetune/`` or ``finetunes/ft-3/``: missed, it was on no row and
    never cleared) and the GGUF hash memos. A marked run folder a user put files in counts too: only
    mechkit's temporary names are ever taken from it."""
    points = mount_points()
    runs = [*_children(root / "runs"), *(p for p in unmarked_runs(root) if _is_plain_file(p / RUN_MARKER))]
    return [root, *(root / g for g in GROUPS), *(f for p in runs if not _mounted(p, points)
                                                  for f in _scratch_folders(p, points)), root / "gguf" / ".hashes"]


def _scratch_folders(path: Path, points: frozenset[str], depth: int = 4) -> list[Path]:
    """``path`` and the plain folders under it (not links, not hidden names, not mount points: nothing is
    taken through a mount), ``depth`` levels deep."""
    found = [path]
    if depth > 0:
        with contextlib.suppress(OSError):
            for p in sorted(path.iterdir()):
                if not p.name.startswith(".") and not p.is_symlink() and p.is_dir() and not _mounted(p, points):
                    found += _scratch_folders(p, points, depth - 1)
    return found


def finish_run_dir(path: Path) -> list[Path]:
    """Remove, from a finished run's steps folder ``path``, what runs write there (:func:`run_contents`: the
    marker, the step files, the scratch folders' checkpoints, mechkit's temporary files) and the folders left
    empty; return what was kept: anything else (a user's ``notes.txt`` beside the steps, a folder of theirs
    inside a scratch folder, a mount point) is theirs and never deleted or looked into. A run used to remove
    the folder whole when it finished, a user's files with it."""
    if not path.is_dir():  # a run that kept no steps never made it: nothing to remove, nothing to say
        return []
    points = mount_points()
    if _mounted(path, points):  # a mount over the whole folder: nothing in it is the run's to delete
        return [path]
    files, folders, kept = run_contents(path, points)
    for p in files:
        try:  # reached from the run's folder by descriptors: never through a link or a mount put on the way since
            if (p.is_dir() and not p.is_symlink() and mount_inside(p) is not None) or \
                    not remove_beneath(path, p.relative_to(path)):
                kept.append(p)
        except OSError:
            kept.append(p)
    for folder in [*folders, path]:
        with contextlib.suppress(OSError):
            folder.rmdir()  # a folder still holding a user's file stays
    return kept


def remove_dir(path: Path) -> bool:
    """Delete a cache directory: renamed aside first, so no reader ever finds it half-deleted. A symlink is
    removed itself, never what it points to. A directory with a mount point at it or anywhere inside is kept,
    said in one line on stderr, and ``False`` returned: ``shutil.rmtree`` deletes through a mount, and `cache
    clear runs` emptied a user's directory bind-mounted inside a run's folder."""
    aside = path.with_name(f".{path.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        if path.is_symlink():
            path.unlink(missing_ok=True)
            return True
        if _warn_mounted(path):
            return False
        os.replace(path, aside)
    except FileNotFoundError:
        return True
    except OSError as err:  # an immutable entry or folder, one not ours to rename: kept and said; the others go on
        _warn_unmovable(path, err)
        return False
    try:
        whole = remove_tree(aside)  # never through a mount, however one came to be reachable since the check
    except OSError:
        whole = False
    if not whole and not _warn_mounted(aside):
        import sys

        print(f"mechkit: warning: kept {aside}: part of it could not be removed (a file the system refused to "
              "delete: read-only, immutable or in use); remove it yourself, or fix its permissions and run `mechkit "
              "cache clear leftovers`", file=sys.stderr)
    return whole


_UNMOVABLE = {
    errno.EPERM: ("the system does not permit it: it or the folder holding it is immutable or append-only (see "
                  "`lsattr -d`), or another user's in a folder only its owners may change",
                  "clear that flag (`chattr -i` / `chattr -a`, as root) or ask its owner, then clear again"),
    errno.EACCES: ("permission denied on the folder holding it", "give yourself write permission on that folder "
                   "(`chmod u+w`), then clear again"),
    errno.EROFS: ("the cache's file system is read-only", "remount it writable, then clear again"),
    errno.EBUSY: ("it is in use (a mount point)", "unmount it, then clear again"),
}


def _warn_unmovable(path: Path, err: OSError) -> None:
    """Say in one line on stderr that ``path`` is kept since it could not be renamed aside (or unlinked), with the
    cause and its fix. The error had stopped the whole clear ("cannot write …: change its permissions", which an immutable
    flag ignores), the entries already removed unsaid and those after it never tried."""
    import sys

    why, fix = _UNMOVABLE.get(err.errno, (err.strerror or type(err).__name__, "remove it yourself"))
    print(f"mechkit: warning: kept {path}: it could not be removed ({why}); {fix}",
          file=sys.stderr)


def _warn_mounted(path: Path, points: frozenset[str] | None = None) -> bool:
    """Whether ``path`` holds a mount point, said on stderr in one line naming it and the fix."""
    point = mount_inside(path, points)
    if point is not None:
        import sys

        print(f"mechkit: warning: kept {path}: {point} is a mount point inside it, and `cache clear` never deletes "
              "through a mount (it is not mechkit's); unmount it, then clear again", file=sys.stderr)
    return point is not None


def _resolve_name(root: Path, name: str) -> Path:
    """``gguf/X``, ``toy/X``, ``runs/X`` or a whole group; a bare ``X`` when one group holds it."""
    clean = name.strip().strip("/")
    parts = clean.split("/")
    if clean in GROUPS:
        return root / clean
    if len(parts) == 2 and parts[0] in GROUPS and parts[1] and not parts[1].startswith("."):
        candidate = root / parts[0] / parts[1]
        _refuse_linked_group(root / parts[0], name)
        _refuse_mounted(candidate, name)
        if is_entry(parts[0], candidate):
            return candidate
    elif len(parts) == 1 and clean and not clean.startswith("."):
        for g in GROUPS:
            if not (root / g).is_symlink():
                _refuse_mounted(root / g / clean, name)
        found = [root / g / clean for g in GROUPS if not (root / g).is_symlink() and is_entry(g, root / g / clean)]
        if len(found) == 1:
            return found[0]
    _refuse_unmarked(root, clean, name)
    raise MechkitError(f"no cache entry named {name!r} in {root}",
                       "see `mechkit cache list` for the names, or pass --all")


def _refuse_unmarked(root: Path, clean: str, name: str) -> None:
    """One line for a name `cache list` shows but `cache clear` leaves alone: the ``runs (unmarked)`` row, or
    one of its folders. "No cache entry named …; see `mechkit cache list` for the names" sent the user back
    to the list that had shown it, with no way to remove it."""
    folders = unmarked_runs(root)
    parts = clean.split("/")
    named = [p for p in folders if clean == FOREIGN or (p.name == parts[-1] and parts[:-1] in ([], ["runs"]))]
    if not named:
        return
    import shlex

    shown = " ".join(shlex.quote(str(p)) for p in named[:3]) + (" …" if len(named) > 3 else "")
    marked = sum(_is_plain_file(p / RUN_MARKER) for p in named[:50])
    point = next((m for m in map(mount_inside, named[:50]) if m is not None), None)
    if point is not None:  # an rm -r would delete through it too
        raise MechkitError(f"no cache entry named {name!r}: it names {len(named)} folder(s) in {root / 'runs'}, one "
                           f"holding the mount point {point}, which `cache clear` never deletes through",
                           f"unmount {shlex.quote(point)} first")
    why = ("mechkit did not mark as its own (a user's, or run steps kept by a mechkit older than the marker)"
           if not marked else "hold files no run writes there (mechkit's marker beside a user's files)"
           if marked == len(named) else "mechkit did not mark as its own, or that hold files no run writes there")
    raise MechkitError(f"no cache entry named {name!r}: it names {len(named)} folder(s) in {root / 'runs'} that "
                       f"{why}, which `cache clear` never deletes",
                       f"delete them yourself if they are only old run steps: rm -r {shown}"[:400])


def _refuse_mounted(path: Path, name: str) -> None:
    """One line for a named entry with a mount point at it or inside: `cache clear` never deletes through one."""
    point = mount_inside(path) if not path.is_symlink() else None
    if point is not None:
        raise MechkitError(f"{name!r} ({path}) holds the mount point {point}, and `cache clear` never deletes "
                           "through a mount (what it shows is not mechkit's)", f"unmount {point} first")


def _refuse_linked_group(group: Path, name: str) -> None:
    """A group that is a symlink leads into a directory mechkit did not make (``--all`` leaves it alone): a
    named clear went through it and deleted a user's folder that looked like an entry."""
    if group.is_symlink():
        raise MechkitError(f"{group} is a symlink to {os.path.realpath(group)}; `cache clear` does not delete "
                           f"{name!r} through it (mechkit clears only inside its own directories)",
                           f"delete it there yourself if it is mechkit's, or remove the link {group}")


def clear_cache(names: list[str] | tuple[str, ...] = (), all_entries: bool = False,
                root: Path | None = None) -> list[tuple[str, int]]:
    """Remove the named entries (or every group with ``all_entries``); returns ``(name, bytes freed)``.

    Every name is checked before anything is removed, so a typo removes nothing. Only mechkit's own
    groups are touched: a ``$MECHKIT_CACHE`` pointing at a directory with other files keeps them.
    """
    root = cache_dir_to_read(root)
    if all_entries and names:
        raise MechkitError("pass either NAME… or --all, not both", "see `mechkit cache list`")
    if not all_entries and not names:
        raise MechkitError("nothing to clear", "name entries from `mechkit cache list`, or pass --all")
    leftovers = all_entries or any(n.strip().strip("/") == LEFTOVERS for n in names)
    names = [n for n in names if n.strip().strip("/") != LEFTOVERS]
    if all_entries:  # the groups, and what an interrupted clear left renamed aside
        targets = [root / g for g in GROUPS] + sorted(p for g in GROUPS for p in root.glob(f".{g}.old-*")
                                                      if _ASIDE.match(p.name))  # only remove_dir's own names
    else:
        targets = [_resolve_name(root, n) for n in names]
    removed = []
    if leftovers:  # before the groups go: a journal's roll-back needs its temporary directory
        from mechkit.io.leftovers import clean_leftovers, clean_prepared

        cleaned = [item for f in _leftover_folders(root) for item in clean_leftovers(f)] + clean_prepared()
        if cleaned:
            removed.append((LEFTOVERS, sum(size for _, size in cleaned)))
    for path in dict.fromkeys(targets):  # a name given twice is removed once
        if not path.exists():
            continue
        if path.parent == root and path.name in GROUPS:  # a group: mechkit's entries in it, nothing else
            size = _clear_group(path)
            if size is not None:
                removed.append((path.name, size))
            continue
        if _in_use(path):
            continue
        size = dir_size(path)
        if remove_dir(path):
            removed.append((str(path.relative_to(root)), size))
    return removed


def _in_use(entry: Path) -> bool:
    """Whether a running mechkit process holds ``entry``'s lock (a run keeping its steps there, a conversion
    being built): such an entry is kept, with a warning on stderr ("a write still running is never touched")."""
    from mechkit.io.leftovers import lock_holder

    held, pid = lock_holder(entry.parent, entry.name)
    if held:
        import sys

        print(f"mechkit: warning: kept {entry.parent.name}/{entry.name}: a running mechkit process"
              f"{f' (pid {pid})' if pid else ''} is using it", file=sys.stderr)
    return held


def _clear_group(group: Path) -> int | None:
    """Remove mechkit's entries in ``group`` (and gguf's hash memos), then the group when that leaves it
    empty; bytes freed, ``None`` where nothing of mechkit's was there. Other files stay."""
    if group.is_symlink() or not group.is_dir():
        return None
    points = mount_points()
    with contextlib.suppress(OSError):  # the folders left alone for a mount inside, each said in one line
        for p in sorted(group.iterdir()):
            pattern = _ENTRY.get(group.name)
            if (pattern.match(p.name) if pattern else not p.name.startswith(".")) and not p.is_symlink() \
                    and p.is_dir():
                _warn_mounted(p, points)
    entries = [p for p in _children(group) if not _in_use(p)]
    memos = []
    hashes = group / ".hashes"
    if group.name == "gguf" and hashes.is_dir() and not hashes.is_symlink():
        memos = [p for p in hashes.iterdir() if _HASHES.match(p.name) and p.is_file() and not p.is_symlink()]
    entries = [p for p in entries if mount_inside(p, points) is None]
    size = sum(dir_size(p) for p in entries) + sum(size_of(p) for p in memos)
    for path in entries:
        held = dir_size(path)
        if not remove_dir(path):
            size -= held  # kept (renamed aside or not): none of it counted as freed
    for memo in memos:
        try:
            memo.unlink(missing_ok=True)
        except OSError as err:
            _warn_unmovable(memo, err)
            size -= size_of(memo)
    for folder in (hashes, group):  # only where nothing else is left
        with contextlib.suppress(OSError):
            folder.rmdir()
    return size if entries or memos else None
