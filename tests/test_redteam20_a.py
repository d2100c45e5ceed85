"""Red-team pass 20 (find-only, issue 32), helper A's failures, each fixed in general.

`cache clear runs` deleted a user's files put in a marked run folder (any ``.json``, any hidden name, any folder
of ``.json``/``.safetensors`` files passed for a run's); an ``--out`` through a bind mount of a folder *inside*
the cache was accepted; a directory ``--force`` over a mount point inside it was refused only after the work;
``mk.pattern_hooks`` took functions of the wrong arity; a hook whose signature raises gave a raw exception and
one whose arguments cannot be read got a fix naming ``partial(act)``; a recording's completion missed an
intervention that moved only earlier positions; ``normalized_recovery`` told a quantized tensor to call
``.to_dense()`` and blamed the runs for a gap a float could not hold.
"""

from __future__ import annotations

import pytest

from mechkit.errors import MechkitError


def _marked(root, key="0123456789abcdef"):
    from mechkit.io.disk_cache import mark_run_dir

    folder = root / "runs" / key
    mark_run_dir(folder)
    (folder / "fedcba9876543210.json").write_text('{"key": "k", "value": 1}')
    return folder


@pytest.mark.parametrize("users", [
    {"my_results.json": "{}"}, {".my_notes": "secret"}, {".git/HEAD": "ref"},
    {"mymodel/config.json": "{}", "mymodel/model.safetensors": "w"}, {"finetune/notes.json": "{}"},
    {"finetune/unit/model.safetensors": "w"}])
def test_cache_clear_keeps_a_users_files_in_a_marked_run_folder(tmp_path, monkeypatch, users):
    from mechkit.io.disk_cache import FOREIGN, clear_cache, list_cache

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = _marked(tmp_path)
    for name, text in users.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    assert [e.name for e in list_cache(tmp_path)] == [FOREIGN]
    clear_cache([], all_entries=True, root=tmp_path)
    assert all((folder / name).read_text() == text for name, text in users.items())


def test_a_real_run_folder_with_its_checkpoints_and_temporaries_is_still_cleared(tmp_path, monkeypatch):
    from mechkit.io.disk_cache import CHECKPOINT_FILE, clear_cache, list_cache
    from mechkit.taskarith.finetune import CHECKPOINT

    assert CHECKPOINT_FILE == CHECKPOINT  # the name the cache recognises is the one finetune writes
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path))
    folder = _marked(tmp_path)
    (folder / "finetune").mkdir()
    (folder / "finetune" / CHECKPOINT).write_bytes(b"w")
    (folder / "finetunes" / "0011223344556677").mkdir(parents=True)
    (folder / "finetunes" / "0011223344556677" / CHECKPOINT).write_bytes(b"w")
    (folder / ".fedcba9876543210.json.tmp-99999999-0a1b2c3d").write_text("half")
    assert [e.name for e in list_cache(tmp_path)] == ["runs", "leftovers"]  # a killed writer's temporary file
    clear_cache(["runs"], root=tmp_path)
    assert not folder.exists()


# --- an --out through a bind mount of a folder inside the cache; a mount point inside a --force directory ---

needs_root = pytest.mark.skipif(__import__("os").geteuid() != 0 or not __import__("shutil").which("mount"),
                                reason="bind mounts need root and mount(8); the place logic is also tested without them")


def test_a_place_on_a_device_is_the_same_under_every_mount_that_shows_it():
    from pathlib import Path

    from mechkit.io.read import mount_place

    mounts = [("8:1", "/", "/"), ("8:1", "/data/cache/runs", "/mnt/rb"), ("0:5", "/", "/tmp"),
              ("8:1", "/data", "/srv/d")]
    assert mount_place(Path("/mnt/rb/x"), mounts) == ("8:1", Path("/data/cache/runs/x"))
    assert mount_place(Path("/srv/d/cache"), mounts) == ("8:1", Path("/data/cache"))
    assert mount_place(Path("/tmp/a"), mounts) == ("0:5", Path("/a"))
    assert mount_place(Path("/data/cache"), []) is None


@needs_root
@pytest.mark.parametrize("inside", ["runs", "toy", "runs/deeper"])
def test_an_out_through_a_bind_mount_of_a_folder_inside_the_cache_is_refused(tmp_path, monkeypatch, inside):
    import subprocess

    from mechkit.io.out import check_out, refuse_mount_point

    cache, alias = tmp_path / "cache", tmp_path / "alias"
    (cache / inside).mkdir(parents=True)
    alias.mkdir()
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    subprocess.run(["mount", "--bind", str(cache / inside), str(alias)], check=True)
    try:
        with pytest.raises(MechkitError, match="inside mechkit's cache"):
            check_out(alias / "x")
        with pytest.raises(MechkitError, match="inside mechkit's cache"):
            check_out(alias)
        with pytest.raises(MechkitError, match="choose another --out, outside this mount"):
            refuse_mount_point(alias)  # its fix no longer names a place inside the cache
        check_out(tmp_path / "elsewhere")  # a place outside is still taken
    finally:
        subprocess.run(["umount", str(alias)], check=True)


@needs_root
def test_a_force_over_a_directory_holding_a_mounted_file_is_refused_before_the_work(tmp_path):
    import subprocess

    from mechkit.io.out import check_out
    from mechkit.io.replace import MANIFEST

    out = tmp_path / "run"
    out.mkdir()
    (out / "report.json").write_text("{}")
    (out / "figure.png").write_text("old")
    (out / MANIFEST).write_text('["report.json", "figure.png"]')
    user = tmp_path / "userfile"
    user.write_text("user data")
    subprocess.run(["mount", "--bind", str(user), str(out / "figure.png")], check=True)
    try:
        with pytest.raises(MechkitError, match="holds figure.png, which --force would replace, and it is a mount"):
            check_out(out, force=True)
    finally:
        subprocess.run(["umount", str(out / "figure.png")], check=True)
    assert user.read_text() == "user data"
    check_out(out, force=True)  # unmounted: taken


# --- the hook API ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h():
    import mechkit as mk

    return mk.load_model("tiny:llama")


@pytest.mark.parametrize("fns,qkv", [({0: [lambda p, hook: None]}, None), ({0: [lambda: None]}, None),
                                     ({}, {0: {"q": [lambda q, hook: None]}}), ({}, {1: {"v": [lambda: None]}})])
def test_pattern_hooks_of_the_wrong_arity_are_one_line_before_the_forward(h, fns, qkv):
    import mechkit as mk

    with pytest.raises(MechkitError, match=r"cannot be called as fn\((pattern|tensor)\)"), \
            mk.pattern_hooks(h, fns, qkv=qkv):
        h(h.to_tokens("hello world"))


def test_a_hook_whose_signature_raises_is_one_line(h):
    import mechkit as mk

    class BadSignature:
        @property
        def __signature__(self):
            raise RuntimeError("boom")

        def __call__(self, act, hook):
            return None

    with pytest.raises(MechkitError, match="arguments cannot be read"), \
            mk.hooks(h, {"blocks.0.hook_resid_pre": BadSignature()}):
        pass


@pytest.mark.parametrize("make,call", [
    (lambda: __import__("functools").partial(__import__("torch").clamp, min=0), "your_callable(act)"),
    (lambda: __import__("torch").relu, "torch.relu(act)"), (lambda: max, "return max(act)")])
def test_the_fix_for_a_callable_whose_arguments_cannot_be_read_names_a_call_that_exists(h, make, call):
    import mechkit as mk

    with pytest.raises(MechkitError) as err, mk.hooks(h, {"blocks.0.hook_resid_pre": make()}):
        pass
    assert call in err.value.fix and "partial(act)" not in err.value.fix


@pytest.mark.parametrize("position", [0, 2, -1])
def test_a_completion_sees_an_intervention_at_any_position(h, position):
    import mechkit as mk

    ids = h.to_tokens("hello world, how are you")
    last = h.anatomy.n_layers - 1

    def moved(x, hook):
        x = x.clone()
        x[:, position] += 5.0
        return x

    with mk.hooks(h, {f"blocks.{last}.hook_resid_mid": moved}), mk.record(h, [f"blocks.{last}.hook_resid_post"]) as c:
        h(ids)
    with pytest.raises(MechkitError, match="other logits"):
        c.completion([f"blocks.{last}.hook_resid_mid"])


# --- normalized_recovery ---------------------------------------------------------------------------------------


def test_the_fix_for_a_quantized_grid_is_one_that_converts_it():
    import torch

    from mechkit.patching import normalized_recovery

    grid = torch.quantize_per_tensor(torch.tensor([0.5]), 0.1, 0, torch.quint8)
    with pytest.raises(MechkitError) as err:
        normalized_recovery(grid, 1.0, 0.0)
    assert "patched.dequantize()" in err.value.fix
    assert float(normalized_recovery(grid.dequantize(), 1.0, 0.0)[0]) == pytest.approx(0.5)


@pytest.mark.parametrize("patched", [2**62 + 1, "tensor"])
def test_a_gap_of_whole_numbers_no_float_holds_apart_is_taken_exactly(patched):
    import torch

    from mechkit.patching import normalized_recovery

    value = torch.tensor([2**62 + 1]) if patched == "tensor" else patched
    assert float(torch.as_tensor(normalized_recovery(value, 2**62 + 2, 2**62)).reshape(-1)[0]) == pytest.approx(0.5)
