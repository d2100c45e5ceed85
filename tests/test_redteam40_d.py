"""Red-team pass 40 (b), the run's record (F1–F6), fixed.

A step resumed although what it read had changed: a file opened through ``link/../`` was recorded by ``abspath``'s
text (another file); a ``dir_fd`` open was taken as the working directory's file of that name (a decoy there), and
a relative open of a missing file as a ``dir_fd`` open (never resumed, the warning naming a descriptor); a folder
listed by a helper whose file path held "importlib" was not recorded; a variable read and then set by the run
(``setdefault``, a re-export) was forgotten; and ``generation_config.json`` was neither keyed nor recorded.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

import mechkit as mk
from tests.stepping import CALLS, STOP, stepping, stop_then_rerun


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))


def _read_text(path):
    def read(ctx):
        with open(path) as f:  # the path as given: link/../ is the system's, not abspath's
            return f.read()

    return read


def test_a_file_opened_through_a_link_and_dot_dot_is_the_file_the_system_opened(tmp_path, cache):
    (tmp_path / "y" / "sub").mkdir(parents=True)
    (tmp_path / "y" / "data.txt").write_text("one")
    (tmp_path / "x").mkdir()
    os.symlink(tmp_path / "y" / "sub", tmp_path / "x" / "link")
    path = f"{tmp_path}/x/link/../data.txt"
    results, log = stop_then_rerun(tmp_path, stepping("rt40d-dotdot", _read_text(path)),
                                   lambda: (tmp_path / "y" / "data.txt").write_text("two"))
    assert results == {"s0": "two"} and CALLS == ["s0", "s0"] and "y/data.txt" in log


def test_a_dir_fd_open_is_never_the_working_directorys_file_of_that_name(tmp_path, cache, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("one")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "notes.txt").write_text("decoy")
    monkeypatch.chdir(tmp_path / "cwd")

    def read(ctx):
        folder = os.open(tmp_path / "d", os.O_RDONLY)
        fd = os.open("notes.txt", os.O_RDONLY, dir_fd=folder)
        try:
            return os.read(fd, 100).decode()
        finally:
            os.close(fd)
            os.close(folder)

    results, log = stop_then_rerun(tmp_path, stepping("rt40d-dirfd", read),
                                   lambda: (tmp_path / "d" / "notes.txt").write_text("two"))
    assert results == {"s0": "two"} and "d/notes.txt, which the run read, has changed" in log


def test_an_unchanged_dir_fd_read_and_fwalk_resume(tmp_path, cache):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "f").write_text("one")

    def walk(ctx):
        found = []
        for _root, _dirs, files, fd in os.fwalk(tmp_path / "d"):
            for name in files:
                f = os.open(name, os.O_RDONLY, dir_fd=fd)
                found.append(os.read(f, 10).decode())
                os.close(f)
        return found

    results, log = stop_then_rerun(tmp_path, stepping("rt40d-fwalk", walk), lambda: None)
    assert results == {"s0": ["one"]} and CALLS == ["s0"] and log == ""
    results, log = stop_then_rerun(tmp_path, stepping("rt40d-fwalk2", walk),
                                   lambda: (tmp_path / "d" / "sub" / "f").write_text("two"))
    assert results == {"s0": ["two"]} and "sub/f, which the run read, has changed" in log


def test_a_missing_relative_file_resumes_while_still_missing(tmp_path, cache, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def optional(ctx):
        try:
            return open("optional.cfg").read()
        except FileNotFoundError:
            return "none"

    results, log = stop_then_rerun(tmp_path, stepping("rt40d-optional", optional), lambda: None)
    assert results == {"s0": "none"} and CALLS == ["s0"] and log == ""
    results, log = stop_then_rerun(tmp_path, stepping("rt40d-optional2", optional),
                                   lambda: (tmp_path / "optional.cfg").write_text("set"))
    assert results == {"s0": "set"} and "optional.cfg, which the run read, has changed" in log


def test_a_listing_by_a_helper_whose_path_holds_importlib_is_recorded(tmp_path, cache, monkeypatch):
    helpers = tmp_path / "importlib_stuff"
    helpers.mkdir()
    (helpers / "rt40d_lister.py").write_text(textwrap.dedent("""
        import os
        def names(path):
            return ",".join(sorted(os.listdir(path)))
    """))
    monkeypatch.syspath_prepend(str(helpers))
    import rt40d_lister

    (tmp_path / "ls").mkdir()
    (tmp_path / "ls" / "a").write_text("")
    try:
        results, log = stop_then_rerun(tmp_path, stepping("rt40d-lister", lambda ctx: rt40d_lister.names(
            tmp_path / "ls")), lambda: (tmp_path / "ls" / "b").write_text(""))
    finally:
        sys.modules.pop("rt40d_lister", None)
    assert results == {"s0": "a,b"} and "which the run listed, holds other names" in log


@pytest.mark.parametrize("how", ["setdefault", "reexport"])
def test_a_variable_the_run_reads_and_then_sets_is_the_users_value(tmp_path, cache, monkeypatch, how):
    name = f"RT40D_{how.upper()}"
    if how == "setdefault":
        monkeypatch.delenv(name, raising=False)
        compute = lambda ctx: os.environ.setdefault(name, "1")  # noqa: E731
    else:
        monkeypatch.setenv(name, "2")

        def compute(ctx):
            value = os.environ.get(name, "1")
            os.environ[name] = value
            return value

    def change():
        os.environ[name] = "5"  # the user's value for the rerun, set between the runs

    results, log = stop_then_rerun(tmp_path, stepping(f"rt40d-env-{how}", compute), change)
    assert results == {"s0": "5"} and CALLS == ["s0", "s0"] and f"variable {name}, which the run read, has changed" in log


def test_a_variable_a_library_sets_with_no_value_given_still_resumes(tmp_path, cache, monkeypatch):
    monkeypatch.delenv("RT40D_LIB", raising=False)

    def compute(ctx):
        os.environ.setdefault("RT40D_LIB", "True")  # what sklearn's import does with KMP_DUPLICATE_LIB_OK
        return 1

    results, log = stop_then_rerun(tmp_path, stepping("rt40d-lib", compute), lambda: None)
    assert results == {"s0": 1} and CALLS == ["s0"] and log == ""


def test_generation_settings_are_in_the_resume_key(tmp_path):
    from mechkit.model.checks.identity import model_key

    m = mk.load_model("tiny:llama")
    before = model_key(m)
    m.model.generation_config.repetition_penalty = 50.0
    after = model_key(m)
    assert before["generation_sha256"] != after["generation_sha256"]
    assert before["config_sha256"] == after["config_sha256"]
    m.model.generation_config.repetition_penalty = 1.0
    assert json.dumps(model_key(m), sort_keys=True, default=str) != ""


def test_a_saved_models_generation_config_edited_between_runs_starts_the_steps_afresh(tmp_path, cache):
    m = mk.load_model("tiny:llama")
    model_dir = tmp_path / "model"
    m.model.save_pretrained(model_dir)
    m.tokenizer.save_pretrained(model_dir)

    class Decodes(mk.Plugin):
        name, version, summary = "rt40d-generate", "0.1", "decodes greedily"

        def run(self, ctx):
            ids = ctx.model.to_tokens("ab")
            out = ctx.step("a", lambda: CALLS.append("a") or ctx.model.model.generate(
                ids, max_new_tokens=4, do_sample=False, pad_token_id=0)[0].tolist())
            if STOP:
                raise KeyboardInterrupt
            return mk.Result(results={"v": out})

    def edit():
        path = model_dir / "generation_config.json"
        config = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**config, "repetition_penalty": 50.0, "no_repeat_ngram_size": 1}))

    stop_then_rerun(tmp_path, Decodes, edit, model=str(model_dir))
    assert CALLS == ["a", "a"]
