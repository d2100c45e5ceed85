"""Red-team pass 7 of issue 32, classes 1, 3, 6 and 10, and the token-id checks of the Python API.

Each test holds one class of failure the pass found: another tool's ``report.json`` taken for mechkit's
list of its own files (``--force`` deleted that tool's files), a task vector written with ``--force`` over a
fine-tune's weights or its ``config.json``, ``prune --save-model`` and ``finetune`` refusing a model they
did not write only after the work, a run started without ``--force`` replacing a file that appeared in
``--out`` meanwhile, ``cache clear`` deleting a running run's checkpoints, a cache that is a file crashing a
checkpointing run, a reader of a half-installed set told "config.json is missing", reports with integers
no float holds or names no file can have, figures read beside a link to a report instead of beside the
report, and token ids of unsigned, sparse or mixed-up forms reaching torch.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io.disk_cache import mark_run_dir
from tests.test_reliability import _cli, _model_dir


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the refusals below must come before the work."""
    def refuse(*_a, **_k):
        raise AssertionError("the model was loaded before the refusal")

    import mechkit.model
    from mechkit.model import loading

    monkeypatch.setattr(mechkit.model, "load_model", refuse)
    monkeypatch.setattr(loading, "load_model", refuse)


def _finetune_like(folder: Path) -> Path:
    """A directory as ``finetune`` leaves it: a model and its manifest naming the writer."""
    _model_dir(folder)
    names = sorted(p.name for p in folder.iterdir())
    (folder / ".mechkit-files").write_text(json.dumps({"writer": "finetune", "files": [*names, ".mechkit-files"]}))
    return folder


# ---- class 1: another tool's report.json is not mechkit's list of its files -----------------------------

def test_another_tools_report_json_never_makes_its_files_mechkits(tmp_path):
    from mechkit.io.replace import owned_names, replacing_dir, set_writer

    out = tmp_path / "results"
    out.mkdir()
    (out / "data.csv").write_text("a,b\n1,2\n")
    (out / "report.json").write_text(json.dumps({"tool": "other", "plugin": "x", "artifacts": ["data.csv"]}))
    assert owned_names(out) == [] and set_writer(out) is None
    with replacing_dir(out, writer="inspect", force=True) as tmp:
        (tmp / "report.json").write_text("{}")
    assert (out / "data.csv").read_text() == "a,b\n1,2\n"


def test_a_mechkit_reports_list_is_still_its_own_without_a_manifest(tmp_path):
    from mechkit.io.replace import owned_names
    from mechkit.report.schema import SCHEMA

    (tmp_path / "report.json").write_text(json.dumps({"schema": SCHEMA, "artifacts": ["fig.png"]}))
    assert owned_names(tmp_path) == ["report.json", "report.html", "fig.png"]


# ---- class 1: a task vector never replaces a model's files, whatever --force says -----------------------

@pytest.mark.parametrize("name", ["model.safetensors", "config"])  # "config" writes its metadata to config.json
@pytest.mark.parametrize("manifest", [True, False], ids=["finetune-run", "users-model"])
def test_a_vector_never_replaces_a_models_weights_or_config(tmp_path, capsys, no_model_load, name, manifest):
    folder = _finetune_like(tmp_path / "ft") if manifest else _model_dir(tmp_path / "ft")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    (tmp_path / "a.safetensors").write_bytes(b"x")
    code, err = _cli(capsys, "taskvec", "merge", "-v", str(tmp_path / "a.safetensors"), "--method", "task_arithmetic",
                     "--out", str(folder / name), "--force")
    assert code == 2 and len(err) == 1 and "would replace it" in err[0] and "another --out" in err[0]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_vector_beside_a_model_and_over_its_own_earlier_vector_is_still_written(tmp_path):
    from mechkit.taskarith.vector import check_vector_out

    folder = _model_dir(tmp_path / "ft")
    assert check_vector_out(folder / "v.safetensors", force=False) == folder / "v.safetensors"
    (folder / "v.safetensors").write_bytes(b"old vector")
    (folder / "v.safetensors.json").write_text("{}")
    assert check_vector_out(folder / "v.safetensors", force=True) == folder / "v.safetensors"


# ---- class 1: a model the run would replace is refused before the model loads ---------------------------

def test_prune_save_model_over_a_users_model_folder_is_refused_before_the_work(tmp_path, capsys, no_model_load):
    out = tmp_path / "run"
    _model_dir(out / "model")
    (out / "notes.txt").write_text("mine")
    code, err = _cli(capsys, "prune", "--model", "tiny:llama", "--save-model", "--out", str(out), "--force")
    assert code == 2 and "holds model, which mechkit did not write" in err[-1]
    assert (out / "notes.txt").read_text() == "mine" and (out / "model" / "config.json").is_file()


def test_finetune_over_a_users_model_is_refused_before_the_work(tmp_path, capsys, no_model_load):
    out = _model_dir(tmp_path / "mine")
    code, err = _cli(capsys, "finetune", "--model", "tiny:llama", "--out", str(out), "--force")
    assert code == 2 and "config.json, model.safetensors, which mechkit did not write" in err[-1]


def test_prune_without_save_model_writes_no_model_and_is_not_refused():
    from plugins.prune import PrunePlugin

    assert PrunePlugin.writes({"save_model": False}) == () and PrunePlugin.writes({"save_model": True}) == ("model",)


# ---- class 3: without --force nothing that appeared in --out meanwhile is replaced -----------------------

def test_a_report_without_force_never_replaces_a_file_that_appeared_meanwhile(tmp_path):
    from mechkit.report import build_report, write_report

    out = tmp_path / "run"
    out.mkdir()
    (out / "report.html").write_text("another writer's page")
    report = build_report(plugin="probe", plugin_version="1", model={"name": "m"}, params={}, seed=0,
                          results={}, artifacts=[], timings={}, finding="f")
    with pytest.raises(MechkitError, match="report.html already exists"):
        write_report(out, report)
    assert (out / "report.html").read_text() == "another writer's page" and not (out / "report.json").exists()


# ---- class 3/10: cache clear never deletes what a running run holds --------------------------------------

def test_cache_clear_keeps_an_entry_a_running_run_holds(tmp_path, monkeypatch, capsys):
    from mechkit.io.disk_cache import clear_cache
    from mechkit.io.outlock import out_lock

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    live, done = tmp_path / "runs" / ("a" * 16), tmp_path / "runs" / ("b" * 16)
    for entry in (live, done):
        (entry / "finetune").mkdir(parents=True)
        mark_run_dir(entry)  # as a run makes it
        (entry / "finetune" / "checkpoint.safetensors").write_bytes(b"state")
    with out_lock(live):
        assert [name for name, _ in clear_cache(["runs"])] == ["runs"]
        assert (live / "finetune" / "checkpoint.safetensors").is_file() and not done.exists()
        assert clear_cache(["runs/" + "a" * 16]) == []
        assert clear_cache(all_entries=True) == [] and live.is_dir()
    assert f"kept runs/{'a' * 16}: a running mechkit process (pid {os.getpid()})" in capsys.readouterr().err
    assert [name for name, _ in clear_cache(["runs"])] == ["runs"] and not live.exists()


# ---- class 10: a cache that cannot hold steps: the run goes on, unkept, whatever the plugin keeps --------

def test_a_checkpointing_run_goes_on_when_the_cache_is_a_file(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("MECHKIT_CACHE", str(blocker))
    log = io.StringIO()
    run = mk.run("finetune", model="tiny:llama", steps=2, batch_size=2, eval_n=2, checkpoint_every=1,
                 out=str(tmp_path / "ft"), device="cpu", console=Console(file=log))
    assert len(run.results["losses"]) == 2 and blocker.read_text().startswith("a file")
    lines = [x for x in log.getvalue().splitlines() if x.startswith("mechkit: warning:")]
    assert len(lines) == 1 and "cannot keep finished steps" in lines[0] and "Not a directory" in lines[0]


@pytest.mark.parametrize("code", [errno.ENAMETOOLONG, errno.ENOTDIR])
def test_an_error_in_the_cache_names_mechkit_cache_in_its_fix(tmp_path, monkeypatch, code):
    from mechkit.io.fs_errors import describe

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    err = describe(OSError(code, os.strerror(code), str(tmp_path / "cache" / "runs")))
    assert err is not None and "$MECHKIT_CACHE" in str(err) and "--out" not in str(err)


# ---- class 10: a reader of a set a killed --force write left half-installed -------------------------------

_KILL = textwrap.dedent("""
    import os, sys, pathlib
    from mechkit.io.replace import replacing_dir
    out, source, after = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
    real, count = os.replace, [0]
    def replace(a, b):
        if count[0] == after:
            os._exit(9)
        count[0] += 1
        real(a, b)
    os.replace = replace
    with replacing_dir(out, writer="finetune", force=True) as tmp:
        for p in source.iterdir():
            (tmp / p.name).write_bytes(p.read_bytes())
""")


def _half_installed(out: Path, source: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", _KILL, str(out), str(source), "4"], env=env)
    assert done.returncode == 9 and (out.parent / f".{out.name}.mechkit-replace").exists()
    assert not (out / "config.json").exists()  # the key file is out: a plain reader saw "no model"


def test_a_model_left_half_installed_is_rolled_back_when_it_is_loaded(tmp_path):
    out = _finetune_like(tmp_path / "ft")
    weights = (out / "model.safetensors").read_bytes()
    _half_installed(out, _model_dir(tmp_path / "other", family="gpt2"))
    handle = mk.load_model(str(out), device="cpu")
    assert handle.anatomy.family_name == "llama" and (out / "model.safetensors").read_bytes() == weights
    assert not (tmp_path / ".ft.mechkit-replace").exists()


def test_a_run_left_half_installed_is_rolled_back_when_its_report_is_read(tmp_path):
    from mechkit.report import build_report, write_report

    report = build_report(plugin="probe", plugin_version="1", model={"name": "m"}, params={}, seed=0,
                          results={"n": 1}, artifacts=[], timings={}, finding="first")
    out = write_report(tmp_path / "run", report)
    other = write_report(tmp_path / "second", {**report, "finding": "second", "results": {"n": 2}})
    _half_installed(out, other)
    assert mk.load_report(out).finding == "first"


def test_a_set_being_written_is_named_so_not_read_half(tmp_path):
    from mechkit.report import build_report, write_report

    report = build_report(plugin="probe", plugin_version="1", model={"name": "m"}, params={}, seed=0,
                          results={}, artifacts=[], timings={}, finding="f")
    out = write_report(tmp_path / "run", report)
    _half_installed(out, write_report(tmp_path / "second", report))
    import fcntl

    from mechkit.io.outlock import lock_path

    fd = os.open(lock_path(out), os.O_RDWR | os.O_CREAT)  # the writer's lock, held as a live writer holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(MechkitError, match="being written by another mechkit run"):
            mk.load_report(out)
    finally:
        os.close(fd)
    assert mk.load_report(out).finding == "f"  # once it is free: rolled back, read whole


# ---- class 6: reports read only their own files, and numbers a float holds -------------------------------

@pytest.fixture(scope="module")
def detect_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rt7a") / "det"
    mk.run("detect", model="tiny:llama", n_seqs=2, seg_len=4, out=str(out), device="cpu")
    return out


def _crafted(run: Path, to: Path, edit) -> Path:
    import shutil

    shutil.copytree(run, to)
    report = json.loads((to / "report.json").read_text())
    edit(report)
    (to / "report.json").write_text(json.dumps(report))
    return to


@pytest.mark.parametrize("where", ["views", "results", "seed"])
def test_an_integer_no_float_holds_is_one_line_for_every_reader(detect_run, tmp_path, capsys, where):
    def edit(report):
        if where == "views":
            next(iter(report["views"]["grids"].values()))["values"][0][0] = 10**400
        elif where == "results":
            report["results"]["huge"] = [10**400, 1]
        else:
            report["seed"] = 10**400

    run = _crafted(detect_run, tmp_path / "run", edit)
    with pytest.raises(MechkitError, match="too large for a number in a report"):
        mk.load_report(run)
    for command in (["report", "show", str(run)], ["report", "compare", str(run), str(detect_run),
                                                     "--out", str(tmp_path / "cmp")]):
        code, err = _cli(capsys, *command)
        assert code == 2 and len(err) == 1 and "too large" in err[0]


def test_an_artifact_name_no_file_can_have_is_skipped(detect_run, tmp_path):
    run = _crafted(detect_run, tmp_path / "run", lambda r: r["artifacts"].append("\ud800.png"))
    loaded = mk.load_report(run)
    assert "\ud800.png" not in loaded.images() and "data:image/png" in loaded._repr_html_()


def test_figures_come_from_the_folder_the_report_lies_in_not_from_beside_a_link(detect_run, tmp_path, capsys):
    view = tmp_path / "view"
    view.mkdir()
    (view / "report.json").symlink_to(detect_run / "report.json")
    name = json.loads((detect_run / "report.json").read_text())["artifacts"][0]
    decoy = b"\x89PNG\r\n\x1a\n" + b"another run's figure"
    (view / name).write_bytes(decoy)
    assert mk.load_report(view / "report.json").images()[name] == (detect_run / name).read_bytes()
    code, _ = _cli(capsys, "report", "compare", str(view / "report.json"), str(detect_run), "--out", str(tmp_path / "c"))
    import base64

    page = (tmp_path / "c" / "compare.html").read_text()
    assert code == 0 and base64.b64encode(decoy).decode() not in page


# ---- the Python API: odd token ids are one line, unsigned ones work ---------------------------------------

@pytest.mark.parametrize("ids, says", [
    ([2**70], "token id 1180591620717411303424 is outside"),
    ([[1, 2], 3], "not a mix of both"),
    (torch.tensor([[1, 2]]).to_sparse(), "not a sparse one"),
    (torch.tensor([[2**63]], dtype=torch.uint64), "token id 9223372036854775808 is outside"),
    (torch.tensor([[1, 300]], dtype=torch.uint16), "token id 300 is outside"),
])
def test_odd_token_ids_are_one_line(llama, ids, says):
    for call in (lambda: llama(ids), lambda: mk.run_with_cache(llama, ids), lambda: llama.to_str_tokens(ids)):
        with pytest.raises(MechkitError, match=says) as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_token_ids_give_the_same_logits(llama, dtype):
    ids = torch.tensor([[1, 2, 258]])
    assert torch.equal(llama(ids.to(dtype)), llama(ids))


@pytest.mark.parametrize("ids", [torch.tensor([[-5]]), [1, 10_000], torch.tensor([[1.5]])])
def test_to_str_tokens_refuses_ids_it_cannot_decode(llama, ids):
    with pytest.raises(MechkitError):
        llama.to_str_tokens(ids)
    assert llama.to_str_tokens([1, 2]) == llama.to_str_tokens(torch.tensor([[1, 2]]))
