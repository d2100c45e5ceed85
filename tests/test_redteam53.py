"""Red-team pass 53, fixed.

- A path given to the Python API as a PathLike whose ``__fspath__`` gives bytes raised a raw TypeError
  (``AttentionView.save``, ``TaskVector.save``/``load``, ``ActivationVector.load``, ``mk.load_report``); it is
  decoded as the system decodes it (:mod:`mechkit.io.patharg`).
- ``write_locked("x/")`` wrote the file ``x``; a file path ending in ``/`` is refused, its fix never a name under
  a file nor one keeping a ``..`` past a missing name; a folder ``--out`` whose ``..`` lands on a file was
  offered that file.
- ``prune --sparsity heads=0.9`` (each key/value group keeps a head) or ``layers=0.9`` of 2 removed what the
  model can lose under a row labelled 0.9; such a level is refused before the work with the most it can remove.
- ``--offload-folder nosuch/../OF`` left an empty ``nosuch``; ``tools/taskselect_rho.py --json nosuch/../x``
  was refused only after the work; ``mechkit.taskselect.rho.load_report`` hung on a FIFO.
- Fixes: ``lower --protect-top-k`` names a value that works; its guide refusal no longer says "add heads" under
  ``--target layers``; ``--protect-top-k 0`` is never "ignored"; a repeated ``--sparsity`` key's example uses the
  user's fractions; a pruned model stripped of its ``mechkit_pruning`` entry is not told to set its layer
  count; a roll-back whose ``FOLDER`` became a link says so, not "holds a mount point".
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rich.console import Console

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.io.journal import journal_path
from mechkit.io.locked_write import write_locked
from mechkit.io.out import check_out
from mechkit.options.option import OptionError
from mechkit.pruning.guides import Scores
from mechkit.pruning.select import make_plan, past_reach, removes_nothing
from tests.rho_tool import rho_tool


class Raw:
    """A PathLike giving bytes, as ``os.fspath`` allows."""

    def __init__(self, path):
        self.path = path

    def __fspath__(self):
        return os.fsencode(str(self.path))


QUIET = dict(console=Console(file=io.StringIO()))


# --- bytes paths ------------------------------------------------------------------------------------------------


def test_bytes_paths_are_read_as_the_system_reads_them(tmp_path, monkeypatch):
    from mechkit.actvec.vector import ActivationVector
    from mechkit.taskarith.vector import TaskVector

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    handle = mk.load_model("tiny:llama")
    view = mk.show_attention(handle, "The cat sat", "0.0")
    assert view.save(Raw(tmp_path / "a.html")).read_text(encoding="utf-8").startswith("<!")
    assert write_locked(os.fsencode(str(tmp_path / "b.txt")), "x", "the test") == tmp_path / "b.txt"
    vector = TaskVector({"w": torch.ones(2)})
    assert vector.save(Raw(tmp_path / "v.safetensors")) == tmp_path / "v.safetensors"
    assert TaskVector.load(Raw(tmp_path / "v.safetensors")).numel() == 2
    with pytest.raises(MechkitError, match="is not a mechkit activation vector"):  # read, then refused in one line
        ActivationVector.load(Raw(tmp_path / "v.safetensors"))
    mk.run("inspect", model=handle, out=tmp_path / "run", **QUIET)
    assert mk.load_report(Raw(tmp_path / "run")).report["plugin"] == "inspect"
    handle.model.save_pretrained(tmp_path / "m")
    handle.tokenizer.save_pretrained(tmp_path / "m")
    assert mk.load_model(Raw(tmp_path / "m")).anatomy.n_layers == 2


@pytest.mark.parametrize("value", [None, 3, 2.5, ["v.safetensors"]])
def test_a_path_api_given_no_path_refuses_it_in_one_line(value):
    from mechkit.actvec.vector import ActivationVector
    from mechkit.adapt.scheduler import Scheduler
    from mechkit.taskarith.vector import TaskVector

    for call in (TaskVector.load, ActivationVector.load, Scheduler.load, TaskVector({"w": torch.ones(1)}).save,
                 mk.load_report, mk.load_model):
        with pytest.raises(MechkitError, match="path"):
            call(value)


# --- a file path ending in / ------------------------------------------------------------------------------------


def test_an_api_save_to_a_name_ending_in_a_slash_is_refused_and_writes_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(MechkitError, match="ends with /, which names a folder") as err:
        write_locked(f"{tmp_path}/x/", "data", "the attention page")
    assert err.value.fix == f"drop the / ({tmp_path / 'x'})"
    with pytest.raises(MechkitError, match="ends with /") as err:
        write_locked(Raw(f"{tmp_path}/d/"), "data", "the attention page")
    assert err.value.fix == f"name a file inside it, e.g. {tmp_path / 'd' / 'page.html'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and not any((tmp_path / "d").iterdir())


@pytest.mark.parametrize("given,fix", [
    ("f/", "drop the / (--out {t}/f)"),  # a file there: never a name under it
    ("nosuch/../x/", "drop the / (--out {t}/x)"),  # never the .. past a missing name
    ("d/", "name a file inside it, e.g. --out {t}/d/name.safetensors"),
])
def test_a_file_out_ending_in_a_slash_is_offered_a_fix_that_works(tmp_path, given, fix):
    (tmp_path / "f").write_text("F")
    (tmp_path / "d").mkdir()
    with pytest.raises(MechkitError, match="ends with /") as err:
        check_out(f"{tmp_path}/{given}", kind="file")
    assert err.value.fix == fix.format(t=tmp_path)
    check_out(err.value.fix.split("--out ")[1].rstrip(")"), kind="file", force=True)  # the fix is accepted


def test_a_folder_out_whose_dot_dot_lands_on_a_file_is_not_offered_that_file(tmp_path):
    (tmp_path / "f").write_text("F")
    with pytest.raises(MechkitError, match="which is no folder") as err:
        check_out(tmp_path / "nosuch" / ".." / "f")
    assert err.value.fix == f"choose another --out, without the .. ({tmp_path / 'f'}, where it leads, is a file)"


# --- a level past what the model can lose ----------------------------------------------------------------------

SHAPES = {  # (n_layers, n_heads, n_kv_heads, d_mlp)
    "gqa": (2, 4, 2, 16), "mha": (3, 4, 4, 8), "mqa": (2, 6, 1, 8), "wide": (4, 8, 2, 32)}
LEVELS = [0.2, 0.4, 0.5, 0.6, 0.75, 0.9, 0.99]


def _anatomy(shape):
    L, H, kv, d = SHAPES[shape]
    return SimpleNamespace(n_layers=L, n_heads=H, n_kv_heads=kv, n_groups=H // kv, d_mlp=d)


def _removed(anatomy, level, allocation, gqa):
    rng = np.random.default_rng(0)
    L, H, d = anatomy.n_layers, anatomy.n_heads, anatomy.d_mlp
    scores = Scores(rng.random((L, d)), rng.random((L, H)), rng.random(L), "magnitude")
    plan = make_plan(scores, anatomy, level, allocation, gqa)
    return {"layers": len(plan.layers), "heads": sum(map(len, plan.heads.values())),
            "neurons": sum(map(len, plan.mlp.values()))}


@pytest.mark.parametrize("shape,allocation,gqa", [  # --gqa group on MQA is refused before the levels (pass 49)
    (shape, allocation, gqa) for shape in sorted(SHAPES) for allocation in ("uniform", "global")
    for gqa in ("slot", "group") if not (gqa == "group" and shape == "mqa")])
def test_a_level_past_reach_is_refused_and_its_fix_removes_the_most_it_names(shape, allocation, gqa):
    anatomy = _anatomy(shape)
    refused = 0
    for target in ("heads", "layers", "neurons"):
        for fraction in LEVELS:
            level = {target: fraction}
            if removes_nothing(anatomy, level, allocation, gqa):
                continue
            found = past_reach(anatomy, level, allocation, gqa)
            if found is None:  # met: what it removes is what was asked, rounded to the slots that go together
                continue
            refused += 1
            most = int(found[0].split("so at most ")[1].split()[0])
            fixed = json.loads("{" + ",".join(f'"{k}": {v}' for k, v in (
                part.split("=") for part in found[1].split("--sparsity ")[1].rstrip(")").split(","))) + "}")
            assert past_reach(anatomy, fixed, allocation, gqa) is None and not removes_nothing(anatomy, fixed,
                                                                                                 allocation, gqa)
            n_layers_kept = anatomy.n_layers
            got = _removed(anatomy, fixed, allocation, gqa)[target]
            per_layer = allocation == "uniform" and target != "layers"
            assert got == (most * n_layers_kept if per_layer else most), (level, found, got)
            assert _removed(anatomy, level, allocation, gqa)[target] == got  # what 0.9 had silently removed
    assert refused  # 0.99 is past every shape's reach


def test_prune_refuses_a_level_past_reach_before_the_work(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    common = dict(model="tiny:llama", tasks="capitalize", calib=2, n=2, shots=1, repeats=1, **QUIET)
    with pytest.raises(OptionError, match="asks for 7 of this model's 8 heads, and each key/value group keeps a "
                                          "head, so at most 4 can go") as err:
        mk.run("prune", out=tmp_path / "a", target="heads", sparsity="0.9", guide="magnitude", **common)
    assert err.value.fix == "give it 0.5 or less (--sparsity heads=0.5)"
    with pytest.raises(OptionError, match="layers=0.9 asks for 2 of this model's 2 layers"):
        mk.run("prune", out=tmp_path / "b", target="layers", sparsity="0.9", guide="magnitude", **common)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    run = mk.run("prune", out=tmp_path / "c", target="heads", sparsity="0.5", guide="magnitude", **common)
    assert run.report["results"]["rows"][0]["plan"]["counts"]["heads"] == 4


# --- paths refused before the work -------------------------------------------------------------------------------


def test_an_offload_folder_going_back_out_of_a_missing_name_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MechkitError, match="--offload-folder nosuch/../OF goes back") as err:
        mk.load_model("tiny:llama", offload_folder="nosuch/../OF")
    assert err.value.fix == f"name the place without the .. (--offload-folder {tmp_path / 'OF'})"
    assert list(tmp_path.iterdir()) == []


def test_the_rho_tools_json_target_is_checked_like_an_out(tmp_path):
    tool = rho_tool()
    (tmp_path / "run").mkdir()
    with pytest.raises(MechkitError, match="--json .*nosuch/../x.json goes back"):
        tool.check_json_target(f"{tmp_path}/nosuch/../x.json", str(tmp_path / "run"))
    with pytest.raises(MechkitError, match="ends with /, which names a folder"):
        tool.check_json_target(f"{tmp_path}/out/", str(tmp_path / "run"))
    tool.check_json_target(str(tmp_path / "x.json"), str(tmp_path / "run"))  # the fix: accepted


def test_the_rho_reader_never_blocks_on_a_fifo_nor_reads_through_a_link(tmp_path):
    from mechkit.taskselect.rho import load_report

    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "report.json")
    (tmp_path / "elsewhere.json").write_text('{"plugin": "select-tasks"}')
    (tmp_path / "linked").mkdir()
    os.symlink(tmp_path / "elsewhere.json", tmp_path / "linked" / "report.json")
    def hung(*_):
        raise TimeoutError("the reader blocked on the FIFO")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)  # a regression hangs on the FIFO: fail, never hang the suite
    try:
        with pytest.raises(MechkitError, match="is not a regular file"):
            load_report(tmp_path / "run")
        with pytest.raises(MechkitError, match="is a symlink, not the run's own report"):
            load_report(tmp_path / "linked")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


# --- fixes that name what works ----------------------------------------------------------------------------------


def test_protection_fixes_name_a_value_that_works():
    anatomy = SimpleNamespace(n_layers=2, n_heads=4, n_kv_heads=4, n_groups=1, d_mlp=8)
    scores = Scores(np.zeros((2, 8)), np.arange(8.0).reshape(2, 4), np.array([0.1, 5.0]), "induction",
                    ((0, 0), (0, 1), (1, 0)))
    with pytest.raises(MechkitError, match="with the 3 that --protect-top-k keeps only") as err:
        make_plan(scores, anatomy, {"heads": 0.75}, "global", strict=True)
    assert "--protect-top-k 0 keeps none" in err.value.fix
    scores.protected_heads = ()  # what --protect-top-k 0 gives
    assert sum(map(len, make_plan(scores, anatomy, {"heads": 0.75}, "global", strict=True).heads.values())) == 6


@pytest.mark.parametrize("target,refused", [("neurons", False), ("layers", True), ("heads", True)])
def test_protect_top_k_0_is_never_ignored_and_its_guide_fix_adds_no_heads_under_layers(tmp_path, monkeypatch,
                                                                                      target, refused):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    common = dict(model="tiny:llama", tasks="capitalize", calib=2, n=2, shots=1, repeats=1, guide="magnitude",
                  target=target, sparsity="0.5", **QUIET)
    run = mk.run("prune", out=tmp_path / "a", protect_top_k=0, **common)  # 0 keeps none: nothing to ignore
    assert run.report["results"]["rows"]
    if refused:
        with pytest.raises(OptionError, match="--protect-top-k") as err:
            mk.run("prune", out=tmp_path / "b", protect_top_k=3, **common)
        assert "--target" not in err.value.fix  # --target already prunes what it protects
        assert "--guide magnitude,induction" in err.value.fix


def test_a_repeated_sparsity_key_is_shown_its_own_fractions(tmp_path):
    with pytest.raises(OptionError, match="names heads twice") as err:
        mk.run("prune", model="tiny:llama", out=tmp_path / "a", target="heads", sparsity="heads=0.25,heads=0.5",
               **QUIET)
    assert err.value.fix.endswith("(--target heads --sparsity 0.25,0.5)")


def test_a_pruned_model_stripped_of_its_entry_is_not_told_to_set_its_layer_count(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    mk.run("prune", model="tiny:llama", out=tmp_path / "p", target="heads,layers", sparsity="heads=0.5,layers=0.5",
           guide="magnitude", tasks="capitalize", calib=2, n=2, shots=1, repeats=1, save_model=True, **QUIET)
    config = tmp_path / "p" / "model" / "config.json"
    data = json.loads(config.read_text())
    data.pop("mechkit_pruning")
    config.write_text(json.dumps(data))
    with pytest.raises(MechkitError, match="do not have the shapes config.json gives them") as err:
        mk.load_model(config.parent)
    assert "num_hidden_layers" not in str(err.value) and "mechkit_pruning" in err.value.fix


# --- the roll-back of a killed write whose folder became a link ---------------------------------------------------

KILLED = """
import os, sys
from pathlib import Path
import mechkit.io.replace as R
from tests.rho_tool import rho_tool
out = Path(sys.argv[1])
with R.replacing_dir(out, writer="taskvec apply", force=True) as tmp:
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
(out / "model" / "notes.txt").write_text("the user's")  # kept: the set's names go one folder deep
real = os.replace
def replace(src, dst):
    real(src, dst)
    if ".tmp-" in str(src) and Path(dst).name == "config.json" and Path(dst).parent.parent == out:
        os._exit(9)
R.os.replace = replace
with R.replacing_dir(out, writer="taskvec apply", force=True) as tmp:
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text('{"new": 1}')
"""


def test_a_roll_back_whose_folder_became_a_link_names_the_link_not_a_mount(tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 9 and journal_path(out).exists(), done.stderr[-2000:]
    record = json.loads(journal_path(out).read_text())
    assert "model/config.json" in record["install"]  # the case: a FOLDER/NAME entry
    (out / "model").rename(tmp_path / "moved")  # the user swaps the folder for a link to it
    os.symlink(tmp_path / "moved", out / "model")
    with pytest.raises(MechkitError, match="the folder holding config.json of that write, is now a link") as err:
        mk.load_report(out)
    assert "mount" not in str(err.value)
    assert (tmp_path / "moved" / "notes.txt").read_text() == "the user's"
    (out / "model").unlink()  # the fix, as said: the link out, the folder back
    (tmp_path / "moved").rename(out / "model")
    with pytest.raises(MechkitError, match="no report at"):  # rolled back, then read: a set with no report
        mk.load_report(out)
    assert json.loads((out / "model" / "config.json").read_text()) == {}
    assert not journal_path(out).exists()
