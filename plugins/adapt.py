"""``mechkit adapt``: one model that adapts to a latency budget at run time, training-free.

Execution plans (which blocks run, which context tokens stay after layer K) come from an importance
guide on calibration prompts; their latency is measured on this machine and predicted by a
calibrated cost table; a scheduler picks, per budget, the plan with the best calibration accuracy —
per input from an early-layer task signal (logistic regression), or one static plan. On held-out
prompts it reports, per budget: accuracy per task for the adaptive scheduler, the best static plan
and static pruning (``mechkit prune --budget``), both at the budget and searched to the scheduler's
measured latency, compared at that same latency (:func:`same_latency`); latency measured per input
against the dense model and the share of inputs within the budget; the plans chosen per task and
the tokens kept; the accuracy–latency frontier. The budget margin is calibrated split-conformally
for ``--adherence`` (the share of inputs meant to measure within budget) on calibration prompts timed
as held-out ones are, then (``--debias``) on the plans the scheduler chooses, whose predictions carry
their median residual; a budget no plan fits after it is reported infeasible, and the dense plan
counts as within any budget ≥ 1 (the strict measured adherence is reported beside it). The
scheduler is saved as ``scheduler.json``, for
``mechkit.adapt.adaptive(model, budget=0.7, scheduler="DIR/scheduler.json")``.

The measurements are :class:`mechkit.adapt.AdaptStudy`'s; this plugin checks the options, runs it
and shapes the tables, the finding and the figures.
"""

from __future__ import annotations

import json

from mechkit.options import DEFAULT_TASKS, NumberList, OptionError, TargetList, TaskList
from mechkit.plugin import Option, Plugin, Result, RunContext


class AdaptPlugin(Plugin):
    name = "adapt"
    version = "0.2.0"  # 0.2: same_latency compares at the scheduler's latency (pruned copies bracketing it)
    needs = frozenset({"module_calls", "patterns", "generation", "gradients", "weight_writes"})
    summary = "Adaptive inference under a latency budget: per-input execution plans and token selection."
    options = (
        Option("tasks", str, DEFAULT_TASKS, "Comma-separated task ids (see `mechkit tasks`).", parse=TaskList()),
        Option("budgets", str, "0.5,0.6,0.7,0.8,0.9,1.0", "Latency budgets, fractions of the dense latency.",
               parse=NumberList(float, min=0, max=1, min_exclusive=True, sort=True, example="0.5,0.7,1.0")),
        Option("guide", str, "attribution", "Block importance: attribution (first-order), ablation (exact "
                                            "bypass of each block) or induction (attribution; blocks with the "
                                            "top induction/previous-token heads always run).",
               choices=("attribution", "ablation", "induction")),
        Option("token_layers", str, "6,12,18", "Token selection after these blocks (blank: none); each with every "
                                          "--token-keep.", parse=NumberList(int, min=0, sort=True, allow_empty=True)),
        Option("token_keep", str, "0.5,0.3", "Shares of the context tokens kept after a --token-layers block.",
               parse=NumberList(float, min=0, max=1, min_exclusive=True, sort=True, allow_empty=True)),
        Option("signal_layer", int, 1, "The block after which the scheduler reads the task signal (blocks up "
                                       "to it always run).", min=0),
        Option("select", str, "logprob", "What ranks plans within a budget: the calibration prompts' mean answer "
                                         "log-prob (smooth) or their exact-match accuracy (coarse with few prompts).",
               choices=("logprob", "accuracy")),
        Option("min_cv", float, 0.9, "Trust the task signal only at this cross-validated accuracy; else static.",
               min=0, max=1),
        Option("adherence", float, 0.99, "Target share of inputs measured within the budget: the margin "
                                         "subtracted from each budget is the split-conformal ⌈(n+1)q⌉/n quantile of "
                                         "measured − predicted latency on calibration prompts.",
               min=0, max=1, min_exclusive=True, max_exclusive=True),
        Option("margin_prompts", int, 4, "Calibration prompts per task timed for the margin, each against dense "
                                         "under --margin-plans plans (not the cost table's fitting prompts); "
                                         "tasks × prompts × plans must reach q/(1−q) residuals (99 for 0.99).", min=1),
        Option("margin_plans", int, 10, "Plans spanning the predicted ratios timed on each margin prompt.", min=1),
        Option("debias", bool, True, "Time the plans the scheduler chooses on the margin prompts too: each gets "
                                     "its median residual added to its prediction, and the margin is recalibrated "
                                     "on the de-biased residuals (--no-debias: the first margin, as before).",
               is_flag=True),
        Option("margin", float, None, "Safety margin subtracted from each budget, given by hand (skips the "
                                      "conformal calibration; default: calibrated for --adherence).", min=0, max=1),
        Option("calib", int, 8, "Calibration prompts per task (guides, candidate scores, signal).", min=2),
        Option("n", int, 10, "Held-out prompts per task.", min=1),
        Option("shots", int, 10, "Demonstrations per prompt.", min=0),
        Option("repeats", int, 3, "Timed runs per plan and input, each between two dense runs (medians).", min=1),
        Option("clock", str, "auto", "Latency clock: wall (elapsed), cpu (the timing thread's CPU time: latency on an idle "
                                     "core, less sensitive to other jobs on a shared machine) or auto (cpu on a one-thread "
                                     "CPU run, else wall).", choices=("auto", "wall", "cpu")),
        Option("timing_prompts", int, 1, "Calibration prompts per task timed for the cost table.", min=1),
        Option("prune_budgets", str, "0.7", "Budgets at which to run static pruning for comparison (blank: none).",
               parse=NumberList(float, min=0, max=1, min_exclusive=True, max_exclusive=True, sort=True,
                                allow_empty=True)),
        Option("prune_targets", str, "neurons", "Units static pruning may remove: neurons, heads, layers.",
               parse=TargetList()),
        Option("prune_reconstruct", str, "lsq", "What replaces the units static pruning removes (as `mechkit prune "
                                                "--reconstruct`, whose default this is): none, mean or lsq.",
               choices=("none", "mean", "lsq")),
        Option("protect_top_k", int, 10, "induction guide: top-k induction and previous-token heads whose "
                                         "blocks always run.", min=0),
        Option("batch_size", int, 8, "Prompts per forward pass when scoring.", min=1),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.adapt import AdaptStudy

        p, parsed = ctx.params, ctx.parsed
        study = AdaptStudy(ctx.model, parsed["tasks"], guide=p["guide"], n_calib=p["calib"], n=p["n"],
                           shots=p["shots"], seed=ctx.seed,
                           token_options=[(k, keep) for k in parsed["token_layers"] for keep in parsed["token_keep"]],
                           signal_layer=p["signal_layer"], protect_top_k=p["protect_top_k"], repeats=p["repeats"],
                           timing_prompts=p["timing_prompts"], margin=p["margin"], min_cv=p["min_cv"],
                           batch_size=p["batch_size"], clock=p["clock"], select=p["select"],
                           adherence=p["adherence"], margin_prompts=p["margin_prompts"],
                           margin_plans=p["margin_plans"], debias=p["debias"], step=ctx.step)
        study.check_margin_sample()  # too few residuals for --adherence: say so before any work
        results = study.run(parsed["budgets"], parsed["prune_budgets"], parsed["prune_targets"],
                            p["prune_reconstruct"])
        scheduler = results.pop("scheduler")
        results["same_latency"] = same_latency(results)
        results["summary"] = _summary(results)
        figures = {"frontier": _frontier(results), "accuracy_vs_budget": _per_task(results)}
        return Result(results=results, figures=figures,
                      files={"scheduler.json": json.dumps(scheduler, indent=1)}, finding=finding(results))

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        missing = [b for b in parsed["prune_budgets"] if b not in parsed["budgets"]]
        if missing:  # pruning is compared with the scheduler at the same budget: it must run there too
            raise OptionError(f"--prune-budgets {','.join(f'{b:g}' for b in missing)} not among --budgets",
                              "add them to --budgets or drop them from --prune-budgets")

    @classmethod
    def tables(cls, results: dict) -> list:
        from mechkit.report import Table

        tasks, rows = results["tasks"], results["rows"]
        main = []
        for r in rows:
            a, s, pr = r["adaptive"], r["static"], r.get("prune") or {}
            main.append([r["budget"], a["mean_accuracy"], s["mean_accuracy"], pr.get("mean_accuracy"),
                         a["latency_ratio"], s["latency_ratio"], pr.get("latency_ratio"), a["adherence"],
                         a.get("adherence_dense_met"), a["adherence_with_noise"], a.get("coverage"),
                         _feasible(r), a["tokens_kept"]])
        noise = (results.get("input_noise") or {}).get("p95", results["cost"].get("noise"))
        note = (f"held-out prompts per task: {results['heldout_prompts']}; latency: median over inputs of the "
                f"measured prefill latency / dense on the same input (prune: the pruned copy timed the same way); "
                f"adherence: share of inputs within the budget — strictly by measurement; counting the dense "
                f"plan as within any budget ≥ 1 (it is the reference: its measured ratio is timing noise); and "
                f"within the measured noise {_num(noise)} (95th percentile of |1 − dense/dense| per input); "
                f"{_margin_note(results)}; coverage: share measured within predicted + margin; dense "
                f"accuracy {_num(results['dense']['mean_accuracy'])}")
        per_task = [[r["budget"], t, r["adaptive"]["accuracy"][t], r["static"]["accuracy"][t],
                     (r.get("prune") or {}).get("accuracy", {}).get(t)] for r in rows for t in tasks]
        plans = [[r["budget"], t, "; ".join(f"{label} ×{n}" for label, n in r["adaptive"]["plans"][t].items()),
                  "; ".join(r["static"]["plans"][t])] for r in rows for t in tasks]
        cost = results["cost"]
        checks = [[row["plan"], row["tokens"], row["measured"], row["predicted"]]
                  for part in ("fit", "validation") for row in cost[part]["rows"]]
        table = cost["table"]
        same = [[x["budget"], x["adaptive"], x["adaptive_latency"], x["prune"], x["verdict"],
                 "; ".join(f"{c['kind']}: {_copy_words(c)}" for c in x["copies"])]
                for x in results.get("same_latency", [])]
        return [
            Table("Mean accuracy and measured latency by budget", ["budget", "adaptive", "best static", "static prune",
                  "adaptive latency", "static latency", "prune latency", "adherence (strict)",
                  "(dense = met)", "(±noise)", "coverage", "feasible", "tokens kept"], main,
                  note=note),
            Table("Static pruning at the adaptive scheduler's measured latency",
                  ["budget", "adaptive", "adaptive latency", "prune (interpolated)", "keeps more", "pruned copies"],
                  same, note="pruned copies: `mechkit prune --budget` at the budget, and searched to the scheduler's "
                             "measured latency (matched); each timed on every held-out input as the plans are; pruning "
                             "at the scheduler's latency is read off the segment between the copies that bracket it"),
            Table("Held-out accuracy per task", ["budget", "task", "adaptive", "best static", "static prune"], per_task),
            Table("Plans chosen (adaptive: plan × inputs; static: the best plan over all tasks)",
                  ["budget", "task", "adaptive", "static"], plans,
                  note="a plan's predicted cost depends a little on the prompt's length (token selection), so the "
                       "static choice can differ between prompts of different lengths"),
            Table("Cost table: measured vs predicted latency (fraction of dense)",
                  ["plan", "tokens", "measured", "predicted"], checks,
                  note=(f"ratio ≈ 1 − {table['beta_attn']:.3f}·(1 − work_attn) − {table['beta_mlp']:.3f}·(1 − "
                        f"work_mlp) + {table['gamma']:.3f}·ranks + {table['eta']:.3f}·masked; one block ≈ {cost['per_layer_ms']:.1f} ms of "
                        f"{cost['dense_ms']:.0f} ms at {cost['typical_tokens']} tokens; validation mean |error| "
                        f"{_num(cost['validation']['mean_abs_error'], '.3f')}, max "
                        f"{_num(cost['validation']['max_abs_error'], '.3f')}; noise {_num(noise, '.3f')}")),
        ]


def _num(v, fmt: str = ".2f") -> str:
    return "—" if v is None else format(v, fmt)


def _feasible(row: dict) -> str:
    """``yes``, or how many inputs had no plan that fits after the margin (the cheapest ran)."""
    bad = max(row["adaptive"].get("infeasible_inputs", 0), row["static"].get("infeasible_inputs", 0))
    return "yes" if row.get("feasible", True) else f"no ({bad} inputs: cheapest plan ran)"


def _margin_note(results: dict) -> str:
    cal = results.get("margin_calibration") or {}
    if cal.get("method") == "conformal":
        chosen = cal.get("chosen_plans")
        if chosen and chosen.get("margin"):
            m = chosen["margin"]
            return (f"margin {results['margin']:.3f}: split-conformal for {m['q']:g} adherence, the {m['k']}th of "
                    f"{m['n']} de-biased residuals on {cal['prompts']} calibration prompts × {len(cal['plans'])} "
                    f"spanning plans and {sum((x['timed_in_round'] or 0) > 0 for x in chosen['plans'])} "
                    f"chosen plans ({chosen['rounds']} round{'s' if chosen['rounds'] != 1 else ''}, "
                    f"{chosen['forwards']} forwards, {chosen['seconds']:.0f} s); each chosen plan's prediction "
                    f"carries its median residual as a bias (margin_calibration.chosen_plans; first margin "
                    f"{cal['value']:.3f})")
        return (f"margin {results['margin']:.3f}: split-conformal for {cal['q']:g} adherence, the {cal['k']}th of "
                f"{cal['n']} residuals (measured − predicted) on {cal['prompts']} calibration prompts × "
                f"{len(cal['plans'])} plans")
    return f"margin {results['margin']:.3f}, given by hand"


def _summary(results: dict) -> dict:
    out = {"dense": f"mean accuracy {results['dense']['mean_accuracy']:.2f}"}
    for r in results["rows"]:
        a, s = r["adaptive"], r["static"]
        line = (f"adaptive {a['mean_accuracy']:.2f} at {a['latency_ratio']:.2f} (adherence {a['adherence']:.2f} "
                f"strict, {a.get('adherence_dense_met', a['adherence']):.2f} dense = met) | "
                f"static {s['mean_accuracy']:.2f} at {s['latency_ratio']:.2f}")
        if not r.get("feasible", True):
            line += " | infeasible: the cheapest plan ran"
        if r.get("prune") and "mean_accuracy" in r["prune"]:
            line += f" | prune {r['prune']['mean_accuracy']:.2f} at {r['prune']['latency_ratio']:.2f}"
        out[f"budget {r['budget']:.2f}"] = line
    pooled = (results.get("pooled_adherence") or {}).get("adaptive")
    if pooled:
        out["adherence, all budgets"] = (f"adaptive {pooled['within']} of {pooled['inputs']} inputs within their "
                                         f"budget (dense = met): {pooled['share']:.3f}, supporting ≥ "
                                         f"{pooled['lower95']:.3f} at 95 % confidence")
    sig = results["signal"]
    out["signal"] = (f"layer {sig['layer']}, cross-validated accuracy {_num(sig['cv_accuracy'])}, "
                     f"{'trusted' if sig['trusted'] else 'not trusted: static fallback'}")
    return out


def pruned_copies(row: dict) -> list[dict]:
    """The static-prune copies measured at one budget (at the budget, and searched to the adaptive
    scheduler's latency), without the ones that failed, fastest first."""
    pr = row.get("prune") or {}
    copies = [dict(c, kind=kind) for kind, c in (("at budget", pr), ("matched", pr.get("matched") or {}))
              if "mean_accuracy" in c]
    return sorted(copies, key=lambda c: c["latency_ratio"])


def same_latency(results: dict) -> list[dict]:
    """For each static-prune budget: the adaptive scheduler's accuracy at its measured median latency
    against static pruning at that same latency.

    The pruned copies are points of pruning's accuracy–latency frontier, and pruning at a latency
    keeps at least what any copy at least as fast keeps. Where two copies bracket the scheduler's
    latency, pruning there is read off the segment between them (linear), or is the best faster
    copy where that keeps more. ``verdict``: ``adaptive`` where the scheduler keeps more, ``prune``
    where pruning keeps as much or more. With no copy as fast as the scheduler, a slower copy that
    keeps less is beaten outright; with every copy faster, one that keeps as much wins outright;
    otherwise ``undecided``. ``gap_prompts`` is the difference in held-out prompts (of
    ``inputs``), since a verdict by one or two prompts is within sampling noise."""
    out = []
    for r in results["rows"]:
        copies = pruned_copies(r)
        if not copies:
            continue
        a = r["adaptive"]
        lat, acc = a["latency_ratio"], a["mean_accuracy"]
        item = {"budget": r["budget"], "adaptive": acc, "adaptive_latency": lat,
                "static": r["static"]["mean_accuracy"], "static_latency": r["static"]["latency_ratio"],
                "inputs": a.get("inputs"),
                "copies": [{k: c.get(k) for k in ("kind", "latency_ratio", "mean_accuracy", "within", "inputs")}
                           for c in copies], "prune": None, "gap_prompts": None}
        below = [c for c in copies if c["latency_ratio"] <= lat]
        above = [c for c in copies if c["latency_ratio"] >= lat]
        faster = max((c["mean_accuracy"] for c in below), default=None)
        if below and above:
            lo, hi = below[-1], above[0]
            span = hi["latency_ratio"] - lo["latency_ratio"]
            w = 0.0 if span == 0 else (lat - lo["latency_ratio"]) / span
            item["prune"] = max(lo["mean_accuracy"] + w * (hi["mean_accuracy"] - lo["mean_accuracy"]), faster)
            item["verdict"] = "adaptive" if acc > item["prune"] + 1e-9 else "prune"
            if item["inputs"]:
                item["gap_prompts"] = round((acc - item["prune"]) * item["inputs"], 1)
        elif above:  # every copy is slower than the scheduler
            item["verdict"] = "adaptive" if acc > above[0]["mean_accuracy"] + 1e-9 else "undecided"
        else:  # every copy is faster
            item["verdict"] = "prune" if faster >= acc - 1e-9 else "undecided"
        out.append(item)
    return out


def _copy_words(c: dict) -> str:
    within = f", {c['within']}/{c['inputs']} inputs within the budget" if c.get("inputs") else ""
    return f"{c['mean_accuracy']:.2f} at {c['latency_ratio']:.2f}{within}"


def finding(results: dict) -> str:
    """Two or three sentences: at the budget nearest 0.7, adaptive vs best static accuracy with the
    measured latency and adherence; the same-latency comparison with static pruning and where (if
    anywhere) adaptivity pays; and the budgets no plan fits after the margin (infeasible)."""
    rows = results["rows"]
    r = min(rows, key=lambda x: abs(x["budget"] - 0.7))
    a, s = r["adaptive"], r["static"]
    text = (f"At a {r['budget']:.2f} latency budget the adaptive scheduler keeps {a['mean_accuracy']:.2f} mean "
            f"accuracy (best static plan {s['mean_accuracy']:.2f}, dense {results['dense']['mean_accuracy']:.2f}), "
            f"measured at {a['latency_ratio']:.2f} of the dense latency with {a['adherence']:.0%} of inputs within "
            f"the budget{_margin_words(results)}" + ("" if r.get("feasible", True) else
                                                      ", but no plan fits it: the cheapest plan ran") + ".")
    parts = []
    same = results.get("same_latency", [])
    for item in ([x for x in same if x["budget"] == r["budget"]] or same)[:1]:
        copies = "; ".join(f"{c['kind']} {_copy_words(c)}" for c in item["copies"])
        verdict = {"adaptive": "the adaptive scheduler keeps more", "prune": "static pruning keeps as much or more",
                   "undecided": "undecided: the pruned copies do not bracket that latency and none decides it"}
        at = "" if item["prune"] is None else f" static pruning keeps {item['prune']:.2f} (interpolated);"
        if item.get("gap_prompts") is not None:
            at += f" a difference of {item['gap_prompts']:+g} of {item['inputs']} prompts;"
        parts.append(f"at the scheduler's measured {item['adaptive_latency']:.2f}{at} "
                     f"{verdict[item['verdict']]} (pruned copies: {copies})")
    gains = [x["adaptive"]["mean_accuracy"] - x["static"]["mean_accuracy"] for x in rows]
    if not results["signal"]["trusted"]:
        parts.append("the task signal was not trusted, so every input ran the static plan")
    elif max(gains) <= 0:
        parts.append("adaptivity does not pay on this model: the static plan is as good at every budget")
    else:
        best = rows[gains.index(max(gains))]
        parts.append(f"adaptivity gains most at the {best['budget']:.2f} budget (+{max(gains):.2f})")
    text += " " + "; ".join(parts)[:1].upper() + "; ".join(parts)[1:] + "."
    bad = results.get("infeasible_budgets") or []
    if bad:
        target = (results.get("margin_calibration") or {}).get("q")
        at = f" at {_pct(target)} adherence" if target else ""
        text += (f" Infeasible{at} on this machine: no plan fits the {', '.join(f'{b:.2f}' for b in bad)} "
                 f"budget{'s' if len(bad) > 1 else ''} after the {results['margin']:.3f} margin, so the cheapest "
                 f"plan ran there (over budget by prediction).")
    return text


def _margin_words(results: dict) -> str:
    cal = results.get("margin_calibration") or {}
    if cal.get("method") == "conformal":
        return f" (margin {results['margin']:.3f}, calibrated for {_pct(cal['q'])})"
    return f" (margin {results['margin']:.3f}, given)" if "margin" in results else ""


def _frontier(results: dict):
    from mechkit.report import xy_plot

    rows = results["rows"]
    series = {"adaptive": ([r["adaptive"]["latency_ratio"] for r in rows], [r["adaptive"]["mean_accuracy"] for r in rows]),
              "best static plan": ([r["static"]["latency_ratio"] for r in rows],
                                   [r["static"]["mean_accuracy"] for r in rows])}
    pruned = sorted((c for r in rows for c in pruned_copies(r)), key=lambda c: c["latency_ratio"])
    if pruned:
        series["static prune"] = ([x["latency_ratio"] for x in pruned], [x["mean_accuracy"] for x in pruned])
    return xy_plot(series, f"Held-out accuracy vs measured latency ({', '.join(results['tasks'])})",
                   "measured latency / dense (median over inputs)", "mean exact-match accuracy",
                   reference=(1.0, results["dense"]["mean_accuracy"]))


def _per_task(results: dict):
    from mechkit.report import line_plot

    rows = results["rows"]
    series, groups = {}, {}
    for i, t in enumerate(results["tasks"]):
        for kind, style in (("adaptive", "-"), ("static", "--")):
            series[f"{t} {kind}"] = [r[kind]["accuracy"][t] for r in rows]
            groups[f"{t} {kind}"] = (i, style)
    return line_plot([r["budget"] for r in rows], series, "Held-out accuracy per task vs latency budget "
                     "(solid: adaptive, dashed: best static)", "budget (fraction of dense latency)",
                     "exact-match accuracy", groups=groups)


def _pct(share: float) -> str:
    """A target share as a percentage, with the digit 99.5 % needs (not rounded up to 100 %)."""
    return f"{100 * share:g}%"
