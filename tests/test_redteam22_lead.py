"""Red-team pass 22 (find-only, issue 32), run on the code that closed pass 21: what it found, fixed.

A run that kept no steps warned that its (never made) steps folder held a user's files; a finished run deleted
a user's ``checkpoint.safetensors`` in a folder of their own beside its steps; a plugin with no source file (a
notebook cell) resumed on steps its old code computed; the unchanged check missed a tokenizer method set on
the tokenizer object, ``model_input_names`` changed and the handle's remembered counts, and refused a
``save_pretrained`` (it records ``architectures`` and ``dtype`` in the config) and an all-zero gradient.
"""

from __future__ import annotations

import pytest

import mechkit as mk
from mechkit.errors import MechkitError
from tests.conftest import edit_plugin


def _plugin(edit):
    return edit_plugin(edit, "rt22-edit")


def test_a_run_that_keeps_no_steps_says_nothing_about_its_steps_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    mk.run("inspect", model="tiny:gpt2", write=False)
    assert "holds files no mechkit run writes" not in capsys.readouterr().err


def test_a_finished_run_keeps_a_users_checkpoint_in_a_folder_it_did_not_make(tmp_path):
    from mechkit.io.disk_cache import CHECKPOINT_FILE, finish_run_dir, mark_scratch

    folder = tmp_path / "runs" / "0123456789abcdef"
    mark_scratch(folder, "finetunes")
    (folder / "fedcba9876543210.json").write_text("{}")
    (folder / "finetunes" / "ft-0123456789abcdef").mkdir(parents=True)  # a unit's folder, as select-tasks makes
    (folder / "finetunes" / "ft-0123456789abcdef" / CHECKPOINT_FILE).write_bytes(b"ours")
    (folder / "mine").mkdir()
    (folder / "mine" / CHECKPOINT_FILE).write_bytes(b"precious")
    kept = finish_run_dir(folder)
    assert (folder / "mine" / CHECKPOINT_FILE).read_bytes() == b"precious" and folder / "mine" in kept
    assert not (folder / "finetunes").exists() and not (folder / "fedcba9876543210.json").exists()


@pytest.mark.parametrize("value", [2, 3])
def test_a_plugin_without_a_source_file_is_keyed_by_its_compiled_code(value):
    from mechkit.plugin_key import plugin_code

    def make(v):
        namespace = {"mk": mk}
        exec(compile(f"""
class Probe(mk.Plugin):
    name, version, summary, options = "probe-nb", "0.1.0", "probe", ()
    def run(self, ctx):
        return mk.Result(results={{"a": ctx.step("a", lambda: {v})}}, finding="ok")
""", "<notebook-cell>", "exec"), namespace)
        return namespace["Probe"]

    assert plugin_code(make(value)) == plugin_code(make(value))  # the same cell: the same key (it resumes)
    assert plugin_code(make(value)) != plugin_code(make(1))  # the cell edited: another key (it starts fresh)


def _encode_reversed(h):
    tokenizer = h.tokenizer
    original = type(tokenizer).encode
    tokenizer.encode = lambda text, *a, **k: original(tokenizer, text[::-1], *a, **k)


@pytest.mark.parametrize("edit,words", [
    (_encode_reversed, "tokenizer.encode was set on the tokenizer object"),
    (lambda h: setattr(h.tokenizer, "model_input_names", ["input_ids"]), "model_input_names was changed"),
    (lambda h: setattr(h, "_n_vocab", 10**9), "_n_vocab"),
    (lambda h: setattr(h, "_n_positions", 5), "_n_positions")])
def test_the_tokenizer_object_and_the_handles_counts_are_compared(edit, words):
    with pytest.raises(MechkitError, match=words):
        mk.run(_plugin(edit), model=mk.load_model("tiny:llama"), write=False)


def _zero_grad_kept(h):
    ids = h.to_tokens("hi there")
    h.model(ids, labels=ids).loss.backward()
    h.model.zero_grad(set_to_none=False)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("edit", [lambda h, tmp: h.model.save_pretrained(tmp / "saved"),
                                  lambda h, tmp: _zero_grad_kept(h), lambda h, tmp: h(h.to_tokens("hello"))])
def test_ordinary_use_that_computes_the_same_passes(family, edit, tmp_path):
    run = mk.run(_plugin(lambda h: edit(h, tmp_path)), model=mk.load_model(f"tiny:{family}"), write=False)
    assert all(run.report["checks"].values())


# --- pass 22 a, F1 and F2: prune --save-model's folder built in $TMPDIR --------------------------------------


def test_a_full_disk_in_mechkits_own_tmpdir_folder_names_tmpdir():
    import errno
    import os
    import tempfile

    from mechkit.io.fs_errors import describe

    inside = os.path.join(tempfile.gettempdir(), "mechkit-pruned-abc123", "model.safetensors")
    err = describe(OSError(errno.ENOSPC, "No space left on device", inside))
    assert "TMPDIR" in err.fix and "--out" not in err.fix
    elsewhere = os.path.join(tempfile.gettempdir(), "my-run", ".x.tmp-1-0a1b2c3d", "model.safetensors")
    assert "--out" in describe(OSError(errno.ENOSPC, "No space left on device", elsewhere)).fix


@pytest.mark.skipif(__import__("os").geteuid() != 0 or not __import__("shutil").which("mount"),
                    reason="a small tmpfs needs root and mount(8); the message logic is tested without it above")
def test_a_prepared_folder_moved_onto_a_full_disk_is_one_plain_error_and_leaves_nothing(tmp_path):
    import errno
    import subprocess

    from mechkit.io.leftovers import make_prepared_dir
    from mechkit.report.writer import move_prepared

    src = make_prepared_dir()  # as prune's save makes it
    (src / "model.safetensors").write_bytes(b"\0" * 400_000)
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(small)], check=True)
    try:
        with pytest.raises(OSError) as err:
            move_prepared(src, small / "model")
        assert err.value.errno == errno.ENOSPC and str(small) in err.value.filename  # the full disk's own path
        assert not src.exists()  # the prepared folder is not left in $TMPDIR
    finally:
        subprocess.run(["umount", str(small)], check=True)
