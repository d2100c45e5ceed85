"""The composition study: its prompt sets, its arithmetic, the component effects, strengthening,
the logical tasks, intermediate steps, and the plugin end to end (tiny models only)."""

from __future__ import annotations

import random
import re
from collections import Counter

import numpy as np
import pytest
import torch

import mechkit as mk
from mechkit import compose
from mechkit.actvec import score_edited
from mechkit.compose import stepwise as steps_module
from mechkit.errors import MechkitError, UnknownTaskError
from mechkit.heads import Head, attribution_effects
from mechkit.plugins.compose import ComposePlugin
from mechkit.tasks import get_task
from mechkit.tasks.logic import LOGIC_TASKS
from mechkit.tasks.words import VERB_PAST

DEMO = re.compile(r"input: ([^\n]*)\noutput: ([^\n]*)\n")
# Each component's marked form, read independently of mechkit: which demonstrations belong to it.
MARKED = {
    "capitalize+swap": (r"\* [a-z]+", r"\([a-z]+ [a-z]+\)"),
    "capitalize+plus-one": (r"[a-z]+", r"\d+"),
    "modular+two-sum-plus-one": (r"\d+ @ \d+", r"\d+ # \d+"),
    "negation+conjunction": (r"not \((?:true|false)(?: true| false)*\)", r"(?:true|false)(?: and (?:true|false))+"),
}


def demos(text: str) -> list[tuple[str, str]]:
    return DEMO.findall(text)


# ---- Definition 4.4.1's prompt sets ---------------------------------------------------------------------
@pytest.mark.parametrize("pair", sorted(MARKED))
@pytest.mark.parametrize("shots", [0, 1, 4, 5])
def test_definition_sets_are_the_composite_prompt_split_by_task(pair, shots):
    sets = compose.definition_prompts(pair, n=6, shots=shots, seed=2)
    union = sets["union"]
    assert union == mk.build_prompts(pair, n=6, shots=shots, seed=2, setting="composite")
    k, g = get_task(pair).components
    for i, u in enumerate(union):
        sk, sg = sets[k][i], sets[g][i]
        assert sk.query == sg.query == u.query and sk.answer == sg.answer == u.answer
        assert (sk.setting, sg.setting) == (f"only:{k}", f"only:{g}")
        for p in (sk, sg):
            assert p.text.endswith(f"input: {u.query}\noutput:")
        dk, dg, du = demos(sk.text), demos(sg.text), demos(u.text)
        assert all(re.fullmatch(MARKED[pair][0], x) for x, _ in dk), dk
        assert all(re.fullmatch(MARKED[pair][1], x) for x, _ in dg), dg
        assert Counter(dk + dg) == Counter(du) and len(du) == shots
        assert sorted((len(dk), len(dg))) == [shots // 2, shots - shots // 2]
        assert [d for d in du if d in dk] == dk and [d for d in du if d in dg] == dg  # order kept
        if shots == 0:
            assert sk.text == sg.text == u.text


def test_study_settings_share_queries_and_match_the_task_builder():
    sets = compose.study_prompts("capitalize+swap", n=4, shots=3, seed=1)
    assert sorted(sets) == ["composite", "composite-in-context", "only:capitalize", "only:swap",
                            "simple:capitalize", "simple:swap"]
    cic = mk.build_prompts("capitalize+swap", n=4, shots=3, seed=1, setting="composite-in-context")
    assert sets["composite-in-context"] == cic
    assert [p.query for p in sets["composite"]] == [p.query for p in cic]
    simple = mk.build_prompts("capitalize+swap", n=4, shots=3, seed=1, setting="simple")
    assert sets["simple:capitalize"] + sets["simple:swap"] == simple
    assert all(p.task == "capitalize" for p in sets["simple:capitalize"])


def test_pairs_and_bad_ids():
    assert compose.parse_pairs("swap+capitalize , capitalize+swap") == ["capitalize+swap"]
    assert compose.parse_pairs("disjunction+conjunction,conjunction+negation") == [
        "conjunction+disjunction", "negation+conjunction"]
    assert len(compose.parse_pairs("all")) == 10
    for bad in ("capitalize", "", "capitalize+opposite", "negation+swap"):
        with pytest.raises(MechkitError):
            compose.parse_pairs(bad)


@pytest.mark.parametrize("pair", sorted(LOGIC_TASKS) + ["capitalize+swap", "modular+two-sum-plus-one"])
def test_composite_ids_resolve_in_either_order(pair):
    task = get_task(pair)
    assert get_task("+".join(reversed(pair.split("+")))) is task
    assert get_task(f" {pair.upper().replace('+', ' + ')} ") is task


@pytest.mark.parametrize("bad, needle", [
    ("negation+swap", "not supported"),  # a logical and a suite task: no such composite
    ("negation+negation", "not supported"),
    ("negation+conjunction+disjunction", "not supported"),
    ("conjunction+nope", "'nope' is not a simple task"),
])
def test_unsupported_logic_composites_name_the_supported_ids(bad, needle):
    with pytest.raises(UnknownTaskError) as err:
        get_task(bad)
    message = str(err.value)
    assert needle in message and "\n" not in message
    if needle == "not supported":
        assert all(t in message for t in mk.list_tasks("composite") + mk.list_tasks("logic-composite"))
    else:
        assert all(t in message for t in mk.list_tasks("logic"))


def test_parts_parse_to_the_canonical_order():
    assert compose.parse_parts(" strengthen,study ,steps") == ("study", "steps", "strengthen")
    for bad, needle in [("nope", "unknown part 'nope'"), ("", "no part given"), (",", "no part given"),
                        ("study,everything", "unknown part 'everything'")]:
        with pytest.raises(MechkitError, match=needle):
            compose.parse_parts(bad)


# ---- the study's arithmetic -----------------------------------------------------------------------------
def test_ability_test_and_gap_from_known_accuracies():
    assert compose.ability_test(0.3, 0.5, 0.5)["holds"]  # equality passes: "≤"
    failed = compose.ability_test(0.6, 0.2, 0.5)
    assert not failed["holds"] and failed["max_single"] == 0.6 and failed["margin"] == pytest.approx(-0.1)
    assert compose.compositional_gap(composite=0.2, in_context=0.9) == pytest.approx(0.7)
    def m(acc, lp=-1.0):
        return {"accuracy": acc, "logprob": lp}

    cells = [{"model": "m", "pair": "capitalize+plus-one", "shots": 4, "seed": s,
              "metrics": {"composite": m(comp, -1.0), "composite-in-context": m(cic, -0.5),
                          "only:capitalize": m(sk, -2.0), "only:plus-one": m(sg, -1.5)}}
             for s, (comp, cic, sk, sg) in enumerate([(0.5, 1.0, 0.25, 0.75), (0.75, 0.5, 0.5, 0.25)])]
    row = compose.summarize(cells)["m"]["capitalize+plus-one"]["4"]
    assert row["settings"]["composite"]["mean"] == pytest.approx(0.625)
    assert row["settings"]["composite"]["std"] == pytest.approx(0.125)
    assert row["gap"] == pytest.approx(0.75 - 0.625)
    # On the means: max(0.375, 0.5) = 0.5 <= 0.625; per seed: 0.75 > 0.5 fails, 0.5 <= 0.75 holds.
    assert row["ability"]["holds"] and row["ability"]["margin"] == pytest.approx(0.125)
    assert (row["ability"]["seeds_holding"], row["ability"]["seeds"]) == (1, 2) and not row["ability"]["floor"]
    assert row["ability_logprob"]["holds"] and row["ability_logprob"]["margin"] == pytest.approx(0.5)
    assert row["gap_logprob"] == pytest.approx(0.5)
    zero = [{**c, "metrics": {k: m(0.0) for k in c["metrics"]}} for c in cells]
    assert compose.summarize(zero)["m"]["capitalize+plus-one"]["4"]["ability"]["floor"]


def test_word_level_accuracy_is_the_seeds_partial_credit(tiny_llama, monkeypatch):
    assert compose.word_accuracy(" 674", [" 674 visited"]) == 0.5  # one part of a by-parts answer
    assert compose.word_accuracy(" FORD BELL", [" BELL FORD"]) == 0.0  # positions count
    assert compose.word_accuracy(" 4 x", [" 11", " 4"]) == 1.0  # the best accepted answer
    assert compose.word_accuracy("", [" APPLE"]) == 0.0
    import mechkit.compose.study as study

    monkeypatch.setattr(study, "greedy_line", lambda handle, text, budget: " 674")
    cell = compose.evaluate_cell(tiny_llama, "past-tense+plus-one", shots=1, seed=0, n=2, words=True)
    assert all(0.0 <= row["words"] <= 1.0 for row in cell.values())


def test_identical_prompts_are_scored_once_and_agree(tiny_llama):
    cell = compose.evaluate_cell(tiny_llama, "capitalize+swap", shots=0, seed=0, n=3)
    zero = cell["composite"]
    assert cell["composite-in-context"] == cell["only:capitalize"] == cell["only:swap"] == zero
    direct = mk.score_prompts(tiny_llama, mk.build_prompts("capitalize+swap", n=3, shots=0, setting="composite"))
    assert zero["accuracy"] == direct.accuracy and zero["logprob"] == pytest.approx(direct.logprob)


# ---- component effects ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def swap_prompts():
    return mk.build_prompts("swap", n=3, shots=2, seed=0)


def test_exact_head_effect_equals_a_direct_ablation(tiny_llama, swap_prompts):
    eff = compose.component_effects(tiny_llama, swap_prompts, method="exact", mlp_mode="zero")
    clean = mk.score_prompts(tiny_llama, swap_prompts).logprob
    assert eff.clean_logprob == pytest.approx(clean, abs=1e-5)
    with mk.ablate(tiny_llama, [Head(1, 2)]):
        ablated = mk.score_prompts(tiny_llama, swap_prompts).logprob
    assert eff.heads[1, 2] == pytest.approx(ablated - clean, abs=1e-5)
    assert compose.exact_head_effects(tiny_llama, swap_prompts, [Head(1, 2)])[0] == pytest.approx(eff.heads[1, 2], abs=1e-6)
    with mk.hooks(tiny_llama, {"blocks.0.hook_mlp_out": lambda x, _p: torch.zeros_like(x)}):
        no_mlp = mk.score_prompts(tiny_llama, swap_prompts).logprob
    assert eff.mlps[0] == pytest.approx(no_mlp - clean, abs=1e-5)


def test_exact_mean_ablation_of_an_mlp_block(tiny_llama, swap_prompts):
    eff = compose.component_effects(tiny_llama, swap_prompts, method="exact", mlp_mode="mean")
    means = compose.mlp_means(tiny_llama, swap_prompts)
    with mk.hooks(tiny_llama, {"blocks.1.hook_mlp_out": lambda x, _p: means[1].to(x).expand_as(x).clone()}):
        ablated = mk.score_prompts(tiny_llama, swap_prompts).logprob
    assert eff.mlps[1] == pytest.approx(ablated - mk.score_prompts(tiny_llama, swap_prompts).logprob, abs=1e-5)


def test_attribution_heads_are_mechkit_heads_attribution(tiny_llama, swap_prompts):
    mine = compose.component_effects(tiny_llama, swap_prompts, method="attribution", mlp_mode="zero")
    theirs = attribution_effects(tiny_llama, swap_prompts)
    np.testing.assert_allclose(mine.heads, theirs.logprob, atol=1e-6)
    mean_mode = compose.component_effects(tiny_llama, swap_prompts, method="attribution", mlp_mode="mean")
    np.testing.assert_allclose(mean_mode.heads, mine.heads)
    assert not np.allclose(mean_mode.mlps, mine.mlps)


def test_mean_ablation_attribution_is_the_per_position_formula(tiny_llama, swap_prompts):
    """The single-pass form ā·Σg − Σa·g equals Σ over positions of (ā − a)·∂metric/∂a."""
    from mechkit.eval import batches, forward_kept, row_metrics

    means = compose.mlp_means(tiny_llama, swap_prompts)
    (batch,) = batches(tiny_llama, swap_prompts, 16)
    kept = {}

    def keep(x, point):
        kept[point.layer] = x
        return x

    with mk.enable_grad(), mk.hooks(tiny_llama, {"blocks.*.hook_mlp_out": keep}):
        lp, _ = row_metrics(forward_kept(tiny_llama, batch), batch)
        grads = torch.autograd.grad(lp.sum(), [kept[0], kept[1]])
    valid = batch.mask[:, :, None].float()
    naive = [float(((means[L] - kept[L].detach()) * g * valid).sum()) / len(swap_prompts)
             for L, g in enumerate(grads)]
    eff = compose.component_effects(tiny_llama, swap_prompts, method="attribution", mlp_mode="mean")
    np.testing.assert_allclose(eff.mlps, naive, rtol=1e-4, atol=1e-6)


def test_composite_specific_effect_and_ranks():
    comp = np.array([[-0.5, -0.1], [0.0, -0.3]])
    k = np.array([[-0.1, -0.3], [0.0, 0.0]])
    g = np.array([[0.0, -0.2], [-0.1, -0.1]])
    # importance = -effect; CS = I_composite - max(I_k, I_g)
    np.testing.assert_allclose(compose.composite_specific(comp, [k, g]), [[0.4, -0.2], [-0.1, 0.2]])
    np.testing.assert_allclose(compose.composite_specific(comp, [k, g], "mean"), [[0.45, -0.15], [-0.05, 0.25]])
    cs = compose.composite_specific(comp, [k, g])
    assert compose.ranks_of(cs, [Head(0, 0), Head(1, 1), Head(0, 1)]) == [1, 2, 4]


# ---- strengthening --------------------------------------------------------------------------------------
def test_scaling_by_one_changes_nothing(tiny_llama, swap_prompts):
    clean = mk.score_prompts(tiny_llama, swap_prompts)
    heads = [Head(0, 1), Head(1, 3)]
    with compose.scale_heads(tiny_llama, heads, 1.0):
        same = mk.score_prompts(tiny_llama, swap_prompts)
    assert same.logprobs == clean.logprobs and same.correct == clean.correct
    with compose.scale_heads(tiny_llama, heads, 3.0):
        assert mk.score_prompts(tiny_llama, swap_prompts).logprobs != clean.logprobs
    zero_vector = compose.head_vector_edits(tiny_llama, torch.zeros(2, 4, 16), heads, 2.0)
    plain, edited = score_edited(tiny_llama, swap_prompts, [None, zero_vector])
    assert [e.layer for e in zero_vector] == [0, 1] and edited.logprobs == plain.logprobs


def test_random_draws_are_disjoint_from_the_selected_heads():
    selected = [Head(0, 0), Head(1, 1), Head(1, 2)]
    draws = compose.random_draws(2, 4, k=3, draws=4, seed=7, exclude=selected)
    assert len(draws) == 4 and all(len(d) == 3 and not set(d) & set(selected) for d in draws)
    assert compose.random_draws(2, 4, k=3, draws=4, seed=7, exclude=selected) == draws  # seeded
    assert compose.choose_strength({2.0: (0.5, -1.0), 4.0: (0.5, -0.5), 8.0: (0.25, 0.0)}) == 4.0


# ---- logical tasks --------------------------------------------------------------------------------------
def _py(expr: str) -> bool:
    """Evaluate a boolean expression with Python itself (true/false -> True/False)."""
    return eval(expr.replace("true", "True").replace("false", "False"), {"__builtins__": {}})  # noqa: S307


def _independent_answer(task_id: str, text: str) -> str:
    word = {True: "true", False: "false"}
    if task_id == "negation":
        inner = re.fullmatch(r"not \(([a-z ]+)\)", text).group(1)
        return " ".join(word[_py(f"not {v}")] for v in inner.split())
    if task_id == "conjunction+disjunction":
        left, right = text.split(" , ")
        assert " or " not in left and " and " not in right
        return f"{word[_py(left)]} {word[_py(right)]}"
    if task_id == "conjunction":
        assert " or " not in text
    if task_id == "disjunction":
        assert " and " not in text
    return word[_py(text)]


@pytest.mark.parametrize("task_id", sorted(LOGIC_TASKS))
def test_logic_answers_are_correct_by_construction(task_id):
    task, rng = get_task(task_id), random.Random(3)
    answers = Counter()
    for _ in range(400):
        ex = task.sample(rng)
        assert ex.output == _independent_answer(task_id, ex.input), ex
        answers[ex.output] += 1
    if task_id not in ("negation", "conjunction+disjunction"):
        assert set(answers) == {"true", "false"} and 150 < answers["true"] < 250  # balanced
    for setting in task.settings:  # and through the prompt builder, in every setting
        for p in mk.build_prompts(task_id, n=5, shots=3, seed=1, setting=setting):
            assert p.target == _independent_answer(p.task if setting == "simple" else task_id, p.query)
            for x, y in demos(p.text):
                if setting != "composite":
                    assert y == _independent_answer(p.task if setting == "simple" else task_id, x)


def test_logic_tasks_are_registered():
    assert mk.list_tasks("logic") == ["negation", "conjunction", "disjunction"]
    assert mk.list_tasks("logic-composite") == ["negation+conjunction", "negation+disjunction",
                                                "conjunction+disjunction"]
    assert [get_task(t).how for t in mk.list_tasks("logic-composite")] == ["steps", "steps", "parts"]


# ---- intermediate steps ---------------------------------------------------------------------------------
def test_intermediate_step_answers():
    past = dict(VERB_PAST)
    assert compose.chains("capitalize+swap", "(* bell * ford)") == [("BELL FORD", "FORD BELL")]
    assert compose.chains("swap+capitalize", "(* bell * ford)") == [("BELL FORD", "FORD BELL")]
    verb_a, verb_b = list(past)[:2]
    assert compose.chains("swap+past-tense", f"* {verb_a} {verb_b} #") == [
        (f"{past[verb_a]} {past[verb_b]}", f"{past[verb_b]} {past[verb_a]}")]
    assert compose.chains("capitalize+two-sum", "* (thirty-seven @ sixteen)") == [("fifty-three", "FIFTY-THREE")]
    assert compose.chains("capitalize+plus-one", "684 cat") == [("684 CAT", "685 CAT")]
    # 8 # 9 @ 7: left to right (8+9+1) % 7 = 4, right to left 8 + (9 % 7) + 1 = 11 (the seeds' Table 9.1)
    assert compose.chains("modular+two-sum-plus-one", "8 # 9 @ 7") == [("18", "4"), ("2", "11")]
    assert compose.chains("modular+two-sum-plus-one", "15 @ 6 # 2") == [("3", "6"), ("9", "6")]
    assert compose.chains("negation+disjunction", "not (false or false)") == [("false", "true")]
    assert compose.chains("conjunction+disjunction", "true and true , false or false") == [
        ("true , false or false", "true false")]
    for pair in compose.STEPS:
        for p, cic in zip(compose.steps_prompts(pair, n=6, shots=3, seed=5),
                          mk.build_prompts(pair, n=6, shots=3, seed=5, setting="composite-in-context"), strict=True):
            assert p.query == cic.query and p.setting == "composite-steps"
            assert {compose.split_chain(a)[1] for a in p.accepted} == {a.strip() for a in cic.accepted}
            assert [x for x, _ in demos(p.text)] == [x for x, _ in demos(cic.text)]  # same demonstrations
            for (_, with_steps), (_, plain) in zip(demos(p.text), demos(cic.text), strict=True):
                assert compose.split_chain(with_steps)[1] == plain


def test_steps_accuracy_counts_the_final_part(tiny_llama, monkeypatch):
    prompts = compose.steps_prompts("capitalize+swap", n=3, shots=1, seed=0)
    final = prompts[1].answer.split(" -> ")[1]
    lines = iter([prompts[0].answer.strip(), f"SOMETHING ELSE -> {final}", "no arrow at all"])
    monkeypatch.setattr(steps_module, "greedy_line", lambda *_a, **_k: next(lines))
    score = compose.score_steps(tiny_llama, prompts)
    assert score.correct == [True, True, False] and score.accuracy == pytest.approx(2 / 3)
    assert score.chain == pytest.approx(1 / 3) and score.intermediate == pytest.approx(1 / 3)
    assert score.written[2] == "no arrow at all"
    assert compose.split_chain(" 18 -> 4") == ("18", "4") and compose.split_chain("4") == (None, "4")
    # Where the seeds accept two orders, either chain counts.
    gh = compose.steps_prompts("modular+two-sum-plus-one", n=8, shots=1, seed=0)
    two = next(p for p in gh if len(p.accepted) == 2)
    lines = iter([two.accepted[1].strip()])
    assert compose.score_steps(tiny_llama, [two]).as_dict() == {"accuracy": 1.0, "chain": 1.0, "intermediate": 1.0,
                                                                 "n": 1}


def test_greedy_line_is_what_generate_writes(tiny_llama):
    p = compose.steps_prompts("capitalize+plus-one", n=1, shots=2, seed=0)[0]
    ids = tiny_llama.to_tokens(p.text)
    gen = tiny_llama.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                    pad_token_id=0)
    expected = tiny_llama.tokenizer.decode(gen[0, ids.shape[1]:]).split("\n")[0]
    assert steps_module.greedy_line(tiny_llama, p.text, 6) == expected


# ---- the plugin -----------------------------------------------------------------------------------------
SMALL = dict(n=2, seeds=2, shots="0,2", n_effect=2, n_dev=2, n_test=2, n_contexts=2, n_seqs=4, seg_len=5, top_k=2,
             verify=2, draws=2)


def test_plugin_end_to_end(tmp_path):
    run = mk.run(ComposePlugin, model="tiny:llama", out=tmp_path / "c", pairs="capitalize+swap,conjunction+disjunction",
                 treatment="both", models="tiny:gpt2", word_match=True, **SMALL)
    res = run.results
    assert run.report["checks"]["logits_unchanged"] and (run.out_dir / "report.json").exists()
    assert set(res["study"]["summary"]) == {"tiny:llama", "tiny:gpt2"}
    row = res["study"]["summary"]["tiny:llama"]["capitalize+swap"]["2"]
    assert {"composite", "composite-in-context", "only:swap", "simple:capitalize", "composite-steps"} <= set(row["settings"])
    assert "composite-steps" not in res["study"]["summary"]["tiny:llama"]["capitalize+swap"]["0"]["settings"]
    assert "words" in row["settings"]["composite"] and "ability_words" in row and "gap_words" in row
    assert {r["setting"] for r in res["table_4_4"]} >= {"Compose", "Com. in-context", "capitalize", "swap"}
    comp = res["components"]["pairs"]["capitalize+swap"]
    assert np.asarray(comp["composite_specific_heads"]).shape == (2, 4) and len(comp["composite_specific_mlps"]) == 2
    assert len(comp["verified"]) == 2 and set(comp["reference_heads"]) == {"induction", "previous-token"}
    for pair, st in res["strengthen"].items():
        selected = set(st["selected"])
        assert len(st["draws"]) == 2 and all(not selected & set(d) for d in st["draws"])
        assert {"scale", "vector"} <= set(st) and st["scale"]["selected"]["strength"] in (1.25, 1.5, 2.0), pair
    names = {p.name for p in run.out_dir.iterdir()}
    assert {"report.html", "accuracy_vs_shots_capitalize_swap.png", "accuracy_vs_model_capitalize_swap.png",
            "composite_specific_heads_capitalize_swap.png", "strengthen_conjunction_disjunction.png"} <= names


@pytest.mark.parametrize("options, needle", [
    ({"shots": "two"}, "--shots"),
    ({"shots": "-1,2"}, "--shots"),
    ({"parts": "study,everything"}, "--parts"),
    ({"pairs": "capitalize"}, "not a composite"),
    ({"pairs": "capitalize+opposite"}, "not supported"),
    ({"n": 0}, "--n"),
    ({"top_k": 0}, "--top-k"),
    ({"top_k": 5}, "too few other heads"),
    ({"strengths": "0,2"}, "--strengths"),
    ({"effect_shots": -2}, "--effect-shots"),
    ({"pairs": "bogus+x"}, "--pairs"),
    ({"shots": "-1"}, "--shots"),
    ({"strengths": "0"}, "--strengths"),
    ({"strengths": "inf"}, "--strengths"),
    ({"parts": "nope"}, "--parts"),
    ({"seg_len": 1}, "--seg-len"),
    ({"verify": -1}, "--verify"),
    ({"models": "no-such-model-dir"}, "no-such-model-dir"),
])
def test_bad_options_fail_with_one_line_before_work(tmp_path, monkeypatch, options, needle):
    def no_work(*_a, **_k):
        raise AssertionError("work started")

    import mechkit.compose.analysis as core

    for name in ("evaluate_cell", "component_effects", "compute_scores"):
        monkeypatch.setattr(core, name, no_work)
    with pytest.raises(MechkitError) as err:
        mk.run(ComposePlugin, model="tiny:llama", out=tmp_path / "bad", **{**SMALL, "treatment": "both", **options})
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "bad").exists()


def test_the_study_counts_its_units_and_resumes_from_its_steps(tiny_llama):
    """Every unit announced is counted by ``units`` (the progress bar's total), and a rerun over the
    stored steps computes nothing again and gives the same results."""
    stored, calls = {}, []

    def step(key, compute):
        if key not in stored:
            stored[key] = compute()
        return stored[key]

    def study(on_unit):
        return compose.ComposeStudy(tiny_llama, ["capitalize+swap"], shots=[0, 2], n=2, seeds=2, n_effect=2,
                                    top_k=2, verify=1, n_seqs=4, seg_len=5, draws=1, n_dev=2, n_test=2,
                                    n_contexts=2, step=step, on_unit=on_unit)

    first = study(calls.append)
    out = first.run(compose.PARTS, {"tiny": tiny_llama}, ["scale", "vector"])
    assert len(calls) == first.units(compose.PARTS, 1, ["scale", "vector"]) and len(stored) == len(calls)
    assert first.units(["steps"]) == 2 and first.units(["components"]) == 1 + 4
    again = study(lambda _d: None)
    again.step = lambda key, compute: stored[key]  # a KeyError if anything were computed again
    assert again.run(compose.PARTS, {"tiny": tiny_llama}, ["scale", "vector"]) == out
    with pytest.raises(MechkitError, match="too few other heads"):
        compose.ComposeStudy(tiny_llama, ["capitalize+swap"], top_k=5)


def test_the_plugin_parts_are_the_studys_parts():
    from mechkit.compose import PARTS
    from mechkit.plugins import compose

    assert compose.PARTS == PARTS
