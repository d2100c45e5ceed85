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

import pytest
from rich.console import Console

import mechkit as mk

CALLS: list[str] = []
STOP: list[bool] = []


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
