"""Issue 32, pass 10's leftovers fixed by the lead: cache entries are mechkit's by their metadata file or by
holding only model files, never by their name alone.

A ``$MECHKIT_CACHE`` pointed at a project directory may hold a user's ``toy/induction-deadbeef/`` or a
``gguf/<stem>-<16 hex>/`` folder: `cache clear` deleted it (its name matched), and the toy model's training and
a GGUF conversion replaced it as a "stale partial entry".
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mechkit.errors import MechkitError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _user_folder(path):
    path.mkdir(parents=True)
    (path / "notes.txt").write_text("precious")
    return path / "notes.txt"


@pytest.mark.parametrize("group, name", [("toy", "induction-deadbeef"), ("gguf", "my-model-0123456789abcdef")])
def test_cache_clear_keeps_a_users_folder_that_bears_an_entry_name(cache, group, name):
    from mechkit.cli.main import cli

    notes = _user_folder(cache / group / name)
    old_entry = cache / group / (name[:-1] + "0")  # an entry written before the metadata file: model files only
    old_entry.mkdir()
    for file in ("config.json", "model.safetensors", "tokenizer.json"):
        (old_entry / file).write_text("{}")
    done = CliRunner().invoke(cli, ["cache", "clear", "--all"])
    assert done.exit_code == 0, done.output
    assert notes.read_text() == "precious" and not old_entry.exists()


def test_training_the_toy_model_never_replaces_a_users_folder_of_its_name(cache):
    from mechkit.model.sources.toy import cache_dir, toy_model

    notes = _user_folder(cache_dir())
    with pytest.raises(MechkitError, match="in the way of mechkit's cache entry") as err:
        toy_model()  # refused before the training
    assert "\n" not in str(err.value) and "$MECHKIT_CACHE" in err.value.fix
    assert notes.read_text() == "precious"


def test_a_gguf_conversion_never_replaces_a_users_folder_of_its_name(cache, tmp_path):
    from mechkit.model.sources.gguf import cached_gguf, entry_dir, gguf_sha256

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(200)))
    notes = _user_folder(entry_dir(gguf, gguf_sha256(gguf)))
    with pytest.raises(MechkitError, match="in the way of mechkit's cache entry"):
        cached_gguf(gguf)  # refused before dequantizing (this file would not parse)
    assert notes.read_text() == "precious"


def test_replacing_a_run_that_saved_vectors_names_vectors_not_a_model(tmp_path):
    """select-tasks --force over an icl-vectors run said the folder "holds a model" (pass 10b's note)."""
    from mechkit.io.replace import refuse_foreign_model, replacing_dir

    out = tmp_path / "D"
    with replacing_dir(out, writer="icl-vectors") as built:
        for name in ("report.json", "swap.task-vector.safetensors"):
            (built / name).write_text("{}")
    with pytest.raises(MechkitError, match=r"holds saved tensors \(vectors or weights\) that a `icl-vectors` run"):
        refuse_foreign_model(out, "select-tasks", ["report.json"])


@pytest.mark.parametrize("plugin, options", [
    ("finetune", dict(task="capitalize", steps=2, batch_size=2, eval_n=2)),
    ("prune", dict(guide="magnitude", target="heads", sparsity="0.25", tasks="swap", n=2, calib=2, shots=1, repeats=1,
                   timing_batch=1, save_model=True)),
])
def test_a_saved_model_larger_than_the_file_size_limit_is_refused_before_the_work(tmp_path, monkeypatch, plugin,
                                                                                   options):
    """finetune under ``ulimit -f`` trained to the end, then failed to write the weights (pass 11a's note)."""
    import mechkit as mk
    from mechkit.taskarith import finetune as ft
    from tests.conftest import file_size_limit

    monkeypatch.setattr(ft, "finetune", lambda *a, **k: pytest.fail("trained before the refusal"))
    with file_size_limit(200_000), pytest.raises(MechkitError, match="more than this process's file-size limit") as e:
        mk.run(plugin, model="tiny:llama", out=tmp_path / "run", device="cpu", **options)
    assert "ulimit -f unlimited" in e.value.fix and not (tmp_path / "run").exists()


def test_a_vector_path_that_is_a_fifo_is_named_as_one_not_missing(tmp_path):
    import os

    from mechkit.actvec import ActivationVector

    fifo = tmp_path / "v.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(MechkitError, match="is not a regular file"):
        ActivationVector.load(fifo)
    with pytest.raises(MechkitError, match="does not exist"):
        ActivationVector.load(tmp_path / "missing.safetensors")


def test_cache_list_and_clear_refuse_a_mechkit_cache_that_is_a_file(tmp_path, monkeypatch):
    """`cache list` printed "(empty)" for it."""
    from click.testing import CliRunner

    from mechkit.cli.main import cli
    from mechkit.io.disk_cache import cache_root

    (tmp_path / "f").write_text("mine")
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "f"))
    for args in (["cache", "list"], ["cache", "clear", "--all"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code != 0 and "is not a directory" in result.output, result.output
    assert (tmp_path / "f").read_text() == "mine"  # (a run goes on unkept: tests/test_redteam7_a.py)
    monkeypatch.setenv("MECHKIT_CACHE", "rel-cache")
    monkeypatch.chdir(tmp_path)
    assert cache_root() == tmp_path / "rel-cache"  # relative: from the working directory, made absolute


def test_gradients_at_a_read_only_point_name_the_activation_it_is_computed_from():
    import mechkit as mk
    from mechkit.errors import MechkitError

    m = mk.load_model("tiny:llama", device="cpu")
    with pytest.raises(MechkitError, match=r"cannot take a gradient at ln_final.hook_scale.*blocks\.1\.hook_resid_post"):
        mk.gradients(m, "ln_final.hook_scale", m.to_tokens("hello"), lambda logits: logits[0, -1, 3])


def test_a_plugin_that_declares_a_table_it_writes_is_not_held_to_the_model_file_size_limit(tmp_path):
    """The ``ulimit -f`` check is for runs that save a model; a third-party plugin declaring ``scores.csv``
    (so the runner checks --out for it) was refused for its model's weight size."""
    import mechkit as mk
    from tests.conftest import file_size_limit

    class Table(mk.Plugin):
        name, version, summary = "table-writer", "0.0.1", "writes a small table beside its report"

        @classmethod
        def writes(cls, params):
            return ("scores.csv",)

        def run(self, ctx):
            return mk.Result(results={"rows": 1}, files={"scores.csv": "head,score\n0.1,0.5\n"})

    with file_size_limit(200_000):  # the weights (~400 kB) would not fit; the table and report do
        run = mk.run(Table, model="tiny:llama", out=tmp_path / "run", device="cpu")
    assert run.results == {"rows": 1} and (tmp_path / "run" / "scores.csv").is_file()
