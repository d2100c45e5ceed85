"""The seeds' compositional study: accuracy per setting, the ability test and the compositional gap.

One *cell* is (model, composite, K shots, prompt seed): every setting of
:func:`mechkit.compose.settings.study_prompts` scored on the same queries, plus the intermediate-step
setting where asked. Identical prompts are scored once (at K = 0 the composite, in-context and
Definition prompts are all the zero-shot composite prompt), in one pooled, length-sorted pass.

Across seeds, :func:`summarize` gives each setting's mean ± std and, on the means:

- the **compositional-ability test** (Definition 4.4.1): ``max(Acc(S_k), Acc(S_g)) ≤ Acc(S_k ∪ S_g)``
  with ``margin = Acc(S_k ∪ S_g) − max(…)`` (:func:`ability_test`), and how many seeds pass it;
- the **compositional gap**: ``Acc(composite-in-context) − Acc(composite)``, what demonstrations of
  the composite itself add over demonstrations of its parts (:func:`compositional_gap`).

>>> ability_test(0.25, 0.5, 0.75)
{'max_single': 0.5, 'union': 0.75, 'margin': 0.25, 'holds': True}
>>> compositional_gap(composite=0.25, in_context=0.75)
0.5
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mechkit.compose.settings import composite_task, only, study_prompts
from mechkit.compose.stepwise import SETTING as STEPS_SETTING
from mechkit.compose.stepwise import answer_budget, greedy_line, score_steps, steps_prompts
from mechkit.eval import mean_std, score_prompts

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

__all__ = ["STEPS_SETTING", "ability_test", "compositional_gap", "evaluate_cell", "summarize", "word_accuracy"]


def ability_test(acc_k: float, acc_g: float, acc_union: float) -> dict:
    """Definition 4.4.1 on known accuracies: holds when ``max(acc_k, acc_g) <= acc_union``.

    It also holds when all three are 0 — a model that never answers the composite passes it
    trivially; :func:`summarize` flags that case (``floor``) and adds the same test on answer
    log-probs, which stays informative there.
    """
    best = max(acc_k, acc_g)
    return {"max_single": best, "union": acc_union, "margin": acc_union - best, "holds": acc_union >= best}


def compositional_gap(composite: float, in_context: float) -> float:
    """``in_context − composite``: positive when the model composes worse from the parts than it
    solves the composite from its own demonstrations."""
    return in_context - composite


def word_accuracy(written: str, accepted: Sequence[str]) -> float:
    """The seeds' word-level exact match (§9.1.2: "the number of matched words divided by the length
    of ground truth"): words compared position by position, the best accepted answer.

    >>> word_accuracy(" 674", [" 674 visited"]), word_accuracy("FORD BELL", ["BELL FORD"])
    (0.5, 0.0)
    """
    got = written.split()
    best = 0.0
    for answer in accepted:
        truth = answer.split()
        best = max(best, sum(a == b for a, b in zip(got, truth, strict=False)) / max(len(truth), 1))
    return best


def evaluate_cell(handle: ModelHandle, task_id: str, shots: int, seed: int, n: int, steps: bool = False,
                  batch_size: int = 16, words: bool = False) -> dict[str, dict]:
    """Scores of every setting of one (composite, K, seed) cell: ``{setting: {"accuracy", "logprob", "n"}}``.

    With ``steps`` (and K > 0) also ``composite-steps``, whose accuracy counts the final part. With
    ``words`` every setting also gets ``words``, the seeds' word-level accuracy
    (:func:`word_accuracy`) of what greedy decoding writes — partial credit that shows, for
    example, a composite answered with one part only; prompts scored correct need no decoding.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> cell = evaluate_cell(m, "capitalize+swap", shots=2, seed=0, n=2)
    >>> sorted(cell)[:3], cell["composite"]["n"]
    (['composite', 'composite-in-context', 'only:capitalize'], 2)
    """
    sets = study_prompts(task_id, n, shots, seed)
    pool: dict[tuple, int] = {}
    for prompts in sets.values():
        for p in prompts:
            pool.setdefault((p.text, p.accepted, p.terminator), len(pool))
    unique = [None] * len(pool)
    for prompts in sets.values():
        for p in prompts:
            unique[pool[(p.text, p.accepted, p.terminator)]] = p
    score = score_prompts(handle, unique, batch_size=batch_size)
    partial = None
    if words:
        partial = [1.0 if ok else word_accuracy(greedy_line(handle, p.text, answer_budget(handle, p)), p.accepted)
                   for p, ok in zip(unique, score.correct, strict=True)]
    out = {}
    for name, prompts in sets.items():
        idx = [pool[(p.text, p.accepted, p.terminator)] for p in prompts]
        out[name] = {"accuracy": sum(score.correct[i] for i in idx) / len(idx),
                     "logprob": sum(score.logprobs[i] for i in idx) / len(idx), "n": len(idx)}
        if partial is not None:
            out[name]["words"] = sum(partial[i] for i in idx) / len(idx)
    if steps and shots > 0:
        out[STEPS_SETTING] = score_steps(handle, steps_prompts(task_id, n, shots, seed)).as_dict()
    return out


def summarize(cells: Sequence[dict]) -> dict:
    """Aggregate cells ``{"model", "pair", "shots", "seed", "metrics"}`` over seeds.

    Returns ``{model: {pair: {shots: {"settings": {name: {"mean", "std", "per_seed", "logprob", …}},
    "ability": …, "ability_logprob": …, "gap": …, "gap_logprob": …}}}}`` (shots as strings, for
    JSON): accuracy means and stds over seeds, mean answer log-probs, the steps setting's ``chain``
    and ``intermediate`` means and, where measured, the word-level accuracy ``words`` (then also
    ``ability_words`` and ``gap_words``: the test and the gap in the seeds' own metric).

    >>> def m(acc):
    ...     return {"accuracy": acc, "logprob": -1.0}
    >>> cells = [{"model": "m", "pair": "capitalize+swap", "shots": 2, "seed": s,
    ...           "metrics": {"composite": m(a), "composite-in-context": m(0.5),
    ...                       "only:capitalize": m(0.0), "only:swap": m(0.1)}}
    ...          for s, a in enumerate([0.2, 0.4])]
    >>> row = summarize(cells)["m"]["capitalize+swap"]["2"]
    >>> round(row["settings"]["composite"]["mean"], 3), round(row["gap"], 3), row["ability"]["holds"]
    (0.3, 0.2, True)
    """
    grouped: dict = {}
    for c in cells:
        grouped.setdefault(c["model"], {}).setdefault(c["pair"], {}).setdefault(int(c["shots"]), []).append(c)
    out: dict = {}
    for model, pairs in grouped.items():
        for pair, by_shots in pairs.items():
            k, g = composite_task(pair).components
            for shots, group in sorted(by_shots.items()):
                settings = {}
                for name in group[0]["metrics"]:
                    per_seed = [c["metrics"][name]["accuracy"] for c in group]
                    mean, std = mean_std(per_seed)
                    row = {"mean": mean, "std": std, "per_seed": per_seed}
                    for extra in ("chain", "intermediate", "logprob", "words"):
                        if extra in group[0]["metrics"][name]:
                            row[extra] = mean_std([c["metrics"][name][extra] for c in group])[0]
                    settings[name] = row
                acc = {name: row["mean"] for name, row in settings.items()}
                ability = ability_test(acc[only(k)], acc[only(g)], acc["composite"])
                ability["seeds_holding"] = sum(
                    ability_test(c["metrics"][only(k)]["accuracy"], c["metrics"][only(g)]["accuracy"],
                                 c["metrics"]["composite"]["accuracy"])["holds"] for c in group)
                ability["seeds"] = len(group)
                ability["floor"] = ability["union"] == ability["max_single"] == 0
                lp = {name: row["logprob"] for name, row in settings.items() if "logprob" in row}
                out.setdefault(model, {}).setdefault(pair, {})[str(shots)] = {
                    "settings": settings, "ability": ability,
                    "ability_logprob": ability_test(lp[only(k)], lp[only(g)], lp["composite"]),
                    "gap": compositional_gap(acc["composite"], acc["composite-in-context"]),
                    "gap_logprob": lp["composite-in-context"] - lp["composite"]}
                words = {name: row["words"] for name, row in settings.items() if "words" in row}
                if {only(k), only(g), "composite", "composite-in-context"} <= set(words):
                    cell = out[model][pair][str(shots)]
                    cell["ability_words"] = ability_test(words[only(k)], words[only(g)], words["composite"])
                    cell["gap_words"] = compositional_gap(words["composite"], words["composite-in-context"])
    return out
