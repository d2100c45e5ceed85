"""Adaptive inference: plans on one model, token selection, cost table, scheduler, the ``adapt`` plugin.

The identities, as mergekit's tests state theirs: a plan that runs every unit *is* the dense
model; a skipped unit *is* its ablation by bypass; keeping every token *is* the dense model; a
cached generation under a plan *is* the uncached one; and the model is the same after a plan.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit.adapt import (
    Candidate,
    CostTable,
    ExecutionPlan,
    Scheduler,
    TaskSignal,
    TokenSelection,
    adaptive,
    channel_groups,
    run_plan,
    score_plan,
    signal_features,
)
from mechkit.adapt.cost import Measured
from mechkit.adapt.scheduler import structure_identity
from mechkit.adapt.tokens import keep_positions
from mechkit.errors import MechkitError
from mechkit.model.sources.tiny import tiny_model
from mechkit.pruning import UnitsToRemove, masked

TEXTS = ["input: cat\noutput: CAT\ninput: dog\noutput: DOG\ninput: emu\noutput:", "input: a\noutput:"]


@pytest.fixture(scope="module")
def deep():
    """A tiny Llama with 6 blocks, so plans have layers to skip above the signal layer."""
    model, tok = tiny_model("llama", num_hidden_layers=6)
    return mk.load_model(model, tokenizer=tok, device="cpu")


def _batch(handle, texts=TEXTS):
    enc = handle.tokenizer(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def _logits(handle, ids, mask=None):
    with torch.no_grad():
        return handle(ids, attention_mask=mask) if mask is not None else handle(ids)


def _no_wrappers(handle) -> bool:
    return all("forward" not in block.__dict__ for block in handle.anatomy.layers)


# --- plans: identities ---------------------------------------------------------------------------------

def test_a_plan_running_every_unit_is_the_dense_model_and_the_model_is_restored(deep):
    ids, mask = _batch(deep)
    before = _logits(deep, ids, mask)
    with run_plan(deep, ExecutionPlan()) as run:
        inside = _logits(deep, ids, mask)
    assert torch.equal(before, inside)
    assert run.log[0]["label"] == "dense" and run.log[0]["kept"] == [1.0, 1.0]
    with run_plan(deep, ExecutionPlan(layers=(2, 4), heads={1: (0, 3)}, tokens=TokenSelection(1, 0.5, tail=3))):
        changed = _logits(deep, ids, mask)
    assert not torch.equal(before, changed)
    assert torch.equal(before, _logits(deep, ids, mask)) and _no_wrappers(deep)


def test_skipped_units_equal_their_ablation_by_bypass(deep):
    ids, mask = _batch(deep)
    channels = tuple(range(0, 128, 3))
    plan = ExecutionPlan(layers=(3,), heads={1: (0, 2), 4: (1,)}, mlp={2: channels})
    with run_plan(deep, plan):
        bypassed = _logits(deep, ids, mask)
    # a skipped block is the residual passing through; skipped heads are zero-ablated heads; skipped
    # channels read zero — the pruning package's reference semantics and mk.ablate, exactly
    with masked(deep, UnitsToRemove(layers=[3], mlp={2: list(channels)})), mk.ablate(deep, heads="1.0,1.2,4.1"):
        ablated = _logits(deep, ids, mask)
    assert torch.equal(bypassed, ablated)


def test_whole_sub_blocks_are_bypassed_not_computed_and_equal_their_ablation(deep):
    ids, mask = _batch(deep)
    a = deep.anatomy
    plan = ExecutionPlan(heads={2: tuple(range(a.n_heads))}, mlp={4: tuple(range(a.d_mlp))}, mlp_layers=(5,))
    assert plan.check(a).attn_layers == (2,) and plan.check(a).mlp_layers == (4, 5)
    calls = []
    hooks = [a.attn_proj(2, "q").register_forward_hook(lambda *_: calls.append("q")),
             a.mlp_out(4).register_forward_hook(lambda *_: calls.append("down"))]
    try:
        with run_plan(deep, plan):
            bypassed = _logits(deep, ids, mask)
    finally:
        for h in hooks:
            h.remove()
    assert calls == []
    everything = list(range(a.d_mlp))
    with masked(deep, UnitsToRemove(mlp={4: everything, 5: everything})), mk.ablate(deep, heads="layer:2"):
        ablated = _logits(deep, ids, mask)
    assert torch.equal(bypassed, ablated)


def test_sub_block_bypass_keeps_biases_and_cached_generation(tiny):
    ids = tiny.to_tokens(TEXTS[0])
    a = tiny.anatomy
    if a.n_layers < 2:
        pytest.skip("one block")
    plan = ExecutionPlan(attn_layers=(1,), mlp_layers=(1,), name="no block 1 sub-blocks")
    with run_plan(tiny, plan):
        bypassed = _logits(tiny, ids)
    everything = list(range(a.d_mlp))
    with masked(tiny, UnitsToRemove(mlp={1: everything})), mk.ablate(tiny, heads="layer:1"):
        ablated = _logits(tiny, ids)
    assert torch.allclose(bypassed, ablated, atol=1e-6)  # GPT-2's projections have biases
    if a.family_name == "gemma2":
        return  # its cached masks are sized by block 1's cache (the first full-attention block): keep it
    with torch.no_grad(), run_plan(tiny, ExecutionPlan(attn_layers=(1,), tokens=TokenSelection(0, 0.5, tail=3))) as run:
        cached = tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                                     pad_token_id=tiny.tokenizer.pad_token_id)
        seq = ids
        for _ in range(3):
            with run.queries([ids.shape[1] - 1]):
                seq = torch.cat([seq, tiny(seq)[0, -1].argmax().view(1, 1)], dim=1)
    assert torch.equal(cached, seq)


def test_a_skipped_block_is_not_computed(deep):
    calls = []
    hook = deep.anatomy.mlp(3).register_forward_hook(lambda *_: calls.append(1))
    try:
        with run_plan(deep, ExecutionPlan(layers=(3,))):
            _logits(deep, _batch(deep)[0])
        assert calls == []
        _logits(deep, _batch(deep)[0])
        assert calls == [1]
    finally:
        hook.remove()


def test_channel_groups_split_by_importance():
    groups = channel_groups(list(range(10, 0, -1)), 3)  # channel 9 is the least important
    assert groups == [[6, 7, 8, 9], [3, 4, 5], [0, 1, 2]]
    assert sorted(sum(groups, [])) == list(range(10))


def test_plans_are_checked_and_round_trip(deep):
    for bad in (ExecutionPlan(layers=(0,)), ExecutionPlan(layers=(6,)), ExecutionPlan(heads={2: (4,)}),
                ExecutionPlan(layers=(2,), tokens=TokenSelection(2, 0.5)), ExecutionPlan(tokens=TokenSelection(5, 0.5)),
                ExecutionPlan(tokens=TokenSelection(1, 0.0))):
        with pytest.raises(MechkitError):
            bad.check(deep.anatomy)
    plan = ExecutionPlan(layers=(4, 2), heads={1: [3, 0]}, tokens=TokenSelection(1, 0.5, "heads", (1,)), name="x")
    again = ExecutionPlan.from_dict(plan.as_dict())
    assert again == plan and again.key() == plan.key() and again.layers == (2, 4)


def test_the_model_is_restored_after_an_error(deep):
    ids, mask = _batch(deep)
    before = _logits(deep, ids, mask)
    with pytest.raises(RuntimeError, match="boom"), run_plan(deep, ExecutionPlan(layers=(2,))):
        raise RuntimeError("boom")
    assert _no_wrappers(deep) and torch.equal(before, _logits(deep, ids, mask))


# --- token selection -----------------------------------------------------------------------------------

def test_keep_positions_protects_the_sink_the_query_line_and_the_answer():
    sel = TokenSelection(layer=0, keep=0.5, first=1, tail=2)
    received = torch.tensor([[0.0, 0.9, 0.1, 0.8, 0.2, 0.0, 0.0, 0.0], [0.0, 0.5, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True] * 8, [True] * 5 + [False] * 3])
    keep, selected = keep_positions(sel, received, valid, torch.tensor([5, 4]))
    assert keep[0].tolist() == [0, 1, 3, 4, 5, 6, 7]  # 2 of 4 context tokens (1, 3): the most attended
    assert selected[0].all()
    # row 2 (query at 4) keeps 0, 1 (1 of 2 context), 3, 4 and is filled up with masked padding
    assert keep[1][selected[1]].tolist() == [0, 1, 3, 4] and not selected[1][keep[1] >= 5].any()


def test_keep_ratio_one_is_the_dense_model(tiny):
    ids, mask = _batch(tiny)
    dense = _logits(tiny, ids, mask)
    with run_plan(tiny, ExecutionPlan(tokens=TokenSelection(0, 1.0))) as run:
        kept = _logits(tiny, ids, mask)
    assert torch.equal(dense, kept) and run.log[0]["kept"] == [1.0, 1.0]


def test_a_row_under_token_selection_is_the_same_alone_or_batched(deep):
    ids, mask = _batch(deep)
    plan = ExecutionPlan(layers=(4,), tokens=TokenSelection(1, 0.5, tail=3))
    with run_plan(deep, plan) as run:
        batched = _logits(deep, ids, mask)
        n1 = int(mask[1].sum())
        alone = [_logits(deep, ids[:1]), _logits(deep, ids[1:2, :n1])]
    assert torch.allclose(batched[0, -1], alone[0][0, -1], atol=1e-5)
    assert torch.allclose(batched[1, n1 - 1], alone[1][0, -1], atol=1e-5)
    assert 0 < run.log[0]["kept"][0] < 1


def test_a_cached_generation_under_a_plan_equals_the_uncached_one(tiny):
    ids = tiny.to_tokens(TEXTS[0])
    n = ids.shape[1]
    plan = ExecutionPlan(tokens=TokenSelection(0, 0.5, tail=3))
    with torch.no_grad(), run_plan(tiny, plan) as run:
        out = tiny.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                  pad_token_id=tiny.tokenizer.pad_token_id, output_scores=True,
                                  return_dict_in_generate=True)
        seq, steps = ids, []
        for _ in range(4):  # uncached: the whole sequence again, the query still the prompt's last token
            with run.queries([n - 1]):
                logits = tiny(seq)[0, -1]
            steps.append(logits)
            seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
    assert torch.equal(out.sequences, seq)
    assert all(torch.allclose(a[0], b, atol=1e-4) for a, b in zip(out.scores, steps, strict=True))
    assert run.log[0]["kept"][0] < 1


def test_cached_generation_with_skipped_blocks_and_tokens(deep):
    ids = deep.to_tokens(TEXTS[0])
    plan = ExecutionPlan(layers=(2, 5), tokens=TokenSelection(3, 0.4, tail=3))
    with torch.no_grad(), run_plan(deep, plan) as run:
        cached = deep.model.generate(ids, max_new_tokens=5, do_sample=False, output_scores=True,
                                     return_dict_in_generate=True, pad_token_id=deep.tokenizer.pad_token_id)
        seq = ids
        for step in range(5):
            with run.queries([ids.shape[1] - 1]):
                logits = deep(seq)[0, -1]
            assert torch.allclose(cached.scores[step][0], logits, atol=1e-4)
            seq = torch.cat([seq, logits.argmax().view(1, 1)], dim=1)
    assert torch.equal(cached.sequences, seq)


def test_score_plan_uses_the_prompt_as_the_query(deep):
    prompts = mk.build_prompts("capitalize", n=3, shots=2)
    dense = score_plan(deep, ExecutionPlan(), prompts, batch_size=2)
    assert dense["accuracy"] == mk.score_prompts(deep, prompts).accuracy and dense["kept"] == 1.0
    sel = score_plan(deep, ExecutionPlan(tokens=TokenSelection(1, 0.5, tail=3)), prompts, batch_size=2)
    assert 0 < sel["kept"] < 1 and len(sel["correct"]) == 3


# --- adaptive choice, cost table, scheduler --------------------------------------------------------------

def test_a_plan_chosen_mid_forward_equals_that_plan_run_statically(deep):
    ids, mask = _batch(deep)
    plan = ExecutionPlan(layers=(3, 5), heads={2: (1,)}, tokens=TokenSelection(2, 0.5, tail=3))
    seen = []

    def choose(features, lengths):
        seen.append((tuple(features.shape), lengths.tolist()))
        return plan

    with run_plan(deep, choose=choose, choose_after=1, candidates=[plan]):
        chosen = _logits(deep, ids, mask)
    with run_plan(deep, plan):
        static = _logits(deep, ids, mask)
    assert torch.equal(chosen, static)
    assert seen == [((2, 64), mask.sum(1).tolist())]
    with pytest.raises(MechkitError), run_plan(deep, choose=lambda f, n: ExecutionPlan(layers=(1,)), choose_after=1):
        _logits(deep, ids, mask)  # a plan chosen after block 1 cannot skip block 1
    assert _no_wrappers(deep)


def test_a_plan_chosen_mid_forward_may_select_tokens_at_the_signal_block(deep):
    # the chosen plan ranks tokens by the very block the choice reads: its pattern is captured
    # before the choice is known (this once failed only when the scheduler happened to pick it)
    ids, mask = _batch(deep)
    plan = ExecutionPlan(tokens=TokenSelection(1, 0.5, tail=3))
    with run_plan(deep, choose=lambda f, n: plan, choose_after=1, candidates=[ExecutionPlan(), plan]):
        chosen = _logits(deep, ids, mask)
    with run_plan(deep, plan):
        static = _logits(deep, ids, mask)
    assert torch.equal(chosen, static)
    assert _no_wrappers(deep)


def test_the_cost_table_recovers_known_costs():
    n_layers, rng = 10, np.random.default_rng(0)
    plans = [ExecutionPlan(layers=tuple(range(1, 1 + s))) for s in (1, 3, 5)]
    plans += [ExecutionPlan(tokens=TokenSelection(2, k, first=0, tail=1)) for k in (0.5, 0.25)]
    plans += [ExecutionPlan(tokens=TokenSelection(6, 0.5, first=0, tail=1))]
    plans += [ExecutionPlan(layers=(7, 8), tokens=TokenSelection(2, 0.5, first=0, tail=1))]
    plans += [ExecutionPlan(heads={5: (0,)}), ExecutionPlan(attn_layers=(6, 7)), ExecutionPlan(mlp_layers=(3,))]
    truth = CostTable(beta_attn=0.25, beta_mlp=0.6, gamma=0.03, eta=0.1, dense_a=0.01, dense_b=0.002,
                      n_layers=n_layers, rho=0.7)
    measured = []
    for plan in plans:
        for n in (50, 100):
            dense = truth.dense_seconds(n) * (1 + 0.001 * rng.standard_normal())
            measured.append(Measured(plan, n, dense * truth.predict(plan, n), dense))
    fit = CostTable.fit(measured, n_layers)
    assert abs(fit.beta_attn - 0.25) < 1e-6 and abs(fit.beta_mlp - 0.6) < 1e-6
    assert abs(fit.gamma - 0.03) < 1e-6 and abs(fit.eta - 0.1) < 1e-6 and fit.rho == pytest.approx(0.7)
    assert abs(fit.dense_b - 0.002) < 1e-4 and fit.fit_error < 1e-6 and fit.under < 1e-6
    assert CostTable.from_dict(fit.as_dict()) == fit
    assert fit.validate(measured[:2])["max_abs_error"] < 1e-6


def _table(n_layers: int) -> CostTable:
    return CostTable(beta_attn=0.25, beta_mlp=0.75, gamma=0.0, eta=0.0, dense_a=0.0, dense_b=0.001, n_layers=n_layers)


def test_the_scheduler_picks_per_task_plans_and_falls_back_to_the_static_one():
    rng = np.random.default_rng(0)
    feats = np.vstack([rng.normal(0, 1, (12, 4)) + [4, 0, 0, 0], rng.normal(0, 1, (12, 4)) - [4, 0, 0, 0]])
    signal = TaskSignal.fit(feats, ["a"] * 12 + ["b"] * 12, layer=1)
    assert signal.cv_accuracy == 1.0 and np.allclose(signal.proba(feats).sum(1), 1)
    assert TaskSignal.from_dict(signal.as_dict()).proba(feats[:3]).argmax(1).tolist() == [0, 0, 0]
    skip_a, skip_b = ExecutionPlan(layers=(2, 3)), ExecutionPlan(layers=(4, 5))
    cands = [Candidate(ExecutionPlan(), "static", {"a": 1.0, "b": 1.0}),
             Candidate(skip_a, "static", {"a": 0.9, "b": 0.1}), Candidate(skip_b, "static", {"a": 0.2, "b": 0.3}),
             Candidate(skip_b, "b", {"b": 0.8})]
    s = Scheduler(cands, _table(6), ["a", "b"], signal, margin=0.0)
    assert s.decide(feats[:1], 50, 0.7).plan == skip_a  # task a's best within 0.7
    assert s.decide(feats[-2:], 50, 0.7).plan == skip_b and s.decide(feats[-1:], 50, 0.7).task == "b"
    assert s.decide(feats[[0, -1]], 50, 0.7).reason == "rows disagree"  # one plan per batch: static
    assert s.decide(None, 50, 0.7).plan == skip_a  # static: best mean (0.5 > 0.25)
    assert s.decide(feats[:1], 50, 1.0).plan == ExecutionPlan()
    over = s.decide(None, 50, 0.2)
    assert not over.fits and over.predicted == pytest.approx(2 / 3)  # nothing fits: the cheapest
    weak = Scheduler(cands, _table(6), ["a", "b"], TaskSignal.fit(rng.normal(0, 1, (24, 4)), ["a", "b"] * 12, 1),
                     margin=0.0, min_cv=0.99)
    assert not weak.adaptive_ok and weak.decide(feats[-1:], 50, 0.7).plan == skip_a
    assert Scheduler.from_dict(s.as_dict()).decide(feats[-1:], 50, 0.7).plan == skip_b


def test_the_scheduler_ranks_by_log_prob_or_accuracy_and_ties_go_to_more_compute():
    light, heavy = ExecutionPlan(layers=(2, 3, 4)), ExecutionPlan(layers=(5,))
    cands = [Candidate(ExecutionPlan(), "static", {"a": 0.5}, {"a": -1.0}),
             Candidate(light, "static", {"a": 0.75}, {"a": -3.0}), Candidate(heavy, "static", {"a": 0.5}, {"a": -1.5})]
    by_lp = Scheduler(cands, _table(6), ["a"], margin=0.0)
    by_acc = Scheduler(cands, _table(6), ["a"], margin=0.0, select="accuracy")
    assert by_lp.static(0.9, 50).plan == heavy and by_acc.static(0.9, 50).plan == light
    assert by_lp.static(1.0, 50).plan == ExecutionPlan() and by_acc.static(1.0, 50).plan == light
    tied = [Candidate(light, "static", {"a": 0.5}), Candidate(heavy, "static", {"a": 0.5})]
    assert Scheduler(tied, _table(6), ["a"], margin=0.0).static(0.9, 50).plan == heavy
    with pytest.raises(MechkitError):
        Scheduler(cands, _table(6), ["a"], select="loss")


def test_adaptive_runs_the_scheduled_plan_inside_the_forward(deep, tmp_path):
    prompts = mk.build_prompts("capitalize", n=4, shots=1) + mk.build_prompts("past-tense", n=4, shots=1)
    feats = signal_features(deep, [p.text for p in prompts], layer=1, batch_size=3)
    assert feats.shape == (8, 64)
    signal = TaskSignal.fit(feats, ["capitalize"] * 4 + ["past-tense"] * 4, layer=1)
    cap = ExecutionPlan(layers=(3, 4), tokens=TokenSelection(2, 0.5, tail=3))
    past = ExecutionPlan(layers=(4, 5))
    cands = [Candidate(ExecutionPlan(), "static", {"capitalize": 1.0, "past-tense": 1.0}),
             Candidate(cap, "capitalize", {"capitalize": 0.9}), Candidate(past, "past-tense", {"past-tense": 0.9})]
    sched = Scheduler(cands, _table(6), ["capitalize", "past-tense"], signal, margin=0.0, min_cv=0.0,
                      min_confidence=0.0, model=structure_identity(deep))  # a file must say its model
    path = tmp_path / "scheduler.json"
    path.write_text(__import__("json").dumps(sched.as_dict()))
    ids = deep.to_tokens(prompts[5].text)
    task = sched.decide(feats[5:6], ids.shape[1], 0.8).task
    with adaptive(deep, budget=0.8, scheduler=path) as run:
        chosen = _logits(deep, ids)
    with run_plan(deep, cap if task == "capitalize" else past):
        static = _logits(deep, ids)
    assert torch.allclose(chosen, static, atol=1e-5) and run.decisions[0].task == task
    with adaptive(deep, budget=2.0, scheduler=sched) as run:
        assert torch.equal(_logits(deep, ids), _logits(deep, ids)) and run.log[0]["label"] == "dense"
    with pytest.raises(MechkitError, match="scheduler"), adaptive(deep, budget=0.5):
        pass
    assert _no_wrappers(deep)


# --- the plugin -------------------------------------------------------------------------------------------

def test_the_adapt_plugin_reports_accuracy_latency_and_plans(tmp_path):
    from mechkit.plugins.adapt import AdaptPlugin

    run = mk.run(AdaptPlugin, model="tiny:llama", out=tmp_path / "run", tasks="capitalize,past-tense",
                 budgets="0.7,1.0", calib=3, n=2, shots=1, token_layers="0", token_keep="0.5", signal_layer=0, repeats=1,
                 prune_budgets="0.7", adherence=0.5, margin_prompts=1, margin_plans=2, prune_targets="layers",
                 prune_reconstruct="none")  # whole layers: a tiny model's pruned copy reaches 0.7 only so
    res = run.results
    assert [r["budget"] for r in res["rows"]] == [0.7, 1.0]
    row = res["rows"][0]
    for kind in ("adaptive", "static"):
        assert set(row[kind]["accuracy"]) == {"capitalize", "past-tense"} and 0 <= row[kind]["adherence"] <= 1
        assert row[kind]["adherence"] <= row[kind]["adherence_dense_met"] and 0 <= row[kind]["coverage"] <= 1
        assert row[kind]["adherence_dense_met"] == row[kind]["within"] / row[kind]["inputs"]
        assert row[kind]["adherence_lower95"] <= row[kind]["adherence_dense_met"]
    for kind in ("adaptive", "static"):  # pooled over budgets: the counts the rows give
        pooled = res["pooled_adherence"][kind]
        assert pooled["inputs"] == sum(r[kind]["inputs"] for r in res["rows"])
        assert pooled["within"] == sum(r[kind]["within"] for r in res["rows"])
        assert pooled["lower95"] <= pooled["share"] <= 1
    assert "adherence, all budgets" in run.report["results"]["summary"]
    cal = res["margin_calibration"]
    assert cal["method"] == "conformal" and cal["q"] == 0.5 and cal["value"] >= 0
    assert cal["n"] == 2 * len(cal["plans"]) and res["adherence_target"] == 0.5
    chosen = cal["chosen_plans"]  # --debias (the default): the chosen plans timed, the margin recalibrated on them
    assert res["margin"] == chosen["margin"]["value"] >= 0 and chosen["first_margin"] == cal["value"]
    assert chosen["margin"]["n"] >= cal["n"] and 0 <= chosen["rounds"] <= 2 and chosen["forwards"] >= 0
    assert all({"plan", "predicted", "bias", "chosen_in_round", "timed_in_round"} <= set(p) for p in chosen["plans"])
    saved = json.loads((tmp_path / "run" / "scheduler.json").read_text())
    assert all("bias" in c for c in saved["candidates"]) and saved["margin"] == res["margin"]
    notes = " ".join(t.note or "" for t in AdaptPlugin.tables(res))
    assert "de-biased" in notes and "chosen plans" in notes
    assert res["infeasible_budgets"] == [r["budget"] for r in res["rows"] if not r["feasible"]]
    assert row["prune"] is not None and res["cost"]["validation"]["rows"]
    assert res["cost"]["clock"] in ("cpu", "wall")
    # timed on every held-out input, reconstructed as asked, and a copy searched to the scheduler's latency
    assert row["prune"]["inputs"] == sum(res["heldout_prompts"].values()) and row["prune"]["reconstruct"] == "none"
    matched = row["prune"]["matched"]  # a search to the scheduler's measured latency may find no plan on a busy machine
    assert row["prune"]["within"] <= row["prune"]["inputs"]
    assert matched["reconstruct"] == "none" if "error" not in matched else "reaches" in matched["error"]
    assert row["prune"]["matched"]["target"] == row["adaptive"]["latency_ratio"]
    (same,) = res["same_latency"]
    assert same["adaptive_latency"] == row["adaptive"]["latency_ratio"] and len(same["copies"]) == 2
    assert (tmp_path / "run" / "scheduler.json").exists() and (tmp_path / "run" / "frontier.png").exists()
    assert "0.70" in run.report["finding"] and "margin" in run.report["finding"]
    from mechkit.adapt.findings import finding

    said = finding({**res, "infeasible_budgets": [0.7], "rows": [{**res["rows"][0], "feasible": False}, *res["rows"][1:]]})
    assert "no plan fits it: the cheapest plan ran" in said and "Infeasible at 50% adherence" in said
    titles = [t.title for t in AdaptPlugin.tables(res)]
    assert any("budget" in t for t in titles)
    item = {"budget": 0.7, "adaptive": 0.22, "adaptive_latency": 0.62, "prune": 0.2, "verdict": "adaptive",
            "copies": [{"kind": "matched", "latency_ratio": 0.57, "mean_accuracy": 0.15, "within": 60, "inputs": 60},
                       {"kind": "at budget", "latency_ratio": 0.67, "mean_accuracy": 0.25, "within": 52, "inputs": 60}]}
    said = finding({**res, "same_latency": [item]})
    assert ("at the scheduler's measured 0.62 static pruning keeps 0.20 (interpolated); the adaptive scheduler "
            "keeps more (pruned copies: matched 0.15 at 0.57, 60/60 inputs within the budget; at budget 0.25 at "
            "0.67, 52/60 inputs within the budget)") in said.lower()
    said = finding({**res, "same_latency": [{**item, "gap_prompts": 1.2, "inputs": 60}]})
    assert "a difference of +1.2 of 60 prompts; the adaptive scheduler keeps more" in said
    (same,) = [t for t in AdaptPlugin.tables({**res, "same_latency": [item]}) if "same" in t.title or
               "scheduler's measured" in t.title]
    assert same.rows[0][:5] == [0.7, 0.22, 0.62, 0.2, "adaptive"]


def test_left_padded_batch_generation_under_a_plan(deep):
    tok = deep.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    try:
        enc = tok(TEXTS, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = side
    kwargs = dict(attention_mask=enc["attention_mask"], max_new_tokens=3, do_sample=False, output_scores=True,
                  return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        dense = deep.model.generate(enc["input_ids"], **kwargs)
        with run_plan(deep, ExecutionPlan(tokens=TokenSelection(2, 1.0))):
            kept = deep.model.generate(enc["input_ids"], **kwargs)
        with run_plan(deep, ExecutionPlan(layers=(4,), tokens=TokenSelection(2, 0.5, tail=3))) as run:
            cut = deep.model.generate(enc["input_ids"], **kwargs)
    assert torch.equal(dense.sequences, kept.sequences)
    assert all(torch.equal(a, b) for a, b in zip(dense.scores, kept.scores, strict=True))
    assert cut.sequences.shape == dense.sequences.shape and all(0 < k < 1 for k in run.log[0]["kept"])
    assert all(torch.isfinite(s).all() for s in cut.scores)


def test_the_cost_table_is_fitted_and_validated_on_measured_plans(deep):
    from mechkit.adapt import AdaptStudy

    study = AdaptStudy(deep, ["capitalize", "past-tense"], n_calib=2, n=1, shots=1, repeats=1,
                       token_options=((2, 0.5), (3, 0.3)), signal_layer=1)
    table = study.cost_table()
    report = study.cost_report
    assert report["clock"] in ("cpu", "wall") and len(report["fit"]["rows"]) == 2 * 8
    assert len(report["validation"]["rows"]) == 2 * 4 and report["validation"]["max_abs_error"] is not None
    assert 0 <= table.rho <= 1 and table.under >= 0 and table.fit_error >= table.under
    units = study.orders()["static"]
    # the order holds the units whose bypass the table says saves time: on a tiny model timed on a
    # loaded machine the fit may find no saving at all (then nothing is worth skipping)
    kinds = {k for k, _ in units}
    saving = {"block": table.beta_attn + table.beta_mlp, "attn": table.beta_attn, "mlp": table.beta_mlp}
    assert kinds <= {k for k, v in saving.items() if v > 0} and all(i >= 2 for _, i in units)
    assert ("mlp" in kinds) == (table.beta_mlp > 0)  # MLPs are never protected
    assert table.beta_attn >= 0 and table.beta_mlp >= 0 and table.gamma >= 0 and table.eta >= 0


# --- the budget margin: split-conformal ---------------------------------------------------------------------

def test_the_conformal_quantile_is_exact_clamped_and_checks_q():
    from mechkit.adapt.conformal import calibrate_margin, conformal_quantile, residuals_needed

    scores = np.random.default_rng(0).permutation(np.arange(1.0, 21.0))  # 1..20, shuffled
    assert conformal_quantile(scores, 0.9) == 19.0  # k = ⌈21·0.9⌉ = 19
    assert conformal_quantile(scores, 0.5) == 11.0 and conformal_quantile(scores, 0.95) == 20.0
    assert conformal_quantile(scores, 0.99) == float("inf")  # 20 scores cannot certify 99 %
    assert residuals_needed(0.99) == 99 and conformal_quantile(np.arange(99.0), 0.99) == 98.0
    m = calibrate_margin(-scores, 0.9)  # a table that over-predicts every plan: no negative margin
    assert m.value == 0.0 and m.quantile == -2.0 and (m.n, m.k) == (20, 19)
    assert calibrate_margin(scores, 0.9, predicted=scores / 40).bins[-1]["max"] == 20.0
    for bad in (0, 1, -0.1, 1.5, float("nan"), "x"):
        with pytest.raises(MechkitError, match="adherence"):
            conformal_quantile(scores, bad)
    # what it promises: a new exchangeable residual stays under the bound at least q of the time
    rng = np.random.default_rng(1)
    draws = rng.standard_normal((4000, 100))
    covered = np.mean([row[-1] <= conformal_quantile(row[:-1], 0.9) for row in draws])
    assert 0.88 <= covered <= 0.93


def test_the_scheduler_keeps_the_margin_and_says_when_a_budget_is_infeasible():
    skip2, skip3 = ExecutionPlan(layers=(2, 3)), ExecutionPlan(layers=(2, 3, 4))  # predicted 2/3 and 1/2
    cands = [Candidate(ExecutionPlan(), "static", {"a": 1.0}), Candidate(skip2, "static", {"a": 0.8}),
             Candidate(skip3, "static", {"a": 0.3})]
    assert Scheduler(cands, _table(6), ["a"], margin=0.0).decide(None, 50, 0.7).plan == skip2
    tight = Scheduler(cands, _table(6), ["a"], margin=0.05, adherence=0.99)
    d = tight.decide(None, 50, 0.7)  # 2/3 + 0.05 > 0.7: the better plan is not chosen
    assert d.plan == skip3 and d.fits and "infeasible" not in d.reason
    wide = Scheduler(cands, _table(6), ["a"], margin=0.25)
    d = wide.decide(None, 50, 0.7)  # 1/2 + 0.25 > 0.7: nothing fits — the cheapest runs, and it says so
    assert d.plan == skip3 and not d.fits and "infeasible" in d.reason and not wide.feasible(0.7, 50)
    assert wide.decide(None, 50, 1.0).plan == ExecutionPlan() and wide.feasible(1.0, 50)  # dense at 1: the reference
    assert Scheduler.from_dict(tight.as_dict()).adherence == 0.99 and Scheduler.from_dict(tight.as_dict()).margin == 0.05
    with pytest.raises(MechkitError, match="margin"):
        Scheduler(cands, _table(6), ["a"], margin=-0.1)


def test_adherence_counts_the_dense_plan_at_budget_one_as_met_and_reports_both():
    from mechkit.adapt.measures import adherence
    from mechkit.adapt.scheduler import Decision

    dense = Decision(ExecutionPlan(), None, "static scheduler", 1.0, True)
    cut = Decision(ExecutionPlan(layers=(2,)), None, "static scheduler", 0.9, True)
    over = Decision(ExecutionPlan(layers=(2, 3)), None, "static scheduler; infeasible", 0.8, False)
    a = adherence(1.0, [1.06, 0.99, 1.02], [dense, dense, cut], noise=0.05, margin=0.1)
    assert a["adherence"] == pytest.approx(1 / 3) and a["adherence_dense_met"] == pytest.approx(2 / 3)
    assert a["adherence_with_noise"] == pytest.approx(2 / 3) and a["dense_inputs"] == 2
    assert a["coverage"] == pytest.approx(2 / 3) and a["infeasible_inputs"] == 0
    b = adherence(0.9, [1.01, 0.85], [dense, over], noise=0.0, margin=0.0)  # below 1 dense is measured
    assert b["adherence"] == b["adherence_dense_met"] == 0.5 and b["dense_inputs"] == 0
    assert b["infeasible_inputs"] == 1


def test_the_margin_is_calibrated_on_calibration_prompts_timed_like_heldout_ones(deep):
    from mechkit.adapt import AdaptStudy

    study = AdaptStudy(deep, ["capitalize", "past-tense"], n_calib=2, n=2, shots=1, repeats=1,
                       token_options=((2, 0.5),), signal_layer=1, adherence=0.6, margin_prompts=2, margin_plans=3)
    heldout = {p.text for ps in study.test.values() for p in ps}
    fitted = set(study.timing_texts())
    texts = [x for xs in study.margin_texts.values() for x in xs]
    assert len(texts) == 4 and not set(texts) & (heldout | fitted)
    plans = study.margin_plan_set([0.7, 1.0])
    table = study.cost_table()
    ratios = [table.predict(p, study.typical_tokens) for p in plans]
    assert 1 <= len(plans) <= 3 and ratios == sorted(ratios) and ratios[-1] == pytest.approx(1.0)  # dense: the top
    value = study.margin_value([0.7, 1.0])  # calibrated once, then kept
    report = study.margin_report
    assert report["method"] == "conformal" and report["n"] == 4 * len(plans) and report["value"] == value >= 0
    assert report["forwards"] == 4 * (len(plans) + 1) and study.margin_value([0.5]) == value
    assert len(report["plans"]) == len(plans) and report["k"] == {4: 3, 8: 6, 12: 8}[report["n"]]  # ⌈(n + 1)·0.6⌉
    given = AdaptStudy(deep, ["capitalize"], n_calib=2, n=1, shots=1, repeats=1, token_options=(), margin=0.03)
    assert given.margin_calibration([0.7]) == (None, {"method": "given", "value": 0.03, "q": None})
    few = AdaptStudy(deep, ["capitalize", "past-tense"], n_calib=2, n=1, shots=1, token_options=(), adherence=0.99,
                     margin_prompts=2, margin_plans=10)
    with pytest.raises(MechkitError, match="margin-prompts"):
        few.margin_calibration([0.7])  # 4 prompts × 10 plans cannot certify 99 %, refused before any timing


def test_the_adherence_option_parses_and_refuses_bad_values_in_one_line(tmp_path):
    from click.testing import CliRunner

    from mechkit.cli.main import cli
    from mechkit.options import OptionError
    from mechkit.options.resolve import resolve_options
    from mechkit.plugins.adapt import AdaptPlugin

    params, _ = resolve_options(AdaptPlugin, {"adherence": "0.95", "margin_prompts": "5"})
    assert params["adherence"] == 0.95 and params["margin_prompts"] == 5 and params["margin_plans"] == 10
    for bad in ("0", "1", "1.5", "-0.2", "nan", "x"):
        result = CliRunner().invoke(cli, ["adapt", "--model", "tiny:llama", "--adherence", bad,
                                          "--out", str(tmp_path / "out")])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and "--adherence" in lines[0], (bad, result.stderr)
        assert not (tmp_path / "out").exists()
        with pytest.raises(OptionError, match="--adherence"):
            mk.run(AdaptPlugin, model="tiny:llama", write=False, adherence=bad)
    with pytest.raises(OptionError, match="--margin-prompts"):
        resolve_options(AdaptPlugin, {"margin_prompts": "0"})
    # pruning at a budget the scheduler does not run could not be compared: refused before any work
    result = CliRunner().invoke(cli, ["adapt", "--model", "tiny:llama", "--budgets", "0.7,1.0", "--prune-budgets",
                                      "0.65", "--out", str(tmp_path / "out")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "--prune-budgets 0.65 not among --budgets" in lines[0]
    assert not (tmp_path / "out").exists()
    with pytest.raises(OptionError, match="--prune-budgets 0.65"):  # with the other options: no model loaded
        resolve_options(AdaptPlugin, {"budgets": "0.7,1.0", "prune_budgets": "0.65"})
    assert not resolve_options(AdaptPlugin, {"budgets": "0.7,1.0", "prune_budgets": ""})[1]["prune_budgets"]


def test_a_plan_bias_moves_an_under_predicted_plan_out_of_a_budget_and_round_trips():
    skip2, skip3 = ExecutionPlan(layers=(2, 3)), ExecutionPlan(layers=(2, 3, 4))  # predicted 2/3 and 1/2
    cands = [Candidate(ExecutionPlan(), "static", {"a": 1.0}), Candidate(skip2, "static", {"a": 0.8}),
             Candidate(skip3, "static", {"a": 0.3})]
    assert Scheduler(cands, _table(6), ["a"], margin=0.0).decide(None, 50, 0.7).plan == skip2
    cands[1] = Candidate(skip2, "static", {"a": 0.8}, bias=0.06)  # the table under-predicts it: 2/3 + 0.06 > 0.7
    s = Scheduler(cands, _table(6), ["a"], margin=0.0, adherence=0.99)
    d = s.decide(None, 50, 0.7)
    assert d.plan == skip3 and d.fits and s.predicted(skip2, 50) == pytest.approx(2 / 3 + 0.06)
    assert s.decide(None, 50, 0.75).plan == skip2 and s.decide(None, 50, 0.75).predicted == pytest.approx(2 / 3 + 0.06)
    back = Scheduler.from_dict(json.loads(json.dumps(s.as_dict())))  # scheduler.json keeps the biases
    assert [c.bias for c in back.candidates] == [0.0, 0.06, 0.0] and back.decide(None, 50, 0.7).plan == skip3
    old = s.as_dict()
    for c in old["candidates"]:
        del c["bias"]  # a scheduler.json written before biases: all 0
    assert Scheduler.from_dict(old).decide(None, 50, 0.7).plan == skip2


def test_debiased_residuals_are_pooled_leave_one_out():
    from mechkit.adapt.conformal import calibrate_margin, debiased_residuals, plan_biases

    groups = {"p": [0.10, 0.12, 0.08, 0.11], "q": [-0.05, -0.03, -0.04], "r": [0.4]}
    assert plan_biases(groups) == pytest.approx({"p": 0.105, "q": -0.04})  # r: one residual, no bias
    pooled = debiased_residuals(groups)
    expect = [0.10 - 0.11, 0.12 - 0.10, 0.08 - 0.11, 0.11 - 0.10, -0.05 + 0.035, -0.03 + 0.045, -0.04 + 0.04, 0.4]
    assert pooled == pytest.approx(expect) and len(pooled) == 8  # one score per residual: the count is kept
    m = calibrate_margin(pooled, 0.75)  # k = ⌈9·0.75⌉ = 7th smallest
    assert m.k == 7 and m.value == pytest.approx(sorted(expect)[6])


def _cached(cache: dict):
    """A resumable step backed by ``cache`` (what ``ctx.step`` does across runs)."""
    def step(key, compute):
        if key not in cache:
            cache[key] = compute()
        return cache[key]
    return step


def _clocked_study(handle, **kw):
    """An AdaptStudy on a known cost table whose margin timings are that table's predictions plus a
    small spread, except the first set of *chosen* plans timed, which measure 0.5 above their prediction
    (plans the table badly under-predicts). Timing a tiny model on a shared machine is too noisy to test
    which plan gets chosen."""
    from mechkit.adapt import AdaptStudy
    from mechkit.adapt.cost import prompt_ids

    table = _table(handle.anatomy.n_layers)

    class Clocked(AdaptStudy):
        sets: dict = {}

        def cost_table(self):
            return table

        def _time_margin_input(self, plans, text):
            index = self.sets.setdefault(tuple(p.key() for p in plans), len(self.sets))
            n = int(prompt_ids(self.handle, text).shape[1])
            over = 0.5 if index == 1 else 0.01 * (len(text) % 3)
            return {"n_tokens": n, "spent_s": 0.001,
                    "seconds": {"dense": 1.0, **{f"plan {j}": table.predict(p, n) + over for j, p in enumerate(plans)}}}

    study = Clocked(handle, ["capitalize", "past-tense"], **kw)
    study.sets = {}
    return study


def test_debiasing_times_the_chosen_plans_and_a_second_round_the_newly_chosen(deep):
    kw = dict(n_calib=2, n=1, shots=1, repeats=1, token_options=(), signal_layer=1, adherence=0.6,
              margin_prompts=2, margin_plans=1)
    budgets = [0.8, 0.9, 1.0]
    cache = {}
    study = _clocked_study(deep, step=_cached(cache), **kw)
    sched = study.scheduler(budgets)
    chosen = study.margin_report["chosen_plans"]
    assert chosen["rounds"] == 2 and chosen["forwards"] > 0 and chosen["seconds"] > 0, chosen
    first = [p for p in chosen["plans"] if p["timed_in_round"] == 1]
    second = [p for p in chosen["plans"] if p["timed_in_round"] == 2]
    assert first and second and all(p["bias"] == pytest.approx(0.5) and not p["chosen"] for p in first)
    assert all(p["chosen_in_round"] == 2 and abs(p["bias"]) < 0.05 for p in second) and not chosen["untimed_chosen"]
    assert chosen["margin"]["n"] == 4 * (1 + len(first) + len(second))  # 2 tasks × 2 prompts × every timed plan
    assert sched.margin == chosen["margin"]["value"] < 0.05 and not any(c.bias > 0.1 for c in sched.candidates
                                                                      if c.plan.key() in sched.bias)
    for b in budgets:  # the corrected predictions are what fits
        d = sched.decide(None, study.typical_tokens, b)
        assert d.plan.is_dense or d.predicted + sched.margin <= b or not d.fits
    keys = [k for k in cache if "|margin-chosen|" in k]
    assert len({k.rsplit("|", 1)[1] for k in keys}) == 2 and len(keys) == 2 * 4  # one step per prompt and round

    # --no-debias: the first margin and the table's predictions, the decisions as before
    old = _clocked_study(deep, step=_cached(cache), debias=False, **kw)
    s0 = old.scheduler(budgets)
    assert "chosen_plans" not in old.margin_report and s0.margin == chosen["first_margin"]
    assert all(c.bias == 0 for c in s0.candidates) and not s0.bias
    ref = Scheduler(study.candidates(budgets, chosen["first_margin"]), study.cost_table(), study.tasks,
                    study.signal(), chosen["first_margin"], study.min_cv)
    for b in budgets:
        for n in (study.typical_tokens, 2 * study.typical_tokens):
            assert s0.decide(None, n, b).plan == ref.decide(None, n, b).plan


def _drifting(speed: list[float], cost: float, calls: list[str], name: str):
    """A fake timer: ``cost`` seconds at the machine's current speed, which slows 5 % per forward."""
    def run():
        calls.append(name)
        speed[0] *= 1.05
        return cost * speed[0], ({"name": name, "n": len(calls)} if name != "dense" else None)
    return run


def test_paired_timing_cancels_drift_and_keeps_logs():
    """Each forward is compared with the reference forwards beside it, so a machine slowing steadily
    still gives a plan of half the work a ratio of ~0.5 (medians a round apart would be ~15 % off),
    the reference's seconds are its own median, logs are the last per timer, the warm-up is untimed
    and the garbage collector is back on afterwards."""
    import gc

    from mechkit.adapt.cost import time_paired

    speed, calls = [1.0], []
    timers = [(n, _drifting(speed, c, calls, n)) for n, c in (("dense", 1.0), ("half", 0.5), ("same", 1.0))]
    seconds, logs = time_paired(timers, repeats=3, warmup=True)
    assert calls[:3] == ["dense", "half", "same"] and calls[3:8] == ["dense", "half", "dense", "same", "dense"]
    assert len(calls) == 3 + 3 * 5
    half, same = seconds["half"] / seconds["dense"], seconds["same"] / seconds["dense"]
    assert abs(half - 0.5) < 0.002 and abs(same - 1.0) < 0.002  # drift: 1.05 per call, cancelled to O(0.05²)
    dense_times = [1.05 ** (i + 1) for i, c in enumerate(calls) if c == "dense" and i >= 3]
    assert seconds["dense"] == pytest.approx(sorted(dense_times)[len(dense_times) // 2])
    assert logs["half"]["n"] == len(calls) - 3 and logs["same"]["n"] == len(calls) - 1 and "dense" not in logs
    assert gc.isenabled()


def test_paired_timing_restores_gc_on_error():
    import gc

    from mechkit.adapt.cost import time_paired

    def boom():
        raise RuntimeError("forward failed")

    with pytest.raises(RuntimeError, match="forward failed"):
        time_paired([("dense", lambda: (1.0, None)), ("plan", boom)], repeats=2)
    assert gc.isenabled()


def test_the_reproduce_bench_rebuilds_a_run_from_its_saved_scheduler(tmp_path):
    """``bench/adapt_reproduce.py`` (plain transformers calls and clocks around the saved scheduler)
    runs on a finished `mechkit adapt` output: same held-out prompts, the report's accuracy by greedy
    decoding, and a latency ratio per input under both timing protocols."""
    import subprocess
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from mechkit.cli.main import cli

    run = tmp_path / "run"
    result = CliRunner().invoke(cli, ["adapt", "--model", "tiny:llama", "--tasks", "capitalize,past-tense",
                                      "--budgets", "0.7,1.0", "--calib", "3", "--n", "2", "--shots", "1",
                                      "--token-layers", "0", "--token-keep", "0.5", "--signal-layer", "0",
                                      "--repeats", "1", "--prune-budgets", "", "--margin", "0.05", "--out", str(run)])
    assert result.exit_code == 0, result.output
    script = Path(__file__).resolve().parents[1] / "bench" / "adapt_reproduce.py"
    out = tmp_path / "repro.json"
    done = subprocess.run([sys.executable, str(script), str(run), "--repeats", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    report = json.loads((run / "report.json").read_text())["results"]
    assert summary["prompts"] == sum(report["heldout_prompts"].values())
    assert [b["budget"] for b in summary["budgets"]] == [0.7, 1.0]
    for line, row in zip(summary["budgets"], report["rows"], strict=True):
        assert line["accuracy"] == pytest.approx(row["adaptive"]["mean_accuracy"])
        for proto in ("paired", "rounds"):
            assert line[proto]["median"] > 0 and 0 <= line[proto]["strict"] <= line[proto]["dense_met"] <= 1


def _row(budget: float, adaptive: tuple[float, float], *copies: tuple[float, float]) -> dict:
    """A results row: the adaptive scheduler's (latency, accuracy) and pruned copies' (latency, accuracy)."""
    def pruned(lat: float, acc: float) -> dict:
        return {"latency_ratio": lat, "mean_accuracy": acc, "within": 60, "inputs": 60}
    prune = pruned(*copies[0]) if copies else None
    if len(copies) > 1:
        prune["matched"] = pruned(*copies[1])
    return {"budget": budget, "adaptive": {"latency_ratio": adaptive[0], "mean_accuracy": adaptive[1], "inputs": 60},
            "static": {"latency_ratio": adaptive[0], "mean_accuracy": 0.0}, "prune": prune}


def test_static_pruning_is_compared_at_the_schedulers_measured_latency():
    from mechkit.adapt.findings import same_latency

    def verdict(adaptive, *copies):
        (item,) = same_latency({"rows": [_row(0.7, adaptive, *copies)]})
        return item

    # two copies bracket the scheduler's 0.62: pruning there is read off the segment (halfway: 0.20)
    item = verdict((0.62, 0.22), (0.67, 0.25), (0.57, 0.15))
    assert item["prune"] == pytest.approx(0.20) and item["verdict"] == "adaptive"
    assert item["gap_prompts"] == pytest.approx(1.2)  # 0.02 of 60 prompts: the reader sees how little that is
    assert [c["kind"] for c in item["copies"]] == ["matched", "at budget"]  # fastest first
    assert verdict((0.62, 0.20), (0.67, 0.25), (0.57, 0.15))["verdict"] == "prune"  # as much: pruning's
    # a faster copy that keeps more bounds pruning from below, whatever the segment says
    item = verdict((0.62, 0.22), (0.67, 0.15), (0.57, 0.25))
    assert item["prune"] == pytest.approx(0.25) and item["verdict"] == "prune"
    item = verdict((0.62, 0.22), (0.62, 0.30), (0.57, 0.15))  # a copy exactly at the scheduler's latency
    assert item["prune"] == pytest.approx(0.30) and item["verdict"] == "prune"
    # every copy slower: beaten outright only by keeping more than the fastest of them
    item = verdict((0.62, 0.22), (0.67, 0.20), (0.64, 0.18))
    assert item["prune"] is None and item["verdict"] == "adaptive" and item["gap_prompts"] is None
    assert verdict((0.62, 0.22), (0.67, 0.25), (0.64, 0.24))["verdict"] == "undecided"
    # every copy faster: pruning wins outright by keeping as much with any of them
    assert verdict((0.62, 0.22), (0.60, 0.22))["verdict"] == "prune"
    assert verdict((0.62, 0.22), (0.58, 0.25), (0.60, 0.20))["verdict"] == "prune"
    assert verdict((0.62, 0.22), (0.60, 0.10))["verdict"] == "undecided"
    assert same_latency({"rows": [_row(0.7, (0.62, 0.22))]}) == []  # no pruning run at this budget
    failed = _row(0.7, (0.62, 0.22), (0.60, 0.10))
    failed["prune"] = {"budget": 0.7, "error": "no plan of neurons reaches 0.7 of the dense latency"}
    assert same_latency({"rows": [failed]}) == []
    half = _row(0.7, (0.62, 0.22), (0.67, 0.25), (0.57, 0.15))  # the matched copy failed: the other still counts
    half["prune"]["matched"] = {"budget": 0.7, "error": "no plan of neurons reaches 0.62 of the dense latency"}
    (item,) = same_latency({"rows": [half]})
    assert [c["kind"] for c in item["copies"]] == ["at budget"] and item["verdict"] == "undecided"


def test_pruned_copies_are_timed_on_every_heldout_input_and_matched_to_the_scheduler(deep):
    from mechkit.adapt import AdaptStudy

    study = AdaptStudy(deep, ["capitalize", "past-tense"], n_calib=2, n=2, shots=1, repeats=1, token_options=(),
                       margin=0.03)
    ids = deep.to_tokens(TEXTS[0])
    before = _logits(deep, ids)
    (row,) = study.prune_rows([0.9], targets=("layers",), matched={0.9: 0.8})
    inputs = sum(len(ps) for ps in study.test.values())
    for copy in (row, row["matched"]):
        assert copy["inputs"] == inputs and 0 <= copy["within"] <= inputs
        assert copy["adherence"] == copy["within"] / inputs and copy["adherence_lower95"] <= copy["adherence"]
        assert 0 < copy["latency_ratio"] <= copy["latency_ratio_max"] and copy["budget"] == 0.9
        assert copy["reconstruct"].startswith("lsq")  # as `mechkit prune` by default
    # the matched copy is searched within the scheduler's latency (adherence still counts against the budget)
    assert row["matched"]["target"] == 0.8 and row["matched"]["search_budget"] == 0.8
    for copy, aim in ((row, 0.9), (row["matched"], 0.8)):  # each search says truly whether its row met its aim
        assert copy["search_met"] == (copy["search_latency_ratio"] <= aim)
    # (that the faster aim prunes as much or more is likely, not guaranteed: both searches time a 6-layer tiny
    # model on a shared machine, and noise once put the matched copy at 0.225 of the layers, the other at 0.239)
    assert torch.equal(before, _logits(deep, ids))  # the copies leave the model as it was
    (mean,) = study.prune_rows([0.9], targets=("layers",), reconstruct="mean")
    assert mean["reconstruct"] == "mean" and "matched" not in mean
