"""Bad input a hostile user hands in: one line naming the problem, exit 2, nothing written."""

from __future__ import annotations

import pytest
import torch

from mechkit.errors import MechkitError
from mechkit.model.sources.tiny import byte_tokenizer, tiny_model
from tests.conftest import noisy_model_dir


def _model_dir(path, truncate: bool = False):
    model, _ = tiny_model("llama")
    model.save_pretrained(path, safe_serialization=True)
    byte_tokenizer().save_pretrained(path)
    if truncate:
        weights = path / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    return path


def test_truncated_finetuned_weights_are_one_line_for_taskvec_extract(tmp_path, capsys):
    from mechkit.cli.main import main

    ft = _model_dir(tmp_path / "ft", truncate=True)
    capsys.readouterr()  # transformers' own save progress
    with pytest.raises(SystemExit) as exit_info:
        main(["taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(ft), "--out", str(tmp_path / "v.st")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert "cannot read weights" in err[0] and "truncated" in err[0]
    assert not (tmp_path / "v.st").exists()


@pytest.mark.parametrize("expression", ["+".join(["a"] * 5000), "-" * 5000 + "a", "a" * 20_000])
def test_pathological_expressions_are_one_line(expression):
    from mechkit.taskarith import TaskVector, evaluate_expression

    with pytest.raises(MechkitError, match="nests too deeply|characters long"):
        evaluate_expression(expression, {"a": TaskVector({"w": torch.ones(1)})})


def test_runaway_shots_are_refused_before_any_prompt_is_built():
    import time

    import mechkit as mk
    from mechkit.tasks.prompt import MAX_SHOTS, check_counts

    start = time.perf_counter()
    with pytest.raises(MechkitError, match="shots=100000"):
        mk.build_prompts("capitalize", n=20, shots=100_000)
    assert time.perf_counter() - start < 0.5
    check_counts(1, MAX_SHOTS)  # the bound itself is allowed
    with pytest.raises(MechkitError, match=f"at most {MAX_SHOTS}"):
        check_counts(1, MAX_SHOTS + 1)


def test_a_prompt_longer_than_the_context_is_one_line_not_an_allocation(tiny_llama):
    import mechkit as mk
    from mechkit.actvec import icl_task_vectors

    prompts = mk.build_prompts("capitalize", n=2, shots=200)  # byte tokens: far past tiny's 512 positions
    with pytest.raises(MechkitError, match="longer than the model's context"):
        mk.score_prompts(tiny_llama, prompts)
    with pytest.raises(MechkitError, match="longer than the model's context"):
        icl_task_vectors(tiny_llama, "capitalize", prompts=prompts)


@pytest.mark.parametrize(("grid", "match"), [
    ([[float("nan")] * 4, [0.0] * 4], "NaN"),
    ([[0.1] * 3, [0.0] * 3], "2×3 model"),
    ([["a"] * 4, [0.0] * 4], "not a grid"),
])
def test_a_detect_report_with_odd_scores_is_refused(tiny_llama, grid, match):
    from mechkit.heads import scores_from_report

    report = {"results": {"scores": {"induction": grid}}}
    with pytest.raises(MechkitError, match=match):
        scores_from_report(report, tiny_llama.anatomy, "r.json")


# ---- shared helpers for the checks below --------------------------------------------------------------
def _listing(root) -> list[str]:
    """Every path under ``root`` (hidden temporary files included), to compare before and after."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _one_line_exit_2(argv: list[str], capsys, root) -> str:
    """Run the CLI; assert exit 2, exactly one stderr line and nothing written under ``root``."""
    from mechkit.cli.main import main

    before = _listing(root)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("mechkit: error: ")
    assert _listing(root) == before  # no partial file, no temporary file
    return err[0]


@pytest.fixture(scope="module")
def other_llama():
    """tiny:llama's architecture with other weights (seed 1): another base model."""
    import mechkit as mk

    model, tok = tiny_model("llama", seed=1)
    return mk.load_model(model, device="cpu", dtype="float32", tokenizer=tok)


@pytest.fixture(scope="module")
def files(llama, other_llama, tmp_path_factory):
    """Vector files: two of tiny:llama, one of tiny:qwen2, one of other llama weights; and a fine-tuned dir."""
    import mechkit as mk
    from mechkit.taskarith import extract

    root = tmp_path_factory.mktemp("bad-input")
    ft = noisy_model_dir(root / "ft-llama")
    out = {"ft": ft}
    out["cap"] = extract(llama, ft, tasks=["capitalize"]).save(root / "cap.safetensors")
    out["low"] = extract(llama, noisy_model_dir(root / "ft-llama2", seed=2), tasks=["lowercase"]).save(
        root / "low.safetensors")
    qwen = mk.load_model("tiny:qwen2", device="cpu", dtype="float32")
    out["qwen"] = extract(qwen, noisy_model_dir(root / "ft-qwen", family="qwen2"), tasks=["lowercase"]).save(
        root / "qwen.safetensors")
    out["other"] = extract(other_llama, noisy_model_dir(root / "ft-other", base_seed=1), tasks=["lowercase"]).save(
        root / "other.safetensors")
    return out


# ---- 1. everything mechkit writes is finite -----------------------------------------------------------
def test_a_diverging_finetune_stops_at_the_step_and_writes_no_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "work").mkdir()
    line = _one_line_exit_2(["finetune", "--model", "tiny:llama", "--steps", "3", "--lr", "1e30", "--batch-size",
                             "4", "--eval-n", "4", "--out", str(tmp_path / "work" / "ft")], capsys, tmp_path / "work")
    assert "training diverged at step 2 (loss nan" in line and "lower --lr" in line


def test_finetune_refuses_an_infinite_rate_and_never_saves_nan_weights(llama, tmp_path):
    from mechkit.taskarith.finetune import Finetuned, Recipe, finetune, model_files, save_checkpoint

    with pytest.raises(MechkitError, match="learning rate"):
        finetune(llama, Recipe(task="capitalize", steps=1, lr=float("inf"), batch_size=4, pool=16))
    model, _ = tiny_model("llama")
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    with pytest.raises(MechkitError, match=r"model\.safetensors: tensor model\.norm\.weight holds NaN"):
        model_files(Finetuned(model=model, losses=[1.0], recipe=Recipe(task="capitalize")), None)
    named = [(n, p) for n, p in model.named_parameters()]
    opt = torch.optim.AdamW([p for _, p in named])
    import random

    with pytest.raises(MechkitError, match=r"checkpoint\.safetensors: tensor param\.model\.norm\.weight holds NaN"):
        save_checkpoint(tmp_path, Recipe(task="capitalize"), named, opt, random.Random(0), [1.0])
    assert _listing(tmp_path) == []


@pytest.mark.parametrize(("args", "word"), [
    (["--expr", "a", "--scale", "nan"], "--scale"),
    (["--method", "task_arithmetic", "--weights", "nan,1"], "--weights"),
    (["--method", "ties", "--scale", "-inf"], "--scale"),  # --density/--p nan were already out of range
    (["--expr", "1e999*a + b"], "too large to be finite"),
    (["--expr", "1e38*(1e38*a) + b"], "holds inf values"),  # finite numbers, an overflowing vector
])
def test_non_finite_merges_are_one_line_and_write_no_vector(files, tmp_path, capsys, args, word):
    line = _one_line_exit_2(["taskvec", "merge", "-v", f"a={files['cap']}", "-v", f"b={files['low']}", *args,
                             "--out", str(tmp_path / "m.safetensors")], capsys, tmp_path)
    assert word in line, line


def test_non_finite_apply_is_one_line_and_writes_no_model(files, tmp_path, capsys):
    line = _one_line_exit_2(["taskvec", "apply", "--base", "tiny:llama", "-v", f"a={files['cap']}", "--expr", "a",
                             "--scale", "inf", "--out", str(tmp_path / "merged")], capsys, tmp_path)
    assert "--scale" in line


def test_the_python_api_refuses_non_finite_scales_and_tensors(llama, files, tmp_path):
    from mechkit.taskarith import TaskVector, apply, merge, save_merged

    a = TaskVector.load(files["cap"])
    for bad in (lambda: a * float("nan"), lambda: a.scaled({"*": float("inf")}),
                lambda: merge([a], weights=[float("nan")]), lambda: merge([a], scale=float("inf"))):
        with pytest.raises(MechkitError, match="not a finite number"):
            bad()
    with pytest.raises(MechkitError, match="not a finite number"), apply(llama, a, scale=float("nan")):
        pass
    with pytest.raises(MechkitError, match="has inf values"):
        save_merged(llama, a, tmp_path / "merged", scale=1e39)  # a finite λ, inf weights
    broken = TaskVector({"model.norm.weight": torch.full((64,), float("nan"))}, {"tasks": ["capitalize"]})
    with pytest.raises(MechkitError, match=r"v\.safetensors: tensor model\.norm\.weight holds NaN"):
        broken.save(tmp_path / "v.safetensors")
    assert _listing(tmp_path) == []


def test_activation_vectors_and_pruned_models_are_never_saved_with_nan(llama, tmp_path):
    from mechkit.actvec.vector import ActivationVector
    from mechkit.pruning.plan import UnitsToRemove
    from mechkit.pruning.slicing import prune_copy, save_pruned

    vec = ActivationVector(vector=torch.tensor([1.0, float("inf")]), method="function-vector", task="capitalize",
                           layer=0, mode="add")
    with pytest.raises(MechkitError, match=r"fv\.safetensors: tensor vector holds inf"):
        vec.save(tmp_path / "fv.safetensors")
    pruned = prune_copy(llama, UnitsToRemove(mlp={1: [1, 2]}))
    with torch.no_grad():
        pruned.model.model.norm.weight[0] = float("nan")
    with pytest.raises(MechkitError, match=r"model\.safetensors: tensor model\.norm\.weight holds NaN"):
        save_pruned(pruned, tmp_path / "pruned")
    assert _listing(tmp_path) == []


def test_a_report_holding_nan_names_the_key_and_writes_nothing(tmp_path):
    import json

    from mechkit.report import build_report, write_report
    from mechkit.report.show import load_report

    kwargs = dict(plugin="probe", plugin_version="0.1", model={"spec": "tiny:llama"}, params={}, seed=0,
                  results={"table": [{"acc": 0.5, "not_computed": None}, {"acc": float("nan")}]}, artifacts=[],
                  timings={"run_s": 0.1})
    with pytest.raises(MechkitError, match=r"results\.table\[1\]\.acc is nan"):
        build_report(**kwargs, nonfinite="error")
    report = build_report(**{**kwargs, "results": {"table": [{"acc": 0.5, "not_computed": None}]}})
    write_report(tmp_path / "ok", report)  # None means "not computed": kept, written as null
    assert json.loads((tmp_path / "ok" / "report.json").read_text())["results"]["table"][0]["not_computed"] is None
    report["results"]["loss"] = float("inf")
    before = _listing(tmp_path)
    with pytest.raises(MechkitError, match=r"report value results\.loss is inf"):
        write_report(tmp_path / "bad", report)
    assert _listing(tmp_path) == before
    text = (tmp_path / "ok" / "report.json").read_text().replace('"acc": 0.5', '"acc": NaN')
    (tmp_path / "ok" / "report.json").write_text(text)
    with pytest.raises(MechkitError, match=r"results\.table\[0\]\.acc is nan"):
        load_report(tmp_path / "ok")


# ---- 2. vectors of different bases are never combined ----------------------------------------------------
@pytest.mark.parametrize("other", ["qwen", "other"])
def test_merging_vectors_of_different_bases_names_both(files, tmp_path, capsys, other):
    for how in (["--expr", "a + b"], ["--method", "ties"]):
        line = _one_line_exit_2(["taskvec", "merge", "-v", f"a={files['cap']}", "-v", f"b={files[other]}", *how,
                                 "--out", str(tmp_path / "m.safetensors")], capsys, tmp_path)
        assert "different base models" in line and "tiny:llama" in line
        assert str(files["cap"]) in line and str(files[other]) in line


def test_the_algebra_refuses_vectors_of_different_bases(files):
    from mechkit.taskarith import TaskVector, analogy, evaluate_expression, merge

    a, b, c = (TaskVector.load(files[k]) for k in ("cap", "low", "other"))
    a + b  # noqa: B018 - same base: fine
    for combine in (lambda: a + c, lambda: a - c, lambda: merge([a, c]), lambda: analogy(a, b, c),
                    lambda: evaluate_expression("a + 0*c", {"a": a, "c": c})):
        with pytest.raises(MechkitError, match="different base models"):
            combine()


def test_applying_a_vector_to_another_base_is_refused_unless_asked(files, other_llama, tmp_path, capsys):
    from mechkit.cli.main import main
    from mechkit.taskarith import TaskVector, apply

    line = _one_line_exit_2(["taskvec", "apply", "--base", "tiny:qwen2", "-v", f"a={files['cap']}", "--expr", "a",
                             "--out", str(tmp_path / "merged")], capsys, tmp_path)
    assert "was extracted from tiny:llama" in line and "--allow-other-base" in line
    main(["taskvec", "apply", "--base", "tiny:qwen2", "-v", f"a={files['cap']}", "--expr", "a",
          "--allow-other-base", "--out", str(tmp_path / "merged")])  # asked for: applied (names and shapes fit)
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    a = TaskVector.load(files["cap"])
    with pytest.raises(MechkitError, match="weights differ"), apply(other_llama, a):
        pass
    with apply(other_llama, a, allow_other_base=True):
        pass


def test_extract_refuses_a_base_the_finetune_did_not_start_from(other_llama, tmp_path):
    import mechkit as mk
    from mechkit.taskarith import extract

    run = mk.run("finetune", model="tiny:llama", task="capitalize", steps=1, batch_size=2, eval_n=2,
                 checkpoint_every=0, out=tmp_path / "ft")
    with pytest.raises(MechkitError, match="fine-tuned from other weights"):
        extract(other_llama, run.out_dir)


# ---- 3. readers validate what they are handed -----------------------------------------------------------
def _rewrite_header(src, dst, edit):
    """Copy a safetensors file with its JSON header changed by ``edit(header_dict) -> str``."""
    import json
    import struct

    data = src.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = edit(json.loads(data[8:8 + n]))
    dst.write_bytes(struct.pack("<Q", len(header)) + header.encode() + data[8 + n:])
    return dst


def _meta_edit(change):
    import json

    def edit(header):
        meta = json.loads(header["__metadata__"]["mechkit"])
        header["__metadata__"]["mechkit"] = json.dumps(change(meta))
        return json.dumps(header)
    return edit


def _twice(header):
    import json

    name = next(k for k in header if k != "__metadata__")
    text = json.dumps(header)
    return text[:-1] + f', {json.dumps(name)}: {json.dumps(header[name])}}}'


@pytest.mark.parametrize(("edit", "word"), [
    (_meta_edit(lambda m: [m]), "JSON list, not an object"),
    (_meta_edit(lambda m: {**m, "tasks": "capitalize"}), "'tasks' must be a list of strings"),
    (_meta_edit(lambda m: {**m, "base": "tiny:llama"}), "'base' must be an object"),
    (_meta_edit(lambda m: {**m, "n_tensors": m["n_tensors"] + 1}), "'n_tensors'"),
    (_twice, "named twice"),
])
def test_a_malformed_task_vector_file_is_one_line_naming_it(files, tmp_path, capsys, edit, word):
    bad = _rewrite_header(files["cap"], tmp_path / "bad.safetensors", edit)
    line = _one_line_exit_2(["taskvec", "info", str(bad)], capsys, tmp_path)
    assert word in line and str(bad) in line, line


def test_a_task_vector_file_holding_nan_is_refused(files, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(files["cap"]), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(files["cap"]))
    tensors["model.norm.weight"][3] = float("nan")
    save_file(tensors, str(tmp_path / "nan.safetensors"), metadata=metadata)
    line = _one_line_exit_2(["taskvec", "info", str(tmp_path / "nan.safetensors")], capsys, tmp_path)
    assert "model.norm.weight holds NaN" in line
    line = _one_line_exit_2(["taskvec", "merge", "-v", f"a={tmp_path / 'nan.safetensors'}", "--expr", "a",
                             "--out", str(tmp_path / "m.safetensors")], capsys, tmp_path)
    assert "holds NaN" in line


def test_an_activation_vector_with_list_metadata_or_nan_is_refused(tmp_path):
    import json

    from safetensors.torch import save_file

    from mechkit.actvec.vector import ActivationVector

    meta = {"method": "function-vector", "task": "capitalize", "layer": 0, "mode": "add"}
    cases = {"list": ([meta], torch.ones(64), "JSON list, not an object"),
             "nan": (meta, torch.full((64,), float("nan")), "holds NaN"),
             "scale": ({**meta, "scale": float("nan")}, torch.ones(64), "'scale' must be a finite number"),
             "layer": ({**meta, "layer": "0"}, torch.ones(64), "'layer' must be an integer")}
    for name, (metadata, vector, word) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file({"vector": vector}, str(path), metadata={"mechkit": json.dumps(metadata)})
        with pytest.raises(MechkitError, match=word):
            ActivationVector.load(path)


def test_extract_validates_task_ids_and_the_finetune_report(files, tmp_path, capsys):
    out = str(tmp_path / "v.safetensors")
    line = _one_line_exit_2(["taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(files["ft"]),
                             "--task", "bogus", "--out", out], capsys, tmp_path)
    assert "bogus" in line
    ft = noisy_model_dir(tmp_path / "ft")
    (ft / "report.json").write_text("[1, 2]")
    line = _one_line_exit_2(["taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(ft), "--out", out],
                            capsys, tmp_path)
    assert str(ft / "report.json") in line and "JSON list" in line
    (ft / "report.json").write_text('{"results": {"recipe": {"task": "bogus"}}}')
    line = _one_line_exit_2(["taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(ft), "--out", out],
                            capsys, tmp_path)
    assert str(ft / "report.json") in line and "bogus" in line and "--task" in line


def test_a_checkpoint_of_another_model_or_malformed_is_ignored_with_one_warning(llama, other_llama, tmp_path,
                                                                                   capsys):
    import json

    from safetensors.torch import load_file, save_file

    from mechkit.taskarith.finetune import CHECKPOINT, Recipe, checkpoint_state, finetune

    recipe = Recipe(task="capitalize", steps=4, lr=1e-3, batch_size=2, pool=16)

    def stop_after_two(step, loss):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune(llama, recipe, checkpoint=tmp_path, checkpoint_every=2, on_step=stop_after_two)
    assert checkpoint_state(tmp_path)["step"] == 2
    capsys.readouterr()
    seen = []
    finetune(other_llama, recipe, checkpoint=tmp_path, checkpoint_every=0, on_step=lambda i, _: seen.append(i))
    err = capsys.readouterr().err.strip().splitlines()
    assert seen == [0, 1, 2, 3]  # not resumed from the other model's weights
    assert len(err) == 1 and "warning" in err[0] and "other base weights" in err[0], err
    tensors = load_file(str(tmp_path / CHECKPOINT))
    save_file(tensors, str(tmp_path / CHECKPOINT), metadata={"mechkit_checkpoint": json.dumps([1, 2])})
    seen.clear()
    finetune(llama, recipe, checkpoint=tmp_path, checkpoint_every=0, on_step=lambda i, _: seen.append(i))
    err = capsys.readouterr().err.strip().splitlines()
    assert seen == [0, 1, 2, 3] and len(err) == 1 and "warning" in err[0] and str(tmp_path) in err[0], err


# ---- devices that are not here, and NaN that a plugin computes ------------------------------------------


@pytest.mark.parametrize(("device", "words"), [
    ("bogus", "unknown device 'bogus'"), ("meta", "cannot run a model here"),
    pytest.param("cuda", "--device cuda:", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="this machine has CUDA, so --device cuda is valid here")),
])
def test_a_device_that_is_not_here_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, device, words):
    from mechkit.cli.main import main
    from mechkit.model import loading

    monkeypatch.setattr(loading, "_resolve", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", "--model", "tiny:gpt2", "--device", device, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert words.rstrip(":") in err[0] and "use" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_nan_a_plugin_computes_in_a_step_is_refused_naming_its_key(tmp_path, monkeypatch):
    import mechkit as mk

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))

    class Diverges(mk.Plugin):
        name, version, summary, needs_model = "diverges", "0.0.1", "returns a NaN metric from a step", False

        def run(self, ctx):
            return mk.Result(results={"loss": ctx.step("loss", lambda: float("nan"))})

    with pytest.raises(MechkitError, match=r"results\.loss is nan"):
        mk.run(Diverges, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_undefined_statistics_are_stored_as_not_computed():
    import numpy as np

    from mechkit.heads.effects import spearman
    from mechkit.pruning.cost import perplexity

    assert spearman(np.zeros((2, 2)), np.arange(4.0).reshape(2, 2)) is None

    class Huge:  # logits so confident and wrong that exp(mean NLL) overflows a float
        device = "cpu"

        def tokenizer(self, text, return_tensors):
            return {"input_ids": torch.tensor([[1, 2, 3, 4]])}

        def __call__(self, ids):
            logits = torch.full((1, ids.shape[1], 8), -1e4)
            logits[..., 0] = 1e4
            return logits

    assert perplexity(Huge(), "text") is None


# ---- a fresh red-team pass: each one line and exit 2 (or help and exit 0), nothing written --------------

def _cli(capsys, args: list[str]) -> tuple[int, list[str]]:
    from mechkit.cli.main import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


TINY = ["--model", "tiny:llama"]


@pytest.mark.parametrize(("args", "words", "loads"), [
    (["inspect", *TINY, "--seed", "99999999999999999999999"], "seed 99999999999999999999999 is out of range", False),
    (["ablate", *TINY, "--n", "99999999999999999999999"], "is more than 1,000,000", False),
    (["ablate", *TINY, "--heads", "a.b"], "malformed head spec 'a.b'", False),
    (["shuffle", *TINY, "--heads", "layer:-1"], "malformed head spec 'layer:-1'", False),
    (["icl-vectors", *TINY, "--fv-scales", "1e308"], "--fv-scales", False),
    (["inspect", "--model", "tiny:gpt2", "--seq-len", "5000"], "longer than the model's context", True),
    (["shuffle", *TINY, "--heads", "0.0", "--tasks", "capitalize"], "a shuffle permutes weights", True),
    (["ablate", *TINY, "--tasks", "capitalize", "--setting", "composite"], "applies to composite tasks", False),
])
def test_red_team_inputs_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, args, words, loads):
    from mechkit.model import loading

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    if not loads:  # refused from the options alone: the model is never loaded
        monkeypatch.setattr(loading, "_resolve", lambda *a, **k: pytest.fail("the model was loaded"))
    code, err = _cli(capsys, [*args, "--out", str(tmp_path / "run")])
    assert code == 2 and len(err) == 1 and words in err[0], err
    assert not (tmp_path / "run").exists()


def test_an_out_path_with_a_newline_is_refused(tmp_path, capsys):
    code, err = _cli(capsys, ["inspect", "--model", "tiny:gpt2", "--out", str(tmp_path / "a\nb")])
    assert code == 2 and len(err) == 1 and "control character" in err[0]
    assert list(tmp_path.iterdir()) == []


def test_ablate_counts_the_heads_an_explicit_spec_names(tmp_path, monkeypatch):
    import mechkit as mk

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    run = mk.run("ablate", model="tiny:llama", heads="0.0,0.0,1.1", tasks="capitalize", n=2, shots=1,
                 baseline_seeds=1, write=False)
    assert {c["name"]: c["k"] for c in run.results["conditions"]} == {"clean": None, "target": 2, "random": 2}


def test_scores_from_another_models_detect_report_are_refused(tmp_path, monkeypatch):
    import mechkit as mk

    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    mk.run("detect", model="tiny:llama", n_seqs=2, seg_len=5, out=tmp_path / "detect")
    with pytest.raises(MechkitError, match="scored the heads of tiny:llama"):
        mk.run("ablate", model="tiny:gpt2", from_report=str(tmp_path / "detect"), tasks="capitalize", n=2, shots=1,
               baseline="none", write=False)


@pytest.mark.parametrize("args", [["--method", "ties", "--density", "0"], ["--method", "ties", "--weights", "0,0"],
                                  ["--expr", "cap", "--sparsity-density", "0"]])
def test_merges_that_would_be_all_zero_are_refused(files, tmp_path, capsys, args):
    code, err = _cli(capsys, ["taskvec", "merge", "-v", f"cap={files['cap']}", "-v", f"low={files['low']}", *args,
                              "--out", str(tmp_path / "m.safetensors")])
    assert code == 2 and len(err) == 1 and ("all-zero" in err[0] or "keeps no entry" in err[0]), err
    assert not (tmp_path / "m.safetensors").exists()


def test_the_sweep_offers_the_flag_its_other_base_message_names(files, tmp_path, capsys):
    from mechkit import registry

    assert "allow_other_base" in {o.name for o in registry.get("taskvec-sweep").options}
    code, err = _cli(capsys, ["taskvec-sweep", "--model", "tiny:llama", "--vectors", f"{files['cap']},{files['other']}",
                              "--n", "2", "--lambdas", "0,1", "--out", str(tmp_path / "run")])
    assert code == 2 and len(err) == 1 and "--allow-other-base" in err[0], err


@pytest.mark.parametrize("group", [[], ["report"], ["plugins"], ["cache"], ["taskvec"]])
def test_a_bare_command_group_prints_its_help(capsys, group):
    from mechkit.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(group)
    captured = capsys.readouterr()
    assert exit_info.value.code == 0 and captured.out.startswith("Usage: mechkit") and captured.err == ""


def test_a_file_that_is_not_a_report_names_the_fix(tmp_path, capsys):
    (tmp_path / "report.json").write_bytes(b"\xc8\x00binary")
    code, err = _cli(capsys, ["report", "show", str(tmp_path)])
    assert code == 2 and len(err) == 1 and "as a report" in err[0] and "— pass a report.json" in err[0]


def test_the_python_api_refuses_empty_and_malformed_calls(llama):
    import mechkit as mk

    prompts = mk.build_prompts("capitalize", n=2, shots=1)
    for call, words in [(lambda: mk.score_prompts(llama, prompts, batch_size=0), "batch_size"),
                        (lambda: mk.score_prompts(llama, []), "no prompts"),
                        (lambda: mk.parse_heads(None, 2, 4), "head spec must be"),
                        (lambda: mk.run("inspect", model="tiny:gpt2", seed="abc", write=False), "seed must be"),
                        (lambda: mk.run("inspect", model="tiny:gpt2", seed=10**30, write=False), "out of range")]:
        with pytest.raises(MechkitError, match=words):
            call()


def test_lora_options_with_full_fine_tuning_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MECHKIT_CACHE", str(tmp_path / "cache"))
    code, err = _cli(capsys, ["finetune", *TINY, "--method", "full", "--rank", "4", "--out", str(tmp_path / "run")])
    assert code == 2 and len(err) == 1 and "--rank applies to --method lora" in err[0], err
    assert not (tmp_path / "run").exists()
