"""``mechkit patch``: activation patching between clean and corrupted prompts, with the logit lens and
direct logit attribution of the clean runs.

Prompt pairs come from the ``ioi`` task (the repeated subject swapped for the indirect object), from an
ICL task with its demonstrations' labels shuffled (``--task capitalize``), or from ``--clean``/
``--corrupted`` with ``--answers correct,wrong``. The metric is the logit difference between the two
answers at the last position, averaged over ``--pairs`` pairs. Denoising: each clean activation is patched
into the corrupted run (the residual stream at every layer × position, each head's output at every layer),
reported as the normalized recovery ``(patched − corrupted) / (clean − corrupted)``; ``--method
attribution`` estimates it from one forward and one backward per pair, ``both`` adds the rank agreement.
Algorithms: :mod:`mechkit.patching`.
"""

from __future__ import annotations

from mechkit.options import OptionError, Text
from mechkit.options.unused import refuse_ignored
from mechkit.plugin import Option, Plugin, Result, RunContext


class PatchPlugin(Plugin):
    name = "patch"
    version = "0.2.0"
    needs = frozenset({"gradients"})  # --method attribution
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Activation patching clean -> corrupted (layer x position, layer x head), logit lens and DLA."
    options = (
        Option("task", str, "ioi", "Prompt pairs from this task: ioi (the name swapped) or an ICL task id (its "
               "demonstrations' labels shuffled); not with --clean."),
        Option("clean", str, None, "Clean prompt text (with --corrupted and --answers).", parse=Text("the clean prompt")),
        Option("corrupted", str, None, "Corrupted prompt text, the same number of tokens as --clean.",
               parse=Text("the corrupted prompt", "The cat sat. The dog sat.")),
        Option("answers", str, None, "The clean answer and the competing one, comma-separated (' Mary, John')."),
        Option("pairs", int, 1, "Prompt pairs to average over (seeded by --seed).", min=1, max=256),
        Option("pair", int, 0, "The first pair to use (0 = the seed's first).", min=0, max=10_000),
        Option("shots", int, 5, "Demonstrations per ICL prompt (ICL tasks only).", min=2, max=40),
        Option("method", str, "exact", "exact, attribution (one forward and backward per pair), or both (adds "
               "their rank agreement).", choices=("exact", "attribution", "both")),
        Option("batch_size", int, 32, "Patches per forward pass.", min=1),
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        given = [k for k in ("clean", "corrupted", "answers") if parsed.get(k) is not None]
        if given and len(given) != 3:
            raise OptionError("--clean, --corrupted and --answers go together; give all three")
        if parsed.get("answers") is not None and len(parsed["answers"].split(",")) != 2:
            raise OptionError("--answers takes two answers, comma-separated: the clean one, then the competing one")
        if parsed.get("answers") is not None and not all(a for a in parsed["answers"].split(",")):
            raise OptionError(f"--answers {parsed['answers']!r}: an answer is empty",
                              "give two answers, comma-separated: the clean one, then the competing one (' Mary, John')")
        if parsed.get("answers") is not None and len(set(parsed["answers"].split(","))) == 1:  # known before the load
            raise OptionError(f"--answers {parsed['answers']!r}: the clean and the competing answer are the same text",
                              "give two different answers, comma-separated: the clean one, then the competing one")
        if parsed.get("clean") is not None and parsed["clean"] == parsed.get("corrupted"):
            raise OptionError("--clean and --corrupted are the same text: patching would restore nothing",
                              "give a corrupted prompt that changes the answer (e.g. a name swapped)")
        if given and (parsed.get("pairs", 1) != 1 or parsed.get("pair", 0) != 0):
            raise OptionError("--pairs and --pair choose among a task's prompt pairs; --clean/--corrupted give one pair",
                              "drop --pairs and --pair, or drop --clean/--corrupted/--answers to use --task")
        if parsed.get("method") == "attribution":  # one forward and one backward per pair: no patch is batched
            refuse_ignored(cls, parsed, ("batch_size",), "sets the patches per forward pass of the exact scans, and "
                           "--method attribution runs none", "drop --batch-size, or pass --method both")
        if given:  # one pair given as text: no task builds pairs, so neither --task nor --shots is read
            refuse_ignored(cls, parsed, ("task", "shots"), "builds a task's prompt pairs, and --clean/--corrupted "
                           "give the pair", "drop it, or drop --clean/--corrupted/--answers to use --task")
            return
        from mechkit.patching.pairs import check_pair_task

        task = parsed.get("task", "ioi")  # not `or "ioi"`: --task "" was checked as ioi
        check_pair_task(task)
        if task == "ioi":  # its pairs have no demonstrations
            refuse_ignored(cls, parsed, ("shots",), "sets the demonstrations of an ICL task's prompts, and ioi's "
                           "pairs have none", "drop --shots, or pass an ICL task (--task capitalize)")

    def run(self, ctx: RunContext) -> Result:
        from mechkit.eval.scoring import check_texts_context, fewest_shots
        from mechkit.patching.pairs import PromptPair, aligned, task_pairs
        from mechkit.patching.study import run_study

        opts, m = ctx.options, ctx.model
        if opts["clean"] is not None:
            correct, wrong = opts["answers"].split(",")
            pairs = [PromptPair(opts["clean"], opts["corrupted"], correct, wrong)]
        else:
            wanted = opts["pair"] + opts["pairs"]
            pairs = task_pairs(opts["task"], 4 * wanted + 8, ctx.seed, opts["shots"], m.text_tokenizer())
        kept = aligned(m, pairs, strict=opts["clean"] is not None)[opts["pair"]:][:opts["pairs"]]
        with fewest_shots(self.options):  # every prompt against the context before any work, --shots' least known
            check_texts_context(m, [text for p, _ in kept for text in (p.clean, p.corrupted)])
        with ctx.progress() as bar:
            job = bar.add_task("patching prompt pairs", total=len(kept))
            study = run_study(m, [toks for _, toks in kept], opts["method"], opts["batch_size"], step=ctx.step,
                              on_pair=lambda: bar.advance(job))
        results = _results(study, [vars(p) for p, _ in kept], opts["method"], ctx.model.anatomy)
        return Result(results=results, figures=_figures(m.anatomy.n_layers, study), finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        from mechkit.report import Table, kv_table

        rows = [[f"{h['layer']}.{h['index']}", h["value"], results["dla_heads"][h["layer"]][h["index"]]]
                for h in results["top_heads"]]
        n = results.get("n_pairs", 1)
        facts = {"clean (first pair)": results["pair"]["clean"], "corrupted (first pair)": results["pair"]["corrupted"],
                 "answers (first pair)": f"{results['pair']['correct']!r} vs {results['pair']['wrong']!r}",
                 "pairs averaged": n, "pairs in the residual map (the first pair's length)": results.get("n_resid_pairs", 1),
                 "method": results.get("method", "exact"),
                 "clean logit difference": results["clean"], "corrupted logit difference": results["corrupted"],
                 "DLA unexplained (frozen final-norm scale)": results["dla_unexplained"]}
        for name, a in (results.get("agreement") or {}).items():
            facts[f"attribution vs exact, {name}: Spearman"] = "undefined" if a["spearman"] is None else a["spearman"]
            facts[f"attribution vs exact, {name}: top-{a['top_k']} overlap"] = a["top_k_overlap"]
        return [Table("Heads whose clean output restores the answer most", ["head", "recovery", "DLA"], rows,
                      digits=3, note="recovery: (patched − corrupted) / (clean − corrupted), denoising hook_z; "
                      "DLA: the head's direct logit difference in the clean run, final-norm scale frozen"
                      + (f"; both averaged over {n} pairs" if n > 1 else "")),
                kv_table("Prompt pairs", facts, digits=3)]


def _results(study, pairs: list[dict], method: str, anatomy) -> dict:
    from mechkit.heads.scores import grid_list  # None where a pruned layer lacks the head

    resid, heads = study.resid, study.heads
    results = {
        "pair": pairs[0], "pairs": pairs, "n_pairs": study.n_pairs, "n_resid_pairs": study.n_resid_pairs,
        "method": method, "tokens": resid.labels, "direction": resid.direction,
        "metric": "logit difference (correct − wrong), last position, averaged over pairs",
        "clean": heads.clean, "corrupted": heads.corrupted,
        "resid_recovery": resid.recovery.tolist(), "head_recovery": grid_list(heads.recovery, anatomy),
        "dla_heads": grid_list(study.dla_heads, anatomy), "dla_attn": study.dla_attn.tolist(), "dla_mlp": study.dla_mlp.tolist(),
        "dla_embed": study.dla_embed, "dla_unexplained": study.dla_unexplained, "lens_logit_diff": study.lens.tolist(),
        "top_heads": _top(heads.recovery, 5), "top_dla_heads": _top(study.dla_heads, 5),
        "top_resid": _top(resid.recovery, 3),
    }
    if study.agreement:
        results["agreement"] = study.agreement
        results["attribution_resid_recovery"] = study.attribution["resid"].recovery.tolist()
        results["attribution_head_recovery"] = grid_list(study.attribution["heads"].recovery, anatomy)
    return results


def _figures(n_layers: int, study) -> dict:
    from mechkit.report import head_heatmap, line_plot

    how = "estimated by attribution patching" if study.resid.direction.endswith("(attribution)") else "exact"
    averaged = f", mean of {study.n_pairs} pairs" if study.n_pairs > 1 else ""
    figures = {
        "resid_pre_recovery": head_heatmap(study.resid.recovery.numpy(), f"Denoising the residual stream (block input, "
                                           f"{how}{averaged if study.n_resid_pairs > 1 else ''})", "normalized recovery",
                                           xlabels=study.resid.labels, xlabel="position"),
        "head_recovery": head_heatmap(study.heads.recovery.numpy(), f"Denoising each head's output (all positions, "
                                      f"{how}{averaged})", "normalized recovery"),
        "dla_heads": head_heatmap(study.dla_heads.numpy(), f"Direct logit attribution per head (clean run{averaged})",
                                  "logit difference"),
        "dla_layers": line_plot(list(range(n_layers)), {"attention": study.dla_attn.tolist(), "MLP": study.dla_mlp.tolist()},
                                f"Direct logit attribution per layer (clean run{averaged})", "layer", "logit difference"),
        "logit_lens": line_plot(list(range(n_layers + 1)), {"logit lens": study.lens.tolist()},
                                f"Logit lens: logit difference of each block's input (clean run{averaged})", "layer",
                                "logit difference"),
    }
    if study.attribution:
        figures["attribution_head_recovery"] = head_heatmap(
            study.attribution["heads"].recovery.numpy(), "Each head's output, estimated by attribution patching",
            "normalized recovery")
    return figures


def _top(grid, k: int) -> list[dict]:
    flat = [i for i in grid.flatten().argsort(descending=True).tolist() if not grid.flatten()[i].isnan()][:k]
    return [{"layer": int(i) // grid.shape[1], "index": int(i) % grid.shape[1], "value": float(grid.flatten()[i])}
            for i in flat]


def finding(results: dict) -> str:
    """Where the clean residual stream restores the answer, which heads carry it, and which write it."""
    r, toks = results["top_resid"][0], results["tokens"]
    heads = ", ".join(f"{h['layer']}.{h['index']} ({h['value']:.0%})" for h in results["top_heads"][:3])
    dla = ", ".join(f"{h['layer']}.{h['index']} ({h['value']:+.2f})" for h in results["top_dla_heads"][:3])
    n = results.get("n_pairs", 1)
    over = f" (mean of {n} pairs)" if n > 1 else ""
    text = (f"Logit difference {results['clean']:+.2f} clean, {results['corrupted']:+.2f} corrupted{over}. Patching "
            f"the clean residual stream into block {r['layer']} at position {r['index']} ({toks[r['index']]!r}) restores "
            f"{r['value']:.0%} of it; the heads whose clean output restores most are {heads}; by direct logit "
            f"attribution (final-norm scale frozen) the heads writing the clean answer most are {dla}.")
    agree = (results.get("agreement") or {}).get("heads")
    if agree:
        rho = "undefined" if agree["spearman"] is None else f"{agree['spearman']:.2f}"
        text += (f" Attribution patching ranks the heads with Spearman {rho} against exact patching "
                 f"(top-{agree['top_k']} overlap {agree['top_k_overlap']:.0%}).")
    return text
