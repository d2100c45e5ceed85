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
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.leftovers import dir_size, is_mechkit_temp, size_of

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
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # a damaged entry is listed as incomplete, not a traceback
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
    folder: steps, :func:`_holds_only_steps`; a model entry built before its metadata file existed: model
    files, :func:`_holds_only_model_files`). A ``$MECHKIT_CACHE`` pointed at a project directory may hold
    a user's own ``runs/`` or ``toy/``; `cache clear` and a rebuild must never delete those."""
    if path.name.startswith(".") or path.is_symlink() or not path.is_dir():
        return False
    if group == "runs":  # only a folder mechkit marked when it made it (:func:`mark_run_dir`)
        return bool(_ENTRY["runs"].match(path.name)) and (path / RUN_MARKER).is_file() and _holds_only_steps(path)
    if group in _META and (path / _META[group]).is_file():
        return True
    pattern = _ENTRY.get(group)
    return bool(pattern and pattern.match(path.name)) and (group == "runs" or _holds_only_model_files(path))


# What a model entry holds: weights, configs, tokenizer files and mechkit's own metadata.
_MODEL_FILE = re.compile(r"^(.+\.safetensors|model\.safetensors\.index\.json|(generation_)?config\.json|"
                         r"tokenizer(_config)?\.json|special_tokens_map\.json|added_tokens\.json|vocab\.json|"
                         r"merges\.txt|tokenizer\.model|chat_template\.jinja|mechkit-[a-z]+\.json)$")


def _holds_only_model_files(path: Path) -> bool:
    """Whether a model entry's folder holds only files mechkit writes there (hidden leftovers aside). A user's
    ``toy/induction-deadbeef/notes.txt`` matched the entry name alone and was deleted by `cache clear --all`."""
    try:
        names = [p for p in path.iterdir() if not p.name.startswith(".")]
    except OSError:
        return False
    return all(p.is_file() and not p.is_symlink() and _MODEL_FILE.match(p.name) for p in names)


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
    `cache clear`; now only marked folders are entries. Raises ``OSError`` where it cannot be written."""
    path.mkdir(parents=True, exist_ok=True)
    marker = path / RUN_MARKER
    if not marker.is_file():
        marker.write_text('{"mechkit": "run steps"}\n', encoding="utf-8")


def mark_scratch(path: Path, name: str) -> None:
    """Record in the run's marker that it made the scratch folder ``name``: only a recorded folder's
    checkpoints are removed when the run finishes (a user's ``mine/checkpoint.safetensors`` beside them was
    deleted, taken for one). Raises ``OSError`` where it cannot be written."""
    mark_run_dir(path)
    names = scratch_names(path)
    if name not in names:  # written beside and renamed over it: a reader sees the old marker or the new one
        tmp = path / f".{RUN_MARKER}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.write_text(json.dumps({"mechkit": "run steps", "scratch": sorted({*names, name})}) + "\n", encoding="utf-8")
        os.replace(tmp, path / RUN_MARKER)


def scratch_names(path: Path) -> set[str]:
    """The scratch folders a run recorded in its marker (none for a marker written before they were recorded)."""
    try:
        data = json.loads((path / RUN_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    names = data.get("scratch") if isinstance(data, dict) else None
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


def _holds_only_steps(path: Path) -> bool:
    """Whether a run-key-named folder holds only what a run keeps there: its marker, its step files
    (``<16 hex>.json``), its scratch folders (checkpoints) and mechkit's own temporary files. A user's
    ``runs/`` with an experiment named by a hash (an MLflow run id) was cleared by `cache clear runs`, its
    ``metrics.csv`` with it; and a marked folder where a user had put ``results.json``, a ``.git`` or a model
    folder (``config.json``, ``model.safetensors``) was cleared too, since any ``.json``, any hidden name and
    any folder of ``.json``/``.safetensors`` files passed."""
    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    return all(not p.is_symlink() and (
        is_mechkit_temp(p.name) or (p.is_file() and (p.name == RUN_MARKER or STEP_FILE.match(p.name) is not None))
        or (p.is_dir() and not p.name.startswith(".") and _holds_only_checkpoints(p))) for p in entries)


def _holds_only_checkpoints(path: Path, depth: int = 4) -> bool:
    """Whether a step folder's scratch folder holds only what runs keep there: ``checkpoint.safetensors``,
    mechkit's temporary files and folders of the same (one per unit of a run), a few levels deep."""
    if depth == 0:
        return False
    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    return all(not p.is_symlink() and (
        is_mechkit_temp(p.name) or (p.is_file() and p.name == CHECKPOINT_FILE)
        or (p.is_dir() and not p.name.startswith(".") and _holds_only_checkpoints(p, depth - 1))) for p in entries)


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
        entries.append(CacheEntry(LEFTOVERS, "leftovers", f"{len(stale)} temporary dir(s) and lock file(s) of killed runs",
                                  sum(size_of(p) for p in stale), None, root))
    return entries


FOREIGN = "runs (unmarked)"  # the row `cache list` shows for look-alike folders it leaves alone
LEFTOVERS = "leftovers"  # the name `cache list` shows and `cache clear` takes for killed runs' leftovers


def _leftovers(root: Path) -> list[Path]:
    """Stale temporary directories, set-aside directories, lock files and journals in the cache."""
    from mechkit.io.leftovers import stale_leftovers

    return [p for f in _leftover_folders(root) for p in stale_leftovers(f)]


def _leftover_folders(root: Path) -> list[Path]:
    """Where a killed write in the cache leaves its temporary files: the root, the groups, each run's step
    folder (a step is written atomically beside its name), the scratch folders inside it (a killed checkpoint's
    ``.checkpoint.safetensors.tmp-*`` in ``finetune/`` or ``finetunes/ft-3/``: missed, it was on no row and
    never cleared) and the GGUF hash memos. A marked run folder a user put files in counts too: only
    mechkit's temporary names are ever taken from it."""
    runs = [*_children(root / "runs"), *(p for p in unmarked_runs(root) if (p / RUN_MARKER).is_file())]
    return [root, *(root / g for g in GROUPS), *(f for p in runs for f in _scratch_folders(p)),
            root / "gguf" / ".hashes"]


def _scratch_folders(path: Path, depth: int = 4) -> list[Path]:
    """``path`` and the plain folders under it (not links, not hidden names), ``depth`` levels deep."""
    found = [path]
    if depth > 0:
        with contextlib.suppress(OSError):
            for p in sorted(path.iterdir()):
                if not p.name.startswith(".") and not p.is_symlink() and p.is_dir():
                    found += _scratch_folders(p, depth - 1)
    return found


def finish_run_dir(path: Path) -> list[Path]:
    """Remove, from a finished run's steps folder ``path``, what runs write there (the marker, the step files,
    the scratch folders' checkpoints, mechkit's temporary files) and the folders left empty; return what was
    kept: anything else (a user's ``notes.txt`` beside the steps) is theirs and never deleted. A run used to
    remove the folder whole when it finished, a user's files with it."""
    kept: list[Path] = []
    if not path.is_dir():  # a run that kept no steps never made it: nothing to remove, nothing to say
        return kept
    scratch = scratch_names(path)

    def clear(folder: Path, depth: int, top: bool) -> None:
        try:
            entries = sorted(folder.iterdir())
        except FileNotFoundError:
            return
        except OSError:
            kept.append(folder)
            return
        for p in entries:
            ours_file = (p.name == RUN_MARKER or STEP_FILE.match(p.name) is not None) if top else p.name == CHECKPOINT_FILE
            try:
                if p.is_symlink() or os.path.ismount(p):
                    kept.append(p)
                elif is_mechkit_temp(p.name):
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
                elif p.is_file() and ours_file:
                    p.unlink()
                elif p.is_dir() and not p.name.startswith(".") and depth > 0 and (not top or p.name in scratch):
                    clear(p, depth - 1, False)
                    with contextlib.suppress(OSError):
                        p.rmdir()  # a folder still holding a user's file stays
                else:
                    kept.append(p)
            except OSError:
                kept.append(p)

    clear(path, 4, True)
    with contextlib.suppress(OSError):
        path.rmdir()
    return kept


def remove_dir(path: Path) -> None:
    """Delete a cache directory: renamed aside first, so no reader ever finds it half-deleted. A symlink is
    removed itself, never what it points to."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
        return
    aside = path.with_name(f".{path.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.replace(path, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _resolve_name(root: Path, name: str) -> Path:
    """``gguf/X``, ``toy/X``, ``runs/X`` or a whole group; a bare ``X`` when one group holds it."""
    clean = name.strip().strip("/")
    parts = clean.split("/")
    if clean in GROUPS:
        return root / clean
    if len(parts) == 2 and parts[0] in GROUPS and parts[1] and not parts[1].startswith("."):
        candidate = root / parts[0] / parts[1]
        _refuse_linked_group(root / parts[0], name)
        if is_entry(parts[0], candidate):
            return candidate
    elif len(parts) == 1 and clean and not clean.startswith("."):
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
    marked = sum((p / RUN_MARKER).is_file() for p in named[:50])
    why = ("mechkit did not mark as its own (a user's, or run steps kept by a mechkit older than the marker)"
           if not marked else "hold files no run writes there (mechkit's marker beside a user's files)"
           if marked == len(named) else "mechkit did not mark as its own, or that hold files no run writes there")
    raise MechkitError(f"no cache entry named {name!r}: it names {len(named)} folder(s) in {root / 'runs'} that "
                       f"{why}, which `cache clear` never deletes",
                       f"delete them yourself if they are only old run steps: rm -r {shown}"[:400])


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
        from mechkit.io.leftovers import clean_leftovers

        cleaned = [item for f in _leftover_folders(root) for item in clean_leftovers(f)]
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
        remove_dir(path)
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
    entries = [p for p in _children(group) if not _in_use(p)]
    memos = []
    hashes = group / ".hashes"
    if group.name == "gguf" and hashes.is_dir() and not hashes.is_symlink():
        memos = [p for p in hashes.iterdir() if _HASHES.match(p.name) and p.is_file() and not p.is_symlink()]
    size = sum(dir_size(p) for p in entries) + sum(size_of(p) for p in memos)
    for path in entries:
        remove_dir(path)
    for memo in memos:
        memo.unlink(missing_ok=True)
    for folder in (hashes, group):  # only where nothing else is left
        with contextlib.suppress(OSError):
            folder.rmdir()
    return size if entries or memos else None
