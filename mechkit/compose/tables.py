"""What a composition run reports in words: the seeds' Table 4.4, one summary line per finding, and the finding.

Both read the results of :meth:`mechkit.compose.analysis.ComposeStudy.run` (after a JSON round
trip as well as before), so a report can be re-summarised without rerunning anything.

>>> row = {"mean": 0.25, "std": 0.1}
>>> pm(row)
'0.25±0.10'
"""

from __future__ import annotations

from collections.abc import Sequence

from mechkit.compose.settings import composite_task, only, simple

__all__ = ["accuracy_by_setting", "finding", "pm", "summary_lines"]


def pm(row: dict) -> str:
    """``mean±std`` of a setting's summary row, two decimals."""
    return f"{row['mean']:.2f}±{row['std']:.2f}"


def accuracy_by_setting(study: dict, pairs: Sequence[str], shots: int) -> list[dict]:
    """The seeds' Table 4.4 from :func:`~mechkit.compose.study.summarize`'s output: per composite,
    rows for each simple task, Compose, Com. in-context (and steps, S_k, S_g), one column per
    model, accuracy in % (mean ± std over seeds) at ``shots``, and the word-level accuracy where
    measured. Settings measured for no model are left out.

    >>> cell = {"mean": 0.5, "std": 0.0}
    >>> study = {"m": {"capitalize+swap": {"2": {"settings": {"composite": cell}}}}}
    >>> accuracy_by_setting(study, ["capitalize+swap"], 2)
    [{'tasks': '(A+B) capitalize+swap', 'how': 'steps', 'setting': 'Compose', 'm': '50 ± 0'}]
    """
    rows = []
    for pair in pairs:
        task = composite_task(pair)
        k, g = task.components
        names = [(simple(k), k), (simple(g), g), ("composite", "Compose"),
                 ("composite-in-context", "Com. in-context"), ("composite-steps", "Com. in-context, steps"),
                 (only(k), f"S_{k} only"), (only(g), f"S_{g} only")]
        for setting, label in names:
            row = {"tasks": f"({task.letter}) {pair}", "how": task.how, "setting": label}
            for spec in study:
                cell = study[spec].get(pair, {}).get(str(shots), {}).get("settings", {}).get(setting)
                if cell is not None:
                    row[spec] = f"{100 * cell['mean']:.0f} ± {100 * cell['std']:.0f}"
                    if "words" in cell:
                        row[spec] += f" (words {100 * cell['words']:.0f})"
            if len(row) > 3:
                rows.append(row)
    return rows


def _study_line(task, row: dict, shots: int) -> str:
    k, g = task.components
    s, ab, ab_lp = row["settings"], row["ability"], row["ability_logprob"]
    verdict = "holds at 0" if ab["floor"] else ("holds" if ab["holds"] else "fails")
    line = (f"{task.letter} by {task.how}, K={shots}: {k} {pm(s[simple(k)])} | {g} {pm(s[simple(g)])} | "
            f"compose {pm(s['composite'])} | in-context {pm(s['composite-in-context'])}")
    if "composite-steps" in s:
        line += f" | steps {pm(s['composite-steps'])}"
    line += (f" | gap {row['gap']:+.2f} (log-prob {row['gap_logprob']:+.2f}) | ability {verdict}: "
             f"S_k {s[only(k)]['mean']:.2f}, S_g {s[only(g)]['mean']:.2f}, union {ab['union']:.2f}; "
             f"log-prob margin {ab_lp['margin']:+.2f}")
    if "ability_words" in row:
        line += (f" | words: compose {s['composite']['words']:.2f}, in-context "
                 f"{s['composite-in-context']['words']:.2f}, ability margin {row['ability_words']['margin']:+.2f}")
    return line


def _heads_line(row: dict) -> str:
    ref, mlp = row["reference_heads"], row["mlp_ranking"][0]
    heads = ", ".join(f"{h['layer']}.{h['head']} ({h['cs']:+.3f})" for h in row["selected"])
    total = sum(v is not None for r in row["composite_specific_heads"] for v in r)  # a pruned layer's empty cells: None
    return (f"top composite-specific {heads} | CS ranks of the top induction heads {ref['induction']['cs_ranks']}, "
            f"previous-token {ref['previous-token']['cs_ranks']} (of {total}) | top MLP {mlp['layer']} ({mlp['cs']:+.3f})")


def _strengthen_line(c: dict) -> str:
    return (f"composite {c['clean']:.2f} → selected {c['selected']['accuracy']:.2f} (×{c['selected']['strength']:g}) "
            f"vs random {c['random_mean']:.2f} ± {c['random_std']:.2f}; Δlog-prob {c['selected']['delta_logprob']:+.3f} "
            f"vs {c['random_delta_logprob']:+.3f}")


def summary_lines(out: dict, shots: int, treatments: Sequence[str]) -> dict[str, str]:
    """One line per composite and model (settings at ``shots``, gap, ability test), per composite's
    components (top heads, reference heads' ranks, top MLP) and per treatment (strengthening vs random)."""
    lines: dict[str, str] = {}
    study = out.get("study", {}).get("summary", {})
    for spec, pairs in study.items():
        for pair, by_shots in pairs.items():
            lines[f"{spec} {pair}" if len(study) > 1 else pair] = _study_line(composite_task(pair),
                                                                             by_shots[str(shots)], shots)
    for pair, row in out.get("components", {}).get("pairs", {}).items():
        lines[f"{pair} heads"] = _heads_line(row)
    for pair, res in out.get("strengthen", {}).items():
        for treatment in treatments:
            lines[f"{pair} {treatment}"] = _strengthen_line(res[treatment])
    return lines


def finding(results: dict) -> str | None:
    """Whether the first model composes each pair from simple-task demonstrations at the largest K, against
    composite demonstrations and its parts; and what strengthening the top heads did against random ones."""
    sentences = []
    summary = results.get("study", {}).get("summary", {})
    if summary:
        spec, pairs = next(iter(summary.items()))
        k = str(max(int(x) for x in next(iter(pairs.values()))))
        parts = []
        for pair, by_k in pairs.items():
            s = by_k[k]["settings"]
            a, b = pair.split("+")
            parts.append(f"{pair} composes {s['composite']['mean']:.2f} from simple-task demonstrations and "
                         f"{s['composite-in-context']['mean']:.2f} from composite ones (its parts alone "
                         f"{s['simple:' + a]['mean']:.2f} and {s['simple:' + b]['mean']:.2f})")
        sentences.append(f"On {spec} at K = {k}, " + "; ".join(parts) + ".")
    for pair, res in results.get("strengthen", {}).items():
        for treatment, c in res.items():
            if isinstance(c, dict) and "selected" in c and "clean" in c:
                sentences.append(f"Strengthening {pair}'s top composite-specific heads ({treatment}) moves held-out "
                                 f"composite accuracy {c['clean']:.2f} → {c['selected']['accuracy']:.2f}, random "
                                 f"heads {c['random_mean']:.2f} ± {c['random_std']:.2f} (Δ log-prob "
                                 f"{c['selected']['delta_logprob']:+.3f} vs {c['random_delta_logprob']:+.3f}).")
    if not sentences:
        for pair, row in results.get("components", {}).get("pairs", {}).items():
            h = row["selected"][0]
            sentences.append(f"The most composite-specific head for {pair} is {h['layer']}.{h['head']} "
                             f"(CS {h['cs']:+.3f}).")
    return " ".join(sentences) or None
