"""``mechkit patch``: activation patching between a clean and a corrupted prompt, with the logit lens
and direct logit attribution of the clean run.

Prompt pairs come from the ``ioi`` task (the repeated subject swapped for the indirect object) or from
``--clean``/``--corrupted`` with ``--answers correct,wrong``. The metric is the logit difference between
the two answers at the last position. Denoising: each clean activation is patched into the corrupted
run (the residual stream at every layer × position, each head's output at every layer), reported as the
normalized recovery ``(patched − corrupted) / (clean − corrupted)``. Algorithms: :mod:`mechkit.patching`.
"""

from __future__ import annotations

from mechkit.options import OptionError
from mechkit.plugin import Option, Plugin, Result, RunContext


class PatchPlugin(Plugin):
    name = "patch"
    version = "0.1.0"
    needs = frozenset({"module_calls"})
    summary = "Activation patching clean -> corrupted (layer x position, layer x head), logit lens and DLA."
    options = (
        Option("task", str, "ioi", "Prompt pairs from this task (ioi: the name swapped); ignored with --clean.",
               choices=("ioi",)),
        Option("clean", str, None, "Clean prompt text (with --corrupted and --answers)."),
        Option("corrupted", str, None, "Corrupted prompt text, the same number of tokens as --clean."),
        Option("answers", str, None, "The clean answer and the competing one, comma-separated (' Mary, John')."),
        Option("pair", int, 0, "Which IOI pair (seeded by --seed).", min=0),
        Option("batch_size", int, 32, "Patches per forward pass.", min=1),
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        given = [k for k in ("clean", "corrupted", "answers") if parsed.get(k) is not None]
        if given and len(given) != 3:
            raise OptionError("--clean, --corrupted and --answers go together; give all three")
        if parsed.get("answers") is not None and len(parsed["answers"].split(",")) != 2:
            raise OptionError("--answers takes two answers, comma-separated: the clean one, then the competing one")

    def run(self, ctx: RunContext) -> Result:
        import mechkit.patching as P
        from mechkit.patching.pairs import PromptPair, ioi_pairs, tokens
        from mechkit.patching.patch import source_cache
        from mechkit.report import head_heatmap, line_plot

        opts, m = ctx.options, ctx.model
        if opts["clean"] is not None:
            correct, wrong = opts["answers"].split(",")
            pair = PromptPair(opts["clean"], opts["corrupted"], correct, wrong)
        else:
            pair = ioi_pairs(opts["pair"] + 1, ctx.seed)[opts["pair"]]
        clean, corrupted, c, w = tokens(m, pair)
        metric = lambda logits: P.logit_diff(logits, c, w)  # noqa: E731
        bs = opts["batch_size"]
        resid = P.denoise(m, clean, corrupted, "hook_resid_pre", metric, batch_size=bs)
        heads = P.denoise(m, clean, corrupted, "attn.hook_z", metric, over="head", batch_size=bs)
        cache = source_cache(m, clean, P.dla_names(m) + P.lens_names(m))
        dla = P.direct_logit_attribution(m, cache, c, w)
        lens = P.logit_diff(P.logit_lens(m, cache)[:, 0], c, w)
        results = {
            "pair": vars(pair), "tokens": resid.labels, "metric": "logit difference (correct − wrong), last position",
            "clean": resid.clean, "corrupted": resid.corrupted, "direction": resid.direction,
            "resid_recovery": resid.recovery.tolist(), "head_recovery": heads.recovery.tolist(),
            "dla_heads": dla.heads[0].tolist(), "dla_attn": dla.attn[0].tolist(), "dla_mlp": dla.mlp[0].tolist(),
            "dla_embed": float(dla.embed[0]), "dla_unexplained": float(dla.unexplained[0]),
            "lens_logit_diff": lens.tolist(),
        }
        results["top_heads"] = _top(heads.recovery, 5)
        results["top_dla_heads"] = _top(dla.heads[0], 5)
        results["top_resid"] = _top(resid.recovery, 3)
        figures = {
            "resid_pre_recovery": head_heatmap(resid.recovery.numpy(), "Denoising the residual stream (block input)",
                                               "normalized recovery", xlabels=resid.labels, xlabel="position"),
            "head_recovery": head_heatmap(heads.recovery.numpy(), "Denoising each head's output (all positions)",
                                          "normalized recovery"),
            "dla_heads": head_heatmap(dla.heads[0].numpy(), "Direct logit attribution per head (clean run)",
                                      "logit difference"),
            "dla_layers": line_plot(list(range(m.n_layers)), {"attention": results["dla_attn"],
                                                              "MLP": results["dla_mlp"]},
                                    "Direct logit attribution per layer (clean run)", "layer", "logit difference"),
            "logit_lens": line_plot(list(range(m.n_layers + 1)), {"logit lens": results["lens_logit_diff"]},
                                    "Logit lens: logit difference of each block's input (clean run)", "layer",
                                    "logit difference"),
        }
        return Result(results=results, figures=figures, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        from mechkit.report import Table, kv_table

        rows = [[f"{h['layer']}.{h['index']}", h["value"], results["dla_heads"][h["layer"]][h["index"]]]
                for h in results["top_heads"]]
        facts = {"clean": results["pair"]["clean"], "corrupted": results["pair"]["corrupted"],
                 "answers": f"{results['pair']['correct']!r} vs {results['pair']['wrong']!r}",
                 "clean logit difference": results["clean"], "corrupted logit difference": results["corrupted"],
                 "DLA unexplained (frozen final-norm scale)": results["dla_unexplained"]}
        return [Table("Heads whose clean output restores the answer most", ["head", "recovery", "DLA"], rows,
                      digits=3, note="recovery: (patched − corrupted) / (clean − corrupted), denoising hook_z; "
                      "DLA: the head's direct logit difference in the clean run, final-norm scale frozen"),
                kv_table("Prompt pair", facts, digits=3)]


def _top(grid, k: int) -> list[dict]:
    flat = grid.flatten().argsort(descending=True)[:k]
    return [{"layer": int(i) // grid.shape[1], "index": int(i) % grid.shape[1], "value": float(grid.flatten()[i])}
            for i in flat]


def finding(results: dict) -> str:
    """Where the clean residual stream restores the answer, which heads carry it, and which write it."""
    r, toks = results["top_resid"][0], results["tokens"]
    heads = ", ".join(f"{h['layer']}.{h['index']} ({h['value']:.0%})" for h in results["top_heads"][:3])
    dla = ", ".join(f"{h['layer']}.{h['index']} ({h['value']:+.2f})" for h in results["top_dla_heads"][:3])
    return (f"Logit difference {results['clean']:+.2f} clean, {results['corrupted']:+.2f} corrupted. Patching the "
            f"clean residual stream into block {r['layer']} at position {r['index']} ({toks[r['index']]!r}) restores "
            f"{r['value']:.0%} of it; the heads whose clean output restores most are {heads}; by direct logit "
            f"attribution (final-norm scale frozen) the heads writing the clean answer most are {dla}.")
