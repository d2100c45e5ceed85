"""Red-team pass 21, helper A's failures, each fixed in general.

A finished run deleted its steps folder whole, a user's files put there with it; ``--force`` moved an owned
folder (``prune --save-model``'s ``model/``) aside whole, a user's notes inside with it; ``report compare
--force`` replaced a ``compare.html`` it never wrote and wrote into an input run's directory; a killed
checkpoint's temporary file inside a scratch folder was on no ``cache list`` row and never cleared; a file
bind-mounted inside an owned folder was moved into a hidden temporary folder left behind; the saved pruned
model's folder was 0700 under umask 022.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import put_files, run_folder

TEMP = ".checkpoint.safetensors.tmp-999999-0a1b2c3d"  # a killed writer's (pid 999999 is not alive)




# --- F2: a finished run removes only what runs write in its steps folder ----------------------------------


@pytest.mark.parametrize("users", [
    {"notes.txt": "mine"}, {"finetune/mynotes.txt": "mine2"}, {"notes.txt": "a", "finetune/mynotes.txt": "b"},
    {".git/HEAD": "ref"}, {"finetunes/ft-3/results.csv": "1,2"}])
def test_finishing_a_run_folder_keeps_a_users_files(tmp_path, users):
    from mechkit.io.disk_cache import CHECKPOINT_FILE, RUN_MARKER, finish_run_dir

    folder = run_folder(tmp_path, "finetune", "finetunes")
    put_files(folder, {"finetune/" + CHECKPOINT_FILE: "w", "finetunes/ft-3/" + CHECKPOINT_FILE: "w",
                  "finetune/" + TEMP: "half", "abcdefabcdefabcd.json": "{}"})
    put_files(folder, users)
    kept = finish_run_dir(folder)
    assert kept
    assert all((folder / name).read_text() == text for name, text in users.items())
    left = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert left == set(users)  # the marker, the steps, the checkpoints and the temporaries are gone
    assert not (folder / RUN_MARKER).exists()


def test_finishing_a_run_folder_of_only_its_own_files_removes_the_folder(tmp_path):
    from mechkit.io.disk_cache import CHECKPOINT_FILE, finish_run_dir

    folder = run_folder(tmp_path, "finetune", "finetunes")
    put_files(folder, {"finetune/" + CHECKPOINT_FILE: "w", "finetunes/ft-1/" + TEMP: "x"})
    assert finish_run_dir(folder) == []
    assert not folder.exists()


class Steps(mk.Plugin):
    name, version, summary = "steps21", "0.0.1", "test plugin with a resumable step"
    needs_model = False
    options = (mk.Option("stop", bool, False, is_flag=True),)

    def run(self, ctx):
        first = ctx.step("first", lambda: {"value": 1})
        if ctx.params["stop"] or STOP:
            raise KeyboardInterrupt
        return mk.Result(results={"sum": first["value"]})


STOP: list[int] = []


@pytest.mark.parametrize("users", [{"notes.txt": "mine"}, {"scratch/mynotes.txt": "mine2"}])
def test_a_finished_run_keeps_a_users_files_in_its_steps_folder_and_says_so(tmp_path, monkeypatch, users):
    from mechkit.io.disk_cache import RUN_MARKER

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    STOP.append(1)
    try:
        with pytest.raises((KeyboardInterrupt, MechkitError)):
            mk.run(Steps, out=tmp_path / "run", console=Console(file=io.StringIO()))
    finally:
        STOP.clear()
    (resume,) = [p.parent for p in (tmp_path / "cache" / "runs").glob("*/" + RUN_MARKER)]
    put_files(resume, users)
    log = io.StringIO()
    run = mk.run(Steps, out=tmp_path / "run", console=Console(file=log, width=400))  # resumes, finishes
    assert run.results == {"sum": 1}
    assert all((resume / name).read_text() == text for name, text in users.items())
    assert not (resume / RUN_MARKER).exists() and not list(resume.glob("*.json"))
    warnings = [line for line in log.getvalue().splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(resume) in warnings[0] and "left the rest" in warnings[0]
    for name in users:
        (resume / name).unlink()
        if (resume / name).parent != resume:
            (resume / name).parent.rmdir()  # the user's own folder too: a run leaves a folder it did not make
    log = io.StringIO()
    mk.run(Steps, out=tmp_path / "run", console=Console(file=log, width=400), force=True)
    assert not any((tmp_path / "cache" / "runs").glob("[0-9a-f]*")) and "warning" not in log.getvalue()  # its own


# --- F1: a killed checkpoint's temporary file inside a scratch folder is a leftover -------------------------


@pytest.mark.parametrize("where", ["finetune", "finetunes/ft-2", "finetunes/ft-2/unit"])
@pytest.mark.parametrize("user_file", [False, True])
def test_a_temporary_file_inside_a_scratch_folder_is_a_leftover(tmp_path, monkeypatch, where, user_file):
    from mechkit.io.disk_cache import CHECKPOINT_FILE, LEFTOVERS, clear_cache, list_cache

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = run_folder(tmp_path, "finetune", "finetunes")
    put_files(folder, {f"{where}/{CHECKPOINT_FILE}": "w", f"{where}/{TEMP}": "half"})
    if user_file:
        put_files(folder, {"notes.txt": "mine"})
    assert LEFTOVERS in [e.name for e in list_cache(tmp_path)]
    clear_cache([LEFTOVERS], root=tmp_path)
    assert not (folder / where / TEMP).exists()
    assert (folder / where / CHECKPOINT_FILE).read_text() == "w"
    assert not user_file or (folder / "notes.txt").read_text() == "mine"


# --- F5: --force replaces only what an owned folder's own manifest lists ------------------------------------


def _owned_model_set(out: Path, folder_manifest: bool = True) -> None:
    from mechkit.io.replace import MANIFEST

    out.mkdir()
    (out / "report.json").write_text('{"old": 1}')
    (out / "model").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (out / "model" / name).write_text("old " + name)
    if folder_manifest:
        (out / "model" / MANIFEST).write_text(json.dumps({"writer": "prune", "files": [
            MANIFEST, "config.json", "model.safetensors", "tokenizer.json"], "dirs": []}))
    (out / MANIFEST).write_text(json.dumps({"writer": "prune", "files": [MANIFEST, "model", "report.json"],
                                            "dirs": ["model"]}))


def _new_model_set(tmp: Path, extra: str | None = None) -> None:
    (tmp / "report.json").write_text('{"new": 1}')
    (tmp / "model").mkdir()
    for name in ("config.json", "model.safetensors", *([extra] if extra else [])):
        (tmp / "model" / name).write_text("new " + name)


@pytest.mark.parametrize("users", [{"model/NOTES.md": "my notes"}, {"model/a.txt": "1", "model/b.csv": "2"},
                                   {"model/.hidden": "h"}, {"model/sub/deep.txt": "d"}])
@pytest.mark.parametrize("folder_manifest", [True, False])
def test_force_keeps_a_users_file_inside_an_owned_folder(tmp_path, users, folder_manifest):
    from mechkit.io.replace import replacing_dir

    out = tmp_path / "pr"
    _owned_model_set(out, folder_manifest)
    put_files(out, users)
    with replacing_dir(out, writer="prune", force=True) as tmp:
        _new_model_set(tmp)
    assert all((out / name).read_text() == text for name, text in users.items())
    assert (out / "model" / "config.json").read_text() == "new config.json"
    assert (out / "report.json").read_text() == '{"new": 1}'
    assert not (out / "model" / "tokenizer.json").exists()  # the old set's file the new one lacks
    assert [p.name for p in tmp_path.iterdir()] == ["pr"]  # nothing hidden left beside it


def test_force_keeps_a_users_file_inside_an_owned_folder_the_new_set_drops(tmp_path):
    from mechkit.io.replace import replacing_dir

    out = tmp_path / "pr"
    _owned_model_set(out)
    put_files(out, {"model/NOTES.md": "mine"})
    with replacing_dir(out, writer="prune", force=True) as tmp:
        (tmp / "report.json").write_text('{"new": 1}')
    assert sorted(p.name for p in (out / "model").iterdir()) == ["NOTES.md"]


@pytest.mark.parametrize("fail_at", [1, 2, 4, 6, 8])
def test_a_killed_nested_install_rolls_back_whole_and_keeps_the_users_file(tmp_path, monkeypatch, fail_at):
    from mechkit.io import replace
    from mechkit.io.journal import journal_path, recover

    out = tmp_path / "pr"
    _owned_model_set(out)
    put_files(out, {"model/NOTES.md": "mine"})
    before = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    calls = []
    real = os.replace

    def dying(a, b):
        if str(b).endswith(".mechkit-replace"):  # the journal's own atomic write
            return real(a, b)
        calls.append(1)
        if len(calls) == fail_at:
            raise SystemExit("killed")
        real(a, b)

    monkeypatch.setattr(replace.os, "replace", dying)
    monkeypatch.setattr(replace, "recover", lambda out: False)  # killed: no roll-back in the writer itself
    with pytest.raises(SystemExit), replace.replacing_dir(out, writer="prune", force=True) as tmp:
        _new_model_set(tmp, extra="tokenizer_config.json")
    monkeypatch.setattr(replace.os, "replace", real)
    assert journal_path(out).exists()
    assert recover(out)  # the next writer's (or `cache clear`'s) roll-back
    after = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert after == before
    with replace.replacing_dir(out, writer="prune", force=True) as tmp:  # the rerun, not killed
        _new_model_set(tmp)
    assert (out / "model" / "NOTES.md").read_text() == "mine" and not journal_path(out).exists()


def test_a_journal_may_name_a_file_inside_a_folder_but_not_deeper_or_outside():
    from mechkit.io.journal import set_name

    assert set_name("model/config.json") and set_name("report.json")
    assert not any(set_name(n) for n in ("../x", "a/../b", "a/b/c", "/etc", "", "a/", 3))


# --- F4: a mount point anywhere under a name --force would move ---------------------------------------------


def _mountinfo(tmp_path: Path, *points: str) -> Path:
    info = tmp_path / "mountinfo"
    info.write_text("".join(f"4{i} 27 254:0 /src {p} rw,relatime - ext4 /dev/vda rw\n" for i, p in enumerate(points)))
    return info


@pytest.mark.parametrize("inside", ["model/config.json", "model/sub", "model/sub/deep.bin"])
def test_force_over_a_mount_inside_an_owned_folder_is_refused_before_the_work(tmp_path, monkeypatch, inside):
    from mechkit.io import out as out_mod
    from mechkit.io import read as read_mod

    out = tmp_path / "pr"
    _owned_model_set(out)
    (out / inside).parent.mkdir(parents=True, exist_ok=True)
    (out / inside).write_text("user")
    monkeypatch.setattr(read_mod, "MOUNTINFO", str(_mountinfo(tmp_path, str(out / inside))))
    with pytest.raises(MechkitError, match="inside it is a mount point") as err:
        out_mod.check_out(out, force=True)
    assert "\n" not in str(err.value) and "unmount" in str(err.value)
    (out / "userdir").mkdir()  # a mount beside the names --force moves is no matter
    monkeypatch.setattr(read_mod, "MOUNTINFO", str(_mountinfo(tmp_path, str(out / "userdir"))))
    assert out_mod.check_out(out, force=True) == out


needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="bind mounts need root")


@needs_root
def test_a_file_bind_mounted_inside_an_owned_folder_is_refused_for_real(tmp_path):
    import subprocess

    from mechkit.io.out import check_out

    out = tmp_path / "pr"
    _owned_model_set(out)
    user = tmp_path / "userfile"
    user.write_text("user data")
    subprocess.run(["mount", "--bind", str(user), str(out / "model" / "config.json")], check=True)
    try:
        with pytest.raises(MechkitError, match="holds model, which --force would replace"):
            check_out(out, force=True)
    finally:
        subprocess.run(["umount", str(out / "model" / "config.json")], check=True)
    assert user.read_text() == "user data"


# --- F6: report compare writes an owned set -----------------------------------------------------------------


def _run_report(value: float) -> dict:
    from mechkit.report import build_report

    return build_report(plugin="inspect", plugin_version="0.1.0", model={"spec": "gpt2", "name": "tiny"},
                        params={"x": value}, seed=0, results={"value": value}, artifacts=[], timings={"run_s": 0.1})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from mechkit.report import write_report

    root = tmp_path_factory.mktemp("runs")
    for name, value in (("ra", 1.0), ("rb", 2.0)):
        write_report(root / name, _run_report(value))
    return root


def _compare(runs: Path):
    from mechkit.report import compare_runs

    return compare_runs([runs / "ra", runs / "rb"])


@pytest.mark.parametrize("page", ["<p>MY OWN page</p>", "", "<html><title>notes</title></html>"])
def test_compare_force_never_replaces_a_page_it_did_not_write(runs, tmp_path, page):
    from mechkit.report import write_compare

    out = tmp_path / "ud"
    out.mkdir()
    (out / "compare.html").write_text(page)
    with pytest.raises(MechkitError, match="compare.html, which mechkit did not write") as err:
        write_compare(_compare(runs), out, force=True)
    assert "\n" not in str(err.value)
    assert (out / "compare.html").read_text() == page


@pytest.mark.parametrize("which", ["ra", "rb"])
def test_compare_into_an_input_run_is_refused(runs, which):
    from mechkit.report import write_compare

    with pytest.raises(MechkitError, match="input"):
        write_compare(_compare(runs), runs / which, force=True)
    assert not (runs / which / "compare.html").exists()


def test_compare_writes_a_manifest_and_force_replaces_only_its_own_page(runs, tmp_path):
    from mechkit.io.replace import MANIFEST, set_writer
    from mechkit.report import write_compare

    out = tmp_path / "uc"
    write_compare(_compare(runs), out)
    assert set_writer(out) == "report compare" and "compare.html" in json.loads((out / MANIFEST).read_text())["files"]
    (out / "notes.txt").write_text("mine")
    write_compare(_compare(runs), out, force=True)
    assert (out / "notes.txt").read_text() == "mine" and "runs compared" in (out / "compare.html").read_text()
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    write_compare(_compare(runs), user, force=True)  # a folder of the user's own files: the page is added
    assert (user / "notes.txt").read_text() == "mine" and (user / "compare.html").is_file()


def test_compare_force_over_another_runs_files_is_refused(runs, tmp_path):
    from mechkit.report import write_compare, write_report

    other = tmp_path / "other"
    write_report(other, _run_report(3.0))
    with pytest.raises(MechkitError, match="report compare would replace them"):
        write_compare(_compare(runs), other, force=True)
    assert (other / "report.json").is_file()


# --- row 20: the saved pruned model's folder gets the umask's permissions -----------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_the_folder_a_study_saves_into_gets_the_umasks_mode(monkeypatch, mask):
    from mechkit.pruning import study as study_mod

    seen = {}

    def fake_save(pruned, out):
        seen["mode"] = stat.S_IMODE(Path(out).stat().st_mode)
        return Path(out)

    monkeypatch.setattr(study_mod, "save_pruned", fake_save)
    self = type("S", (), {"pruned": lambda self, row: None})()
    old = os.umask(mask)
    try:
        path = study_mod.PruneStudy.save(self, {})
    finally:
        os.umask(old)
        shutil.rmtree(seen.get("path", ""), ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)
    assert seen["mode"] == 0o777 & ~mask
