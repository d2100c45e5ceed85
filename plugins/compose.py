"""``mechkit compose``: does the model compose two tasks it solves in context, and which components does that take?

The seeds' compositional study (000 Ch. 4; proposed work §6.2), in four parts (``--parts``):

- ``study``: exact-match accuracy of each composite in the seeds' settings — each simple task,
  ``composite`` (simple-task demonstrations, composite query), ``composite-in-context`` (the gold
  standard) and Definition 4.4.1's S_k / S_g (the composite prompt with one task's demonstrations
  only) — over a shots grid and several prompt seeds (mean ± std); the compositional-ability test
  max(Acc S_k, Acc S_g) ≤ Acc(S_k ∪ S_g), the gap in-context − composite, and Table 4.4 / Figure
  4.2-shaped outputs. ``--models`` adds models (the seeds' axis is model scale).
- ``steps``: composite-in-context demonstrations that spell out ``f(x) -> g(f(x))``, at the
  grid's largest K; accuracy counts the final part (see :mod:`mechkit.compose.stepwise`).
- ``components``: each head's and MLP block's ablation effect on the composite vs on each simple
  task, ranked by the composite-specific effect (:mod:`mechkit.compose.components`), with the
  ranks of the top induction and previous-token heads; the top heads checked by exact ablation.
- ``strengthen``: the top composite-specific heads scaled by α (or given their mean
  composite-in-context output), strength chosen on dev prompts, held-out composite accuracy vs the
  same treatment of random heads (disjoint from them, several draws).

The measurements are :class:`mechkit.compose.ComposeStudy`'s (prompt seeds: its module docstring);
this plugin declares the options, loads the extra models and draws the figures the study describes.
"""

from __future__ import annotations

from dataclasses import dataclass

from mechkit.options import Choices, NumberList, TaskList, unread
from mechkit.options.unused import refuse_ignored
from mechkit.plugin import Option, Plugin, Result, RunContext

PARTS = ("study", "steps", "components", "strengthen")  # mechkit.compose.PARTS, without importing torch
DEFAULT_PAIRS = "capitalize+swap,capitalize+plus-one"  # the seeds' Table 4.3: one by steps, one by parts


@dataclass(frozen=True)
class PairList(TaskList):
    """``--pairs``: composite ids ``a+b`` in either order, or ``suite`` / ``logic`` / ``all`` ->
    canonical composite ids (:func:`mechkit.compose.parse_pairs`).

    >>> PairList()("swap+capitalize, logic")[:2]
    ['capitalize+swap', 'negation+conjunction']
    """

    metavar: str = "A+B[,A+B...]|suite|logic|all"

    def __call__(self, text: str) -> list[str]:
        from mechkit.compose import parse_pairs

        return parse_pairs(str(text))


class ComposePlugin(Plugin):
    name = "compose"
    version = "0.1.0"
    needs = frozenset({"module_calls", "generation"})
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "The seeds' compositional study: settings, ability test, gap; components composition needs; strengthening them."
    options = (
        Option("pairs", str, DEFAULT_PAIRS, "Composites a+b, comma-separated; suite, logic or all for every "
                                            "suite / logical composite.", parse=PairList()),
        Option("shots", str, "0,2,5,10", "Shots grid K (demonstrations per prompt).",
               parse=NumberList(int, min=0, sort=True, example="0,2,5,10")),
        Option("n", int, 5, "Queries per setting, composite, K and seed.", min=1),
        Option("seeds", int, 3, "Prompt seeds (mean ± std over them).", min=1),
        Option("word_match", bool, False, "Also score the seeds' word-level accuracy (matched words / answer "
                                          "length) by greedy decoding: partial credit, slower.", is_flag=True),
        Option("models", str, None, "More model specs for the study, comma-separated (the seeds' axis is scale); "
                                    "loaded before any work."),
        Option("parts", str, "study,steps,components,strengthen", "Which analyses: study, steps, components, "
                                                                  "strengthen.", parse=Choices(PARTS)),
        Option("effect_shots", int, None, "K of the component and strengthening prompts (default: the grid's "
                                          "largest).", min=0),
        Option("n_effect", int, 6, "Prompts per set for the component effects.", min=1),
        Option("method", str, "attribution", "Component effects: attribution (one forward + backward) or exact.",
               choices=("attribution", "exact")),
        Option("mlp_ablation", str, "mean", "How an MLP block is removed.", choices=("zero", "mean")),
        Option("contrast", str, "max", "Composite-specific effect: composite importance minus the max or mean of the "
                                       "simple tasks'.", choices=("max", "mean")),
        Option("top_k", int, None, "Heads selected by composite-specific effect (checked exactly, strengthened); "
               "default 5, at most half the model's heads (the rest are the random baseline).", min=1),
        Option("verify", int, 3, "Top heads whose attribution estimate is checked by exact ablation (0: none).", min=0),
        Option("n_seqs", int, 20, "Random sequences for the induction / previous-token scores.", min=1),
        Option("seg_len", int, 25, "Segment length for those scores.", min=2),
        Option("treatment", str, "scale", "Strengthening: scale (α × head outputs), vector (add their mean "
                                          "composite-in-context output) or both.", choices=("scale", "vector", "both")),
        Option("strengths", str, "1.25,1.5,2", "α (scale) or β (vector) grid, chosen on dev prompts.",
               parse=NumberList(float, min=0, min_exclusive=True, max=1000, sort=True, example="1.25,1.5,2")),
        Option("draws", int, 3, "Random head sets of the baseline.", min=1),
        Option("n_dev", int, 5, "Dev prompts (choose the strength).", min=1),
        Option("n_test", int, 8, "Held-out test prompts.", min=1),
        Option("n_contexts", int, 8, "Composite-in-context prompts averaged for the vector treatment.", min=1),
        Option("batch_size", int, 16, "Prompts per forward pass.", min=1),
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        """Refuse an option of a part, treatment or method not run: it was silently ignored (the report read as if applied)."""
        parts, parts_flag = set(parsed["parts"]), "--parts " + ",".join(parsed["parts"])
        if not parts & {"study", "steps"}:
            refuse_ignored(cls, parsed, ("n", "seeds", "word_match", "models"), f"counts in the study and steps parts, "
                           f"and {parts_flag} leaves both out", "drop it, or add study to --parts")
        if not parts & {"components", "strengthen"}:
            refuse_ignored(cls, parsed, ("effect_shots", "n_effect", "method", "mlp_ablation", "contrast", "top_k",
                                         "verify", "n_seqs", "seg_len"),
                           f"counts in the components and strengthen parts, and {parts_flag} leaves both out",
                           "drop it, or add components to --parts")
        if "strengthen" not in parts:
            refuse_ignored(cls, parsed, ("treatment", "strengths", "draws", "n_dev", "n_test", "n_contexts"),
                           f"counts in the strengthen part, and {parts_flag} leaves it out",
                           "drop it, or add strengthen to --parts")
        elif parsed["treatment"] == "scale":
            refuse_ignored(cls, parsed, ("n_contexts",), "counts for the vector treatment only, and --treatment is "
                           "scale", "drop --n-contexts, or pass --treatment vector (or both)")
        unread.compose_shots(cls, parsed, parts)
        if parsed["method"] == "exact":
            refuse_ignored(cls, parsed, ("verify",), "checks attribution estimates by exact ablation, and --method "
                           "exact computes every effect exactly", "drop --verify, or pass --method attribution")

    def run(self, ctx: RunContext) -> Result:
        import itertools

        import mechkit as mk
        from mechkit import report
        from mechkit.compose import ComposeConfig, ComposeStudy, accuracy_by_setting, summary_lines
        from mechkit.compose.plots import plots
        from mechkit.compose.tables import finding
        from mechkit.model.headspec import default_top_k

        opts, model = ctx.options, ctx.model
        parts, shots = opts["parts"], list(opts["shots"])
        treatments = ["scale", "vector"] if opts["treatment"] == "both" else [opts["treatment"]]
        names = ("n", "seeds", "effect_shots", "n_effect", "method", "contrast", "top_k", "verify", "n_seqs",
                 "seg_len", "draws", "n_dev", "n_test", "n_contexts", "batch_size", "mlp_ablation", "strengths")
        settings = {name: opts[name] for name in names}
        settings["top_k"] = opts["top_k"] or default_top_k(model.anatomy.n_layers, model.anatomy.head_counts, 5)
        config = ComposeConfig(**settings, shots=shots, seed=ctx.seed, words=opts["word_match"])
        study = ComposeStudy(model, opts["pairs"], config, step=ctx.step)  # refuses a --top-k too large for the model
        models = {model.spec: model}
        for spec in (s.strip() for s in str(opts["models"] or "").split(",") if s.strip()):
            models.setdefault(spec, mk.load_model(spec, device=str(model.device), dtype=model.dtype))  # before any work
        study.check_fits(parts, models)  # prompts too long for a model's context: refused before any work
        with ctx.progress() as bar:
            job = bar.add_task("compose", total=study.units(parts, len(models), treatments))
            count = itertools.count()
            study.on_unit = lambda description: bar.update(job, description=description, completed=next(count))
            out = {"pairs": study.pairs, "shots": shots, "effect_shots": study.effect_shots,
                   "models": {spec: {"name": h.name, "parameters": sum(t.numel() for t in h.model.parameters())}
                              for spec, h in models.items()},
                   **study.run(parts, models, treatments)}
        if "study" in out:
            out["table_4_4"] = accuracy_by_setting(out["study"]["summary"], study.pairs, study.top)
        out["summary"] = summary_lines(out, study.top, treatments)
        specs = plots(out, shots, treatments, opts["contrast"], model=model.spec, grid="study" in parts)
        figures = {name: report.draw(s) for name, s in specs.items()}
        return Result(results=out, figures=figures, finding=finding(out))

    @classmethod
    def tables(cls, results: dict) -> list:
        """Table 4.4 (settings × models at the largest K), the ability test and gap per composite, the top
        composite-specific heads per composite, and strengthening vs random heads."""
        from mechkit.report import Table, pm

        out = []
        if results.get("table_4_4"):
            specs = list(results["models"])
            out.append(Table(f"Accuracy (%) at K = {max(results['shots'])}, mean ± std over prompt seeds "
                             "(the seeds' Table 4.4)", ["composite", "by", "setting", *specs],
                             [[r["tasks"], r["how"], r["setting"], *(r.get(s) for s in specs)]
                              for r in results["table_4_4"]]))
            rows = []
            for spec, pairs in results["study"]["summary"].items():
                for pair, by_k in pairs.items():
                    for k, row in by_k.items():
                        ab = row["ability"]
                        verdict = "holds at 0" if ab["floor"] else ("holds" if ab["holds"] else "fails")
                        rows.append([f"{pair} K={k}" + (f" ({spec})" if len(results["models"]) > 1 else ""),
                                     pm(row["settings"]["composite"]["mean"], row["settings"]["composite"]["std"]),
                                     row["gap"], row["gap_logprob"], verdict, row["ability_logprob"]["margin"]])
            out.append(Table("Compositional-ability test and gap", ["composite", "compose", "gap (in-context − "
                             "compose)", "gap, log-prob", "max(S_k, S_g) ≤ S_k ∪ S_g", "log-prob margin"], rows))
        pairs = results.get("components", {}).get("pairs", {})
        if pairs:
            out.append(Table("Top composite-specific components (ablation effect on the composite minus on its "
                             "parts)", ["composite", "heads", "top head CS", "top MLP", "induction heads' CS ranks",
                                        "previous-token heads' CS ranks"],
                             [[pair, [{"layer": h["layer"], "head": h["head"]} for h in row["selected"]],
                               row["selected"][0]["cs"], f"layer {row['mlp_ranking'][0]['layer']}",
                               ", ".join(map(str, row["reference_heads"]["induction"]["cs_ranks"])),
                               ", ".join(map(str, row["reference_heads"]["previous-token"]["cs_ranks"]))]
                              for pair, row in pairs.items()], digits=3))
        rows = [[f"{pair} ({t})", c["clean"], c["selected"]["accuracy"], c["selected"]["strength"],
                 pm(c["random_mean"], c["random_std"]), c["selected"]["delta_logprob"], c["random_delta_logprob"]]
                for pair, res in results.get("strengthen", {}).items() for t, c in res.items() if isinstance(c, dict)
                and "selected" in c and "clean" in c]
        if rows:
            out.append(Table("Strengthening the top composite-specific heads vs random heads (held-out composite "
                             "accuracy)", ["composite (treatment)", "clean", "selected heads", "strength",
                                           "random heads", "Δ log-prob selected", "Δ log-prob random"], rows))
        return out
