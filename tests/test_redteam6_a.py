"""Red-team pass 6 of issue 32, classes 1, 3, 6 and 10: writers, the directory's identity, reports reading
their own files, and the environment.

Each test holds one class of failure the pass found: a task vector's ``OUT.json`` overwritten without
``--force`` (or found to be a directory only after the work), a pruned copy saved over the directory
its dense model came from, ``mechkit cache clear`` deleting a user's own ``runs/`` where ``$MECHKIT_CACHE``
pointed at a project, a run's figure read through a symlink (or gigabytes of it) into a notebook, an
``--out`` that is a mount point, a symlink loop or longer than the kernel takes failing only after the
work, a full disk or ``ulimit -f`` reaching users as safetensors' traceback, and a killed write's
temporary file that nothing ever removed. The last tests fuzz paths and report files.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io.disk_cache import mark_run_dir
from tests.conftest import file_size_limit
from tests.test_reliability import _cli, _model_dir


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny:llama model directory and a noisy copy of it (the "fine-tuned" one)."""
    from tests.conftest import noisy_model_dir

    root = tmp_path_factory.mktemp("rt6a")
    return _model_dir(root / "base"), noisy_model_dir(root / "ft")


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the refusals below must come before the work."""
    def refuse(*_a, **_k):
        raise AssertionError("the model was loaded before the refusal")

    import mechkit.model

    monkeypatch.setattr(mechkit.model, "load_model", refuse)


# ---- class 1: the vector's OUT.json is part of what --out writes -----------------------------------------

@pytest.mark.parametrize("command", ["extract", "merge"])
def test_a_users_file_at_the_vectors_json_is_kept_without_force(tmp_path, capsys, dirs, no_model_load, command):
    base, ft = dirs
    mine = tmp_path / "v.safetensors.json"
    mine.write_text("my notes")
    args = (["--base", str(base), "--finetuned", str(ft)] if command == "extract"
            else ["-v", str(tmp_path / "a.safetensors"), "--method", "task_arithmetic"])
    code, err = _cli(capsys, "taskvec", command, *args, "--out", str(tmp_path / "v.safetensors"))
    assert code == 2 and "v.safetensors.json already exists" in err[-1] and "--force" in err[-1]
    assert mine.read_text() == "my notes" and not (tmp_path / "v.safetensors").exists()


def test_a_directory_at_the_vectors_json_is_refused_before_the_work(tmp_path, capsys, dirs, no_model_load):
    base, ft = dirs
    (tmp_path / "v.safetensors.json" / "sub").mkdir(parents=True)
    code, err = _cli(capsys, "taskvec", "extract", "--base", str(base), "--finetuned", str(ft),
                     "--out", str(tmp_path / "v.safetensors"), "--force")
    assert code == 2 and "not a regular file" in err[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.safetensors.json"]


def test_force_still_writes_the_vector_and_its_json(tmp_path, capsys, dirs):
    base, ft = dirs
    (tmp_path / "v.safetensors.json").write_text("old")
    code, _ = _cli(capsys, "taskvec", "extract", "--base", str(base), "--finetuned", str(ft),
                   "--out", str(tmp_path / "v.safetensors"), "--force")
    assert code == 0 and json.loads((tmp_path / "v.safetensors.json").read_text())["n_tensors"] > 0


# ---- class 1/3: a pruned copy knows the directory its weights came from -----------------------------------

def test_a_pruned_copy_is_never_saved_over_its_dense_models_directory(tmp_path, dirs):
    import shutil

    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove

    dense = tmp_path / "dense"
    shutil.copytree(dirs[0], dense)
    (dense / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in dense.iterdir()}
    pruned = prune_copy(mk.load_model(str(dense)), UnitsToRemove(mlp={0: [0, 1]}))
    for spelling in (dense, f"{dense}/", tmp_path / "x" / ".." / "dense"):
        with pytest.raises(MechkitError, match="the input"):
            save_pruned(pruned, spelling, force=True)
    with pytest.raises(MechkitError, match="the input"):
        mk.run("inspect", model=pruned, out=dense, force=True)
    assert {p.name: p.read_bytes() for p in dense.iterdir()} == before
    assert (save_pruned(pruned, tmp_path / "pruned") / "config.json").is_file()  # elsewhere it is written


def test_out_with_write_false_is_refused_not_ignored(tmp_path):
    with pytest.raises(MechkitError, match="write=False"):
        mk.run("inspect", model="tiny:llama", out=tmp_path / "run", write=False)
    assert not (tmp_path / "run").exists()


# ---- class 1/10: `cache clear` removes only what mechkit put in the cache --------------------------------

def _project_as_cache(root: Path) -> dict[str, Path]:
    """A project directory used as $MECHKIT_CACHE: the user's own runs/, toy/, gguf/, embedded/ folders
    beside one entry of each kind mechkit makes."""
    user = {g: root / g / "mine" / "notes.txt" for g in ("runs", "toy", "gguf", "embedded")}
    for path in user.values():
        path.parent.mkdir(parents=True)
        path.write_text("the user's")
    mark_run_dir(root / "runs" / "0123456789abcdef")  # as a run makes it
    (root / "runs" / "0123456789abcdef" / "fedcba9876543210.json")  # a step file.write_text("{}")
    (root / "toy" / "induction-0123456789ab").mkdir()
    (root / "gguf" / "model-0123456789abcdef").mkdir()
    (root / "gguf" / "model-0123456789abcdef" / "mechkit-cache.json").write_text("[" * 100000 + "]" * 100000)
    (root / "gguf" / ".hashes").mkdir()
    (root / "gguf" / ".hashes" / "0123456789abcdef.json").write_text("{}")
    return user


@pytest.mark.parametrize("names", [["--all"], ["runs", "toy", "gguf", "embedded"], ["runs"]])
def test_cache_clear_keeps_a_users_folders_in_the_cache_directory(tmp_path, monkeypatch, capsys, names):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    user = _project_as_cache(tmp_path)
    code, err = _cli(capsys, "cache", "list")  # a damaged entry's metadata nested 100000 deep: listed, no traceback
    assert code == 0 and err == []
    code, err = _cli(capsys, "cache", "clear", *names)
    assert code == 0 and err == []
    assert all(p.read_text() == "the user's" for p in user.values())
    assert not (tmp_path / "runs" / "0123456789abcdef").exists()
    if "runs" not in names or len(names) > 1:
        assert not (tmp_path / "gguf" / "model-0123456789abcdef").exists()
        assert not (tmp_path / "gguf" / ".hashes" / "0123456789abcdef.json").exists()


def test_cache_list_shows_only_mechkits_entries(tmp_path):
    from mechkit.io.disk_cache import clear_cache, list_cache

    _project_as_cache(tmp_path)
    names = sorted(e.name for e in list_cache(tmp_path))
    assert names == ["gguf/model-0123456789abcdef", "runs", "toy/induction-0123456789ab"]
    with pytest.raises(MechkitError, match="no cache entry"):
        clear_cache(["runs/mine"], root=tmp_path)  # the user's folder is not an entry by name either


# ---- class 6: a run's figures are read only from its own PNG files ---------------------------------------

def test_load_report_embeds_only_the_runs_own_png_files(tmp_path):
    from mechkit.report.artifact_files import MAX_IMAGE_BYTES

    out = tmp_path / "run"
    mk.run("inspect", model="tiny:llama", out=out)
    run = mk.load_report(out)
    name = run.report["artifacts"][0]
    good = (out / name).read_bytes()
    assert run.images() == {name: good}
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-CONTENT")

    def huge(p: Path) -> None:
        p.write_bytes(good)
        os.truncate(p, MAX_IMAGE_BYTES + 1)

    for make in (lambda p: p.symlink_to(secret), lambda p: p.write_text("SECRET-CONTENT"),
                 lambda p: p.symlink_to(out / "report.json"), os.mkfifo, huge):
        (out / name).unlink()
        make(out / name)
        start = time.perf_counter()
        assert run.images() == {} and "SECRET" not in run._repr_html_()
        assert time.perf_counter() - start < 5


# ---- class 3/10: --out that cannot be written is refused before the work ---------------------------------

def test_a_symlink_loop_is_refused_before_the_work_and_not_told_to_pass_force(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("loop").symlink_to("loop")
    Path("a").symlink_to("b")
    Path("b").symlink_to("a")
    for out in ("loop", "a/run"):
        for force in (False, True):
            with pytest.raises(MechkitError, match="symlink loop") as err:
                mk.run("inspect", model="no-such-model-is-loaded", out=out, force=force)
            assert "--force" not in str(err.value)


def test_a_path_longer_than_the_kernel_takes_is_refused_before_the_work(tmp_path):
    from mechkit.io import check_out

    deep = tmp_path.joinpath(*["d" * 200] * 25)
    with pytest.raises(MechkitError, match="as a full path"):
        mk.run("inspect", model="no-such-model-is-loaded", out=deep)
    with pytest.raises(MechkitError, match="as a full path"):
        check_out(deep / "v.safetensors", kind="file")
    assert check_out(tmp_path.joinpath(*["d" * 200] * 10)) is not None  # long but within the limit


def test_a_mount_point_out_is_refused_and_a_directory_inside_it_is_not(tmp_path, monkeypatch):
    from mechkit.io import check_out

    mount = tmp_path / "disk"
    mount.mkdir()
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == mount or real_ismount(p))
    from mechkit.io import out as out_mod

    monkeypatch.setattr(out_mod, "is_mount_point", lambda path: None)  # where fdinfo is not shown: ismount decides
    for spelling in (mount, f"{mount}/", tmp_path / "x" / ".." / "disk"):
        with pytest.raises(MechkitError, match="mount point") as err:
            check_out(spelling, force=True)
        assert "--out " + str(Path(spelling) / "run") in str(err.value)
    assert check_out(mount / "run") == mount / "run"


def test_a_real_mount_point_is_refused(tmp_path):
    """With a real tmpfs (needs root): the run failed after the work with EBUSY (empty) or EXDEV (--force)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root; the monkeypatched test above covers the check")
    try:
        with pytest.raises(MechkitError, match="mount point"):
            mk.run("inspect", model="no-such-model-is-loaded", out=mount)
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# ---- class 10: a full disk or a file-size limit is one line naming the file ------------------------------

def test_a_file_size_limit_is_one_line_and_leaves_nothing(tmp_path, capsys, dirs):
    """``ulimit -f``: safetensors raised its own SafetensorError (a traceback), report files an OSError
    without a mapped errno (EFBIG)."""
    base, ft = dirs
    out = tmp_path / "v.safetensors"
    with file_size_limit(64 * 1024):
        code, err = _cli(capsys, "taskvec", "extract", "--base", str(base), "--finetuned", str(ft), "--out", str(out))
    assert code == 2 and err[-1].startswith(f"mechkit: error: cannot write {out}: a file is larger")
    assert "ulimit -f" in err[-1] and os.listdir(tmp_path) == []


def test_a_write_error_without_a_file_name_names_the_target(tmp_path):
    from mechkit.io import write_atomic
    from mechkit.io.fs_errors import os_error_of

    class SafetensorError(Exception):  # safetensors' own type: no OSError
        pass

    found = os_error_of(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
                        tmp_path / "v")
    assert (found.errno, found.filename) == (errno.ENOSPC, str(tmp_path / "v"))
    with file_size_limit(16), pytest.raises(OSError) as err:
        write_atomic(tmp_path / "big.json", "x" * 4096)
    assert err.value.errno == errno.EFBIG and err.value.filename == str(tmp_path / "big.json")
    assert os.listdir(tmp_path) == []


# ---- class 10: what a killed write leaves is recognised and removed --------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_file_writes_temporary_is_removed_by_the_next_write(tmp_path, monkeypatch):
    from mechkit.io import write_atomic
    from mechkit.io.disk_cache import list_cache

    target = tmp_path / "v.safetensors"
    dead = tmp_path / f".v.safetensors.tmp-{_dead_pid()}-0123abcd"  # this mechkit's name for it
    old = tmp_path / ".v.safetensors.0123abcd.tmp"  # an older mechkit's, without the pid
    live = tmp_path / f".v.safetensors.tmp-{os.getpid()}-0123abce"  # a write still running
    for p in (dead, old, live):
        p.write_bytes(b"half a vector")
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    assert [e.name for e in list_cache()] == ["leftovers"]
    write_atomic(target, "whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "v.safetensors"]


# ---- fuzz: paths and report files ------------------------------------------------------------------------

def test_fuzz_every_spelling_of_a_directory_shares_one_lock(tmp_path, monkeypatch):
    from mechkit.io.outlock import lock_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "sub").mkdir()
    Path("link").symlink_to("runs")
    Path("alink").symlink_to(tmp_path / "runs" / "a")
    rng = random.Random(6)
    want = lock_path(tmp_path / "runs" / "a")
    for _ in range(300):
        head = rng.choice(["runs", "./runs", "link", str(tmp_path / "runs"), "runs/sub/..", "link/./sub/..",
                           "runs//", str(tmp_path / "link")])
        spelling = rng.choice([f"{head}/a", "alink", f"{tmp_path}/alink"]) + rng.choice(["", "/", "//", "/."])
        assert lock_path(spelling) == want, spelling


def test_fuzz_odd_out_paths_are_one_line_or_accepted(tmp_path, monkeypatch):
    from mechkit.io import check_out

    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("x")
    Path("loop").symlink_to("loop")
    os.mkfifo(tmp_path / "fifo")
    rng = random.Random(32)
    parts = ["f", "loop", "fifo", "..", ".", "~", "a" * 220, "b" * 200, "\n", "\x7f", "é", "\udcff", "", "new"]
    for _ in range(400):
        path = "/".join(rng.choice(parts) for _ in range(rng.randint(1, 4)))
        for kind in ("dir", "file"):
            try:
                check_out(path or ".", force=rng.random() < 0.5, kind=kind)
            except MechkitError as err:
                assert "\n" not in str(err)  # one line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "fifo", "loop"]  # the probe leaves nothing


def test_fuzz_damaged_report_files_are_one_line(tmp_path):
    from mechkit.report import load_report

    out = tmp_path / "run"
    mk.run("inspect", model="tiny:llama", out=out)
    good = (out / "report.json").read_bytes()
    rng = random.Random(60)
    for i in range(150):
        data = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(data))
            action = rng.random()
            if action < 0.4:
                data[at] = rng.randrange(256)
            elif action < 0.7:
                del data[at:at + rng.randint(1, 200)]
            else:
                data[at:at] = rng.choice([b"[" * 5000, b"\xff", b"1e999", b"NaN", b'"', b"{}", b"-0"])
        (out / "report.json").write_bytes(bytes(data))
        try:
            report = load_report(out)
        except MechkitError as err:
            assert "\n" not in str(err), i
            continue
        assert isinstance(report, dict)


def test_a_non_utf8_out_is_refused_before_the_work(tmp_path, capsys, dirs, no_model_load, monkeypatch):
    """A vector or model written under such a path could not be opened again by safetensors or the tokenizer
    (``taskvec apply --out $'m\\xff'`` raised UnicodeEncodeError after the work)."""
    base, ft = dirs
    odd = os.fsdecode(bytes(tmp_path) + b"/m\xff")
    code, err = _cli(capsys, "taskvec", "extract", "--base", str(base), "--finetuned", str(ft), "--out", odd)
    assert code == 2 and "not UTF-8" in err[-1]
    (tmp_path / os.fsdecode(b"d\xff")).mkdir()
    monkeypatch.chdir(tmp_path / os.fsdecode(b"d\xff"))
    with pytest.raises(MechkitError, match="working directory of --out holds bytes that are not UTF-8"):
        mk.run("inspect", model="no-such-model-is-loaded", out="run")
    assert sorted(os.listdir(tmp_path)) == [os.fsdecode(b"d\xff")]


def test_a_vector_name_leaves_room_for_its_json(tmp_path, capsys, dirs, no_model_load):
    base, ft = dirs
    code, err = _cli(capsys, "taskvec", "extract", "--base", str(base), "--finetuned", str(ft),
                     "--out", str(tmp_path / ("v" * 199 + ".safetensors")))
    assert code == 2 and "at most 210 bytes" in err[-1] and os.listdir(tmp_path) == []


# ---- class 10: an odd $MECHKIT_CACHE is named as the place to change ------------------------------------

def test_a_cache_that_cannot_take_a_gguf_is_refused_before_converting(tmp_path, monkeypatch):
    from mechkit.model.sources import gguf

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "afile" / "cache"))
    monkeypatch.setattr(gguf, "load_gguf", lambda *a, **k: pytest.fail("dequantized before the refusal"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(MechkitError, match=r"cannot write mechkit's cache .* point \$MECHKIT_CACHE"):
        gguf.cached_gguf(model)


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC, errno.EFBIG])
def test_a_write_error_in_the_cache_names_mechkit_cache_not_out(tmp_path, monkeypatch, code):
    from mechkit.io.fs_errors import describe

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    for where in (tmp_path / "cache", tmp_path / "cache" / "gguf" / "x"):
        line = describe(OSError(code, os.strerror(code), str(where)))
        assert "$MECHKIT_CACHE" in line.fix and "--out" not in line.fix


def test_an_out_above_the_cache_is_not_said_to_be_inside_it(tmp_path, monkeypatch):
    from mechkit.io import check_out

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "proj" / ".cache"))
    with pytest.raises(MechkitError, match="holds mechkit's cache"):
        check_out(tmp_path / "proj", force=True)
    with pytest.raises(MechkitError, match="is inside mechkit's cache"):
        check_out(tmp_path / "proj" / ".cache" / "run")


def test_a_killed_step_writes_temporary_in_the_cache_is_listed_and_cleared(tmp_path, monkeypatch, capsys):
    steps = tmp_path / "runs" / "0123456789abcdef"
    mark_run_dir(steps)  # as a run makes it
    (steps / "aaaaaaaaaaaaaaaa.json").write_text("{}")
    half = steps / f".aaaaaaaaaaaaaaaa.json.tmp-{_dead_pid()}-0123abcd"
    half.write_text("half")
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    code, _ = _cli(capsys, "cache", "clear", "leftovers")
    assert code == 0 and not half.exists() and (steps / "aaaaaaaaaaaaaaaa.json").exists()


def test_a_toy_model_trained_into_an_unwritable_cache_is_still_used(tmp_path, monkeypatch, capsys):
    """The toy model trains for a minute before it is saved: a read-only cache refused it only then."""
    from mechkit.model.sources import toy
    from mechkit.model.sources.tiny import byte_tokenizer, tiny_model

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "afile" / "cache"))
    trained = tiny_model("llama")[0]
    monkeypatch.setattr(toy, "train_induction_model", lambda **_: (trained, byte_tokenizer()))
    model, _ = toy.toy_model(seed=12345)
    assert model is trained and "warning: cannot keep the toy model" in capsys.readouterr().err


@pytest.mark.parametrize("make", ["dir", "fifo"])
def test_a_compare_page_that_is_not_a_file_is_refused_with_a_fix_that_exists(tmp_path, capsys, no_model_load, make):
    out = tmp_path / "cmp"
    out.mkdir()
    page = out / "compare.html"
    page.mkdir() if make == "dir" else os.mkfifo(page)
    code, err = _cli(capsys, "report", "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--force")
    assert code == 2 and "compare.html is not a regular file" in err[-1] and "remove it" in err[-1]


def test_a_deleted_working_directory_is_one_line_for_every_writer(tmp_path, monkeypatch, capsys, dirs):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    for out in ("run", str(tmp_path / "run"), None):
        with pytest.raises(MechkitError, match="working directory no longer exists"):
            mk.run("inspect", model="no-such-model-is-loaded", out=out)
    code, err = _cli(capsys, "taskvec", "extract", "--base", str(dirs[0]), "--finetuned", str(dirs[1]),
                     "--out", str(tmp_path / "v.safetensors"))
    assert code == 2 and "working directory no longer exists" in err[-1]


@pytest.mark.parametrize("command", ["extract", "merge"])
def test_a_file_out_ending_with_a_slash_is_not_written_as_a_file(tmp_path, capsys, dirs, no_model_load, command):
    """``--out vecs/`` wrote a file named ``vecs`` (and ``vecs.json``): a directory was asked for."""
    base, ft = dirs
    args = (["--base", str(base), "--finetuned", str(ft)] if command == "extract"
            else ["-v", str(tmp_path / "a.safetensors"), "--method", "task_arithmetic"])
    code, err = _cli(capsys, "taskvec", command, *args, "--out", f"{tmp_path}/vecs/")
    assert code == 2 and "ends with /" in err[-1] and os.listdir(tmp_path) == []


def test_the_rho_tools_json_never_replaces_a_pipe(tmp_path, monkeypatch, capsys):
    from tests.rho_tool import rho_tool

    tool = rho_tool()
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "rho.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tool, "run", lambda args: pytest.fail("the features were computed before the check"))
    assert tool.main(["run", "--json", "rho.json"]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "rho.json").is_file()


@pytest.mark.parametrize("var,value,want", [("MECHKIT_CACHE", "~/mk-cache", "mk-cache"),
                                            ("XDG_CACHE_HOME", "~/xdg", "xdg/mechkit")])
def test_a_cache_path_with_an_unexpanded_tilde_is_the_home_directorys(monkeypatch, var, value, want):
    from mechkit.io.disk_cache import cache_root

    monkeypatch.delenv("MECHKIT_CACHE", raising=False)
    monkeypatch.setenv(var, value)
    assert cache_root() == Path.home() / want


def test_a_model_saved_with_force_into_an_existing_directory_gets_the_umasks_mode(tmp_path, dirs):
    """safetensors writes 0600; a new directory got the umask's mode, one written with --force kept 0600."""
    from mechkit.io.atomic import file_mode
    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove

    pruned = prune_copy(mk.load_model(str(dirs[0])), UnitsToRemove(mlp={0: [0]}))
    out = save_pruned(pruned, tmp_path / "pruned")
    (out / "notes.txt").write_text("mine")
    save_pruned(pruned, out, force=True)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == file_mode()
    assert (out / "notes.txt").read_text() == "mine"
