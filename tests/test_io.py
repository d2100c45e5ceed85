"""mechkit.io: atomic files and directories under concurrency and failure, and the ``--out`` check."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mechkit.errors import MechkitError
from mechkit.io import atomic_dir, atomic_file, check_out, temp_dir_beside, write_atomic

ROOT = Path(__file__).resolve().parents[1]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---- concurrent writers ----------------------------------------------------------------------

_WRITER = """
import sys
from mechkit.io import write_atomic
path, letter, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(n):
    write_atomic(path, letter.encode() * 200_000)
"""


def test_concurrent_writers_of_one_file_never_mix_and_leave_no_temp_file(tmp_path):
    """Two processes rewrite the same file many times while a reader watches it: every read is one
    writer's whole content (never a mix, never empty or short), and nothing else is left."""
    path = tmp_path / "shared.bin"
    write_atomic(path, b"a" * 200_000)
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), letter, "150"], cwd=ROOT)
               for letter in "ab"]
    reads = 0
    while any(w.poll() is None for w in writers):
        data = path.read_bytes()
        assert len(data) == 200_000 and data in (b"a" * 200_000, b"b" * 200_000)
        reads += 1
    assert reads > 0
    assert [w.returncode for w in writers] == [0, 0]
    assert path.read_bytes() in (b"a" * 200_000, b"b" * 200_000)
    assert _names(tmp_path) == ["shared.bin"]


def test_concurrent_threads_through_atomic_file_never_share_a_temp_name(tmp_path):
    path = tmp_path / "w.bin"
    errors: list[BaseException] = []

    def work(letter: bytes) -> None:
        try:
            for _ in range(200):
                with atomic_file(path) as tmp:
                    assert tmp.parent == tmp_path and tmp != path
                    tmp.write_bytes(letter * 50_000)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(c,)) for c in (b"x", b"y", b"z")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert path.read_bytes() in (b"x" * 50_000, b"y" * 50_000, b"z" * 50_000)
    assert _names(tmp_path) == ["w.bin"]


def _build_full(target: Path, label: str, barrier: threading.Barrier, outcome: dict) -> None:
    try:
        with atomic_dir(target) as tmp:
            for i in range(20):
                (tmp / f"part{i}").write_text(label)
            barrier.wait()  # both have built their directory before either renames it
        outcome[label] = "won"
    except MechkitError as err:
        outcome[label] = err


def _build_empty(target: Path, label: str, barrier: threading.Barrier, outcome: dict) -> None:
    """An empty winner: a plain rename(2) onto an empty directory would replace it silently."""
    try:
        with atomic_dir(target):
            barrier.wait()
        outcome[label] = "won"
    except MechkitError as err:
        outcome[label] = err


@pytest.mark.parametrize("build", [_build_full, _build_empty], ids=["full", "empty"])
def test_concurrent_atomic_dir_builders_one_wins_whole_the_other_is_told(tmp_path, build):
    """Many rounds: exactly one builder wins, the other gets a one-line MechkitError, the directory
    is entirely the winner's, and no temporary directory is left."""
    for round_ in range(30):
        target = tmp_path / f"run{round_}"
        barrier, outcome = threading.Barrier(2, timeout=60), {}
        threads = [threading.Thread(target=build, args=(target, label, barrier, outcome)) for label in "ab"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [k for k, v in outcome.items() if v == "won"]
        losers = [v for v in outcome.values() if isinstance(v, MechkitError)]
        assert len(winners) == 1 and len(losers) == 1, outcome
        assert "\n" not in str(losers[0]) and str(target) in str(losers[0])
        if build is _build_full:
            assert {p.read_text() for p in target.iterdir()} == {winners[0]} and len(_names(target)) == 20
        else:
            assert _names(target) == []
    assert _names(tmp_path) == sorted(f"run{i}" for i in range(30))


def test_atomic_dir_refuses_an_existing_target_before_building(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "mine").write_text("keep")
    with pytest.raises(MechkitError, match="already exists"), atomic_dir(target):
        pytest.fail("the body must not run")  # pragma: no cover
    assert (target / "mine").read_text() == "keep" and _names(tmp_path) == ["out"]


# ---- failure leaves nothing behind -----------------------------------------------------------

@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_an_exception_inside_atomic_dir_leaves_nothing(tmp_path, exc):
    target = tmp_path / "model"
    with pytest.raises(exc), atomic_dir(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights").write_bytes(b"\0" * 1000)
        raise exc("interrupted")
    assert _names(tmp_path) == []


def test_an_exception_inside_atomic_dir_with_replace_keeps_the_old_directory(tmp_path):
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "v").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target, replace=True) as tmp:
        (tmp / "v").write_text("new")
        raise RuntimeError("boom")
    assert (target / "v").read_text() == "old" and _names(tmp_path) == ["model"]


def test_failing_rename_keeps_the_previous_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "v.json"
    write_atomic(path, "first")

    def fail(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "second")
    with pytest.raises(OSError, match="disk full"), atomic_file(path) as tmp:
        tmp.write_text("third")
    assert path.read_text() == "first" and _names(tmp_path) == ["v.json"]


def test_an_exception_inside_atomic_file_keeps_the_previous_file(tmp_path):
    path = tmp_path / "w.bin"
    write_atomic(path, b"old")
    with pytest.raises(ValueError), atomic_file(path) as tmp:
        tmp.write_bytes(b"half")
        raise ValueError("serializer failed")
    assert path.read_bytes() == b"old" and _names(tmp_path) == ["w.bin"]


# ---- replace ------------------------------------------------------------------------------------

@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
@pytest.mark.parametrize("old_kind", ["dir", "file"])
def test_replace_swaps_the_whole_directory_and_removes_the_old_one(tmp_path, monkeypatch, exchange, old_kind):
    if not exchange:  # the portable path: what runs where renameat2 is missing
        monkeypatch.setattr("mechkit.io.atomic._renameat2", lambda *_: False)
    target = tmp_path / "model"
    if old_kind == "dir":
        target.mkdir()
        (target / "stale").write_text("old")
    else:
        target.write_text("a file")
    with atomic_dir(target, replace=True) as tmp:
        (tmp / "fresh").write_text("new")
    assert _names(target) == ["fresh"] and _names(tmp_path) == ["model"]


def test_two_renames_fallback_restores_the_old_directory_when_the_second_rename_fails(tmp_path, monkeypatch):
    monkeypatch.setattr("mechkit.io.atomic._renameat2", lambda *_: False)
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        (tmp / "v").write_text("old")
    real_replace, calls = os.replace, []

    def second_fails(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(OSError, match="disk full"), atomic_dir(target, replace=True) as tmp:
        (tmp / "v").write_text("new")
    assert len(calls) == 3  # set aside, failed swap, put back
    assert (target / "v").read_text() == "old" and _names(tmp_path) == ["model"]


# ---- permissions ----------------------------------------------------------------------------

def test_files_and_directories_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        f = write_atomic(tmp_path / "f.json", "{}")
        with atomic_file(tmp_path / "g.bin") as tmp:
            tmp.write_bytes(b"1")
        with atomic_dir(tmp_path / "d") as tmp:
            (tmp / "inner").write_text("x")
        spare = temp_dir_beside(tmp_path / "e")
    finally:
        os.umask(old)
    assert stat.S_IMODE(f.stat().st_mode) == 0o640  # not mkstemp's 0600
    assert stat.S_IMODE((tmp_path / "g.bin").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o750  # not mkdtemp's 0700
    assert stat.S_IMODE(spare.stat().st_mode) == 0o750


# ---- check_out --------------------------------------------------------------------------------

def _message(call) -> str:
    with pytest.raises(MechkitError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text and " — " in text  # one line: the problem and the fix
    return text


def test_check_out_directory_cases(tmp_path):
    assert check_out(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checking creates nothing
    (tmp_path / "empty").mkdir()
    assert check_out(tmp_path / "empty") == tmp_path / "empty"
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("1")
    text = _message(lambda: check_out(full))
    assert str(full) in text and "not an empty directory" in text and "--force" in text
    assert check_out(full, force=True) == full
    (tmp_path / "f").write_text("1")
    for force in (False, True):
        text = _message(lambda force=force: check_out(tmp_path / "f", force=force))
        assert "is a file" in text and "directory name" in text
    text = _message(lambda: check_out(tmp_path / "f" / "sub"))  # a parent that is a file
    assert f"{tmp_path / 'f'} is not a directory" in text
    assert _names(tmp_path) == ["empty", "f", "full"]  # no probe left behind


def test_check_out_file_cases(tmp_path):
    assert check_out(tmp_path / "new" / "v.safetensors", kind="file") == tmp_path / "new" / "v.safetensors"
    (tmp_path / "v.safetensors").write_text("1")
    text = _message(lambda: check_out(tmp_path / "v.safetensors", kind="file"))
    assert f"{tmp_path / 'v.safetensors'} already exists" in text and "--force" in text
    assert check_out(tmp_path / "v.safetensors", force=True, kind="file") == tmp_path / "v.safetensors"
    for force in (False, True):
        text = _message(lambda force=force: check_out(tmp_path, force=force, kind="file"))
        assert f"{tmp_path} is a directory" in text and "file name" in text
    with pytest.raises(ValueError, match="kind"):
        check_out(tmp_path / "x", kind="folder")


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot create entries in (root ignores modes: use /sys there)."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    sys_dir = Path("/sys")
    try:
        (sys_dir / ".mechkit-test").mkdir()
    except OSError:
        yield sys_dir
        return
    (sys_dir / ".mechkit-test").rmdir()  # pragma: no cover - a writable /sys
    pytest.skip("no read-only directory available as root")


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_check_out_fails_in_a_read_only_location_before_any_work(read_only_dir, kind):
    text = _message(lambda: check_out(read_only_dir / "deeper" / "out", kind=kind))
    assert f"cannot write in {read_only_dir}" in text and "writable" in text


def test_a_read_only_location_fails_the_cli_before_the_model_loads(read_only_dir, capsys, monkeypatch):
    import mechkit.model

    def no_load(*_a, **_k):  # pragma: no cover - reached only if the check came too late
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(mechkit.model, "load_model", no_load)
    from mechkit.cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(read_only_dir),
              "--out", str(read_only_dir / "v.safetensors")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and "cannot write in" in err[0], err


def test_safetensors_files_get_the_umask_mode_not_0600(tmp_path):
    # safetensors creates its file 0600; what mechkit writes is readable as the umask says
    import torch
    from safetensors.torch import save_file

    from mechkit.io.atomic import atomic_dir, atomic_file

    old = os.umask(0o027)
    try:
        with atomic_file(tmp_path / "v.safetensors") as tmp:
            save_file({"a": torch.zeros(2)}, str(tmp))
        with atomic_dir(tmp_path / "model") as d:
            save_file({"a": torch.zeros(2)}, str(d / "model.safetensors"))
    finally:
        os.umask(old)
    for p in (tmp_path / "v.safetensors", tmp_path / "model" / "model.safetensors"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o640
