"""Nothing lost, nothing silently wrong (issue 32): writes, locks, loads and resume keys under a hostile user.

Each section reproduces one class of failure on tiny models in temporary directories. A kill between
two steps of a write is simulated by failing a step with the roll-back switched off (what a ``kill -9``
leaves), then letting the next writer of the directory find the journal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from mechkit.errors import MechkitError, ModelLoadError
from mechkit.io.outlock import OutInUseError, out_lock
from mechkit.model.sources.tiny import byte_tokenizer, tiny_model
from mechkit.report import build_report, write_report


def _cli(capsys, *args: str) -> tuple[int, list[str]]:
    """Run the CLI; its exit code and stderr lines."""
    from mechkit.cli.main import main

    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as done:
        code = done.code
    lines = capsys.readouterr().err.strip().splitlines()
    return code, [x for x in lines if not x.startswith("mechkit: inspect: ")]  # the heartbeat off a terminal


def _model_dir(path: Path, family: str = "llama") -> Path:
    model, _ = tiny_model(family)
    model.save_pretrained(path, safe_serialization=True)
    byte_tokenizer().save_pretrained(path)
    return path


def _report(n: int, artifacts=()) -> dict:
    return build_report(plugin="probe", plugin_version="1", model={"name": "m"}, params={"n": n}, seed=0,
                        results={"run": n}, artifacts=list(artifacts), timings={}, finding=f"run {n}")


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def vector(tmp_path_factory):
    """A task vector of tiny:llama (extracted from a noisy copy of it)."""
    from mechkit.model import load_model
    from mechkit.taskarith import extract
    from tests.conftest import noisy_model_dir

    root = tmp_path_factory.mktemp("tv")
    ft = noisy_model_dir(root / "ft")
    tv = extract(load_model("tiny:llama", device="cpu", dtype="float32"), ft)
    return tv.save(root / "cap.safetensors")


# ---- 1. never delete or replace what is not ours --------------------------------------------------

def test_apply_force_keeps_the_users_files_and_replaces_only_the_model(tmp_path, capsys, vector):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "data.csv").write_text("1,2")
    code, err = _cli(capsys, "taskvec", "apply", "--base", "tiny:llama", "-v", f"cap={vector}", "--expr", "cap",
                     "--out", str(out), "--force")
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "data.csv").read_text() == "1,2"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    from mechkit.model import load_model

    assert load_model(str(out), device="cpu").anatomy.n_layers == 2  # a whole, loadable model


@pytest.mark.parametrize("where", ["holds", "is"])
def test_an_out_holding_or_being_an_input_is_refused_before_any_work(tmp_path, capsys, vector, where):
    out = tmp_path / "d"
    out.mkdir()
    inside = out / "cap.safetensors"
    inside.write_bytes(Path(vector).read_bytes())
    before = _tree(out)
    target = str(out) if where == "holds" else str(inside)
    cmd = ("apply", "--base", "tiny:llama") if where == "holds" else ("merge",)
    code, err = _cli(capsys, "taskvec", *cmd, "-v", f"cap={inside}", "--expr", "cap", "--out", target, "--force")
    assert code == 2 and len(err) == 1 and "the input" in err[0], err
    assert _tree(out) == before  # the input vector untouched


@pytest.mark.parametrize("place", ["cwd", "dot-dot", "home", "parent-of-cwd"])
def test_out_naming_the_working_or_home_directory_is_refused(tmp_path, monkeypatch, place):
    from mechkit.io import check_out

    work = tmp_path / "home" / "work"
    work.mkdir(parents=True)
    (work / "precious.txt").write_text("x")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = {"cwd": ".", "dot-dot": "sub/..", "home": str(tmp_path / "home"), "parent-of-cwd": ".."}[place]
    with pytest.raises(MechkitError, match="choose a new directory for --out"):
        check_out(out, force=True)
    with pytest.raises(MechkitError, match="mechkit will not write a run over it"):
        import mechkit as mk

        mk.run("inspect", model="tiny:gpt2", out=out, force=True)
    assert (work / "precious.txt").read_text() == "x"


def test_report_force_replaces_the_previous_runs_files_as_a_set_and_keeps_others(tmp_path):
    out = tmp_path / "run"
    write_report(out, _report(1), files={"a.csv": "old a", "gone.csv": "old only"})
    (out / "mine.txt").write_text("user")
    write_report(out, _report(2), files={"a.csv": "new a"}, force=True)
    names = sorted(p.name for p in out.iterdir())
    assert names == [".mechkit-files", "a.csv", "mine.txt", "report.html", "report.json"]  # gone.csv was the old run's
    assert json.loads((out / "report.json").read_text())["results"] == {"run": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temp dir, no journal


def _kill_at(monkeypatch, step: int):
    """``os.replace`` dies at its ``step``-th call and the roll-back is skipped, as after ``kill -9``."""
    import mechkit.io.replace as replace

    calls, real = [], os.replace

    def dying(src, dst):
        calls.append(dst)
        if len(calls) == step:
            raise KeyboardInterrupt("killed")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", dying)
    real_recover = replace.recover
    monkeypatch.setattr(replace, "recover", lambda out: False)
    return real_recover


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 6])
def test_a_run_killed_mid_replace_never_shows_a_report_beside_another_runs_files(tmp_path, monkeypatch, step):
    out = tmp_path / "ft"
    model_v1 = tmp_path / "m1"
    model_v1.mkdir()
    (model_v1 / "model.safetensors").write_text("weights 1")
    write_report(out, _report(1), files={"model": model_v1, "log.txt": "log 1"})
    (out / "mine.txt").write_text("user")
    old = _tree(out)
    model_v2 = tmp_path / "m2"
    model_v2.mkdir()
    (model_v2 / "model.safetensors").write_text("weights 2")
    _kill_at(monkeypatch, step)
    with pytest.raises(KeyboardInterrupt):
        write_report(out, _report(2), files={"model": model_v2, "log.txt": "log 2"}, force=True)
    monkeypatch.undo()
    if (out / "report.json").exists():  # what a reader sees right after the kill: a report only beside its files
        run = json.loads((out / "report.json").read_text())["results"]["run"]
        assert (out / "model" / "model.safetensors").read_text() == f"weights {run}"
    with out_lock(out):  # the next run of this --out rolls the killed one back first
        pass
    assert _tree(out) == old
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # temp dir and journal gone


def test_save_merged_killed_mid_replace_is_rolled_back_by_the_next_writer(tmp_path, monkeypatch, vector):
    from mechkit.model import load_model
    from mechkit.taskarith import TaskVector, save_merged

    handle = load_model("tiny:llama", device="cpu", dtype="float32")
    tv = TaskVector.load(vector)
    out = save_merged(handle, tv, tmp_path / "m")
    (out / "notes.txt").write_text("mine")
    old = _tree(out)
    _kill_at(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        save_merged(handle, tv, out, scale=0.5, force=True)
    monkeypatch.undo()
    assert not (out / "config.json").exists()  # the key file left first: no half-set is a loadable model
    save_merged(handle, tv, out, scale=0.5, force=True)  # recovers, then writes the new set whole
    assert (out / "notes.txt").read_text() == "mine" and _tree(out) != old
    assert load_model(str(out), device="cpu").anatomy.n_layers == 2


# ---- 2. never compute on weights the user did not give --------------------------------------------

def _drop_tensor(d: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(d / "model.safetensors")
    state.pop("model.layers.1.self_attn.q_proj.weight")
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})


def _more_layers(d: Path) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    cfg.pop("layer_types", None)
    (d / "config.json").write_text(json.dumps(cfg))


def _fewer_layers(d: Path) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    cfg.pop("layer_types", None)
    (d / "config.json").write_text(json.dumps(cfg))


def _pickle_only(d: Path) -> None:
    from safetensors.torch import load_file

    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()


def _nan(d: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(d / "model.safetensors")
    state["model.norm.weight"][3] = float("nan")
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})


def _latin1_config(d: Path) -> None:
    text = (d / "config.json").read_text().replace('"llama"', '"llamä"')
    (d / "config.json").write_bytes(text.encode("latin-1"))


DAMAGE = {"missing tensor": (_drop_tensor, "lack 1 tensor"), "more layers": (_more_layers, "lack "),
          "fewer layers": (_fewer_layers, "no place for"), "pickle only": (_pickle_only, "only pickle weights"),
          "nan": (_nan, "NaN values in model.norm.weight"), "non-utf8 config": (_latin1_config, "UTF-8")}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_model_directory_is_refused_before_any_work(tmp_path, monkeypatch, damage):
    from mechkit.model import load_model

    d = _model_dir(tmp_path / "m")
    DAMAGE[damage][0](d)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load (pickle) was called"))
    with pytest.raises(ModelLoadError, match=DAMAGE[damage][1]) as err:
        load_model(str(d), device="cpu")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("damage", ["missing tensor", "pickle only"])
def test_cli_refuses_a_damaged_model_in_one_line_and_writes_nothing(tmp_path, capsys, vector, damage):
    d = _model_dir(tmp_path / "m")
    DAMAGE[damage][0](d)
    code, err = _cli(capsys, "taskvec", "apply", "--base", str(d), "-v", f"cap={vector}", "--expr", "cap",
                     "--out", str(tmp_path / "merged"))
    assert code == 2 and len(err) == 1 and DAMAGE[damage][1] in err[0], err
    code, err = _cli(capsys, "inspect", "--model", str(d), "--out", str(tmp_path / "run"))
    assert code == 2 and len(err) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_an_in_memory_model_with_nan_weights_is_refused_at_load(tmp_path):
    import mechkit as mk

    model, tok = tiny_model("gpt2")
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("inf")
    with pytest.raises(ModelLoadError, match="inf values"):
        mk.load_model(model, tokenizer=tok)


# ---- 3. every writer locks, on the directory's real identity ----------------------------------------

@pytest.mark.parametrize("cmd", ["merge", "extract"])
def test_taskvec_extract_and_merge_take_the_lock(tmp_path, capsys, vector, cmd):
    out = tmp_path / "v.safetensors"
    args = {"merge": ("-v", f"cap={vector}", "--expr", "cap"),
            "extract": ("--base", "tiny:llama", "--finetuned", str(Path(vector).parent / "ft"))}[cmd]
    with out_lock(out):  # another run writing it
        code, err = _cli(capsys, "taskvec", cmd, *args, "--out", str(out))
    assert code == 2 and len(err) == 1 and "in use by another mechkit run" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("alias", ["dotdot", "symlink", "relative"])
def test_the_lock_cannot_be_bypassed_by_naming_the_directory_another_way(tmp_path, monkeypatch, alias):
    real = tmp_path / "runs" / "a"
    real.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    if alias == "symlink":
        (tmp_path / "link").symlink_to(real)
    other = {"dotdot": tmp_path / "runs" / ".." / "runs" / "a", "symlink": tmp_path / "link",
             "relative": Path("runs/a")}[alias]
    with out_lock(real), pytest.raises(OutInUseError), out_lock(other):
        pass


@pytest.mark.parametrize("where", ["inside", "the cache itself", "holding the cache"])
def test_an_out_in_mechkits_cache_is_refused(tmp_path, monkeypatch, where):
    import mechkit as mk

    cache = tmp_path / "cache"
    (cache / "runs").mkdir(parents=True)
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    out = {"inside": cache / "runs" / "mine", "the cache itself": cache, "holding the cache": tmp_path}[where]
    said = "holds mechkit's cache" if where == "holding the cache" else "inside mechkit's cache"
    with pytest.raises(MechkitError, match=said):
        mk.run("inspect", model="tiny:gpt2", out=out, force=True)


# ---- 4. a resume key covers everything that decides a result --------------------------------------

def test_the_resume_key_changes_with_config_tokenizer_dtype_and_mechkit_version(monkeypatch):
    import mechkit
    from mechkit import registry
    from mechkit.model import load_model
    from mechkit.runner import resume_dir

    cls = registry.get("inspect")

    def key(**changes) -> Path:
        model, tok = tiny_model("llama")
        handle = load_model(model, tokenizer=tok, device="cpu", dtype=changes.pop("dtype", "float32"))
        for name, value in changes.items():
            setattr(handle.model.config, name, value)
        from mechkit.model.checks.identity import model_identity

        return resume_dir(cls, model_identity(handle), {}, 0)

    base = key()
    assert key() == base  # deterministic
    assert key(rms_norm_eps=1e-3) != base
    assert key(rope_theta=1234.0) != base
    assert key(dtype="bfloat16") != base
    monkeypatch.setattr(mechkit, "__version__", "9.9.9")
    assert key() != base


def test_another_tokenizer_gives_another_resume_key():
    from mechkit.model.checks.identity import tokenizer_sha256

    tok = byte_tokenizer()
    other = byte_tokenizer()
    other.add_tokens(["<extra>"])
    assert tokenizer_sha256(tok) == tokenizer_sha256(byte_tokenizer()) != tokenizer_sha256(other)



def test_a_killed_compose_rerun_with_another_config_recomputes_everything(tmp_path, monkeypatch):
    """The whole scenario of issue 32: a `compose` run is killed midway, the model directory's config is
    changed (``rms_norm_eps``) while its weights stay, and the same command runs again. It must not reuse
    a step of the first run: every step is computed again and the report equals a fresh run's on the
    changed model (which differs from the first config's)."""
    import mechkit as mk
    from mechkit.plugin import RunContext

    model, tok = tiny_model("llama")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    options = dict(pairs="capitalize+swap", parts="study", shots="0,1,2", n=2, seeds=1)  # the others: not read
    real = RunContext._write_step
    written: list[str] = []

    def counting(stop_after: int | None):
        def write(self, path, key, value):
            if stop_after is not None and len(written) == stop_after:
                raise KeyboardInterrupt  # killed between two steps
            written.append(key)
            return real(self, path, key, value)
        return write

    def fresh(name: str) -> dict:
        monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / name))
        return mk.run("compose", model=str(folder), write=False, **options).results

    first_config = fresh("fresh-a")
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    with monkeypatch.context() as patch:
        patch.setattr(RunContext, "_write_step", counting(stop_after=2))
        with pytest.raises(KeyboardInterrupt):
            mk.run("compose", model=str(folder), out=tmp_path / "run", **options)
    assert len(written) == 2
    config = json.loads((folder / "config.json").read_text())
    config["rms_norm_eps"] = 0.5  # the same weights, another computation
    (folder / "config.json").write_text(json.dumps(config))
    written.clear()
    with monkeypatch.context() as patch:
        patch.setattr(RunContext, "_write_step", counting(stop_after=None))
        rerun = mk.run("compose", model=str(folder), out=tmp_path / "run", **options).results
    n_steps = len(written)
    second_config = fresh("fresh-b")
    assert rerun == second_config != first_config
    written.clear()
    with monkeypatch.context() as patch:  # and a fresh run computes exactly as many steps: none was reused
        patch.setattr(RunContext, "_write_step", counting(stop_after=None))
        monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "fresh-c"))
        mk.run("compose", model=str(folder), out=tmp_path / "run-c", **options)
    assert len(written) == n_steps > 2

# ---- 6. reports read only their own files ---------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


@pytest.mark.parametrize("artifact", ["symlink", "not a png", "too large", "path outside"])
def test_compare_embeds_only_real_pngs_inside_the_run_directory(tmp_path, artifact):
    from mechkit.report import compare_runs
    from mechkit.report.artifact_files import MAX_IMAGE_BYTES
    from mechkit.report.compare import render_compare_html

    secret = tmp_path / "secret.png"
    secret.write_bytes(PNG + b"SECRET")
    runs = []
    for n in (1, 2):
        name = "fig.png" if artifact != "path outside" else "../secret.png"
        out = write_report(tmp_path / f"r{n}", _report(n))
        data = json.loads((out / "report.json").read_text())
        data["artifacts"] = [name]
        (out / "report.json").write_text(json.dumps(data))
        if artifact == "symlink":
            (out / name).symlink_to(secret)
        elif artifact == "not a png":
            (out / name).write_bytes(b"GIF89a" + b"\0" * 10)
        elif artifact == "too large":
            (out / name).write_bytes(PNG + b"\0" * MAX_IMAGE_BYTES)
        runs.append(out)
    if artifact == "path outside":  # refused as the report is read
        with pytest.raises(MechkitError, match="plain file name"):
            compare_runs(runs)
        return
    page = render_compare_html(compare_runs(runs))
    assert "data:image/png;base64," not in page


def test_compare_still_embeds_a_real_png(tmp_path):
    from mechkit.report import compare_runs
    from mechkit.report.compare import render_compare_html

    runs = [write_report(tmp_path / f"r{n}", _report(n), files={"fig.png": PNG}) for n in (1, 2)]
    assert render_compare_html(compare_runs(runs)).count("data:image/png;base64,") == 2


# ---- 5. saved artifacts know what they belong to --------------------------------------------------

def _scheduler(handle):
    from mechkit.adapt import Candidate, CostTable, ExecutionPlan, Scheduler
    from mechkit.adapt.scheduler import structure_identity

    table = CostTable(beta_attn=0.3, beta_mlp=0.6, gamma=0.0, eta=0.0, dense_a=0.0, dense_b=0.001, n_layers=2)
    return Scheduler([Candidate(ExecutionPlan(), "static", {"t": 1.0}),
                      Candidate(ExecutionPlan(layers=(1,)), "static", {"t": 0.5})], table, ["t"], margin=0.0,
                     model=structure_identity(handle))


@pytest.mark.parametrize("other", ["tiny:gpt2", "tiny:gemma", "tiny:gpt_neox"])
def test_a_scheduler_is_refused_for_another_model(tmp_path, tiny_llama, other):
    import mechkit as mk
    from mechkit.adapt import Scheduler, adaptive

    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps(_scheduler(tiny_llama).as_dict()))
    with pytest.raises(MechkitError, match="calibrated on another model"), \
            adaptive(mk.load_model(other), budget=0.6, scheduler=path):
        pass
    with adaptive(tiny_llama, budget=0.6, scheduler=Scheduler.load(path)) as run:  # its own model: accepted
        tiny_llama(tiny_llama.to_tokens("input: cat\noutput:"))
    assert run.log


# ---- 7. the "model unchanged" check is not fooled -------------------------------------------------


def _sneaky_plugin(target: str):
    import mechkit as mk

    class Sneaky(mk.Plugin):
        name = f"sneaky-{target}"
        needs = ()

        def run(self, ctx):
            with torch.no_grad():
                param = dict(ctx.model.model.named_parameters())[target]
                param.view(-1)[-1] += 1.0  # the last entry: an unused embedding row, or the last layer's last bias
            return mk.Result(results={"ok": True})

    return Sneaky


@pytest.mark.parametrize("target", ["model.embed_tokens.weight", "model.norm.weight",
                                    "model.layers.1.mlp.down_proj.weight"])
def test_a_weight_left_changed_anywhere_is_caught(tmp_path, target):
    import mechkit as mk
    from mechkit.errors import PluginError

    with pytest.raises(PluginError, match=f"weight {target} differs"):
        mk.run(_sneaky_plugin(target), model="tiny:llama", out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_the_report_says_what_the_unchanged_check_covered():
    import mechkit as mk

    assert mk.run("inspect", model="tiny:gpt2", write=False).report["checks"] == {
        "logits_unchanged": True, "weights_unchanged": True, "modules_unchanged": True}


# ---- 8. the Python API restores in any order and refuses what it ignores -----------------------------

@pytest.mark.parametrize("order", ["fifo", "lifo", "middle-first"])
def test_overlapping_weight_edits_restore_in_any_order(order):
    import mechkit as mk

    handle = mk.load_model("tiny:llama", device="cpu")
    before = {k: v.clone() for k, v in handle.model.state_dict().items()}
    contexts = [mk.edit_weights(handle) for _ in range(3)]
    for n, ctx in enumerate(contexts):
        edits = ctx.__enter__()
        edits.named("model.layers.0.mlp.down_proj.weight").add_(n + 1)
        if n != 1:
            edits.named("model.norm.weight").mul_(2)
    close = {"fifo": [0, 1, 2], "lifo": [2, 1, 0], "middle-first": [1, 0, 2]}[order]
    for i in close:
        contexts[i].__exit__(None, None, None)
    after = handle.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_an_edit_closed_first_keeps_the_newer_edit_while_it_is_open():
    import mechkit as mk

    handle = mk.load_model("tiny:llama", device="cpu")
    name = "model.norm.weight"
    original = dict(handle.model.named_parameters())[name].detach().clone()
    a, b = mk.edit_weights(handle), mk.edit_weights(handle)
    a.__enter__().named(name).add_(1)
    b.__enter__().named(name).add_(10)
    a.__exit__(None, None, None)
    assert torch.equal(dict(handle.model.named_parameters())[name], original + 11)  # b is still open
    b.__exit__(None, None, None)
    assert torch.equal(dict(handle.model.named_parameters())[name], original)


@pytest.mark.parametrize("call", ["run(None)", "run(3)", "handle+dtype", "handle+device_map", "handle+device",
                                  "dtype int8", "dtype 5", "n_seqs str", "out int"])
def test_api_misuse_is_a_mechkit_error_not_a_raw_exception(tiny_llama, call):
    import mechkit as mk

    calls = {
        "run(None)": lambda: mk.run(None, write=False),
        "run(3)": lambda: mk.run(3, write=False),
        "handle+dtype": lambda: mk.run("inspect", model=tiny_llama, write=False, dtype="float16"),
        "handle+device_map": lambda: mk.run("inspect", model=tiny_llama, write=False, device_map="auto"),
        "handle+device": lambda: mk.run("inspect", model=tiny_llama, write=False, device="cpu"),
        "dtype int8": lambda: mk.load_model("tiny:llama", dtype=torch.int8),
        "dtype 5": lambda: mk.load_model("tiny:llama", dtype=5),
        "n_seqs str": lambda: mk.run("detect", model="tiny:llama", write=False, n_seqs="abc"),
        "out int": lambda: mk.run("inspect", model="tiny:llama", out=3),
    }
    with pytest.raises(MechkitError) as err:
        calls[call]()
    assert "\n" not in str(err.value)


# ---- 10. the environment and the file system say no; leftovers of killed runs ----------------------

def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leave_killed_writes(folder: Path, name: str) -> list[Path]:
    """What ``kill -9`` leaves beside ``folder/name``: a temp dir of a dead pid, a set-aside dir, a free lock."""
    tmp = folder / f".{name}.tmp-{_dead_pid()}-0badc0de"
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"x" * 1000)
    old = folder / f".{name}.old-{_dead_pid()}-12345678"
    old.mkdir()
    lock = folder / f".{name}.mechkit-lock"
    lock.write_text("99999\n")
    return [tmp, old, lock]


def test_cache_list_counts_and_cache_clear_removes_killed_runs_leftovers(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MECHKIT_CACHE", str(cache))
    left = _leave_killed_writes(cache / "gguf", "model-0123")
    live = cache / "gguf" / f".other.tmp-{os.getpid()}-0000aaaa"  # a build running now: not a leftover
    live.mkdir()
    left.append(cache / "runs" / ".abcd.mechkit-lock")
    left[-1].parent.mkdir()
    left[-1].write_text("1\n")
    code, _ = _cli(capsys, "cache", "list")
    out = capsys.readouterr().out if code else ""
    from mechkit.io.disk_cache import list_cache

    rows = [e for e in list_cache() if e.name == "leftovers"]
    assert len(rows) == 1 and rows[0].source.startswith("4 ") and rows[0].size >= 1000, (rows, out)
    code, _ = _cli(capsys, "cache", "clear", "leftovers")
    assert code == 0 and not any(p.exists() for p in left) and live.is_dir()
    assert not [e for e in list_cache() if e.name == "leftovers"]


def test_the_next_run_of_an_out_cleans_what_a_killed_one_left(tmp_path):
    left = _leave_killed_writes(tmp_path, "run")
    write_report(tmp_path / "run", _report(1))
    assert not any(p.exists() for p in left) and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_live_writers_lock_and_temp_dir_are_left_alone(tmp_path):
    from mechkit.io.leftovers import stale_leftovers

    with out_lock(tmp_path / "run"):
        (tmp_path / ".run.tmp-1-0badc0de").mkdir()  # pid 1 is alive; untagged-by-us but not dead
        assert stale_leftovers(tmp_path) == []


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EDQUOT", "EROFS"])
def test_a_full_disk_is_one_line_naming_the_path_and_leaves_nothing(tmp_path, capsys, monkeypatch, errno_name):
    import errno

    from mechkit.report import writer

    def full(*args, **kwargs):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)), str(tmp_path / "r"))

    monkeypatch.setattr(writer, "render_html", full)
    # a cache of its own: another suite on this machine (make test-latest beside make test) may hold this very
    # run's resume lock in the shared default cache, and its one-line warning would be a second line here
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path.parent / f"{tmp_path.name}-cache"))
    code, err = _cli(capsys, "inspect", "--model", "tiny:gpt2", "--out", str(tmp_path / "r"))
    assert code == 2 and len(err) == 1 and str(tmp_path / "r") in err[0] and " — " in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("length", [230, 300])
def test_a_name_too_long_for_the_file_system_is_refused_before_any_work(tmp_path, capsys, length):
    code, err = _cli(capsys, "inspect", "--model", "tiny:gpt2", "--out", str(tmp_path / ("n" * length)))
    assert code == 2 and len(err) == 1 and "bytes long" in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cache", ["a file", "unwritable"])
def test_an_odd_cache_location_does_not_stop_a_run(tmp_path, monkeypatch, capsys, cache):
    where = tmp_path / "cache"
    if cache == "a file":
        where.write_text("not a directory")
    else:
        where.mkdir()
        where.chmod(0o500)
    monkeypatch.setenv("MECHKIT_CACHE", str(where))
    try:
        if os.geteuid() == 0 and cache == "unwritable":
            pytest.skip("root writes through permissions")
        code, err = _cli(capsys, "inspect", "--model", "tiny:gpt2", "--out", str(tmp_path / "r"))
    finally:
        where.chmod(0o700) if where.is_dir() else None
    assert code == 0 and (tmp_path / "r" / "report.json").is_file()
    assert len(err) <= 1  # at most the warning that steps are not kept


# ---- 9. pruned models are models -------------------------------------------------------------------

@pytest.fixture(scope="module")
def pruned_dir(tmp_path_factory):
    """tiny:llama with neurons, heads and a layer removed, saved as `prune --save-model` does."""
    from mechkit.model import load_model
    from mechkit.pruning import prune_copy, save_pruned
    from mechkit.pruning.plan import UnitsToRemove

    handle = load_model("tiny:llama", device="cpu", dtype="float32")
    plan = UnitsToRemove(mlp={0: [0, 1, 2]}, heads={0: [0, 1]}, layers=[1])  # a whole KV group
    return save_pruned(prune_copy(handle, plan), tmp_path_factory.mktemp("pruned") / "model")


def test_a_pruned_model_reloads_and_inspect_runs_on_it(pruned_dir):
    import mechkit as mk

    run = mk.run("inspect", model=str(pruned_dir), write=False, batch=1, seq_len=8, repeats=1)
    assert run.results["anatomy"]["n_layers"] == 1


# detect, sweep, ablate, shuffle and icl-vectors run on it now (tests/test_pruned_models.py checks their results);
# prune and adapt would prune its pruned neurons and heads again, which they cannot.
@pytest.mark.parametrize("plugin", ["prune", "adapt"])
def test_a_plugin_that_cannot_handle_a_pruned_model_says_so_in_one_line(pruned_dir, tmp_path, capsys, plugin):
    code, err = _cli(capsys, plugin, "--model", str(pruned_dir), "--out", str(tmp_path / "r"))
    assert code == 2 and len(err) == 1 and "cannot run on a model with pruned" in err[0], err
    assert not (tmp_path / "r").exists()


# ---- the fuzz over files and paths ----------------------------------------------------------------

def _fix_names_real_options(argv, line: str) -> None:
    """Every ``--option`` the fix (after the dash) names is an option of the command that printed it."""
    import re

    import click

    from mechkit.cli.main import cli

    ctx = click.Context(cli)
    command: click.Command = cli
    for word in argv:
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        command = command.get_command(ctx, word) or command
    known = {opt for param in command.params for opt in getattr(param, "opts", [])}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line.split(" — ", 1)[1]))
    assert named <= known, (line, named - known)


def _bad_outs(tmp_path: Path, kind: str) -> dict[str, str]:
    """--out values every writer must refuse before any work, with what each needs to exist."""
    (tmp_path / "home" / "work").mkdir(parents=True, exist_ok=True)
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-dir").mkdir(exist_ok=True)
    (tmp_path / "a-dir" / "keep.txt").write_text("x")
    (tmp_path / "cache").mkdir(exist_ok=True)
    outs = {"cwd": ".", "dotdot": "..", "home": "~", "cache": str(tmp_path / "cache" / "out"),
            "newline": str(tmp_path / "a\nb"), "long name": str(tmp_path / ("x" * 240)),
            "in a file": str(tmp_path / "a-file" / "out")}
    if kind == "dir":
        outs["a file"] = str(tmp_path / "a-file")
        outs["non-empty, no --force"] = str(tmp_path / "a-dir")
    else:
        outs["a dir"] = str(tmp_path / "a-dir")
        outs["existing, no --force"] = str(tmp_path / "a-file")
    return outs


COMMANDS = {  # (argv before --out, kind of --out)
    "inspect": (("inspect", "--model", "tiny:gpt2"), "dir"),
    "taskvec apply": (("taskvec", "apply", "--base", "tiny:llama", "-v", "cap=VECTOR", "--expr", "cap"), "dir"),
    "taskvec merge": (("taskvec", "merge", "-v", "cap=VECTOR", "--expr", "cap"), "file"),
    "taskvec extract": (("taskvec", "extract", "--base", "tiny:llama", "--finetuned", "FT"), "file"),
}
OUT_CASES = [(cmd, case) for cmd, (_, kind) in COMMANDS.items()
             for case in ["cwd", "dotdot", "home", "cache", "newline", "long name", "in a file",
                          *(["a file", "non-empty, no --force"] if kind == "dir" else ["a dir", "existing, no --force"])]]


@pytest.mark.parametrize(("command", "case"), OUT_CASES)
def test_fuzz_bad_out_paths_are_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys, vector, command,
                                                                 case):
    from mechkit.model import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setattr("mechkit.model.load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    argv, kind = COMMANDS[command]
    outs = _bad_outs(tmp_path, kind)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path / "home" / "work")
    argv = [a.replace("VECTOR", str(vector)).replace("FT", str(Path(vector).parent / "ft")) for a in argv]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    code, err = _cli(capsys, *argv, "--out", outs[case])
    assert code == 2 and len(err) == 1 and " — " in err[0], err
    _fix_names_real_options(argv, err[0])
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing created, nothing removed


MODEL_CASES = ["missing tensor", "more layers", "fewer layers", "pickle only", "nan", "non-utf8 config"]


@pytest.mark.parametrize("damage", MODEL_CASES)
@pytest.mark.parametrize("command", ["inspect", "taskvec extract"])
def test_fuzz_damaged_model_files_are_one_line_and_write_nothing(tmp_path, capsys, command, damage):
    d = _model_dir(tmp_path / "m")
    DAMAGE[damage][0](d)
    argv = {"inspect": ("inspect", "--model", str(d), "--out", str(tmp_path / "r")),
            "taskvec extract": ("taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(d),
                                "--out", str(tmp_path / "v.safetensors"))}[command]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    code, err = _cli(capsys, *argv)
    assert code == 2 and len(err) == 1 and " — " in err[0], err
    _fix_names_real_options(argv, err[0])
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
