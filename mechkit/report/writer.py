"""Write a run's directory atomically: report.json, report.html and the artifacts, or nothing.

A reader (a script polling ``mechkit-runs/``, or a person after Ctrl-C) must never find a
half-written report. Everything is rendered into a hidden temporary directory beside ``out_dir``
(same filesystem, so a rename is atomic). A new ``out_dir`` is then created by renaming that
directory in one step (:func:`mechkit.io.atomic_dir`); an existing one gets the run's files as one set
(:func:`mechkit.io.replace.install_set`): the previous report's files are replaced, all or nothing, and
files the user keeps there are left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mechkit.errors import MechkitError, ReportExistsError
from mechkit.io import check_out
from mechkit.io.read import DIR_FLAGS
from mechkit.io.remove import discard_tree
from mechkit.io.replace import replacing_dir, write_folder_manifest
from mechkit.report.html import render_html
from mechkit.report.schema import MAX_REPORT_BYTES, to_jsonable, validate_report
from mechkit.report.views import png_name, views_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from mechkit.report.table import Table

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
PNG_DPI = 120


def default_out_dir(plugin: str, root: str | os.PathLike[str] = "mechkit-runs") -> Path:
    """A fresh run directory name such as ``mechkit-runs/20261121-130501-ablate`` (not created).

    Local time, because people find their runs by when they started them; a ``-2``, ``-3`` …
    suffix keeps two runs started in the same second apart.
    """
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in plugin).strip(".-") or "run"
    base = Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def write_report(
    out_dir: str | os.PathLike[str],
    report: dict,
    figures: Mapping[str, Figure] | None = None,
    files: Mapping[str, bytes | str | Path] | None = None,
    force: bool = False,
    tables: list[Table] | None = None,
) -> Path:
    """Write ``report.json``, ``report.html``, one PNG per figure and the extra files; return ``out_dir``.

    ``figures`` maps names (``"heatmap"`` or ``"heatmap.png"``) to matplotlib figures, ``files``
    maps file names to contents (or to a ``Path`` of a file or directory, moved in whole), ``tables`` are the page's
    tables (the plugin's; default the generic ones). Every name written is added to ``report["artifacts"]``; the
    caller's dict is not modified. Raises :class:`ReportExistsError` when ``out_dir`` already
    holds a report and ``force`` is false, and :class:`MechkitError` naming the key path when a
    value is NaN or infinite (:func:`~mechkit.report.schema.validate_report`); nothing is written then.
    """
    figures, files = _snapshot("figures", figures), _snapshot("files", files)
    _check_arguments(out_dir, report, figures, files, force, tables)
    from mechkit.io.locks import HELD, lock_path
    from mechkit.io.outlock import out_lock

    out = Path(out_dir)  # one writer per directory: a direct call takes the lock a run holds already
    with contextlib.nullcontext() if lock_path(out) in HELD else out_lock(out):
        return _write_locked(out, report, figures, files, force, tables)


def _write_locked(out: Path, report: dict, figures: Mapping[str, Figure] | None,
                  files: Mapping[str, bytes | str | Path] | None, force: bool, tables: list[Table] | None) -> Path:
    target = out / REPORT_JSON
    if target.exists() and not force:
        raise ReportExistsError(
            f"{target} already exists", "pass --force to overwrite it or choose another --out"
        )

    _check_paths(files or {}, out)
    figures = {png_name(k): v for k, v in (figures or {}).items()}
    files = dict(files or {})
    names = list(figures) + list(files)
    _check_names(names, out)
    clash = [n for n in ("report.html", *names) if not force and os.path.lexists(out / n)]
    if clash:  # without --force none of the run's files replaces one there (another writer's, made meanwhile)
        raise ReportExistsError(f"{out / clash[0]} already exists", "pass --force to overwrite it or choose another --out")
    final = dict(to_jsonable(report, "keep"))  # NaN kept, so validate_report names where it is
    final["artifacts"] = list(dict.fromkeys([*final.get("artifacts", []), *names]))
    if "views" not in final:  # the runner puts them in the report; a direct call gets them from its figures
        views = views_of(figures)
        if views:
            final["views"] = views
    validate_report(final)  # before anything is rendered or written
    text = _report_text(final)

    check_out(out, force=True, kind="dir")  # a file there, or a read-only place: one line, before rendering

    created_parents = _missing_ancestors(out.parent)
    moves = _Moves()
    try:
        writer = str(final.get("plugin"))  # a model another plugin saved there is refused
        with replacing_dir(out, writer=writer, force=True) as tmp:  # new: one rename; else one set, with a manifest
            _render(tmp, final, text, figures, files, tables, moves)
    except BaseException as err:  # Ctrl-C included: never leave a half-written run behind
        for parent in created_parents:  # deepest first; only the ones this call created
            try:
                parent.rmdir()
            except OSError:
                break
        from mechkit.io.fs_errors import os_error_of

        found = os_error_of(err, out) if isinstance(err, Exception) else None
        if found is not None and found is not err:  # a full disk seen by write() names no file: name --out
            raise found from err
        if isinstance(err, OSError):  # one naming a file already: still one line (a direct call has no runner)
            from mechkit.io.fs_errors import describe

            said = describe(err)
            if said is not None:
                raise said from err
        raise
    moves.commit()  # the report is in place: what was copied of a user's path goes only now
    return out


class _Moves:
    """The returned paths that are not mechkit's prepared folders (a user's own file or folder a plugin returned),
    as the writer brought them into the report: copied and synced, never moved, so the user's path stays where
    it is until the report is in place, whatever ends the write (a full disk, a name too long, the final rename,
    Ctrl-C, kill -9: a renamed path was deleted with the temporary folder, and a hard-linked one shared its data
    with the report after a kill). :meth:`commit` then removes of the source only what was copied, each file
    as it was when copied (device, inode, size, mtime) and each folder once empty: a file the user wrote or
    replaced there meanwhile stays."""

    def __init__(self) -> None:
        self.taken: list[tuple[Path, tuple]] = []
        self.folders: list[Path] = []
        self.ids: dict[Path, tuple[int, int]] = {}  # each copied folder's (device, inode), as it was copied

    def folder(self, path: Path) -> None:
        """Record the folder ``path`` of a user's returned tree as it is copied."""
        info = os.lstat(path)
        self.folders.append(path)
        self.ids[path] = (info.st_dev, info.st_ino)

    def same_tree(self, path: Path) -> bool:
        """Whether every recorded folder above ``path`` (itself included) is still that folder, and no link: a
        folder swapped for a link to a user's folder meanwhile (a sync tool, a plugin's thread) made the copy
        and the removal reach the user's files through it."""
        import stat

        for folder in (path, *path.parents):
            if folder not in self.ids:
                continue
            try:
                info = os.lstat(folder)
            except OSError:
                return False
            if not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) != self.ids[folder]:
                return False
        return True

    def commit(self) -> None:
        for path, signature in self.taken:
            with contextlib.suppress(OSError):
                if self.same_tree(path.parent):
                    self._unlink_if_same(path, signature)
        for folder in sorted(self.folders, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                if self.same_tree(folder):
                    folder.rmdir()  # only once empty: what the user added meanwhile keeps it
        self.taken.clear()
        self.folders.clear()
        self.ids.clear()


    def _unlink_if_same(self, path: Path, signature: tuple) -> None:
        """Unlink ``path`` through a descriptor of its folder, opened without following a link and checked to be the
        folder copied, where the entry is still the file copied: a check of the path, then an unlink by path, left a
        window in which a folder swapped for a link reached a user's file."""
        fd = os.open(path.parent, DIR_FLAGS)
        try:
            info = os.fstat(fd)
            if path.parent in self.ids and (info.st_dev, info.st_ino) != self.ids[path.parent]:
                return
            if _signature_of(os.stat(path.name, dir_fd=fd, follow_symlinks=False)) == signature:
                os.unlink(path.name, dir_fd=fd)
        finally:
            os.close(fd)


def _signature(path: Path) -> tuple:
    """What says a file is still the one copied: an in-place rewrite that restores its mtime still moves ctime."""
    return _signature_of(os.lstat(path))


def _signature_of(info: os.stat_result) -> tuple:
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode


def _report_text(final: dict) -> str:
    """``report.json``'s text, refused (one line) past the size every reader takes (``report show`` refused a
    42 MB report a run had just written, telling the user to pass one a run wrote)."""
    text = json.dumps(final, indent=2, ensure_ascii=False, allow_nan=False) + "\n"  # as written: the newline too
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_REPORT_BYTES:
        biggest = max((k for k in ("results", "views", "params", "model")),
                      key=lambda k: len(json.dumps(final.get(k), ensure_ascii=False)))
        raise MechkitError(f"report.json would be {size / 2**20:.0f} MB, more than a report's limit of "
                           f"{MAX_REPORT_BYTES // 2**20} MB (its largest part is '{biggest}')",
                           "keep summaries in results and return large data as a file (files={name: bytes or a "
                           "Path}); nothing was written")
    return text


def _render(tmp: Path, final: dict, text: str, figures: Mapping[str, Figure], files: Mapping[str, bytes | str | Path],
            tables: list[Table] | None = None, moves: _Moves | None = None) -> None:
    """Write the figures, the files, ``report.html`` and ``report.json`` of the checked report ``final`` into
    ``tmp``, and move the returned paths in last: a failure of anything else (a full disk, a name too long)
    then never finds a user's path in the temporary folder, which is removed."""
    images: dict[str, bytes] = {}
    for name, fig in figures.items():
        fig.savefig(tmp / name, dpi=PNG_DPI, format="png", bbox_inches="tight")
        images[name] = (tmp / name).read_bytes()
    for name, content in files.items():
        if isinstance(content, Path):  # a file or directory the plugin prepared (e.g. a saved model): last
            continue
        data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        (tmp / name).write_bytes(data)
        if name.lower().endswith(".png"):
            images[name] = data

    (tmp / REPORT_HTML).write_text(render_html(final, images, tables), encoding="utf-8")
    (tmp / REPORT_JSON).write_text(text, encoding="utf-8")
    for name, content in files.items():
        if isinstance(content, Path):
            move_prepared(content, tmp / name, moves)
            if (tmp / name).is_dir() and not (tmp / name).is_symlink():
                write_folder_manifest(tmp / name, str(final.get("plugin")))
    for name, content in files.items():  # the last look before the report goes in place, each copy as written
        if isinstance(content, Path):
            _refuse_changed_tree(tmp / name)


def move_prepared(src: Path, dst: Path, moves: _Moves | None = None) -> None:
    """Move the file or directory a plugin prepared into the report: renamed where it can be, else copied (another
    file system: ``$TMPDIR`` on a tmpfs, a file in ``/dev/shm``), each file synced before the source goes, so a
    full disk is the plain OSError the writer names in one line, not shutil.move's ``shutil.Error`` (a
    traceback). The prepared path is the writer's: moved in, or removed if it cannot be (a failed copy left a
    ``/tmp/mechkit-pruned-*`` behind on every try), and its lock let go after
    (:func:`mechkit.io.leftovers.release_prepared`). One that vanished before or while it was moved (a tmp
    cleaner) is one line naming it: the report is then not written at all. A path that is not a prepared folder
    (a user's own) is copied, never moved, and recorded in ``moves``: what was copied goes after the commit."""
    from mechkit.io.leftovers import release_prepared

    try:
        _move_prepared(src, dst, moves)
    finally:
        release_prepared(src)


def _move_prepared(src: Path, dst: Path, moves: _Moves | None = None) -> None:
    import errno

    from mechkit.io.leftovers import discard_prepared

    keep = None if _in_scratch(src) else moves  # a user's path: copied, never moved, its source gone after the commit
    try:
        if keep is None:
            os.rename(src, dst)  # looked at once more, with every returned path, before the report goes in place
            return
    except OSError as err:
        if err.errno == errno.ENOENT and not os.path.lexists(src):
            raise _vanished(src) from err
        if err.errno != errno.EXDEV:
            _discard_if_scratch(src)
            raise
    done = False
    from mechkit.io.read import mount_points

    points = mount_points()  # read once per returned path: each entry is checked against them as it is copied
    try:
        if not src.is_dir() or src.is_symlink():  # a file: copied whole and synced, then the source goes
            _copy_synced(src, dst, src, keep, points)
            done = True
            return
        _refuse_changed_kind(src, points)
        device = os.lstat(src).st_dev
        dst.mkdir()
        if keep is not None:
            keep.folder(src)
        for path in _tree(src):  # sorted: a folder comes before what it holds, so a mount is refused before
            target = dst / path.relative_to(src)
            if path.is_dir() and not path.is_symlink():
                _refuse_changed_kind(path, points, device)
                target.mkdir(exist_ok=True)
                if keep is not None:
                    keep.folder(path)
            else:
                _copy_synced(path, target, src, keep, points)
        if not src.is_dir():  # removed while it was copied: what was copied is not the whole model
            raise _vanished(src)
        done = True
    finally:
        if done and keep is not None:
            pass  # a user's: what was copied is removed once the report is committed, not before
        elif done:
            discard_prepared(src)  # moved: a complete, synced copy is in the report
        else:  # the report is not written: its partial copy goes, and the source only from the temporary folder
            if dst.is_dir() and not dst.is_symlink():
                discard_tree(dst)
            elif os.path.lexists(dst):
                dst.unlink()
            _discard_if_scratch(src)


def _tree(src: Path) -> list[Path]:
    """Everything under ``src``, links not followed, sorted; a folder that cannot be listed raises (``rglob``
    skipped it, and a model copied in part was reported whole, its source then removed)."""
    found: list[Path] = []

    def fail(err: OSError) -> None:
        raise err

    for root, dirs, files in os.walk(src, onerror=fail):
        found += [Path(root) / n for n in dirs + files]
    return sorted(found)


def _in_scratch(path: Path) -> bool:
    """Whether ``path`` is a folder mechkit prepared for this run (:func:`mechkit.io.leftovers.made_here`): the
    only returned path removed when it cannot be moved in. Anything else a plugin returned (a user's own file,
    inside ``$TMPDIR`` or not) is left where it is."""
    from mechkit.io.leftovers import made_here

    return made_here(path)


def _discard_if_scratch(src: Path) -> None:
    """Remove prepared ``src`` that could not be moved in only where it is inside the temporary directory: one
    elsewhere (a user's own file or folder a plugin returned: its copy onto a full disk failed, or it holds
    ``--out`` so it cannot be renamed into it) is left intact; its lock is let go by :func:`move_prepared`."""
    from mechkit.io.leftovers import discard_prepared

    if _in_scratch(src):
        discard_prepared(src)


def _copy_synced(path: Path, target: Path, src: Path, keep: _Moves | None = None,
                 points: frozenset[str] = frozenset()) -> None:
    """Copy one file of prepared ``src`` to ``target`` (a link as a link) and sync it to disk: only then may the
    source go (a crash after the source went lost a copy still in the page cache). With ``keep`` (a user's
    path), the file as it was copied is recorded for :meth:`_Moves.commit`, and one changed while it was
    copied is refused: the copy would be of no version the user had."""
    import errno

    try:
        _refuse_changed_kind(path, points)
        if keep is not None and not keep.same_tree(path.parent):
            raise MechkitError(f"a folder above {path} changed while the report was written (it is no longer the "
                               "folder that was checked)", "return a folder nothing else changes while it is written")
        before = _signature(path) if keep is not None else None
        shutil.copy2(path, target, follow_symlinks=False)
        if keep is not None:
            if _signature(path) != before:
                raise MechkitError(f"{path} changed while it was copied into the report",
                                   "run it again when nothing writes to it")
            keep.taken.append((path, before))
        if not target.is_symlink():
            fd = os.open(target, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as err:  # sendfile names the source: the disk that is full is the target's
        if err.errno == errno.ENOENT and not os.path.lexists(path):
            raise _vanished(src) from err
        raise OSError(err.errno, err.strerror, str(target)) from err


def _refuse_changed_kind(path: Path, points: frozenset[str] = frozenset(), device: int | None = None) -> None:
    """Refuse (one line) an entry of a returned path that is no longer what the check saw when it is copied: a
    regular file of one link, or a folder on the returned path's own device. Code that ran after the check (a
    figure's draw callback) put a hard link to a user's key there, copied with the umask's mode; a FIFO, whose
    copy failed as a raw OSError; or a bind mount of a user's folder, copied and then removed through.
    ``points`` are the mount points (:func:`mechkit.io.read.mount_points`), ``device`` the returned folder's."""
    import stat

    from mechkit.io.returned import path_kind

    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        if (device is None or info.st_dev == device) and not os.path.ismount(path) \
                and os.path.realpath(path) not in points:  # ismount misses a bind mount from the same disk
            return
        what = "a mount point"
    elif stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and os.path.realpath(path) not in points:
        return
    elif stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
        what = "a mount point"
    else:
        what = path_kind(path) if not stat.S_ISREG(info.st_mode) else \
            f"a file with {info.st_nlink - 1} other hard link(s)"
    raise MechkitError(f"{path} is {what} now, not the plain file it was when the run's result was checked",
                       "return a folder nothing else changes while the report is written")


def _refuse_changed_tree(folder: Path) -> None:
    """:func:`_refuse_changed_kind` for every entry of a returned path as it now lies in the report's temporary
    folder, the last look before the report goes in place: a prepared folder renamed in whole (no copy looked at
    each file) kept a hard link to a user's file that code running after the check put there. A refusal removes
    that name with the temporary folder, never the user's file."""
    from mechkit.io.read import mount_points

    points = mount_points()
    if not folder.is_dir() or folder.is_symlink():
        _refuse_changed_kind(folder, points)
        return
    device = os.lstat(folder).st_dev
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:  # a link to a folder is listed among dirs: refused as a link
            _refuse_changed_kind(Path(root) / name, points, device)


def discard_unmoved(files: object) -> None:
    """Remove each ``Path`` in a plugin's ``files`` that the report did not move in, and let go of its lock
    (:func:`mechkit.io.leftovers.discard_prepared`): the runner calls it however a run ends (a refusal, an
    error, Ctrl-C, ``write=False``), so a prepared model never stays in ``$TMPDIR``, held by a live process
    (a notebook's kernel) that no ``cache clear`` could touch. A moved one is gone from its source already.
    Only a path inside the temporary directory is removed: one elsewhere (a plugin that returned a user's own
    file by mistake) is left where it is, its lock let go."""
    from mechkit.io.leftovers import discard_prepared, release_prepared

    if isinstance(files, dict):
        for value in files.values():
            if isinstance(value, Path):
                discard_prepared(value) if _in_scratch(value) else release_prepared(value)


def _vanished(src: Path) -> MechkitError:
    return MechkitError(f"the folder {src} this run prepared for its report was removed before it was moved in "
                        "(by a cleaner of the temporary folder, or an older mechkit's cache clear)",
                        "run it again; keep cleaners off $TMPDIR while mechkit runs, or point TMPDIR at a folder "
                        "of your own")


def figure_png(fig: Figure) -> bytes:
    """One figure as the PNG bytes a report holds (the same DPI and cropping as the written file)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, dpi=PNG_DPI, format="png", bbox_inches="tight")
    return buf.getvalue()


def _snapshot(what: str, values: object) -> object:
    """``values`` as a plain dict of plain names and paths, read once (:func:`plain_outputs`): what is checked is
    then what is written. A plain dict already so (``mk.run``'s, checked) is passed as it is."""
    if not isinstance(values, Mapping):
        return values
    if type(values) is dict and all(type(k) is str and (not isinstance(v, Path) or _plain_path(v))
                                    for k, v in values.items()):
        return values
    return plain_outputs(what, values)


def _plain_path(value: Path) -> bool:
    return type(value) is type(Path()) and value.is_absolute()


def plain_outputs(what: str, values: Mapping) -> dict:
    """A result's ``figures`` or ``files`` read once into a plain dict: each name a plain ``str`` and each ``Path``
    a plain absolute one, fixed now. Code that ran after the check (a figure's draw callback, a name's own
    ``lower()``) turned a ``Path`` subclass's ``__fspath__`` to a user's file, made a relative path another
    file by ``os.chdir``, or put the working directory in ``files``; a dict subclass's storage held another
    folder than its ``items()`` showed. Whatever a name or path raises is one line."""
    try:
        items = list(values.items())
        return {(str.__str__(k) if isinstance(k, str) else k):
                (Path(os.path.abspath(os.fspath(v))) if isinstance(v, Path) else v) for k, v in items}
    except MechkitError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a mapping, a name or a path raises, one line
        raise MechkitError(f"{what} cannot be read as a dict of names and contents ({type(err).__name__})",
                           f"pass {what} as a plain dict of plain names") from None


def outputs_problem(figures: object, files: object) -> str | None:
    """What is wrong with a report's ``figures`` and ``files`` (``"files['x'] as a int"``), else ``None``: the one
    check of their types for ``mk.run`` (a plugin's result) and a direct :func:`write_report` call.

    >>> outputs_problem({}, {"a.txt": 3})
    "files['a.txt'] as a int"
    """
    for what, values, ok in (("figures", figures, lambda v: hasattr(v, "savefig")),
                             ("files", files, lambda v: isinstance(v, (bytes, bytearray, str, Path)))):
        if not isinstance(values, Mapping):
            return f"{what} as a {type(values).__name__}, not a dict"
        bad = next((k for k, v in values.items() if not ok(v)), None)
        if bad is not None:
            return f"{what}[{bad!r}] as a {type(values[bad]).__name__}"
    seen: set = set()
    for name in [png_name(k) for k in figures] + list(files):  # type: ignore[union-attr]
        if name in seen:  # figures "heat" and "heat.png" were one file: one figure lost without a word
            return f"two figures or files that are both the file {name!r}"
        seen.add(name)
    return None


def _check_arguments(out_dir: object, report: object, figures: object, files: object, force: object,
                     tables: object) -> None:
    """One line for what this public function would otherwise take wrongly or fail on deep inside: ``mk.run``
    checks a plugin's result before it comes here, a direct caller got an int written as NUL bytes, a
    ``force="no"`` that replaced a report, and raw AttributeErrors for a figure that is no figure."""
    fix = "write_report(out, report: dict, figures={name: matplotlib figure}, files={name: bytes, text or Path})"
    try:
        text = os.fspath(out_dir) if isinstance(out_dir, (str, os.PathLike)) else None
    except Exception:  # noqa: BLE001 - a path object whose own __fspath__ raises
        text = None
    if not isinstance(text, str):
        raise MechkitError(f"out_dir must be a path, not {type(out_dir).__name__}", fix)
    if "\0" in text:  # a raw ValueError from every file call
        raise MechkitError(f"out_dir {text!r} holds a NUL byte, which no path can", "pass a plain path")
    from mechkit.io.fs_errors import refuse_missing_cwd

    refuse_missing_cwd()  # every path check below asks getcwd: a FileNotFoundError traceback
    if not isinstance(report, dict):
        raise MechkitError(f"report must be a dict (build_report gives one), not {type(report).__name__}", fix)
    if not isinstance(report.get("artifacts", []), list):  # a str was split into letters, an int a TypeError
        raise MechkitError(f"report['artifacts'] must be a list of file names, not "
                           f"{type(report['artifacts']).__name__}", fix)
    import numpy as np

    if not (isinstance(force, (bool, np.bool_)) or (isinstance(force, np.ndarray) and force.shape == ()
                                                    and force.dtype == np.bool_)):  # what mk.run takes as a switch
        raise MechkitError(f"force must be True or False, not {force!r}", "pass force=True to replace a report")
    problem = outputs_problem(figures or {}, files or {})
    if problem is not None:
        raise MechkitError(problem.replace(" as a ", " is a ", 1), fix)
    from mechkit.report.table import Table

    if tables is not None and (not isinstance(tables, list) or not all(isinstance(t, Table) for t in tables)):
        raise MechkitError("tables must be a list of mechkit.report.Table", "pass tables=None for the generic ones")


def _check_paths(files: Mapping[str, object], out: Path) -> None:
    """Refuse (one line) a ``Path`` in ``files`` that is no plain file or folder of the caller's own
    (:func:`mechkit.io.returned.odd_entry`) or that takes a place no report may take (``out``, the cache, the
    temporary, working or home directory: :func:`mechkit.io.returned.protected`): ``mk.run`` checks these before
    the writer, and a direct call of this public function moved the working directory into a report."""
    from mechkit.io.leftovers import made_here
    from mechkit.io.returned import odd_entry, place_problem, protected, was_checked

    if was_checked(files):  # mk.run's own, checked with the run's inputs as protected places: not walked again
        return
    places = protected(out)
    for name, value in files.items():
        if not isinstance(value, Path) or (made_here(value) and not os.path.lexists(value)):
            continue  # a prepared folder a cleaner removed: its move names it, with the fix for $TMPDIR
        why = place_problem(value, places)
        if why is not None:
            raise MechkitError(f"files[{name!r}] is the path {value}, which {why}: moving it into the report "
                               "would destroy it", "pass a file or folder prepared in a folder of its own")
        odd = odd_entry(value)
        if odd is not None:
            where = f"the path {value}" if odd[0] == value else f"the path {value}, which holds {odd[0]}"
            raise MechkitError(f"files[{name!r}] is {where}, which is {odd[1]}, not a regular file or a directory "
                               "of its own to move into the report", "pass a plain file or folder prepared for it")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the report's JSON and page cannot hold it
        return False
    return True


def _check_names(names: list[str], out: Path | None = None) -> None:
    """Refuse (one line, naming the artifact) a name that is no plain file name, one given twice, or one longer
    than ``out``'s file system allows: written, it failed after the work with "choose a shorter --out", though
    no --out could help, and a user's path a plugin returned beside it was lost with the temporary folder."""
    seen: set[str] = set()
    limit = _name_max(out)
    for name in names:
        if not isinstance(name, str) or "\0" in name or not _utf8(name):  # failed as a raw TypeError/ValueError
            raise MechkitError(f"artifact name {name!r} is not a file name (text with no NUL byte, encodable as "
                               "UTF-8)", "name each figure and file with plain text such as heatmap.png")
        if name and len(os.fsencode(name)) > limit:
            raise MechkitError(f"artifact name {name[:40]!r}... is {len(os.fsencode(name))} bytes long, more than "
                               f"the {limit} a file name may have", "give that figure or file a shorter name")
        if (
            not name
            or "/" in name
            or "\\" in name
            or name.startswith(".")
            or name in (REPORT_JSON, REPORT_HTML)
        ):
            raise MechkitError(
                f"artifact name {name!r} is not allowed", "use a plain file name such as heatmap.png"
            )
        if name in seen:
            raise MechkitError(
                f"artifact name {name!r} is given twice", "give each figure and file its own name"
            )
        seen.add(name)


def _name_max(out: Path | None) -> int:
    """The longest file name (in bytes) the file system of ``out`` (its nearest existing folder) takes; 255."""
    for place in (() if out is None else (out, *out.parents)):
        if os.path.isdir(place):
            try:
                return int(os.pathconf(place, "PC_NAME_MAX"))
            except (OSError, ValueError, AttributeError):
                break
    return 255


def _missing_ancestors(path: Path) -> list[Path]:
    """Directories on ``path`` that do not exist yet, deepest first, so a failure can remove them."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


__all__ = ["default_out_dir", "discard_unmoved", "figure_png", "outputs_problem", "plain_outputs", "write_report"]
