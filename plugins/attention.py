"""``mechkit attention``: where the chosen heads attend on a prompt, as an interactive page that works offline.

The report's page holds the prompt as text, the layer × head grid (hover a head to see its pattern,
click to keep it), the pattern as a token × token matrix with each query's top source marked, and the
prompt per head, tinted by its attention from a query token you click: :func:`mechkit.show_attention`'s
view, which a notebook shows inline. The results count each head's induction stripe on the prompt: of the
tokens seen before, how many attend most to the token after their earlier occurrence.
"""

from __future__ import annotations

from mechkit.options import ExistingPath, HeadSpec, Text
from mechkit.options.unused import refuse_ignored
from mechkit.plugin import Option, Plugin, Result, RunContext

DEFAULT_PROMPT = ("The old lighthouse keeper wrote in his logbook every night. "
                  "The old lighthouse keeper wrote in his logbook every night.")


class AttentionPlugin(Plugin):
    name = "attention"
    version = "0.1.0"
    needs = frozenset({"patterns"})
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Show where heads attend on a prompt: an interactive, offline page of their patterns."
    options = (
        Option("prompt", str, DEFAULT_PROMPT, "The text to look at (a repeated sentence shows induction heads).",
               parse=Text("the prompt")),
        Option("heads", str, "induction", "Head spec: induction, previous-token, random, layer:L or 17.3,18.6.",
               parse=HeadSpec()),
        Option("top_k", int, 10, "k for score-ranked and random head specs.", min=1),
        Option("from_report", str, None, "Read head scores from this detect report.", cli_name="from",
               parse=ExistingPath("detect report (a run directory or its report.json)")),
        Option("n_seqs", int, 20, "Random sequences for head scores (when they are computed).", min=1),
        Option("seg_len", int, 25, "Segment length for head scores (at least 2).", min=2),
    )

    @classmethod
    def check_options(cls, parsed: dict) -> None:
        """Options the heads asked for never read, refused (they were silently ignored): --top-k where every
        head is named, --from and the scoring options where no head is ranked by a score, and --n-seqs and
        --seg-len where the scores come from --from's report."""
        selection = parsed["heads"]
        spec = "--heads " + str(selection)
        if not selection.ranked:
            refuse_ignored(cls, parsed, ("top_k",), f"picks among ranked or random heads, and {spec} names each head",
                           "drop --top-k, or ask for ranked heads (--heads induction, --heads random)")
        if not selection.needs_scores:
            refuse_ignored(cls, parsed, ("from_report", "n_seqs", "seg_len"), f"scores heads to rank them, and {spec} "
                           "ranks none by a score", "drop it, or ask for score-ranked heads (--heads induction)")
        elif parsed["from_report"] is not None:
            refuse_ignored(cls, parsed, ("n_seqs", "seg_len"), "sets how heads are scored here, and --from reads "
                           "the scores of the detect report", "drop it, or drop --from to score the heads now")

    def run(self, ctx: RunContext) -> Result:
        import mechkit as mk
        from mechkit.eval.lengths import check_run_lengths
        from mechkit.heads.scores import load_scores
        from mechkit.report import load_report

        opts, model = ctx.options, ctx.model
        selection = opts["heads"]
        selection.check(model.anatomy.n_layers, model.anatomy.head_counts, [opts["top_k"]], ctx.seed)
        scored = selection.needs_scores and opts["from_report"] is None  # --seg-len and --prompt: refused together
        check_run_lengths(model, opts, ctx.seed, seg_len=scored, prompt=True)
        scores = load_scores(model, load_report(opts["from_report"]) if opts["from_report"] else None, opts["n_seqs"],
                             opts["seg_len"], ctx.seed, ctx.step, opts["from_report"]) if selection.needs_scores else None
        view = mk.show_attention(model, opts["prompt"], heads=selection, seed=ctx.seed, scores=scores,
                                 top_k=opts["top_k"] if selection.ranked else None)
        patterns = view.patterns
        heads = []
        for head in patterns.heads:
            hits, repeats = patterns.stripe(head)
            heads.append({**head.to_dict(), "mean_top_weight": float(patterns.of(head).max(axis=1).mean()),
                          "stripe_hits": hits, "stripe_repeats": repeats,
                          **({"score": scores[_kind(selection)][head.layer][head.head]} if scores else {})})
        results = {"prompt": opts["prompt"], "tokens": patterns.tokens, "heads": heads}
        return Result(results=results, figures={"attention": view.figure()}, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        """One row per head shown: its score (when ranked by one), focus and induction stripe on the prompt."""
        from mechkit.report import Table

        scored = any("score" in h for h in results["heads"])
        rows = [[{"layer": h["layer"], "head": h["head"]}, *([h.get("score")] if scored else []),
                 h["mean_top_weight"], f"{h['stripe_hits']}/{h['stripe_repeats']}"] for h in results["heads"]]
        return [Table(f"Heads on the prompt ({len(results['tokens'])} tokens)",
                      ["head", *(["score"] if scored else []), "mean top weight", "induction stripe"], rows,
                      note="mean top weight: each query's largest attention weight, averaged; induction stripe: of "
                           "the tokens seen before, how many attend most to the token after their earlier occurrence")]


def _kind(selection) -> str:
    return next(item[1] for item in selection.items if item[0] == "score")


def finding(results: dict) -> str:
    """The head whose top sources follow the induction stripe most often on this prompt.

    >>> finding({"tokens": ["a"] * 12, "heads": [{"layer": 3, "head": 1, "stripe_hits": 5, "stripe_repeats": 6},
    ...                                          {"layer": 2, "head": 0, "stripe_hits": 1, "stripe_repeats": 6}]})
    'On this 12-token prompt, head 3.1 attends most to the token after the earlier occurrence for 5 of 6 repeated tokens (next: 2.0, 1 of 6); 2 heads are shown.'
    """
    heads = sorted(results["heads"], key=lambda h: -h["stripe_hits"])
    n = len(results["tokens"])
    if not heads or not heads[0]["stripe_repeats"]:
        return f"On this {n}-token prompt no token repeats, so there is no induction stripe to count; " \
               f"{len(heads)} heads are shown."
    best = heads[0]
    text = (f"On this {n}-token prompt, head {best['layer']}.{best['head']} attends most to the token after the "
            f"earlier occurrence for {best['stripe_hits']} of {best['stripe_repeats']} repeated tokens")
    if len(heads) > 1:
        nxt = heads[1]
        text += f" (next: {nxt['layer']}.{nxt['head']}, {nxt['stripe_hits']} of {nxt['stripe_repeats']})"
    return text + f"; {len(heads)} heads are shown."
