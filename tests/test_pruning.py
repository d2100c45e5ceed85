"""Guides, selection, budget search and the prune plugin, on tiny models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import mechkit as mk
from mechkit.cli.main import cli, main
from mechkit.errors import MechkitError
from mechkit.heads.effects import attribution_effects
from mechkit.model.modules.linear import weight_out_in
from mechkit.pruning import (
    PruneStudy,
    calibrate,
    guide_scores,
    make_plan,
    parse_guides,
    parse_levels,
    parse_sparsity,
    parse_targets,
    prune_copy,
)
from mechkit.pruning.cost import flops_per_token, n_params
from mechkit.pruning.guides import gradient_scores, static_scores
from mechkit.pruning.select import select_heads, select_neurons
from mechkit.tasks import build_prompts


@pytest.fixture(scope="module")
def calib(tiny_llama):
    return calibrate(tiny_llama, ["capitalize", "swap"], n=4, shots=2)


def test_parse_sparsity():
    assert parse_sparsity("0.3", ["neurons", "heads"]) == {"neurons": 0.3, "heads": 0.3}
    assert parse_sparsity("neurons=0.3,layers=0.1", ["neurons"]) == {"neurons": 0.3, "layers": 0.1}
    for bad in ("1.5", "neurons=x", "mlp=0.2"):
        with pytest.raises(MechkitError):
            parse_sparsity(bad, ["neurons"])


def test_levels_targets_and_guides_grammar():
    assert parse_levels("0.1, 0.2", ["neurons", "heads"]) == [{"neurons": 0.1, "heads": 0.1},
                                                             {"neurons": 0.2, "heads": 0.2}]
    assert parse_levels("neurons=0.3,heads=0.2", ["layers"]) == [{"neurons": 0.3, "heads": 0.2}]  # one level
    assert parse_levels("0.25", ["neurons"]) == [{"neurons": 0.25}]
    bad_levels = (("0.1,x", "malformed --sparsity"), ("0.1,1.5", "outside"), ("neurons=0.2,mlp=0.1", "target"))
    for bad, match in bad_levels:
        with pytest.raises(MechkitError, match=match):
            parse_levels(bad, ["neurons"])
    assert parse_targets(" heads,layers ") == ["heads", "layers"]
    for bad in ("mlp", "", "neurons,mlp"):
        with pytest.raises(MechkitError, match="--target"):
            parse_targets(bad)
    assert parse_guides("wanda, attribution@sensitivity") == ["wanda", "attribution@sensitivity"]
    assert parse_guides(" , ") == []
    with pytest.raises(MechkitError, match="guide"):
        parse_guides("wanda,bogus")
    with pytest.raises(MechkitError, match="allocation"):
        parse_guides("wanda@everywhere")


def test_study_steps_resume_and_rows_reload(tiny_llama):
    stored: dict = {}

    def step(key, compute):
        if key not in stored:
            stored[key] = json.loads(json.dumps(compute()))  # what a resumed run reads back
        return stored[key]

    sizes = dict(n_calib=2, n=2, shots=2, repeats=1, timing_batch=2)
    study = PruneStudy(tiny_llama, ["capitalize"], step=step, **sizes)
    assert not {q.text for q in study.test["capitalize"]} & {q.text for q in study.calib.prompts}
    row = study.row("attribution@sensitivity", {"neurons": 0.25})
    assert sorted(stored) == ["row|attribution@sensitivity|global|[('neurons', 0.25)]|lsq ridge=0.01",
                              "scores|attribution", "sensitivity|attribution"]
    assert row["reconstruct"] == "lsq ridge=0.01" and row["reconstruct_s"] >= 0  # one-shot, the default
    again = PruneStudy(tiny_llama, ["capitalize"], step=step, **sizes)
    assert again.row("attribution@sensitivity", {"neurons": 0.25}) == row  # read back, nothing recomputed
    assert again.pruned(row).anatomy.d_mlp < tiny_llama.anatomy.d_mlp
    assert row["params"] < study.dense()["params"]
    seq = PruneStudy(tiny_llama, ["capitalize"], sequential=True, step=step, **sizes).row("wanda", {"neurons": 0.25})
    assert seq["reconstruct"] == "lsq-seq ridge=0.01"
    ids = tiny_llama.to_tokens("input: ab\noutput:")
    with torch.no_grad():  # a row is rebuilt with the fits it was measured with, whatever the study's default
        plan = mk.pruning.UnitsToRemove.from_dict(seq["plan"])
        assert torch.equal(again.pruned(seq)(ids), again.prune(plan, "lsq", sequential=True)(ids))
        assert not torch.equal(again.pruned(seq)(ids), again.prune(plan, "lsq", sequential=False)(ids))


def test_budget_row_is_remeasured_until_it_meets_the_budget(tiny_llama):
    candidates = [{"mix": "neurons", "sparsity": {"neurons": 0.4}, "cost_ratio": 0.7, "calib_accuracy": 0.5},
                  {"mix": "layers", "sparsity": {"layers": 0.5}, "cost_ratio": 0.9, "calib_accuracy": None}]

    def step(key, compute):
        assert key == "budget|wanda|0.75|latency"
        return candidates

    class Timed(PruneStudy):
        ratios: list[float] = []
        levels: list[dict] = []

        def row(self, guide, level):
            self.levels.append(level)
            return {"guide": guide, "latency_ratio": self.ratios.pop(0)}

    study = Timed(tiny_llama, ["capitalize"], n_calib=2, n=2, shots=2, step=step)
    study.ratios = [0.8, 0.74, 0.1]
    out = study.budget("wanda", 0.75)
    assert out["met"] and out["measured_ratio"] == 0.74 and out["chosen"] == candidates[0]
    assert [lv["neurons"] for lv in study.levels] == pytest.approx([0.4, 0.4 * 1.05 + 0.01])
    study.ratios, study.levels = [0.9, 0.9, 0.9, 0.1], []
    out = study.budget("wanda", 0.75)
    assert not out["met"] and len(study.levels) == 3 and study.ratios == [0.1]  # three tries, then reported
    candidates[0]["calib_accuracy"] = None
    with pytest.raises(MechkitError, match="reaches 0.75"):
        study.budget("wanda", 0.75)


def test_uniform_and_global_neuron_selection():
    scores = np.arange(2 * 10, dtype=float).reshape(2, 10)
    assert select_neurons(scores, 0.3, "uniform") == {0: [0, 1, 2], 1: [0, 1, 2]}
    # globally the 6 lowest scores all sit in layer 0
    assert select_neurons(scores, 0.3, "global") == {0: [0, 1, 2, 3, 4, 5]}
    assert select_neurons(scores, 0.3, "global-z") == {0: [0, 1, 2], 1: [0, 1, 2]}


def test_gqa_head_selection_keeps_groups_even(tiny_llama):
    a = tiny_llama.anatomy  # 4 query heads, 2 KV groups of 2
    scores = np.array([[4.0, 1.0, 3.0, 2.0], [1.0, 2.0, 9.0, 9.0]])
    slot = select_heads(scores, a, 0.25, "global", gqa="slot")
    assert slot == {0: [1, 3]}  # the least important head of each group: layer 0 costs 1 + 2, layer 1 costs 1 + 9
    group = select_heads(scores, a, 0.25, "global", gqa="group")
    assert group == {1: [0, 1]}  # the cheapest whole KV group


def test_static_guides_match_their_definitions(tiny_llama, calib):
    a = tiny_llama.anatomy
    mag = static_scores("magnitude", tiny_llama, calib.stats)
    w = weight_out_in(a.mlp_out(1)).detach().double()
    np.testing.assert_allclose(mag.mlp[1], w.norm(dim=0).numpy(), rtol=1e-6)
    wanda = static_scores("wanda", tiny_llama, calib.stats)
    np.testing.assert_allclose(wanda.mlp[1], (w.norm(dim=0) * calib.stats.mlp_norm[1]).numpy(), rtol=1e-6)
    flap = static_scores("flap", tiny_llama, calib.stats)
    np.testing.assert_allclose(flap.mlp[1], (w.pow(2).sum(0) * calib.stats.mlp_var[1]).numpy(), rtol=1e-6)


def test_zero_baseline_gradient_equals_attribution_patching_per_prompt(tiny_llama, calib):
    prompt = build_prompts("capitalize", n=1, shots=2, seed=5)
    ours = gradient_scores(tiny_llama, prompt, calib.stats, baseline="zero")
    ref = attribution_effects(tiny_llama, prompt)
    np.testing.assert_allclose(ours.heads, np.abs(ref.logprob), rtol=1e-4, atol=1e-7)


def test_task_guides_are_finite_and_detach(tiny_llama, calib):
    ids = tiny_llama.to_tokens("input: ab\noutput:")
    with torch.no_grad():
        before = tiny_llama(ids)
    for guide in ("gradient", "attribution", "ablation", "combined", "induction"):
        s = guide_scores(tiny_llama, guide, calib, protect_top_k=1)
        assert np.isfinite(s.mlp).all() and np.isfinite(s.heads).all() and np.isfinite(s.layers).all()
        assert s.mlp.shape == (2, tiny_llama.anatomy.d_mlp)
    with torch.no_grad():
        assert torch.equal(tiny_llama(ids), before)
    assert len(guide_scores(tiny_llama, "induction", calib, protect_top_k=1).protected_heads) >= 1


def test_pruned_model_is_smaller_and_cheaper(tiny_llama, calib):
    s = static_scores("wanda", tiny_llama, calib.stats)
    plan = make_plan(s, tiny_llama.anatomy, {"neurons": 0.5, "heads": 0.5, "layers": 0.5})
    small = prune_copy(tiny_llama, plan, calib.stats)
    assert n_params(small) < n_params(tiny_llama)
    assert flops_per_token(small) < flops_per_token(tiny_llama)
    assert len(small.anatomy.layers) == 1


def _report(path):
    return json.loads((path / "report.json").read_text())


def test_prune_plugin_rows_and_saved_model(tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"  # a private temp dir, so runs beside this one cannot confuse the leak check
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "run"
    r = CliRunner().invoke(cli, ["prune", "--model", "tiny:llama", "--out", str(out), "--guide", "attribution,random",
                                 "--target", "neurons,heads", "--sparsity", "0.25", "--tasks", "capitalize",
                                 "--n", "4", "--calib", "3", "--shots", "2", "--repeats", "1", "--save-model"])
    assert r.exit_code == 0, r.output
    rep = _report(out)
    assert [row["guide"] for row in rep["results"]["rows"]] == ["attribution", "random"]
    dense = rep["results"]["dense"]
    for row in rep["results"]["rows"]:
        assert row["params"] < dense["params"] and row["flops_per_token"] < dense["flops_per_token"]
        assert row["latency_ratio"] == pytest.approx(row["latency_s"] / row["dense_latency_s"])
        assert row["speedup"] == pytest.approx(1 / row["latency_ratio"])
    assert not list(scratch.glob("*mechkit-pruned-*")), "--save-model left a temp directory behind"
    assert tempfile.gettempdir() == str(scratch)
    assert "accuracy_vs_speedup.png" in rep["artifacts"] and "model" in rep["artifacts"]
    saved = mk.load_model(str(out / "model"), device="cpu")
    row = rep["results"]["rows"][0]
    assert row["reconstruct"] == "lsq ridge=0.01"  # the default: one-shot least squares
    dense = mk.load_model("tiny:llama", device="cpu")
    study = PruneStudy(dense, ["capitalize"], n_calib=3, n=4, shots=2)  # what the run calibrated on
    ids = dense.to_tokens("input: ab\noutput:")
    with torch.no_grad():
        assert torch.equal(saved(ids), study.pruned(row)(ids))


def test_budget_mode_meets_a_flops_budget(tmp_path):
    out = tmp_path / "budget"
    r = CliRunner().invoke(cli, ["prune", "--model", "tiny:llama", "--out", str(out), "--guide", "wanda",
                                 "--target", "neurons,heads", "--budget", "0.8", "--budget-unit", "flops",
                                 "--tasks", "capitalize", "--n", "3", "--calib", "3", "--shots", "2", "--repeats", "1"])
    assert r.exit_code == 0, r.output
    budget = _report(out)["results"]["budget"]
    assert budget["met"] and budget["measured_ratio"] <= 0.8
    assert {c["mix"] for c in budget["candidates"]} == {"neurons", "neurons+heads"}


@pytest.mark.parametrize("args, word", [
    (["--sparsity", "1.5"], "sparsity"), (["--guide", "bogus"], "guide"), (["--target", "mlp"], "target"),
    (["--budget", "2"], "budget"), (["--tasks", "nope"], "nope"),
    (["--repeats", "0"], "--repeats"), (["--timing-batch", "0"], "--timing-batch"),
    (["--batch-size", "0"], "--batch-size"), (["--protect-top-k", "-1"], "--protect-top-k"),
    (["--reconstruct", "ols"], "--reconstruct"), (["--ridge", "-1"], "--ridge"),
    (["--calib-text-weight", "1.5"], "--calib-text-weight"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, word):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exit_:
        main(["prune", "--model", "tiny:llama", "--out", str(out), "--n", "2", "--calib", "2", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and word in err[0]
    assert not out.exists()


def test_allocation_follows_inverse_sensitivity():
    from mechkit.pruning.sensitivity import allocate

    out = allocate(np.array([1.0, 2.0, 4.0, 100.0]), 0.2)
    assert out.mean() == pytest.approx(0.2) and out[0] > out[1] > out[2] > out[3] >= 0
    assert out.max() <= 0.5  # never past the probe level
    capped = allocate(np.array([-1.0, 1.0, 1.0, 1.0]), 0.5, max_fraction=0.9)  # noise floor, then the cap
    assert capped[0] == pytest.approx(0.9) and capped.mean() == pytest.approx(0.5)


def test_allocation_stops_when_every_layer_is_capped():
    import warnings

    from mechkit.pruning.sensitivity import allocate

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0 once no layer is left to spread over
        out = allocate(np.array([1.0, 2.0, 3.0]), 0.8, max_fraction=0.5)
    np.testing.assert_array_equal(out, [0.5, 0.5, 0.5])


def test_layer_sensitivity_is_the_exact_masked_drop(tiny_llama, calib):
    from mechkit.eval.scoring import encode_rows, forward_kept, pad_batch, pad_id, row_metrics
    from mechkit.pruning.masking import masked
    from mechkit.pruning.plan import UnitsToRemove
    from mechkit.pruning.sensitivity import layer_sensitivity

    scores = static_scores("wanda", tiny_llama, calib.stats)
    sens = layer_sensitivity(tiny_llama, scores.mlp, calib, probe=0.5, batch_size=64)
    rows = encode_rows(tiny_llama.tokenizer, calib.prompts, None)
    batch = pad_batch(sorted(rows, key=lambda r: len(r.ids)), pad_id(tiny_llama.tokenizer))
    k = tiny_llama.anatomy.d_mlp // 2
    plan = UnitsToRemove(mlp={1: np.argsort(scores.mlp[1], kind="stable")[:k].tolist()}, compensate=True)
    with torch.no_grad():
        base = row_metrics(forward_kept(tiny_llama, batch), batch)[0]
        with masked(tiny_llama, plan, calib.stats):
            out = row_metrics(forward_kept(tiny_llama, batch), batch)[0]
    assert sens[1] == pytest.approx(float((base - out).mean()), abs=1e-5)
    plan = make_plan(scores, tiny_llama.anatomy, {"neurons": 0.3}, "sensitivity", sensitivity=sens)
    assert sum(len(v) for v in plan.mlp.values()) == pytest.approx(0.3 * 2 * tiny_llama.anatomy.d_mlp, abs=2)
