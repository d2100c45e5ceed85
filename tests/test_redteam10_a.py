"""Red-team pass 10 of issue 32, classes 1, 3, 6 and 10, and the forward inputs the Python API checks.

Each test holds one class of failure the pass found: a folder of the user's under a name a run writes
(``d/attention.png/``) went into the replaced set and was deleted with what it held; a full disk under a lock
file (the ``pwrite`` of its pid) was "cannot write a file mechkit was writing ... choose another --out", naming
no path and the wrong fix where the disk was the cache's, and stopped a run that goes on unkept when the cache
cannot hold its steps; and the forward checks' memo trusted CPU tensors written past the version counter
(``.data``, NumPy, the storage: an IndexError, and a mask holding 5 taken as 1) and raised a RuntimeError for
every tensor made under ``torch.inference_mode``.
"""

from __future__ import annotations

import errno
import io
import os

import pytest
import torch

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io.disk_cache import mark_run_dir


@pytest.fixture(scope="module")
def llama():
    return mk.load_model("tiny:llama", device="cpu")


# ---- class 1: a folder of the user's under a name the run writes is never replaced ------------------------------
def test_a_users_folder_under_an_artifact_name_is_refused_and_kept(tmp_path):
    from mechkit.io.replace import replacing_dir

    out = tmp_path / "d"
    (out / "attention.png").mkdir(parents=True)
    (out / "attention.png" / "mine.txt").write_text("keep")
    with pytest.raises(MechkitError, match=r"holds a folder attention\.png, which mechkit did not write"), \
            replacing_dir(out, writer="attention", force=True) as tmp:
        (tmp / "attention.png").write_bytes(b"png")
        (tmp / "report.json").write_text("{}")
    assert (out / "attention.png" / "mine.txt").read_text() == "keep"
    assert sorted(p.name for p in out.iterdir()) == ["attention.png"]
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary directory, no journal left


@pytest.mark.parametrize("name", ["report.html", "model"])
def test_a_users_folder_under_a_known_name_is_refused_before_the_model_loads(tmp_path, name):
    from mechkit.io.replace import refuse_foreign_model

    (tmp_path / name).mkdir()
    (tmp_path / name / "notes.txt").write_text("mine")  # no config.json: not a model, still the user's
    with pytest.raises(MechkitError, match=f"holds a folder {name}"):
        refuse_foreign_model(tmp_path, "prune", ("report.json", "report.html", "model"))
    assert (tmp_path / name / "notes.txt").read_text() == "mine"


def test_a_folder_the_previous_set_wrote_and_a_symlink_are_still_replaced(tmp_path):
    from mechkit.io.replace import replacing_dir

    out = tmp_path / "d"
    with replacing_dir(out, writer="prune") as tmp:
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "attention.png").symlink_to(elsewhere)  # a link is replaced as a link; its target is untouched
    with replacing_dir(out, writer="prune", force=True) as tmp:
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text('{"new": 1}')
        (tmp / "attention.png").write_bytes(b"png")
    assert (out / "model" / "config.json").read_text() == '{"new": 1}'
    assert (out / "attention.png").read_bytes() == b"png" and elsewhere.is_dir()


def test_the_cli_refuses_a_folder_under_an_artifact_name(tmp_path):
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    out = tmp_path / "d"
    (out / "attention.png").mkdir(parents=True)
    (out / "attention.png" / "mine.txt").write_text("keep")
    result = CliRunner().invoke(cli, ["attention", "--model", "tiny:llama", "--heads", "0.1", "--out", str(out),
                                      "--force"])
    lines = [line for line in result.output.splitlines() if line.startswith("mechkit: error")]
    assert result.exit_code == 2 and len(lines) == 1 and "folder attention.png" in lines[0], result.output
    assert (out / "attention.png" / "mine.txt").read_text() == "keep"
    assert sorted(p.name for p in out.iterdir()) == ["attention.png"]


# ---- class 10: a full disk under a lock file names the lock file and the right fix -------------------------------
@pytest.fixture
def full_disk(monkeypatch):
    def pwrite(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", pwrite)


def test_a_full_disk_under_an_out_lock_is_one_line_naming_the_lock(tmp_path, full_disk):
    from mechkit.io.locks import lock_path
    from mechkit.io.outlock import out_lock

    out = tmp_path / "run"
    with pytest.raises(MechkitError) as caught, out_lock(out):
        pass
    assert str(lock_path(out)) in str(caught.value) and "no space left" in str(caught.value)
    assert "choose another --out" in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # the lock file is removed again


def test_a_full_cache_under_a_resume_lock_warns_and_the_run_goes_on(tmp_path, monkeypatch, full_disk):
    from rich.console import Console

    from mechkit.io.outlock import claimed, out_lock

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    resume = tmp_path / "cache" / "runs" / "0123456789abcdef"
    with pytest.raises(MechkitError, match=r"MECHKIT_CACHE"), out_lock(resume):  # the fix names the cache
        pass
    text = io.StringIO()
    with claimed(resume, Console(file=text, width=300)) as kept:
        assert kept is None
    assert "cannot keep finished steps" in text.getvalue() and "No space left" in text.getvalue()


# ---- forward inputs: the memo never trusts a tensor it cannot see change -----------------------------------------
def _data_write(t):
    t.data[0, 0] = 10**6


def _numpy_write(t):
    t.numpy()[0, 0] = 10**6


def _storage_write(t):
    t.untyped_storage().copy_(torch.full_like(t, 10**6).untyped_storage())


@pytest.mark.parametrize("write", [_data_write, _numpy_write, _storage_write], ids=["data", "numpy", "storage"])
def test_ids_written_past_the_version_counter_are_checked_again(llama, write):
    ids = llama.to_tokens("hello there you").clone()
    llama(ids)
    write(ids)
    with pytest.raises(MechkitError, match="outside the model's vocabulary"):
        llama(ids)
    with pytest.raises(MechkitError, match="outside the model's vocabulary"):
        mk.run_with_cache(llama, ids)


def test_a_mask_written_through_data_is_checked_again(llama):
    ids = llama.to_tokens("hello there you")
    mask = torch.ones_like(ids)
    llama(ids, attention_mask=mask)
    mask.data[0, 0] = 5
    with pytest.raises(MechkitError, match="holds 5, which is neither 0 nor 1"):
        llama(ids, attention_mask=mask)


def test_forwards_under_inference_mode_run(llama):
    ids = llama.to_tokens("hello there you")
    expected = llama(ids)
    with torch.inference_mode():
        frozen = ids.clone()
        mask = torch.ones_like(frozen)
        assert torch.equal(llama(frozen, attention_mask=mask), expected)
        bad = frozen.clone()
        bad[0, 0] = 10**6
        with pytest.raises(MechkitError, match="outside the model's vocabulary"):
            llama(bad)
    assert torch.equal(llama(frozen), expected) and torch.equal(llama(frozen), expected)  # twice: no memo error


# ---- API inputs: a hook's replacement of another dtype is the activation's, or one line ---------------------------
def test_a_replacement_of_another_float_dtype_runs_in_the_activations(llama):
    ids = llama.to_tokens("hello there you")
    with mk.hooks(llama, {"blocks.0.hook_resid_pre": lambda act, hook: act.double() * 1.0}):
        doubled = llama(ids)
    assert doubled.dtype == torch.float32 and torch.allclose(doubled, llama(ids))
    with mk.pattern_hooks(llama, {0: [lambda pattern: pattern * 1.0]}):
        eager = llama(ids)  # the pattern path's own kernel: the baseline for a pattern of another dtype
    with mk.pattern_hooks(llama, {0: [lambda pattern: pattern.double()]}):
        assert torch.equal(llama(ids), eager)


@pytest.mark.parametrize("make", [lambda act: act.long(), lambda act: act > 0, lambda act: act.to(torch.complex64)],
                         ids=["int", "bool", "complex"])
def test_a_replacement_of_integers_for_a_float_activation_is_one_line(llama, make):
    ids = llama.to_tokens("hello there you")
    with mk.hooks(llama, {"blocks.0.hook_resid_pre": lambda act, hook: make(act)}), \
            pytest.raises(MechkitError, match=r"blocks\.0\.hook_resid_pre returned .* values; the activation there is float32"):
        llama(ids)


# ---- class 3: the API's file writers take their lock like every writer ------------------------------------------
@pytest.fixture
def held_by_another_run(tmp_path):
    """A directory another live process (a run's stand-in) holds the lock of."""
    import subprocess
    import sys

    from mechkit.io.locks import lock_path

    folder = tmp_path / "run"
    folder.mkdir()
    code = ("import sys, time\nfrom mechkit.io.outlock import out_lock\n"
            "with out_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert lock_path(folder).exists()
        yield folder
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _attention_page(llama, path):
    mk.show_attention(llama, "hi there you", heads="0.1").save(path)


def _activation_vector(llama, path):
    from mechkit.actvec.vector import ActivationVector

    ActivationVector(torch.randn(64), "function-vector", "swap", 0, "add", llama.weights_sha256()).save(path)


@pytest.mark.parametrize("save", [_attention_page, _activation_vector], ids=["attention page", "activation vector"])
def test_an_api_save_inside_a_directory_another_run_writes_is_refused(llama, held_by_another_run, save):
    path = held_by_another_run / "mine.out"
    with pytest.raises(MechkitError, match="which another mechkit run is writing"):
        save(llama, path)
    assert not path.exists() and sorted(p.name for p in held_by_another_run.iterdir()) == []


@pytest.mark.parametrize("save", [_attention_page, _activation_vector], ids=["attention page", "activation vector"])
def test_an_api_save_elsewhere_writes_and_leaves_no_lock(llama, tmp_path, save):
    path = tmp_path / "mine.out"
    save(llama, path)
    save(llama, path)  # again, over its own file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.out"]
    with pytest.raises(MechkitError, match="does not exist"):
        save(llama, tmp_path / "missing" / "mine.out")
    assert not (tmp_path / "missing").exists()


# ---- class 1: `cache clear` takes a run's step folder only when it holds nothing but steps -----------------------
@pytest.mark.parametrize("names", [["runs"], ["--all"], ["runs/0123456789abcdef0123456789abcdef"]])
def test_cache_clear_keeps_a_users_hash_named_experiment_in_a_runs_folder(tmp_path, monkeypatch, names):
    from click.testing import CliRunner

    from mechkit.cli.main import cli

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    mine = tmp_path / "runs" / "0123456789abcdef0123456789abcdef"  # an MLflow run id
    (mine / "artifacts").mkdir(parents=True)
    (mine / "metrics.csv").write_text("precious")
    steps = tmp_path / "runs" / "fedcba9876543210"
    (steps / "finetune").mkdir(parents=True)
    mark_run_dir(steps)  # as a run makes it
    (steps / "0123456789abcdef.json").write_text('{"key": "k", "value": 1}')
    listed = CliRunner().invoke(cli, ["cache", "list"])
    assert "1 run(s), for resuming" in listed.output, listed.output
    CliRunner().invoke(cli, ["cache", "clear", *names])
    assert (mine / "metrics.csv").read_text() == "precious"
    assert not steps.exists() or names[0].startswith("runs/")


def test_a_cache_name_too_long_for_the_file_system_warns_and_the_run_goes_on(tmp_path, monkeypatch):
    from rich.console import Console

    from mechkit.io.outlock import claimed

    cache = tmp_path / ("d" * 300)  # exists() on it raises ENAMETOOLONG: it was a fatal OSError after the load
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    text = io.StringIO()
    with claimed(cache / "runs" / "0123456789abcdef", Console(file=text, width=1000)) as kept:
        assert kept is None
    assert "cannot keep finished steps" in text.getvalue() and "File name too long" in text.getvalue()
    assert list(tmp_path.iterdir()) == []


# ---- class 1: an --out that is or holds a file an option names (--from) is refused before the model loads ----------
@pytest.mark.parametrize("where", ["is", "holds"])
def test_an_out_that_is_or_holds_the_from_report_is_refused(tmp_path, where):
    from mechkit.report import build_report, write_report

    out = tmp_path / "d"
    detect = out if where == "is" else out / "det"
    report = build_report(plugin="detect", plugin_version="0.1", model={"name": "tiny:llama"}, params={}, seed=0,
                          results={}, artifacts=[], timings={}, finding="")
    write_report(detect, report)
    before = sorted(p.name for p in detect.iterdir())
    with pytest.raises(MechkitError, match="which the run reads"):
        mk.run("attention", model="tiny:llama", out=out, force=True, from_report=str(detect), heads="induction")
    assert sorted(p.name for p in detect.iterdir()) == before
