"""Task selection (seed 000 Ch. 3, Algorithm 1): the coverage math, the greedy algorithm on Gaussian
tasks whose right answer is known, the validation conditions' equal budget, bad input, and a tiny run."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import mahalanobis
from sklearn.covariance import OAS, LedoitWolf

from mechkit.errors import MechkitError
from mechkit.taskselect import conditions, coverage, select_tasks, split_budget
from mechkit.taskselect.select import greedy_stop
from mechkit.taskselect.validate import spearman
from tests.rho_tool import rho_tool

D = 4


def _task(rng, mean, n=300, scale=1.0):
    return rng.normal(size=(n, D)) * scale + np.asarray(mean, dtype=float)


def _select(target, pool, p=0.1, estimator="empirical", order=None):
    return select_tasks(target, pool, {k: v.mean(0) for k, v in pool.items()}, target.mean(0), p=p,
                        estimator=estimator, order=order)


# --- coverage identities ---------------------------------------------------------------------------

def test_coverage_is_the_inverse_squared_mahalanobis_distance_computed_independently():
    rng = np.random.default_rng(1)
    points = rng.normal(size=(60, 5)) @ rng.normal(size=(5, 5))
    target = rng.normal(size=5) * 3
    for estimator, cov in (("empirical", np.cov(points, rowvar=False, bias=True)),
                           ("ledoit-wolf", LedoitWolf().fit(points).covariance_),
                           ("oas", OAS().fit(points).covariance_)):
        d = mahalanobis(points.mean(0), target, np.linalg.inv(cov))
        assert coverage(points, target, estimator) == pytest.approx(1 / d ** 2, rel=1e-9)


def test_exact_coverage_is_invariant_to_an_invertible_linear_map_and_shrinkage_is_not():
    rng = np.random.default_rng(2)
    points, target = rng.normal(size=(80, D)) + 1.0, rng.normal(size=D)
    a = rng.normal(size=(D, D)) + 3 * np.eye(D)
    assert abs(np.linalg.det(a)) > 1e-3
    mapped, mapped_target = points @ a.T, a @ target
    assert coverage(mapped, mapped_target, "empirical") == pytest.approx(coverage(points, target, "empirical"),
                                                                         rel=1e-9)
    # Ledoit-Wolf shrinks towards a multiple of the identity, which a linear map does not preserve: the
    # identity holds for the exact formula only (the one the tests pin), and the estimator moves.
    scaled = points * [1, 1, 1, 50]
    lw = coverage(scaled, target * [1, 1, 1, 50], "ledoit-wolf"), coverage(points, target, "ledoit-wolf")
    assert lw[0] != pytest.approx(lw[1], rel=1e-3)


def test_coverage_of_a_unit_gaussian_at_distance_r_is_one_over_r_squared():
    rng = np.random.default_rng(3)
    points = rng.normal(size=(20000, 2))
    points -= points.mean(0)
    points /= points.std(0)
    assert coverage(points, np.array([2.0, 0.0]), "empirical") == pytest.approx(0.25, rel=0.02)


# --- Algorithm 1 on Gaussian tasks with a known answer ---------------------------------------------

def _pools(rng):
    m0 = np.array([10.0, 0, 0, 0])
    consistent = {f"near{i}": _task(rng, m0 + off) for i, off in enumerate(
        ([0, 2, 0, 0], [0, -2, 0, 0], [0, 0, 2, 0], [0, 0, -2, 0]))}
    inconsistent = {f"far{i}": _task(rng, mean) for i, mean in enumerate(
        ([0, 10, 0, 0], [0, 0, 0, 10], [-10, 0, 0, 0]))}
    return _task(rng, m0), consistent, inconsistent


def test_a_covered_target_is_covered_and_an_uncovered_one_is_not():
    rng = np.random.default_rng(4)
    target, consistent, inconsistent = _pools(rng)
    covered = _select(target, consistent)
    uncovered = _select(target, inconsistent)
    assert covered.curve[len(covered.selected) - 1] > 1  # the ellipsoid of D holds μ_T0
    assert max(uncovered.curve) < 1  # no prefix of the far tasks covers it
    assert len(covered.selected) >= 2


def test_a_mixed_pool_selects_consistent_tasks_only_and_stops_before_the_rest():
    rng = np.random.default_rng(5)
    target, consistent, inconsistent = _pools(rng)
    s = _select(target, {**inconsistent, **consistent})
    assert set(s.order[:4]) == set(consistent)  # similarity ranks every consistent task first
    assert s.selected and set(s.selected) <= set(consistent)
    assert s.stop.startswith("stopped at near") or s.stop.startswith("stopped at far")
    i = len(s.selected)
    assert s.curve[i] < (1 + s.p) * s.curve[i - 1]  # the stopping rule held where it stopped
    assert all(s.curve[j] >= (1 + s.p) * s.curve[j - 1] for j in range(1, i))


def test_random_order_with_the_same_rule_can_pick_inconsistent_tasks():
    rng = np.random.default_rng(6)
    target, consistent, inconsistent = _pools(rng)
    s = _select(target, {**consistent, **inconsistent}, order=["far0", "near0", "far1", "near1"])
    assert s.selected[0] == "far0"  # No Con. starts wherever the order does


def test_stopping_rule_edge_cases():
    assert greedy_stop(["a", "b", "c"], [1.0, 2.0, 4.0], 0.5) == (["a", "b", "c"], greedy_stop(
        ["a", "b", "c"], [1.0, 2.0, 4.0], 0.5)[1])
    assert greedy_stop(["a", "b"], [1.0, 1.09], 0.1)[0] == ["a"]
    assert greedy_stop(["a", "b"], [1.0, 1.1], 0.1)[0] == ["a", "b"]  # "at least" the factor
    with pytest.raises(MechkitError, match="above 0"):
        greedy_stop(["a"], [1.0], 0.0)
    with pytest.raises(MechkitError, match="empty"):
        greedy_stop([], [], 0.1)


def test_spearman():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


# --- validation conditions hold the sample budget equal -------------------------------------------

def test_every_condition_trains_on_the_same_number_of_examples():
    rng = np.random.default_rng(7)
    target, consistent, inconsistent = _pools(rng)
    pool = {**consistent, **inconsistent}
    s = _select(target, pool)

    def reselect(order):
        return _select(target, {t: pool[t] for t in order}, order=order).selected

    for budget in (97, 240):
        conds = conditions(s, reselect, budget, draws=3, seed=0)
        methods = [c.method for c in conds]
        assert {m: methods.count(m) for m in methods} == {"None": 1, "Selected": 1, "All": 1, "Random": 3,
                                                          "No Con.": 3, "No Div.": 1}
        for c in conds:
            assert c.total == (0 if c.method == "None" else budget), c
            assert max(c.counts, default=0) - min(c.counts, default=0) <= 1  # split evenly
        k = len(s.selected)
        assert all(len(c.tasks) == k for c in conds if c.method == "Random")
        assert next(c for c in conds if c.method == "No Div.").tasks == tuple(s.order[:min(len(pool), 2 * k)])
    assert split_budget(5, []) == {}


def test_validation_units_share_steps_and_budget():
    from mechkit.taskselect.study import validation_units
    from mechkit.taskselect.validate import TrainConfig

    rng = np.random.default_rng(8)
    target, consistent, _ = _pools(rng)
    s = _select(target, consistent)
    units = validation_units(s, lambda order: order[:1], TrainConfig(target="t", budget=48), [0, 1], 3, 1, None)
    trained = [u for u in units if u["tasks"]]
    assert {sum(u["counts"]) for u in trained} == {48}
    assert len([u for u in units if u["kind"] == "single"]) == len(consistent)


# --- bad input: one line, before any model loads ---------------------------------------------------

@pytest.mark.parametrize("args, word", [
    (["--target", "nope"], "unknown task"),
    (["--target", "past-tense", "--pool", "past-tense,swap"], "among the candidates"),
    (["--target", "past-tense", "--p", "0"], "--p"),
    (["--target", "past-tense", "--p", "-1"], "--p"),
    (["--target", "past-tense", "--pool", ","], "no task ids"),
    (["--target", "past-tense", "--n", "1"], "too few examples"),
    (["--target", "past-tense", "--representation", "lora-grad", "--n", "1"], "too few examples"),
])
def test_bad_input_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch, args, word):
    from mechkit.cli.main import main
    from mechkit.model import loading

    def refuse(*_a, **_k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", refuse)
    with pytest.raises(SystemExit) as exit_:
        main(["select-tasks", "--model", "tiny:llama", "--out", str(tmp_path / "r"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and word in err[0], err


# --- a tiny end-to-end run ------------------------------------------------------------------------

def test_tiny_end_to_end_with_validation(tmp_path):
    import mechkit as mk

    run = mk.run("select-tasks", model="tiny:llama", out=tmp_path / "r", **dict(
        target="past-tense", pool="capitalize,swap,opposite,negation", n=4, validate=True, seeds="0",
        steps=1, budget=8, batch_size=4, eval_n=2, eval_shots="0,1", draws=3, transfer_seeds=1))
    r = run.results["targets"]["past-tense"]
    sel = r["selection"]
    assert sorted(sel["order"]) == ["capitalize", "negation", "opposite", "swap"]
    assert len(sel["curve"]) == 4 and sel["selected"] == sel["order"][:len(sel["selected"])]
    methods = run.results["table"]["past-tense"]
    assert set(methods) == {"None", "Random", "No Con.", "No Div.", "All", "Selected"}
    assert all(0 <= cell["0-shot"]["mean"] <= 1 for cell in methods.values())
    assert {sum(u["counts"]) for u in r["units"] if u["tasks"]} == {8}
    assert set(r["transfer"]["rho"]) == {f"{rep} | {c}" for rep in ("hidden", "pc1", "actvec", "lora-grad")
                                         for c in ("0-shot", "1-shot")}
    assert (tmp_path / "r" / "report.html").exists() and run.finding.startswith("For past-tense")


# --- lora-grad: the weight-space task vector of one SGD step, with a per-example spread -------------

def _rows(handle, task, n, seed):
    from mechkit.eval.scoring import encode
    from mechkit.tasks import build_prompts

    return [encode(handle.tokenizer, p.text, p.answer, p.terminator)
            for p in build_prompts(task, n=n, shots=0, seed=seed)]


def test_lora_grad_mean_is_the_first_plain_sgd_step_of_lora_b_over_minus_lr():
    import torch

    import mechkit as mk
    from mechkit.eval.scoring import pad_id
    from mechkit.taskarith.finetune import training_batch
    from mechkit.taskselect.gradients import gradient_points, lora_b_modules, lora_copy

    handle = mk.load_model("tiny:llama")
    points = gradient_points(handle, ["past-tense"], n=6, seed=3, rank=4, project=False)["past-tense"]
    # One step of torch SGD on the fine-tune's own loss (transformers' mean over the answer tokens of the
    # whole batch) on the same 6 examples (seed 3), from the LoRA start of the validation's fine-tune at seed 3.
    model, lr = lora_copy(handle, rank=4, seed=3), 0.5
    names = list(lora_b_modules(model, handle.anatomy.n_layers, 0))
    trained = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in trained:
        p.requires_grad_(True)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    ids, mask, labels = training_batch(_rows(handle, "past-tense", 6, seed=3), pad_id(handle.tokenizer))
    model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss.backward()
    torch.optim.SGD(trained, lr=lr).step()
    after = dict(model.named_parameters())
    a_moved = [float((after[n].detach() - before[n]).abs().max()) for n in before if "lora_A" in n]
    assert a_moved and max(a_moved) == 0.0  # at B = 0, ∂L/∂A = s·Bᵀ(∂L/∂h)xᵀ = 0: only B moves
    step = np.concatenate([((after[f"{n}.weight"] - before[f"{n}.weight"]) / lr).detach().reshape(-1).numpy()
                           for n in names])
    assert np.abs(step).max() > 1e-3  # a real step, not zeros
    np.testing.assert_allclose(points.mean(0), step, rtol=0, atol=1e-6 * np.abs(step).max())
    assert points.shape == (6, step.size) and np.std(points, axis=0).max() > 0  # a spread for C
    last = gradient_points(handle, ["past-tense"], n=6, seed=3, rank=4, blocks=1, project=False)["past-tense"]
    np.testing.assert_allclose(last, points[:, -last.shape[1]:], rtol=0, atol=1e-6 * np.abs(points).max())


def test_span_coordinates_keep_every_inner_product():
    from mechkit.taskselect.coverage import cosine
    from mechkit.taskselect.gradients import span_coordinates

    rng = np.random.default_rng(9)
    x = rng.normal(size=(15, 300)) + np.repeat(np.arange(3), 5)[:, None]
    x = np.concatenate([x, x[:2] + x[5:7]])  # two points in the span already: no new direction
    y = span_coordinates(x.astype(np.float32))
    assert y.shape == (17, 15)
    np.testing.assert_allclose(y @ y.T, x @ x.T, rtol=1e-5, atol=1e-3)
    assert cosine(y[:5].mean(0), y[10:15].mean(0)) == pytest.approx(cosine(x[:5].mean(0), x[10:15].mean(0)), abs=1e-6)


def test_lora_grad_leaves_the_model_and_the_random_state_unchanged():
    import torch

    import mechkit as mk
    from mechkit.taskselect.representations import task_features

    handle = mk.load_model("tiny:llama")
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        logits = handle.model(ids).logits.clone()
    weights = {k: v.clone() for k, v in handle.model.state_dict().items()}
    rng = torch.get_rng_state()
    feats = task_features(handle, ["past-tense", "swap"], "lora-grad", n=4)
    assert feats["swap"].points.shape[0] == 4
    with torch.no_grad():
        assert torch.equal(handle.model(ids).logits, logits)
    assert all(torch.equal(v, weights[k]) for k, v in handle.model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert not any(m._forward_hooks for m in handle.model.modules())
    assert not any(p.requires_grad and p.grad is not None for p in handle.model.parameters())


def test_rho_tool_agrees_with_the_in_run_rho(tmp_path, monkeypatch, capsys):
    """The fine-tunes are faked with fixed, distinct scores (the tool never fine-tunes; what it must
    reproduce is ρ from the report's gains and freshly computed features); the features are real."""
    import json

    import mechkit as mk
    from mechkit.taskselect import validate

    score = {"capitalize": 0.1, "swap": 0.3, "opposite": 0.2, "negation": 0.05}

    def fake(_handle, unit, _config, _checkpoints):
        s = [score[t] for t in unit["tasks"]]
        return {"0-shot": float(np.mean(s)) if s else 0.0, "1-shot": -float(np.mean(s)) if s else 0.0,
                "loss_first": None, "loss_last": None}

    monkeypatch.setattr(validate, "run_unit", fake)
    run = mk.run("select-tasks", model="tiny:llama", out=tmp_path / "r", **dict(
        target="past-tense", pool=",".join(score), n=4, validate=True, seeds="0", steps=1, budget=8,
        batch_size=4, eval_n=2, eval_shots="0,1", draws=3, transfer_seeds=1))
    in_run = run.results["targets"]["past-tense"]["transfer"]["rho"]
    assert sum(v["similarity"] is not None for v in in_run.values()) >= 4  # distinct gains: real ρ values
    tool = rho_tool()
    assert tool.main([str(tmp_path / "r"), "--representation", "hidden,pc1,actvec,lora-grad",
                      "--json", str(tmp_path / "rho.json")]) == 0
    again = json.loads((tmp_path / "rho.json").read_text())["past-tense"]
    assert set(again) == set(in_run)
    for key, v in in_run.items():
        for what in ("similarity", "coverage"):
            assert again[key][what] == pytest.approx(v[what], abs=1e-9) if v[what] is not None \
                else again[key][what] is None, (key, what)
    assert "lora-grad | 0-shot" in capsys.readouterr().out
    assert tool.main([str(tmp_path / "nowhere")]) == 2
