"""Replace the files a run writes in a user's directory, as one set, all or nothing, and nothing else.

``--force`` over an existing ``--out`` must not touch what is not mechkit's: a user's notes, an input
vector, another tool's files. So a forced write never swaps or empties the directory. It builds the
new files in a hidden temporary directory beside it (:func:`mechkit.io.temp_dir_beside`), then
installs them under a *journal*, a hidden file beside the directory naming every file of the set:

1. the journal is written (atomically);
2. the old files of the set (the new names, plus the names the previous mechkit write listed in the
   directory's manifest ``.mechkit-files``) are moved aside into the temporary directory, the *key* file
   (``report.json``, a model's ``config.json``) first, so no key ever sits beside another run's files;
3. the new files are moved in, the key file last;
4. the journal is removed: this one ``unlink`` is the commit. The files set aside are then deleted.

A process killed anywhere in 2-3 leaves the journal; the next writer of the directory (under its lock,
:func:`mechkit.io.outlock.out_lock`) or ``mechkit cache clear`` rolls the set back to the old one whole
(:func:`recover`). Files whose names are not in either set are never moved, read or deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from mechkit.errors import MechkitError
from mechkit.io.journal import LINK, MANIFEST, journal_path, journal_text, plain_name, recover, tree_files
from mechkit.io.remove import discard_tree

KEY_FILES = ("report.json", "config.json")  # the file that says "this set is whole": out first, in last
REPORT_SCHEMA = "mechkit.report/"  # a report.json whose schema starts so is mechkit's (mechkit.report.schema.SCHEMA)


def _read_json(path: Path) -> object:
    from mechkit.io.read import read_regular_text  # a FIFO or device under a name of ours is never read

    text = read_regular_text(path)
    try:
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError):
        return None


def _mechkit_report(out: Path) -> dict | None:
    """``out``'s ``report.json`` where it is a mechkit report (its ``schema`` says so), else ``None``: another
    tool's ``report.json`` with an ``artifacts`` list names that tool's files, never mechkit's."""
    report = _read_json(out / "report.json")
    schema = report.get("schema") if isinstance(report, dict) else None
    return report if isinstance(schema, str) and schema.startswith(REPORT_SCHEMA) else None


def owned_names(out: Path) -> list[str]:
    """The names the last mechkit write made in ``out``: its manifest, else a mechkit report's own list
    (``report.json``, ``report.html`` and its ``artifacts``); none where neither is there."""
    names = _read_json(out / MANIFEST)
    if isinstance(names, dict):  # {"writer": ..., "files": [...]}; an older manifest is the bare list
        names = names.get("files")
    if not names:
        report = _mechkit_report(out)
        artifacts = report.get("artifacts") if report is not None else None
        names = ["report.json", "report.html", *(artifacts if isinstance(artifacts, list) else [])] \
            if report is not None else []
    return [n for n in names if isinstance(n, str) and plain_name(n)] if isinstance(names, list) else []


def set_writer(out: Path) -> str | None:
    """Who wrote the set in ``out``: its manifest's ``writer`` (``taskvec apply``, ``prune``), else its
    report's ``plugin``; ``None`` where neither says."""
    manifest = _read_json(out / MANIFEST)
    if isinstance(manifest, dict) and isinstance(manifest.get("writer"), str):
        return manifest["writer"]
    report = _mechkit_report(out)
    plugin = report.get("plugin") if report is not None else None
    return plugin if isinstance(plugin, str) else None


def _models(out: Path, names: Sequence[str]) -> list[str]:
    """Those of ``names`` that are (part of) a saved model: weights, a model's config, a model directory."""
    return [n for n in names if n.endswith(".safetensors") or n == "config.json" or (out / n / "config.json").is_file()]


def refuse_foreign_model(out: Path, writer: str, names: Sequence[str] = ()) -> None:
    """Refuse (one line) a forced write by ``writer`` that would replace a saved model it did not write.

    ``--force`` replaces the previous set as one (:func:`install_set`). Where that set holds a model
    (``finetune``'s weights, ``prune --save-model``'s ``model/``, a ``taskvec apply`` directory), only the
    writer that saved it may replace it: another analysis, or ``taskvec apply``, pointed there would delete
    weights that took a training run to make. A model file among ``names`` (the new set) that mechkit did
    not write at all, a folder mechkit did not write under one of those names (``attention --out d --force``
    with the user's ``d/attention.png/`` went into the set and was deleted with what it held), and a FIFO,
    device or socket, are never replaced. Every writer calls this: the plugin runner before the model loads,
    and :func:`replacing_dir` again before it installs anything.
    """
    odd = [n for n in names if _special(out / n)]
    if odd:
        raise MechkitError(f"--out {out} holds {odd[0]}, which is not a regular file (a FIFO, device or socket), "
                           f"where {writer} would write", "choose another --out, or remove it first")
    owned = owned_names(out)
    foreign = [n for n in _models(out, [n for n in names if n not in owned]) if os.path.lexists(out / n)]
    if foreign:
        raise MechkitError(f"--out {out} holds {', '.join(foreign[:3])}, which mechkit did not write, and "
                           f"{writer} would replace it", "choose another --out, or move those files away first")
    folders = [n for n in dict.fromkeys([*names, *owned]) if n != MANIFEST and _real_dir(out / n)
               and not _our_folder(out, n, owned)]  # an owned name is replaced or removed: each is checked
    dirs = owned_folders(out) or set()
    swapped = [n for n in owned if n in dirs and os.path.lexists(out / n) and not _real_dir(out / n)]
    if swapped:  # the user's file or link where mechkit's folder was: replaced by name, it was deleted
        raise MechkitError(f"--out {out} holds {swapped[0]}, which mechkit did not write (it wrote a folder of that "
                           f"name there), and {writer}'s --force would delete it",
                           f"move {out / swapped[0]} away first, or choose another --out")
    for name in owned:  # a returned folder of the set: the user's entries inside, before any work
        if name != MANIFEST and _our_folder(out, name, owned):
            refuse_user_entries(out, name)
    if folders:
        raise MechkitError(f"--out {out} holds a folder {folders[0]}, which mechkit did not write, where {writer} would "
                           "write; --force would delete the folder with all it holds",
                           "choose another --out, or move that folder away first")
    saved = _models(out, owned)
    wrote = set_writer(out)
    if saved and wrote != writer:
        what = "a model" if any(not n.endswith(".safetensors") for n in saved) else "saved tensors (vectors or weights)"
        raise MechkitError(f"--out {out} holds {what} that a `{wrote or 'mechkit'}` run wrote ({', '.join(saved[:3])}), "
                           f"and {writer}'s --force would delete it",
                           "choose another --out, or remove those files yourself first")


def refuse_foreign_file(path: str | os.PathLike[str], writer: str) -> None:
    """Refuse (one line) a file writer (``taskvec extract``, ``merge``, an activation vector's or an attention
    page's ``save``) that would replace, even with ``--force``, a file of a set a directory writer made (its
    manifest lists it: ``finetune``'s ``model.safetensors``), that manifest itself, or any file of a model
    directory (one holding ``config.json``: weights, config, tokenizer; a user's notes there are theirs to
    replace) other than a task vector and its ``.json``. ``--out ft/model.safetensors --force`` put a task vector where a fine-tune's weights were;
    ``--out ft/.mechkit-files`` replaced the list that protects the set, and then ``--out hf/tokenizer.json``
    the model's tokenizer. Only the writer that saved a model replaces it (:func:`refuse_foreign_model`)."""
    if not isinstance(path, str | os.PathLike):
        return  # not a path at all: the writer's own check says so in one line (mechkit.io.write_atomic)
    path = Path(path)
    if not os.path.lexists(path):
        return
    folder, name = path.parent, path.name
    if name == MANIFEST:
        raise MechkitError(f"{path} is mechkit's list of the files a run wrote in {folder}, and {writer} would "
                           "replace it", "choose another --out, outside that directory")
    if name in owned_names(folder):
        raise MechkitError(f"{path} is one of the files a `{set_writer(folder) or 'mechkit'}` run wrote in {folder}, "
                           f"and {writer} would replace it", "choose another --out, outside that directory")
    if (folder / "config.json").is_file() and _model_file(name) and not _task_vector_file(path):
        raise MechkitError(f"{path} is part of the model in {folder} (a directory holding its config.json), and "
                           f"{writer} would replace it", "choose another --out, outside that model directory")


MODEL_FILES = ("config.json", "generation_config.json", "special_tokens_map.json", "added_tokens.json",
               "merges.txt", "chat_template.jinja", "chat_template.json")
MODEL_SUFFIXES = (".safetensors", ".bin", ".gguf", ".model", ".index.json", ".pt", ".pth")


def _model_file(name: str) -> bool:
    """Whether ``name`` in a model directory is part of the model (weights, config, tokenizer), not a user's note."""
    return name in MODEL_FILES or name.startswith(("tokenizer", "vocab.")) or name.endswith(MODEL_SUFFIXES)


def _task_vector_file(path: Path) -> bool:
    """A task vector (``NAME.safetensors`` with its ``NAME.safetensors.json`` beside it) or that ``.json``."""
    name = path.name
    if name.endswith(".safetensors"):
        return path.with_name(name + ".json").is_file()
    return name.endswith(".safetensors.json") and path.with_name(name.removesuffix(".json")).is_file()


def _ordered(names: Sequence[str]) -> list[str]:
    """``names`` with the key files last (they go in last and come out first): a folder's own (``model/config.json``)
    before the directory's."""
    keys = [n for n in names if n.rsplit("/", 1)[-1] in KEY_FILES]
    keys.sort(key=lambda n: "/" not in n)
    return [n for n in names if n not in keys] + keys


def foreign_in_folder(folder: Path) -> list[str]:
    """The names in an owned folder (``prune --save-model``'s ``model/``) that mechkit did not write there: not in
    the folder's own manifest, or, where it has none (an older mechkit wrote it), not a model's file."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    listed = _read_json(folder / MANIFEST)
    if isinstance(listed, dict) and isinstance(listed.get("tree"), list):  # a returned folder: every file listed
        try:
            return [f for f in tree_files(folder) if f not in set(listed["tree"])]
        except OSError:
            return []
    if (folder / MANIFEST).is_file():
        owned = set(owned_names(folder)) | {MANIFEST}
        return [n for n in names if n not in owned]
    return [n for n in names if not _model_file(n)]


def _inside_kept_folders(tmp: Path, out: Path, new: list[str], stale: list[str]) -> tuple[list[str], list[str]]:
    """The set's names, with each owned folder that holds a user's file (``pr/model/NOTES.md``) replaced by the
    files inside it: mechkit's own files there are moved aside and the new ones moved in, one by one; the folder
    and the user's file stay. ``--force`` moved the folder aside whole and deleted the note with it."""
    owned = owned_names(out)
    names_new, names_stale = [], []
    for names, into in ((new, names_new), (stale, names_stale)):
        for name in names:
            folder = out / name
            if not (_real_dir(folder) and _our_folder(out, name, owned) and foreign_in_folder(folder)):
                into.append(name)
                continue
            if name in new and not _real_dir(tmp / name):
                raise MechkitError(f"--out {out} holds {folder}, a folder mechkit wrote that now holds "
                                   f"{foreign_in_folder(folder)[0].rstrip(LINK)}, which mechkit did not write, and the new set "
                                   f"writes a file {name} there", "move that file out of the folder first")
            refuse_user_entries(out, name)
            ours = [n for n in owned_names(folder) if os.path.lexists(folder / n)] if (folder / MANIFEST).is_file() \
                else [n for n in os.listdir(folder) if _model_file(n)]
            fresh = sorted(p.name for p in (tmp / name).iterdir()) if name in new else []
            clash = [n for n in fresh if n not in ours and _real_dir(folder / n)]
            if clash:
                raise MechkitError(f"--out {out} holds a folder {name}/{clash[0]}, which mechkit did not write, where "
                                   "the new set writes", "choose another --out, or move that folder away first")
            if name in new:
                names_new += [f"{name}/{n}" for n in fresh]
                names_stale += [f"{name}/{n}" for n in ours if n not in fresh]
            else:
                names_stale += [f"{name}/{n}" for n in ours]
    return names_new, names_stale


def refuse_user_entries(out: Path, name: str) -> None:
    """Refuse (one line) an owned folder ``out/name`` that lists its whole tree (a returned folder's) and holds
    an entry of the user's a ``--force`` rerun would take with what it replaces: inside a subfolder of it, or a
    folder the user put where mechkit's file was (``m/a.txt`` made a folder: it was moved aside with the set's
    old files and deleted). Known before any work (:func:`refuse_foreign_model` runs it): the outcome does not
    depend on what the new set holds."""
    folder = out / name
    listed = _read_json(folder / MANIFEST)
    if not (_real_dir(folder) and isinstance(listed, dict) and isinstance(listed.get("tree"), list)):
        return
    foreign = foreign_in_folder(folder)  # inside a top-level folder of the user's: kept with it
    nested = [f for f in foreign if "/" in f.rstrip("/") and f.split("/")[0] + "/" not in foreign]
    if nested:  # its subfolder is replaced whole: the user's file there would go with it
        raise MechkitError(f"--out {out} holds {folder / nested[0].rstrip(LINK)}, which mechkit did not write, "
                           f"inside a subfolder of {name} the new set replaces", f"move it out of {folder} first")
    tree = set(listed["tree"])
    replaced = [n for n in owned_names(folder) if n + "/" in foreign]
    replaced += [f for f in foreign if f + "/" in tree]  # a file of the user's where its folder was
    replaced += [f[:-1] for f in foreign if f.endswith(LINK) and {f[:-1], f[:-1] + "/"} & tree]  # a link there
    if replaced:
        raise MechkitError(f"--out {out} holds {name}/{replaced[0]}, which mechkit did not write, where it wrote "
                           "another of the set a rerun replaces", f"move it out of {folder} first")


def _real_dir(path: Path) -> bool:
    """A directory itself, not a symlink to one (a link is replaced as a link; what it leads to is untouched)."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _special(path: Path) -> bool:
    """A FIFO, device or socket: never ours, never replaced (a symlink is replaced as a link, never followed)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode)


def install_set(tmp: Path, out: Path, names: Sequence[str], manifest: bool = True, writer: str | None = None) -> None:
    """Move ``names`` from ``tmp`` into the existing directory ``out`` as one set (see the module doc), with
    a manifest listing them when ``manifest``; the old files of the set end up in ``tmp/.previous`` and
    ``tmp`` is removed afterwards by the caller. ``writer`` (``prune``, ``taskvec apply``) is recorded in the
    manifest and checked against the set it replaces (:func:`refuse_foreign_model`)."""
    recover(out)
    new = [n for n in dict.fromkeys(names) if n != MANIFEST]
    if writer is not None:
        refuse_foreign_model(out, writer, new)
    stale = [n for n in owned_names(out) if n not in new and n != MANIFEST]
    if manifest:
        _write_manifest(tmp, new, writer)
        new.append(MANIFEST)
    elif (out / MANIFEST).exists():
        stale.append(MANIFEST)  # it would list another set
    new, stale = _inside_kept_folders(tmp, out, new, stale)
    new = _ordered(new)
    from mechkit.io.atomic import umask_modes

    umask_modes(tmp, fsync=True)  # as a new --out gets them (atomic_dir): an existing one got neither
    backup = tmp / ".previous"
    backup.mkdir()
    for folder in {n.split("/")[0] for n in [*new, *stale] if "/" in n}:
        (backup / folder).mkdir()
    journal = journal_path(out)
    from mechkit.io.atomic import write_atomic

    write_atomic(journal, journal_text(tmp, new, stale))
    try:
        for name in reversed(_ordered([*new, *stale])):  # key file first
            if (out / name).exists() or (out / name).is_symlink():
                os.replace(out / name, backup / name)
        for name in new:  # key file last
            os.replace(tmp / name, out / name)
    except BaseException:
        recover(out)
        raise
    journal.unlink()  # the commit
    _inherit_group(out, new)
    with contextlib.suppress(OSError):
        for folder in sorted({out, out.parent, *(out / n.split("/")[0] for n in new if "/" in n)}):
            _fsync_dir(folder)  # the renames changed these entries


@contextlib.contextmanager
def replacing_dir(target: str | os.PathLike[str], *, writer: str, force: bool = False, manifest: bool = True
                  ) -> Iterator[Path]:
    """Build a user's output directory in a temporary directory; on success it becomes ``target``.

    A new ``target`` appears in one rename (:func:`mechkit.io.atomic_dir`). An existing one, empty or (only
    with ``force``) not, stays the directory it is (its mode, owner and setgid group: a shared folder made
    for the run) and gets the new files as one set (:func:`install_set`): the
    files this write and the previous mechkit write made are replaced, every other file is kept, and a
    model another ``writer`` saved there is refused (:func:`refuse_foreign_model`). On any error (Ctrl-C
    included) ``target`` is left as it was and the temporary directory removed.

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (out / "notes.txt").write_text("mine")
    >>> with replacing_dir(out, writer="taskvec apply", force=True) as tmp:
    ...     _ = (tmp / "config.json").write_text("{}")
    >>> sorted(p.name for p in out.iterdir())
    ['.mechkit-files', 'config.json', 'notes.txt']
    """
    from mechkit.io.atomic import atomic_dir, temp_dir_beside

    target = Path(os.path.realpath(target))  # a symlinked --out: the directory it names, not the link
    recover(target)
    if not target.is_dir():
        with _naming(target), atomic_dir(target, replace=False) as tmp:
            yield tmp
            if manifest:
                _write_manifest(tmp, [p.name for p in tmp.iterdir()], writer)
        return
    empty = not any(target.iterdir())
    if not force and not empty:
        raise MechkitError(f"{target} already exists and is not an empty directory",
                           "pass --force to replace it or choose another --out")
    refuse_foreign_model(target, writer)  # before the caller's work: nothing of it would be kept
    tmp = temp_dir_beside(target)
    try:
        with _naming(target):
            yield tmp
            install_set(tmp, target, sorted(p.name for p in tmp.iterdir()), manifest=manifest, writer=writer)
    finally:
        if not journal_path(target).exists():  # else it holds the old files the journal's roll-back needs
            discard_tree(tmp)


@contextlib.contextmanager
def _naming(target: Path) -> Iterator[None]:
    """An environment error without a file name (a ``write`` on a full disk, safetensors' wrapped I/O error)
    raised while ``target`` is built names ``target``: the one line said "cannot write a file mechkit was
    writing", which left the user to guess which disk was full."""
    try:
        yield
    except Exception as err:
        from mechkit.io.fs_errors import os_error_of

        found = os_error_of(err, target)
        if found is not None and found is not err:
            raise found from err
        raise


def _inherit_group(out: Path, names: Sequence[str]) -> None:
    """In a setgid directory (a group's shared folder) the files moved in take its group, as files made
    there would: they were built beside it, where another group may apply."""
    try:
        info = out.stat()
    except OSError:
        return
    if not info.st_mode & stat.S_ISGID:
        return
    for name in names:
        for path in [out / name, *((out / name).rglob("*") if (out / name).is_dir() else ())]:
            with contextlib.suppress(OSError):
                os.chown(path, -1, info.st_gid, follow_symlinks=False)


def _write_manifest(tmp: Path, names: Sequence[str], writer: str | None) -> None:
    files = sorted({*names, MANIFEST})
    dirs = sorted(n for n in names if _real_dir(tmp / n))  # so a folder a user later puts under a file's name is theirs
    (tmp / MANIFEST).write_text(json.dumps({"writer": writer, "files": files, "dirs": dirs}), encoding="utf-8")


def write_folder_manifest(folder: Path, writer: str | None) -> None:
    """List what a folder a run returned for its report holds, where it lists nothing yet (a prepared model's own
    list is kept): its names, and under ``tree`` every file below it, so a later ``--force`` knows them all as
    mechkit's and replaces them as a set, and knows a file the user added anywhere inside as theirs. Without a
    list they counted as the user's, so a rerun left the first run's files beside the second's; with one of
    the top level only, a note the user put in a subfolder went with that subfolder."""
    if os.path.lexists(folder / MANIFEST):
        return
    _write_manifest(folder, sorted(p.name for p in folder.iterdir()), writer)
    listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    listed["tree"] = tree_files(folder)
    (folder / MANIFEST).write_text(json.dumps(listed), encoding="utf-8")


def owned_folders(out: Path) -> set[str] | None:
    """The names the last mechkit write in ``out`` made as folders (its manifest's ``dirs``); ``None`` where the
    manifest is older than that list (or absent), so it cannot say."""
    manifest = _read_json(out / MANIFEST)
    dirs = manifest.get("dirs") if isinstance(manifest, dict) else None
    return {n for n in dirs if isinstance(n, str)} if isinstance(dirs, list) else None


def _our_folder(out: Path, name: str, owned: Sequence[str]) -> bool:
    """Whether the folder ``out/name`` is one mechkit wrote: its name is in the set and the manifest lists it as a
    folder. ``inspect --out d`` wrote the file ``report.html``; a user who then made ``d/report.html/`` a folder of
    their own lost it, with all it held, to the next ``--force``. Where the manifest is older than its folder list,
    a folder counts as mechkit's only where it is a saved model (a ``config.json`` or a manifest inside)."""
    if name not in owned:
        return False
    dirs = owned_folders(out)
    if dirs is not None:
        return name in dirs
    return (out / name / "config.json").is_file() or (out / name / MANIFEST).is_file()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
