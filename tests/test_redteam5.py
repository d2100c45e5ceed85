"""The fifth red-team pass of issue 32, fixed as classes.

1. The rule "only the writer that saved a model may replace it with ``--force``" lived in the plugin runner,
   so ``taskvec apply --out DIR --force`` replaced a ``finetune`` run's model and report, and a ``prune
   --save-model`` run's ``model/``. It now lives in the shared writer (:mod:`mechkit.io.replace`): every
   directory writer names itself, its manifest records the name, and a forced write over another writer's
   saved model, or over model files mechkit never wrote, is refused before anything is replaced.
2. ``TaskVector.save`` checked ``--out`` before the minutes of work only: two ``taskvec extract`` (or
   ``merge``) runs to one new ``--out`` both exited 0 and one vector was silently lost. The check is made
   again under the file's lock.
3. ``report compare`` opened a run's PNG artifact with a blocking ``open``: a FIFO under that name hung it.
   Every read of a run's own files now goes through :func:`mechkit.io.read.read_regular` (no link
   followed, never blocks, regular files under a size limit only).
4. A forward pass given text, floats, an empty batch or ids outside the vocabulary raised torch's own
   AttributeError, IndexError or RuntimeError; :func:`mechkit.model.checks.token_ids.checked_ids` refuses each in
   one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import mechkit as mk
from tests.conftest import cli_in_process, noisy_model_dir


def _state(d: Path) -> dict:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(d.rglob("*"))}


# ---- 1. every directory writer refuses to replace a model it did not save ---------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finetune run (model beside its report), a prune --save-model run (model/), a vector and an apply."""
    root = tmp_path_factory.mktemp("writers")
    mk.run("finetune", model="tiny:llama", task="capitalize", steps=1, batch_size=2, eval_n=2,
           out=str(root / "ft"), device="cpu")
    mk.run("prune", model="tiny:llama", target="heads", sparsity="0.25", guide="magnitude", save_model=True,
           calib=2, n=2, shots=0, repeats=1, out=str(root / "pr"), device="cpu")
    vec = root / "v.safetensors"
    assert cli_in_process("taskvec", "extract", "--base", "tiny:llama", "--finetuned",
                          str(noisy_model_dir(root / "noisy")), "--out", str(vec)).returncode == 0
    assert cli_in_process("taskvec", "apply", "--base", "tiny:llama", "-v", f"a={vec}", "--expr", "0.5*a",
                          "--out", str(root / "merged")).returncode == 0
    return root


@pytest.mark.parametrize("target, wrote", [("ft", "finetune"), ("pr/model", "prune")])
def test_taskvec_apply_force_never_replaces_a_model_another_run_saved(runs, target, wrote):
    out = runs / target
    before = _state(out)
    r = cli_in_process("taskvec", "apply", "--base", "tiny:llama", "-v", f"a={runs / 'v.safetensors'}",
                       "--expr", "a", "--out", str(out), "--force")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"holds a model that a `{wrote}` run wrote" in r.stderr and "another --out" in r.stderr
    assert _state(out) == before


def test_taskvec_apply_force_still_replaces_its_own_directory(runs):
    out = runs / "merged"
    assert json.loads((out / ".mechkit-files").read_text())["writer"] == "taskvec apply"
    old = (out / "model.safetensors").read_bytes()
    r = cli_in_process("taskvec", "apply", "--base", "tiny:llama", "-v", f"a={runs / 'v.safetensors'}",
                       "--expr", "a", "--out", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert (out / "model.safetensors").read_bytes() != old  # λ = 1 now, not 0.5


def test_a_plugin_force_never_replaces_a_taskvec_apply_model(runs):
    out = runs / "merged"
    before = _state(out)
    with pytest.raises(mk.MechkitError, match="holds a model that a `taskvec apply` run wrote"):
        mk.run("inspect", model="tiny:llama", out=str(out), force=True, device="cpu")
    assert _state(out) == before


def test_model_files_mechkit_never_wrote_are_never_replaced(tmp_path):
    """A user's own model directory (no manifest, no report): --force may not replace its weights."""
    user = noisy_model_dir(tmp_path / "mine")
    before = {p.name: p.read_bytes() for p in user.iterdir()}
    vec = tmp_path / "v.safetensors"
    assert cli_in_process("taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(user),
                          "--out", str(vec)).returncode == 0
    r = cli_in_process("taskvec", "apply", "--base", "tiny:llama", "-v", f"a={vec}", "--expr", "a",
                       "--out", str(user), "--force")
    assert r.returncode != 0 and "mechkit did not write" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(mk.MechkitError, match="mechkit did not write"):
        mk.run("finetune", model="tiny:llama", task="capitalize", steps=1, batch_size=2, eval_n=2,
               out=str(user), force=True, device="cpu")
    assert {p.name: p.read_bytes() for p in user.iterdir()} == before


def test_the_api_writers_obey_the_same_rule(runs, tmp_path):
    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove
    from mechkit.taskarith import TaskVector, save_merged

    handle = mk.load_model("tiny:llama", device="cpu")
    before = _state(runs / "ft")
    with pytest.raises(mk.MechkitError, match="`finetune` run wrote"):
        save_merged(handle, TaskVector.load(runs / "v.safetensors"), runs / "ft", force=True)
    with pytest.raises(mk.MechkitError, match="`finetune` run wrote"):
        save_pruned(prune_copy(handle, UnitsToRemove(heads={0: [0, 1]})), runs / "ft", force=True)
    assert _state(runs / "ft") == before
    assert mk.load_model("tiny:llama", device="cpu")(torch.tensor([[1, 2]])).equal(handle(torch.tensor([[1, 2]])))


# ---- 2. a file writer re-checks --out under its lock ---------------------------------------------------

def test_a_vector_written_meanwhile_is_not_silently_replaced(tmp_path):
    from mechkit.taskarith import TaskVector

    path = tmp_path / "v.safetensors"
    first = TaskVector({"w": torch.ones(3)})
    first.save(path, force=False)
    with pytest.raises(mk.MechkitError, match="already exists"):
        TaskVector({"w": torch.zeros(3)}).save(path, force=False)
    assert TaskVector.load(path).deltas["w"].equal(torch.ones(3))
    TaskVector({"w": torch.zeros(3)}).save(path)  # the API's default (force=True) still overwrites
    assert TaskVector.load(path).deltas["w"].equal(torch.zeros(3))


def test_two_writers_started_together_never_both_succeed(tmp_path):
    from mechkit.taskarith import TaskVector

    path = tmp_path / "v.safetensors"
    start, results = threading.Barrier(4), {}

    def write(k: int) -> None:
        start.wait()
        try:
            TaskVector({"w": torch.full((1000,), float(k))}).save(path, force=False)
            results[k] = "ok"
        except mk.MechkitError as err:
            results[k] = str(err)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [k for k, v in results.items() if v == "ok"]
    assert len(winners) == 1, results
    assert TaskVector.load(path).deltas["w"][0].item() == float(winners[0])


def test_two_merge_processes_to_one_out_never_both_exit_0(tmp_path):
    from mechkit.taskarith import TaskVector

    vec = tmp_path / "a.safetensors"
    TaskVector({"model.layers.0.mlp.up_proj.weight": torch.ones(8, 4)}).save(vec)
    out = tmp_path / "m.safetensors"
    cmd = [sys.executable, "-m", "mechkit.cli.main", "taskvec", "merge", "-v", f"a={vec}", "--expr", "a",
           "--out", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = [p.wait(timeout=120) for p in procs]
    errs = [p.stderr.read() for p in procs]
    assert 0 in codes, errs
    if codes.count(0) == 2:  # not started together on this machine: the second then ran after the first
        pytest.skip("the two processes did not overlap (the first finished before the second's check)")
    assert any("already exists" in e or "in use" in e for e in errs) and not any("Traceback" in e for e in errs)


# ---- 3. a run's own files are read only where they are plain files ------------------------------------

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    for name in ("a", "b"):
        mk.run("attention", model="tiny:llama", prompt="abab", heads="0.1", out=str(root / name), device="cpu")
    return root


def test_report_compare_never_blocks_on_a_fifo_artifact(two_runs, tmp_path):
    run = two_runs / "a"
    png = next(n for n in json.loads((run / "report.json").read_text())["artifacts"] if n.endswith(".png"))
    os.replace(run / png, tmp_path / png)
    os.mkfifo(run / png)
    try:
        r = subprocess.run([sys.executable, "-m", "mechkit.cli.main", "report", "compare", str(run),
                            str(two_runs / "b"), "--out", str(tmp_path / "cmp")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "cmp" / "compare.html").is_file()
    finally:
        os.unlink(run / png)
        os.replace(tmp_path / png, run / png)


@pytest.mark.parametrize("make", ["fifo", "dir", "link"])
def test_read_regular_refuses_what_is_not_a_plain_file(tmp_path, make):
    from mechkit.io.read import read_regular

    target = tmp_path / "x"
    (tmp_path / "real").write_bytes(b"data")
    {"fifo": lambda: os.mkfifo(target), "dir": lambda: target.mkdir(),
     "link": lambda: target.symlink_to(tmp_path / "real")}[make]()
    assert read_regular(target, limit=100) is None
    assert read_regular(tmp_path / "real", limit=3) is None and read_regular(tmp_path / "real", limit=4) == b"data"


def test_a_forced_run_never_replaces_a_fifo_under_a_name_it_writes(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "report.json")
    with pytest.raises(mk.MechkitError, match="report.json, which is not a regular file"):
        mk.run("inspect", model="tiny:llama", out=str(out), force=True, device="cpu")
    assert [p.name for p in out.iterdir()] == ["report.json"] and (out / "report.json").is_fifo()


# ---- 4. token ids are checked before the model sees them --------------------------------------------------

@pytest.fixture(scope="module")
def m():
    return mk.load_model("tiny:llama", device="cpu")


@pytest.mark.parametrize("ids, says", [
    ("hello", "text, not token ids"),
    (torch.tensor([[1, -1]]), "token id -1 is outside"),
    (torch.tensor([[1, 10_000]]), "token id 10000 is outside"),
    (torch.tensor([[1.0, 2.0]]), "must be integers, not float32"),
    (torch.tensor([[True]]), "must be integers, not bool"),
    (torch.zeros(1, 0, dtype=torch.long), "at least one token"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "not shape (1, 2, 3)"),
    ([1, 2.5], "must be integers"),
    ([[1, 2], [3]], "one length per batch"),
    (7, "not int"),
    (None, "not NoneType"),
])
def test_bad_token_ids_are_one_line(m, ids, says):
    for call in (lambda: m(ids), lambda: mk.run_with_cache(m, ids, names=["blocks.0.hook_resid_post"])):
        with pytest.raises(mk.MechkitError) as err:
            call()
        assert says in str(err.value) and "\n" not in str(err.value) and "to_tokens" in str(err.value)


def test_good_token_ids_in_every_form_give_the_same_logits(m):
    ids = m.to_tokens("abc")
    want = m(ids)
    assert m(ids[0]).equal(want) and m(ids[0].tolist()).equal(want) and m([ids[0].tolist()]).equal(want)
    assert m(ids.int()).equal(want)
    vocab = m.model.get_input_embeddings().num_embeddings
    assert m(torch.tensor([[0, vocab - 1]])).shape == (1, 2, vocab)


# ---- options that would be silently ignored are refused --------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--grad-blocks", "1"], "--grad-blocks counts only under --representation lora-grad"),
    (["--rank", "4"], "--rank counts only under --representation lora-grad or --validate"),
    (["--representation", "actvec", "--grad-blocks", "2"], "--grad-blocks counts only"),
])
def test_select_tasks_refuses_lora_grad_options_it_would_ignore(tmp_path, args, says):
    r = cli_in_process("select-tasks", "--model", "tiny:llama", "--target", "past-tense", "--pool",
                       "opposite,lowercase", *args, "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and says in r.stderr and not (tmp_path / "run").exists()


def test_select_tasks_refuses_more_gradient_blocks_than_the_model_has(tmp_path):
    r = cli_in_process("select-tasks", "--model", "tiny:llama", "--target", "past-tense", "--pool",
                       "opposite,lowercase", "--representation", "lora-grad", "--grad-blocks", "3",
                       "--out", str(tmp_path / "run"))
    assert r.returncode != 0 and "more than the model's 2 blocks" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


# ---- an id that is neither a local directory nor reachable is refused at once ------------------------------

def test_an_unreachable_hub_id_is_one_line_without_a_minute_of_retries(monkeypatch, capfd):
    """The hub at a port nobody listens on (a real refused connection, as offline): no retries, no lines of
    huggingface_hub's own, one line naming the path, the id and the network."""
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    start = time.perf_counter()
    with pytest.raises(mk.MechkitError) as err:
        mk.load_model("nosuch/dir-of-mine")
    assert time.perf_counter() - start < 10
    assert "is not a local directory, not in the hub cache, and 127.0.0.1 cannot be reached" in str(err.value)
    assert "Retrying" not in capfd.readouterr().err


# ---- pass 6's leftovers in the shared writer and the vector reader ---------------------------------------

def test_a_file_added_to_a_reports_list_by_hand_survives_force(tmp_path):
    out = tmp_path / "run"
    mk.run("inspect", model="tiny:llama", out=str(out), device="cpu")
    (out / "thesis.tex").write_text("mine")
    report = json.loads((out / "report.json").read_text())
    report["artifacts"].append("thesis.tex")
    (out / "report.json").write_text(json.dumps(report))
    mk.run("inspect", model="tiny:llama", out=str(out), force=True, device="cpu")
    assert (out / "thesis.tex").read_text() == "mine"


def test_an_existing_empty_out_keeps_its_mode_and_setgid_group(tmp_path):
    import grp

    out = tmp_path / "shared"
    out.mkdir()
    other = next((g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getgid()), None)
    if other is not None:
        try:
            os.chown(out, -1, other)
        except PermissionError:
            other = None
    os.chmod(out, 0o2770)
    mk.run("inspect", model="tiny:llama", out=str(out), device="cpu")
    assert oct(out.stat().st_mode & 0o7777) == oct(0o2770)
    if other is not None:  # as root (or a member of another group): the files take the folder's group
        assert {p.stat().st_gid for p in out.iterdir()} == {other}


def test_a_vector_whose_header_disagrees_with_its_metadata_is_refused_before_its_tensors_are_read(tmp_path):
    from safetensors.torch import save_file

    from mechkit.taskarith import TaskVector

    good = tmp_path / "v.safetensors"
    TaskVector({"w": torch.ones(4)}).save(good)
    raw = good.read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    bad = tmp_path / "big.safetensors"
    save_file({"w": torch.ones(1000)}, str(bad), metadata=header["__metadata__"])  # numel 4 in its metadata
    with pytest.raises(mk.MechkitError, match="metadata 'numel' is 4 but the file holds 1000"):
        TaskVector.load(bad)


def test_the_api_save_without_force_refuses_an_existing_metadata_file(tmp_path):
    from mechkit.taskarith import TaskVector

    (tmp_path / "v.safetensors.json").write_text("my notes")
    with pytest.raises(mk.MechkitError, match="v.safetensors.json already exists"):
        TaskVector({"w": torch.ones(2)}).save(tmp_path / "v.safetensors", force=False)
    assert (tmp_path / "v.safetensors.json").read_text() == "my notes"
    assert not (tmp_path / "v.safetensors").exists()


def test_a_vector_at_a_non_utf8_path_names_the_rename(tmp_path):
    from mechkit.taskarith import TaskVector

    path = Path(os.fsdecode(bytes(tmp_path) + b"/v\xff.safetensors"))
    path.write_bytes(b"x")
    with pytest.raises(mk.MechkitError, match="is not UTF-8") as err:
        TaskVector.load(path)
    assert "rename" in str(err.value) and "extract it again" not in str(err.value)


@pytest.mark.parametrize("text", [3, [], ["a", 2], None])
def test_to_tokens_refuses_what_is_not_text_in_one_line(m, text):
    with pytest.raises(mk.MechkitError, match="to_tokens takes text or a list of texts"):
        m.to_tokens(text)


def test_the_resume_key_covers_the_device(m):
    """Steps computed on one device are never resumed on another (the numbers differ in the last bits)."""
    from mechkit import registry
    from mechkit.runner import resume_dir, run_model_key

    key = run_model_key(m)
    assert key["device"] == "cpu" and key["device_map"] is None and key["weights_sha256"] == m.weights_sha256()
    cls = registry.get("inspect")
    assert resume_dir(cls, key, {}, 0) != resume_dir(cls, {**key, "device": "cuda"}, {}, 0)


def test_mk_run_takes_head_objects_as_mk_ablate_does():
    for heads in ([mk.Head(0, 1), mk.Head(1, 2)], mk.Head(0, 1)):
        run = mk.run("attention", model="tiny:llama", prompt="abab", heads=heads, write=False, device="cpu")
        want = [[h.layer, h.head] for h in (heads if isinstance(heads, list) else [heads])]
        assert [[h["layer"], h["head"]] for h in run.results["heads"]] == want


def test_the_top_level_namespace_lists_no_stdlib_module():
    assert "importlib" not in dir(mk)
