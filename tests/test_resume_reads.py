"""A resumed step is one the files its run read still make (:mod:`mechkit.io.reads`).

The resume key reads the plugin's source, which cannot tell all that the run reads (pass 35 b): a data file,
code run through ``run = exec`` or ``builtins.__dict__``, a module whose name is computed. The run records the
files its process opens; a kept step is taken only while they hold what they held, else it is computed again
with one warning line naming the file.
"""

from __future__ import annotations

import builtins
import importlib
import io
import json
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

import mechkit as mk
from tests.stepping import CALLS, STOP, stepping, stop_then_rerun


def _read(how: str, path: str) -> str:
    if how == "open":
        with open(path) as f:
            return f.read()
    if how == "exec-alias":
        run, names = exec, {}
        with open(path) as f:
            run(f.read(), names)
        return str(names["X"])
    if how == "builtins-dict":
        names = {}
        with open(path) as f:
            builtins.__dict__["exec"](f.read(), names)
        return str(names["X"])
    if how == "computed-import":
        folder, name = os.path.split(path)
        sys.path.insert(0, folder)
        try:
            return str(importlib.import_module(name.removesuffix(".py")).X)
        finally:
            sys.path.remove(folder)
    if how == "own-file":  # a file the run writes, then reads back: derived, never an input
        mine = path + ".mine"
        with open(mine, "w") as f:
            f.write(str(len(CALLS)))
        with open(mine) as f:
            return f.read()
    raise AssertionError(how)


class ReadsFiles(mk.Plugin):
    name, version, summary = "rt-reads", "0.1", "a step that reads a file"
    needs_model = False
    options = (mk.Option("how", str, "open"), mk.Option("path", str, ""))

    def run(self, ctx):
        first = ctx.step("first", lambda: CALLS.append("first") or _read(ctx.params["how"], ctx.params["path"]))
        if STOP:  # not an option: the options are in the resume key
            raise KeyboardInterrupt
        return mk.Result(results={"text": first})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _stopped(tmp_path, log=None, **options):
    STOP.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            mk.run(ReadsFiles, out=tmp_path / "run", console=Console(file=log or io.StringIO(), width=400), **options)
    finally:
        STOP.clear()


@pytest.mark.parametrize(("how", "first", "second"), [
    ("open", "alpha", "beta"),
    ("exec-alias", "X = 1", "X = 2"),
    ("builtins-dict", "X = 1", "X = 2"),
    ("computed-import", "X = 1", "X = 2"),
])
def test_a_file_the_run_read_and_then_changed_starts_the_step_afresh(tmp_path, cache, how, first, second):
    CALLS.clear()
    name = f"rt_reads_helper_{how.replace('-', '_')}"
    data = tmp_path / (f"{name}.py" if how == "computed-import" else "data.txt")
    data.write_text(first)
    _stopped(tmp_path, how=how, path=str(data))
    data.write_text(second)
    sys.modules.pop(name, None)
    os.utime(data, ns=(10**18, 10**18))  # a source edited in the same second still counts as newer than its .pyc
    log = io.StringIO()
    run = mk.run(ReadsFiles, out=tmp_path / "run", how=how, path=str(data), console=Console(file=log, width=400))
    assert CALLS == ["first", "first"]
    assert run.report["results"]["text"] == ("beta" if how == "open" else "2")
    assert f"not resuming step 'first': {data}, which the run read, has changed since the step was kept" \
        in log.getvalue()
    sys.modules.pop(name, None)


@pytest.mark.parametrize("how", ["open", "computed-import", "own-file"])
def test_a_file_the_run_read_unchanged_resumes_the_step(tmp_path, cache, how):
    CALLS.clear()
    name = "rt_reads_same_helper"
    data = tmp_path / (f"{name}.py" if how == "computed-import" else "data.txt")
    data.write_text("X = 1")
    _stopped(tmp_path, how=how, path=str(data))
    log = io.StringIO()
    mk.run(ReadsFiles, out=tmp_path / "run", how=how, path=str(data), console=Console(file=log, width=400))
    assert CALLS == ["first"] and log.getvalue() == ""
    sys.modules.pop(name, None)


def test_a_step_keeps_what_it_read_and_not_what_it_wrote(tmp_path, cache):
    CALLS.clear()
    data = tmp_path / "data.txt"
    data.write_text("alpha")
    _stopped(tmp_path, how="own-file", path=str(data))
    (step,) = [f for f in (cache / "runs").glob("*/*.json") if json.loads(f.read_text()).get("key") == "first"]
    reads = [path for path, _ in json.loads(step.read_text())["reads"]]
    assert str(data) + ".mine" not in reads
    assert not any(path.startswith(str(cache)) for path in reads)  # the step files themselves


@pytest.mark.parametrize("damage", ["nope", [["a"]], [[1, 2]]])
def test_a_damaged_record_of_the_reads_recomputes_the_step(tmp_path, cache, damage):
    CALLS.clear()
    data = tmp_path / "data.txt"
    data.write_text("alpha")
    _stopped(tmp_path, path=str(data))
    (step,) = [f for f in (cache / "runs").glob("*/*.json") if json.loads(f.read_text()).get("key") == "first"]
    stored = json.loads(step.read_text())
    step.write_text(json.dumps({**stored, "reads": damage}))
    log = io.StringIO()
    mk.run(ReadsFiles, out=tmp_path / "run", path=str(data), console=Console(file=log, width=400))
    assert CALLS == ["first", "first"] and "its record of the files the run read is damaged" in log.getvalue()


def test_a_step_after_too_many_files_read_is_kept_but_not_resumed(tmp_path, cache, monkeypatch):
    from mechkit.io import reads

    monkeypatch.setattr(reads, "MAX_READS", 3)
    CALLS.clear()
    files = []
    for i in range(5):
        files.append(tmp_path / f"d{i}.txt")
        files[-1].write_text(str(i))

    class ReadsMany(mk.Plugin):
        name, version, summary, needs_model = "rt-reads-many", "0.1", "reads five files", False

        def run(self, ctx):
            value = ctx.step("first", lambda: CALLS.append("first") or sum(int(f.read_text()) for f in files))
            if STOP:
                raise KeyboardInterrupt
            return mk.Result(results={"sum": value})

    STOP.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            mk.run(ReadsMany, out=tmp_path / "run")
    finally:
        STOP.clear()
    log = io.StringIO()
    assert mk.run(ReadsMany, out=tmp_path / "run", console=Console(file=log, width=400)).report["results"]["sum"] == 10
    assert CALLS == ["first", "first"] and "the run read more than 3 files before it, too many to check" in log.getvalue()


class ReadsEnv(mk.Plugin):
    name, version, summary, needs_model = "rt-reads-env", "0.1", "a step that reads the environment", False
    options = (mk.Option("how", str, "get"),)

    def run(self, ctx):
        def compute():
            CALLS.append("first")
            how = ctx.params["how"]
            if how == "get":
                return os.environ.get("RT_READS_SCALE", "1")
            if how == "getenv":
                return os.getenv("RT_READS_SCALE") or "unset"
            if how == "item":
                return os.environ["RT_READS_SCALE"]
            return str("RT_READS_SCALE" in os.environ)

        first = ctx.step("first", compute)
        if STOP:
            raise KeyboardInterrupt
        return mk.Result(results={"scale": first})


@pytest.mark.parametrize(("how", "before", "after"), [
    ("get", "1", "2"), ("getenv", None, "2"), ("item", "1", "2"), ("contains", "1", None),
])
def test_an_environment_variable_the_run_read_and_then_changed_starts_the_step_afresh(tmp_path, cache, monkeypatch,
                                                                                     how, before, after):
    CALLS.clear()
    for value in (before,):
        monkeypatch.setenv("RT_READS_SCALE", value) if value is not None else monkeypatch.delenv("RT_READS_SCALE",
                                                                                                 raising=False)
    STOP.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            mk.run(ReadsEnv, out=tmp_path / "run", how=how)
    finally:
        STOP.clear()
    monkeypatch.setenv("RT_READS_SCALE", after) if after is not None else monkeypatch.delenv("RT_READS_SCALE")
    log = io.StringIO()
    mk.run(ReadsEnv, out=tmp_path / "run", how=how, console=Console(file=log, width=400))
    assert CALLS == ["first", "first"]
    assert "the environment variable RT_READS_SCALE, which the run read, has changed" in log.getvalue()


def test_an_environment_variable_unchanged_resumes_and_environ_is_restored(tmp_path, cache, monkeypatch):
    CALLS.clear()
    before = type(os.environ).__getitem__
    monkeypatch.setenv("RT_READS_SCALE", "3")
    STOP.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            mk.run(ReadsEnv, out=tmp_path / "run")
    finally:
        STOP.clear()
    assert type(os.environ).__getitem__ is before
    log = io.StringIO()
    assert mk.run(ReadsEnv, out=tmp_path / "run", console=Console(file=log, width=400)).report["results"] == \
        {"scale": "3"}
    assert CALLS == ["first"] and log.getvalue() == ""
    assert type(os.environ).__getitem__ is before


def test_a_link_repointed_between_the_runs_starts_the_step_afresh(tmp_path, cache):
    (tmp_path / "v1").write_text("one")
    (tmp_path / "v2").write_text("two")
    (tmp_path / "cur").symlink_to(tmp_path / "v1")

    def repoint():
        (tmp_path / "cur").unlink()
        (tmp_path / "cur").symlink_to(tmp_path / "v2")

    plugin = stepping("rt-reads-link", lambda ctx: (tmp_path / "cur").read_text())
    results, log = stop_then_rerun(tmp_path, plugin, repoint)
    assert results == {"s0": "two"} and CALLS == ["s0", "s0"] and "cur, which the run read" in log


@pytest.mark.parametrize("how", ["r+", "memmap"])
def test_a_file_opened_for_reading_and_writing_but_only_read_is_recorded(tmp_path, cache, how):
    import numpy as np

    data = tmp_path / "data.bin"
    data.write_bytes(b"\x01\x02")

    def read(ctx):
        if how == "r+":
            with open(data, "r+b") as f:
                return list(f.read())
        return np.memmap(data, dtype=np.uint8).tolist()

    results, log = stop_then_rerun(tmp_path, stepping(f"rt-reads-{how}", read), lambda: data.write_bytes(b"\x03\x04"))
    assert results == {"s0": [3, 4]} and "which the run read, has changed" in log


def test_a_file_inside_a_folder_an_option_names_is_recorded(tmp_path, cache):
    folder = tmp_path / "dir"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "x.txt").write_text("one")
    plugin = stepping("rt-reads-dir", lambda ctx: Path(ctx.params["dir"], "sub", "x.txt").read_text(),
                      options=(mk.Option("dir", str, None, files=True),))
    results, log = stop_then_rerun(tmp_path, plugin, lambda: (folder / "sub" / "x.txt").write_text("two"),
                                   dir=str(folder))
    assert results == {"s0": "two"} and "x.txt, which the run read, has changed" in log


def test_what_the_option_checks_read_is_recorded_with_the_steps(tmp_path, cache):
    data = tmp_path / "limits.txt"
    data.write_text("one")
    seen: list = []
    plugin = stepping("rt-reads-check", lambda ctx: seen[-1], check=lambda params: seen.append(data.read_text()))
    results, log = stop_then_rerun(tmp_path, plugin, lambda: data.write_text("two"))
    assert results == {"s0": "two"} and "limits.txt, which the run read, has changed" in log


@pytest.mark.parametrize("how", ["listdir", "glob", "iterdir", "walk"])
def test_a_folder_the_run_listed_and_that_changed_starts_the_step_afresh(tmp_path, cache, how):
    import glob

    folder = tmp_path / "inputs"
    folder.mkdir()
    for name in "AB":
        (folder / name).write_text(name)
    lists = {"listdir": lambda: os.listdir(folder), "glob": lambda: [os.path.basename(p) for p in glob.glob(f"{folder}/*")],
             "iterdir": lambda: [p.name for p in folder.iterdir()], "walk": lambda: next(os.walk(folder))[2]}
    plugin = stepping(f"rt-reads-{how}", lambda ctx: ",".join(sorted(lists[how]())))
    results, log = stop_then_rerun(tmp_path, plugin, lambda: (folder / "C").write_text("C"))
    assert results == {"s0": "A,B,C"} and "which the run listed, holds other names" in log


def test_an_unchanged_folder_listing_resumes(tmp_path, cache):
    folder = tmp_path / "inputs"
    folder.mkdir()
    (folder / "A").write_text("A")
    plugin = stepping("rt-reads-same-listing", lambda ctx: os.listdir(folder))
    results, log = stop_then_rerun(tmp_path, plugin, lambda: None)
    assert results == {"s0": ["A"]} and CALLS == ["s0"] and log == ""


@pytest.mark.parametrize("how", ["open", "listdir"])
def test_a_relative_name_read_in_another_working_directory_starts_the_step_afresh(tmp_path, cache, monkeypatch, how):
    for name, text in (("A", "alpha"), ("B", "beta")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text(text)
    (tmp_path / "B" / "more.txt").write_text("")
    read = {"open": lambda ctx: Path("notes.txt").read_text(), "listdir": lambda ctx: sorted(os.listdir("."))}[how]
    monkeypatch.chdir(tmp_path / "A")
    results, log = stop_then_rerun(tmp_path, stepping(f"rt-reads-rel-{how}", read),
                                   lambda: monkeypatch.chdir(tmp_path / "B"))
    assert results == {"s0": "beta" if how == "open" else ["more.txt", "notes.txt"]}
    assert CALLS == ["s0", "s0"] and f"relative to the working directory {tmp_path / 'A'}" in log


def test_a_relative_name_read_in_the_same_working_directory_resumes(tmp_path, cache, monkeypatch):
    (tmp_path / "notes.txt").write_text("alpha")
    monkeypatch.chdir(tmp_path)
    results, log = stop_then_rerun(tmp_path, stepping("rt-reads-rel-same", lambda ctx: Path("notes.txt").read_text()),
                                   lambda: None)
    assert results == {"s0": "alpha"} and CALLS == ["s0"] and log == ""


def test_a_file_opened_relative_to_a_folder_descriptor_is_recorded_by_that_folders_path(tmp_path, cache, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "notes.txt").write_text("one")
    monkeypatch.chdir(tmp_path)

    def read(ctx):
        folder = os.open(tmp_path / "data", os.O_RDONLY)
        try:
            fd = os.open("notes.txt", os.O_RDONLY, dir_fd=folder)
            try:
                return os.read(fd, 100).decode()
            finally:
                os.close(fd)
        finally:
            os.close(folder)

    results, log = stop_then_rerun(tmp_path, stepping("rt-reads-dirfd", read),
                                   lambda: (tmp_path / "data" / "notes.txt").write_text("two"))
    assert results == {"s0": "two"} and f"{tmp_path / 'data' / 'notes.txt'}, which the run read, has changed" in log


def test_an_environment_variable_read_as_bytes_is_recorded(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("RT_READS_BYTES", "1")
    plugin = stepping("rt-reads-environb", lambda ctx: (os.environb.get(b"RT_READS_BYTES") or b"").decode())
    results, log = stop_then_rerun(tmp_path, plugin, lambda: monkeypatch.setenv("RT_READS_BYTES", "2"))
    assert results == {"s0": "2"} and "the environment variable RT_READS_BYTES" in log


def test_a_variable_the_process_sets_itself_does_not_stop_a_resume(tmp_path, cache, monkeypatch):
    monkeypatch.delenv("RT_READS_SETDEFAULT", raising=False)

    def compute(ctx):
        os.environ.setdefault("RT_READS_SETDEFAULT", "True")  # as sklearn's import does, between steps or in one
        return os.environ["RT_READS_SETDEFAULT"]

    results, log = stop_then_rerun(tmp_path, stepping("rt-reads-setdefault", compute),
                                   lambda: None)  # still set when the rerun asks for the step, as after an import
    os.environ.pop("RT_READS_SETDEFAULT", None)
    assert results == {"s0": "True"} and CALLS == ["s0"] and log == ""


@pytest.mark.parametrize("how", ["fwalk", "listdir-fd"])
def test_a_folder_listed_by_its_descriptor_is_recorded(tmp_path, cache, how):
    folder = tmp_path / "flat"
    folder.mkdir()
    for name in "ab":
        (folder / name).write_text(name)

    def listed(ctx):
        if how == "fwalk":
            return sorted(next(os.fwalk(folder))[2])
        fd = os.open(folder, os.O_RDONLY)
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    results, log = stop_then_rerun(tmp_path, stepping(f"rt-reads-{how}", listed), lambda: (folder / "c").write_text("c"))
    assert results == {"s0": ["a", "b", "c"]} and "which the run listed, holds other names" in log


@pytest.mark.parametrize("how", ["a+", "rdwr-creat"])
def test_a_file_read_through_a_read_write_open_is_recorded(tmp_path, cache, how):
    data = tmp_path / "f.txt"
    data.write_text("alpha")

    def read(ctx):
        if how == "a+":
            with open(data, "a+") as f:
                f.seek(0)
                return f.read()
        fd = os.open(data, os.O_RDWR | os.O_CREAT)
        try:
            return os.read(fd, 100).decode()
        finally:
            os.close(fd)

    results, log = stop_then_rerun(tmp_path, stepping(f"rt-reads-{how}", read), lambda: data.write_text("beta"))
    assert results == {"s0": "beta"} and "f.txt, which the run read, has changed" in log
