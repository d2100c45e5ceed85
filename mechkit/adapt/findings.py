"""What an adapt study's results say: the comparison with static pruning at the scheduler's measured
latency, the summary lines and the finding, and the words the plugin's tables use for the margin.

Derived from the results alone (JSON in, JSON or text out), so a report can be re-read without a model.
"""

from __future__ import annotations


def num(v, fmt: str = ".2f") -> str:
    """A number for a sentence or a note; ``—`` where there is none."""
    return "—" if v is None else format(v, fmt)


def feasible(row: dict) -> str:
    """``yes``, or how many inputs had no plan that fits after the margin (the cheapest ran)."""
    bad = max(row["adaptive"].get("infeasible_inputs", 0), row["static"].get("infeasible_inputs", 0))
    return "yes" if row.get("feasible", True) else f"no ({bad} inputs: cheapest plan ran)"


def margin_note(results: dict) -> str:
    """How the margin was set, for the tables' note: calibrated (and de-biased) or given by hand."""
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


def summary_lines(results: dict) -> dict:
    """One line per budget (adaptive, static and pruned accuracy at their latency), the pooled adherence and the signal."""
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
    out["signal"] = (f"layer {sig['layer']}, cross-validated accuracy {num(sig['cv_accuracy'])}, "
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


def copy_words(c: dict) -> str:
    """A pruned copy in words: accuracy at latency, and how many inputs were within the budget."""
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
        copies = "; ".join(f"{c['kind']} {copy_words(c)}" for c in item["copies"])
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


def _pct(share: float) -> str:
    """A target share as a percentage, with the digit 99.5 % needs (not rounded up to 100 %)."""
    return f"{100 * share:g}%"
