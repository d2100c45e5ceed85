"""Weight-space task arithmetic on tiny models: the identities, the merges' counts, reversibility."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import mechkit as mk
from mechkit.errors import MechkitError
from mechkit.model.sources.tiny import byte_tokenizer
from mechkit.taskarith import (
    TaskVector,
    analogy,
    apply,
    arithmetic,
    evaluate_expression,
    extract,
    merge,
    save_merged,
    task_correlation,
)
from mechkit.taskarith.compress import rank_for_energy
from mechkit.taskarith.merge import dare_drop, trim
from tests.conftest import noisy_model_dir


def _finetuned_dir(path, seed: int, family: str = "llama", **overrides):
    """A "fine-tuned" tiny model: the base (seed 0) plus seeded noise on every parameter."""
    return noisy_model_dir(path, family=family, seed=seed, **overrides)


@pytest.fixture(scope="module")
def base():
    return mk.load_model("tiny:llama", device="cpu")


@pytest.fixture(scope="module")
def ft_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    return [_finetuned_dir(root / f"ft{i}", seed=i + 1) for i in range(2)]


@pytest.fixture(scope="module")
def vectors(base, ft_dirs):
    return [extract(base, d, tasks=[t]) for t, d in zip(("capitalize", "lowercase"), ft_dirs, strict=True)]


def _ids(handle):
    return handle.to_tokens(["input: apple\noutput:", "hello world"])


def _logits(handle):
    with torch.no_grad():
        return handle(_ids(handle))


# ---- extraction ------------------------------------------------------------------------------------
def test_streaming_extract_equals_in_memory_diff(base, ft_dirs, vectors):
    ft = mk.load_model(str(ft_dirs[0]), device="cpu")
    expected = {n: p.detach() - dict(base.model.named_parameters())[n].detach() for n, p in ft.model.named_parameters()}
    assert set(vectors[0].deltas) == set(expected)
    assert all(torch.equal(vectors[0].deltas[n], expected[n]) for n in expected)
    from_dir = extract(str(ft_dirs[1]), ft_dirs[0])  # a directory as the base streams both sides
    assert all(torch.allclose(from_dir.deltas[n], -(vectors[1].deltas[n] - vectors[0].deltas[n]), atol=1e-6)
               for n in expected)


def test_applying_the_vector_reproduces_the_finetuned_model(base, ft_dirs, vectors):
    ft = mk.load_model(str(ft_dirs[0]), device="cpu")
    with apply(base, vectors[0]):
        merged = _logits(base)
    assert torch.allclose(merged, _logits(ft), atol=1e-5)


def test_mismatched_architecture_and_vocabulary(base, tmp_path):
    with pytest.raises(MechkitError, match="architectures differ"):
        extract(base, _finetuned_dir(tmp_path / "mistral", 1, family="mistral", num_hidden_layers=3))
    wide = _finetuned_dir(tmp_path / "wide", 1, vocab_size=300)
    with pytest.raises(MechkitError, match="vocabulary sizes differ"):
        extract(base, wide)
    truncated = extract(base, wide, embeddings="truncate")
    assert truncated.deltas["model.embed_tokens.weight"].shape[0] == 259
    skipped = extract(base, wide, embeddings="skip")
    assert "model.embed_tokens.weight" not in skipped.deltas and "lm_head.weight" not in skipped.deltas
    with apply(base, truncated):  # fewer rows than the model: edits the shared rows only
        _logits(base)
    with pytest.raises(MechkitError, match="embeddings"):
        extract(base, wide, embeddings="bogus")


# ---- algebra ---------------------------------------------------------------------------------------
def test_identity_at_lambda_zero_and_reversibility(base, vectors):
    before = _logits(base)
    with apply(base, vectors[0], scale=0.0):
        assert torch.equal(_logits(base), before)
    with apply(base, [(vectors[0], 1.0), (vectors[1], -0.7)]):
        assert not torch.equal(_logits(base), before)
    assert torch.equal(_logits(base), before)
    with pytest.raises(RuntimeError), apply(base, vectors[0]):
        raise RuntimeError("boom")
    assert torch.equal(_logits(base), before)


def test_sweep_sets_from_the_snapshot_without_drift(base, vectors):
    with arithmetic(base) as ta:
        ta.set((vectors[0], 1.0))
        once = _logits(base)
        for lam in (0.3, -1.0, 2.5):
            ta.set((vectors[0], 1.0), (vectors[1], lam))
        ta.set((vectors[0], 1.0))
        assert torch.equal(_logits(base), once)


def test_exact_round_trips(vectors):
    a, b = vectors
    twice = (-a).__neg__()
    assert all(torch.equal(twice.deltas[n], a.deltas[n]) for n in a.deltas)
    assert all(torch.count_nonzero((a + (-a)).deltas[n]) == 0 for n in a.deltas)
    assert all(torch.equal((2 * a).deltas[n], (a + a).deltas[n]) for n in a.deltas)
    d = analogy(a, b, a)  # a + b - a
    assert all(torch.allclose(d.deltas[n], b.deltas[n], atol=1e-7) for n in a.deltas)
    assert (a + b).meta["tasks"] == ["capitalize", "lowercase"]
    assert a.cosine(a) == pytest.approx(1.0) and (-a).cosine(a) == pytest.approx(-1.0)


def test_per_module_and_per_layer_lambda(vectors):
    a = vectors[0]
    s = a.scaled({"*.mlp.*": 0.0, "layers:1-1": 2.0}, default=1.0)
    for name, v in s.deltas.items():
        want = 0.0 if ".mlp." in name else 2.0 if ".layers.1." in name else 1.0
        assert torch.equal(v, a.deltas[name] * want)


def test_expression_and_its_safety(vectors):
    a, b = vectors
    got = evaluate_expression("a + 0.5*b - a/2", {"a": a, "b": b})
    assert all(torch.allclose(got.deltas[n], 0.5 * a.deltas[n] + 0.5 * b.deltas[n], atol=1e-7) for n in a.deltas)
    for bad in ("__import__('os')", "a * b", "2 + 3", "a +", "c"):
        with pytest.raises(MechkitError):
            evaluate_expression(bad, {"a": a, "b": b})


def test_save_load_round_trip(vectors, tmp_path):
    path = vectors[0].save(tmp_path / "a.safetensors")
    back = TaskVector.load(path)
    assert back.meta["tasks"] == ["capitalize"] and back.meta["base"]["spec"] == "tiny:llama"
    assert all(torch.equal(back.deltas[n], vectors[0].deltas[n]) for n in back.deltas)
    assert json.loads((tmp_path / "a.safetensors.json").read_text())["schema"] == "mechkit.taskvector/v1"


# ---- compression -----------------------------------------------------------------------------------
def test_low_rank_by_rank_and_energy():
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(12, 3, generator=gen) @ torch.randn(3, 10, generator=gen)  # rank 3
    tv = TaskVector({"w": m, "b": torch.ones(4)})
    r2 = tv.low_rank(rank=2)
    assert torch.linalg.matrix_rank(r2.deltas["w"]) == 2 and torch.equal(r2.deltas["b"], torch.ones(4))
    s = torch.linalg.svdvals(m)
    assert torch.linalg.norm(m - r2.deltas["w"]) == pytest.approx(float(s[2]), rel=1e-4)  # Eckart–Young
    full = tv.low_rank(energy=1.0)
    assert full.meta["ranks"]["w"] <= 3 and torch.allclose(full.deltas["w"], m, atol=1e-4)
    assert rank_for_energy(torch.tensor([3.0, 1.0, 0.0]), 0.9) == 1
    assert rank_for_energy(torch.tensor([3.0, 1.0, 0.0]), 0.95) == 2
    with pytest.raises(MechkitError):
        tv.low_rank()


def test_sparsify_counts():
    gen = torch.Generator().manual_seed(0)
    tv = TaskVector({"a": torch.randn(10, 10, generator=gen), "b": 5 * torch.randn(50, generator=gen)})
    assert tv.sparsify(0.2, scope="global").nonzero() == 30
    per = tv.sparsify(0.2, scope="tensor")
    assert int(torch.count_nonzero(per.deltas["a"])) == 20 and int(torch.count_nonzero(per.deltas["b"])) == 10
    kept = tv.sparsify(0.1).deltas["b"]
    assert torch.equal(kept[kept != 0], tv.deltas["b"][kept != 0])  # survivors unchanged


# ---- merges ----------------------------------------------------------------------------------------
def test_ties_trim_counts_sign_election_and_disjoint_mean():
    v = torch.tensor([0.5, -3.0, 1.0, 0.1, 2.0, -0.2, 0.0, 4.0])
    assert int(torch.count_nonzero(trim(v, 0.5))) == 4 and trim(v, 1.0).equal(v)
    a = TaskVector({"w": torch.tensor([1.0, -2.0, 3.0, 0.5])})
    b = TaskVector({"w": torch.tensor([3.0, 1.0, -1.0, -0.5])})
    c = TaskVector({"w": torch.tensor([-1.0, -1.0, 1.0, 0.2])})
    # elected signs: +, -, +, + (sums 3, -2, 3, 0.2); disjoint means over the agreeing entries
    got = merge([a, b, c], "ties").deltas["w"]
    assert torch.allclose(got, torch.tensor([2.0, -1.5, 2.0, 0.35]))
    assert torch.allclose(merge([a, b, c], "ties", scale=2.0).deltas["w"], 2 * got)
    ta = merge([a, b], "task_arithmetic", weights=[1.0, 0.5]).deltas["w"]
    assert torch.allclose(ta, a.deltas["w"] + 0.5 * b.deltas["w"])


def test_dare_rescale_counts_and_seeds():
    v = torch.randn(20000, generator=torch.Generator().manual_seed(0))
    out = dare_drop(v, 0.9, torch.Generator().manual_seed(1))
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.1) < 0.01
    assert torch.allclose(out[kept], v[kept] / (1 - 0.9))  # exact 1/(1-p) rescale of survivors
    tv = TaskVector({"w": v, "u": v[:100].clone()})
    one, two = merge([tv], "dare", p=0.5, seed=3), merge([tv], "dare", p=0.5, seed=3)
    assert all(torch.equal(one.deltas[n], two.deltas[n]) for n in one.deltas)
    other = merge([tv], "dare", p=0.5, seed=4)
    assert not torch.equal(one.deltas["w"], other.deltas["w"])
    assert torch.equal(merge([tv], "dare", p=0.0).deltas["w"], v)  # p = 0 is the identity
    swapped = merge([TaskVector({"u": tv.deltas["u"], "w": v})], "dare", p=0.5, seed=3)
    assert torch.equal(swapped.deltas["w"], one.deltas["w"])  # masks do not depend on tensor order
    dt = merge([tv, -tv], "dare_ties", p=0.5, seed=3).deltas["w"]
    assert not torch.isnan(dt).any()
    with pytest.raises(MechkitError):
        merge([tv], "dare", p=1.0)


# ---- similarity, saving, CLI -------------------------------------------------------------------------
def test_task_correlation_signs(base, vectors):
    texts = ["input: apple\noutput:", "input: pear\noutput:"]
    same = task_correlation(base, vectors[0], vectors[0], texts)
    assert same["weight_cosine"] == pytest.approx(1.0) and same["output_shift_cosine"] == pytest.approx(1.0, abs=1e-5)
    opposite = task_correlation(base, vectors[0], -vectors[0], texts)
    assert opposite["weight_cosine"] == pytest.approx(-1.0) and opposite["output_shift_cosine"] < 0


def test_save_merged_dir_loads(base, vectors, tmp_path):
    out = save_merged(base, vectors[0], tmp_path / "merged")
    merged = mk.load_model(str(out), device="cpu")
    with apply(base, vectors[0]):
        assert torch.allclose(_logits(merged), _logits(base), atol=1e-6)
    with pytest.raises(MechkitError, match="already exists"):
        save_merged(base, vectors[0], out)


def test_cli_round_trip(ft_dirs, tmp_path):
    from mechkit.cli.main import cli

    runner = CliRunner()
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    for ft, out, task in ((ft_dirs[0], a, "capitalize"), (ft_dirs[1], b, "lowercase")):
        res = runner.invoke(cli, ["taskvec", "extract", "--base", "tiny:llama", "--finetuned", str(ft),
                                  "--out", str(out), "--task", task])
        assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["taskvec", "info", str(a)])
    assert res.exit_code == 0 and "capitalize" in res.output
    res = runner.invoke(cli, ["taskvec", "merge", "-v", f"a={a}", "-v", f"b={b}", "--expr", "a - 0.5*b",
                              "--out", str(tmp_path / "m.safetensors")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["taskvec", "apply", "--base", "tiny:llama", "-v", str(a), "-v", str(b),
                              "--method", "ties", "--density", "0.5", "--rank", "4", "--out", str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    assert mk.load_model(str(tmp_path / "merged")).anatomy.n_layers == 2
    res = runner.invoke(cli, ["taskvec", "sweep", "--model", "tiny:llama", "--vectors", f"{a},{b}",
                              "--lambdas", "-1:1:1", "--n", "2", "--out", str(tmp_path / "sweep")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "sweep" / "report.json").read_text())
    assert [r["lambda"] for r in report["results"]["table"]] == [-1.0, 0.0, 1.0]
    assert report["results"]["tasks"] == ["capitalize", "lowercase"] and report["checks"]["logits_unchanged"]


@pytest.fixture(scope="module")
def vector_file(vectors, tmp_path_factory):
    return vectors[0].save(tmp_path_factory.mktemp("tv") / "a.safetensors")


@pytest.mark.parametrize("args, word", [
    (["merge", "-v", "{a}", "--out", "{out}"], "--expr"),  # neither --expr nor --method
    (["merge", "-v", "x={a}", "-v", "x={a}", "--expr", "x", "--out", "{out}"], "twice"),
    (["merge", "-v", "x={a}", "--method", "ties", "--weights", "a,b", "--out", "{out}"], "--weights"),
    (["merge", "-v", "x={weights}", "--expr", "x", "--out", "{out}"], "not a mechkit task vector"),
    (["merge", "-v", "x={a}", "--expr", "x", "--out", "{tmp}"], "directory"),
    (["apply", "--base", "tiny:llama", "-v", "x={a}", "--expr", "x", "--out", "{a}"], "is a file"),
])
def test_bad_taskvec_input_is_one_line_and_writes_nothing(vector_file, ft_dirs, tmp_path, capsys, args, word):
    from mechkit.cli.main import main

    names = {"a": vector_file, "out": tmp_path / "out", "tmp": tmp_path,
             "weights": ft_dirs[0] / "model.safetensors"}
    before = sorted(tmp_path.iterdir())
    with pytest.raises(SystemExit) as exit_:
        main(["taskvec", *(a.format(**names) for a in args)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and word in err[0], err
    assert sorted(tmp_path.iterdir()) == before  # nothing written, no temp file left


@pytest.mark.parametrize("family", ["gpt_neox", "gpt2", "qwen2"])
def test_extract_and_apply_reproduce_the_finetuned_model_on_other_families(family, tmp_path):
    ft_dir = _finetuned_dir(tmp_path / "ft", seed=1, family=family)
    base, ft = mk.load_model(f"tiny:{family}", device="cpu"), mk.load_model(str(ft_dir), device="cpu")
    tv = extract(base, ft_dir)  # GPT-NeoX saves lm_head as embed_out: renamed as transformers does
    with apply(base, tv):
        assert torch.allclose(_logits(base), _logits(ft), atol=1e-5)


def test_added_tokens_count_on_both_sides_of_the_vocabulary_check(tmp_path):
    ft_dir = _finetuned_dir(tmp_path / "ft", seed=1)
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<task>"]})
    tok.save_pretrained(ft_dir)
    base = mk.load_model(str(ft_dir), device="cpu")  # the same tokenizer, added token included
    assert extract(base, ft_dir).norm() == 0  # no false "different vocabularies"


def test_several_vectors_on_a_bf16_model_are_rounded_once(tmp_path):
    base = mk.load_model("tiny:llama", device="cpu", dtype="bfloat16")
    name = "model.norm.weight"
    p = dict(base.model.named_parameters())[name]
    a = TaskVector({name: torch.full(p.shape, 0.003)})
    b = TaskVector({name: torch.full(p.shape, 0.003)})
    expected = (p.detach().float() + 0.006).to(torch.bfloat16)
    with apply(base, [(a, 1.0), (b, 1.0)]):
        assert torch.equal(p.detach(), expected)


def test_example_script_on_tiny_model(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples/task_arithmetic.py"
    spec = importlib.util.spec_from_file_location("task_arithmetic_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--model", "tiny:llama", "--steps", "2", "--n", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "TIES d=0.2" in out and "λ=-1" in out and (tmp_path / "ft-capitalize" / "model.safetensors").is_file()


def test_best_lambdas_keep_both_tasks_and_prefer_small_lambda():
    from mechkit.options import parse_lambdas
    from mechkit.taskarith.lambdas import best_lambdas

    rows = [{"lambda": lam, "a": a, "b": b} for lam, a, b in
            [(-1.0, 0.8, 0.0), (-0.5, 0.8, 0.0), (0.5, 0.8, 0.4), (1.0, 0.6, 0.8), (1.5, 0.0, 1.0)]]
    best = best_lambdas(rows, "a", "b", own=(0.8, 1.0))
    assert best["multi_task"]["lambda"] == 1.0  # min(0.75, 0.8) beats min(1, 0.4) and one task lost at 1.5
    assert best["unlearning"]["lambda"] == -0.5  # tie with -1: the smaller |λ|
    assert parse_lambdas("-1:1.5:0.5") == [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]
    assert parse_lambdas("1,0,1") == [0.0, 1.0]
    with pytest.raises(MechkitError):
        parse_lambdas("1:0:0.1")
