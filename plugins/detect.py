"""``mechkit detect``: score every head as induction / previous-token / duplicate-token head.

Scores come from attention on repeated random tokens (see :mod:`mechkit.heads.scores`); the report
also carries each head's OV copying score and the per-position loss, whose sharp fall on the
second copy is the in-context-learning signature induction heads produce.
"""

from __future__ import annotations

from mechkit.plugin import Option, Plugin, Result, RunContext

KIND_CHOICES = ("all", "induction", "previous-token", "duplicate-token")


def detect_heads(ctx: RunContext, n_seqs: int, seg_len: int, batch_size: int):
    """Head scores on seeded repeated random tokens (shared by the plugins that rank heads); each batch
    is a resumable step."""
    from mechkit.heads.scores import head_scores, repeated_tokens

    tokens = repeated_tokens(ctx.model, n_seqs=n_seqs, seg_len=seg_len, seed=ctx.seed)
    return head_scores(ctx.model, tokens, seg_len, batch_size=batch_size, step=ctx.step)


def ranked(scores, k: int) -> list[dict]:
    from mechkit.model.headspec import top_heads

    return [{**h.to_dict(), "score": float(scores[h.layer][h.head])} for h in top_heads(scores, k)]


class DetectPlugin(Plugin):
    name = "detect"
    version = "0.1.0"
    needs = frozenset({"patterns"})
    pruned = frozenset({"neurons", "heads", "uneven-heads", "layers"})  # docs/analyses/prune.md
    summary = "Score every head as an induction, previous-token or duplicate-token head on repeated random tokens."
    options = (
        Option("kind", str, "all", "Which scores to rank and plot.", choices=KIND_CHOICES),
        Option("n_seqs", int, 50, "Number of random sequences.", min=1),
        Option("seg_len", int, 25, "Length of the repeated segment (at least 2).", min=2),
        Option("top_k", int, 10, "How many top heads to list per kind.", min=1),
        Option("batch_size", int, 16, "Sequences per forward pass.", min=1),
        Option("reference", str, "none", "Also run this detector on the same sequences and record the agreement "
               "(Spearman, top-k overlap): transformer_lens (TransformerLens' head detector).",
               choices=("none", "transformer_lens")),
    )

    def run(self, ctx: RunContext) -> Result:
        from mechkit.heads.scores import KINDS, grid_list, ov_copying_scores, repeated_tokens
        from mechkit.model.backends.weight_reads import read_weights
        from mechkit.model.headspec import top_heads
        from mechkit.report import head_heatmap, line_plot, record_patterns

        opts = ctx.options
        if opts["reference"] == "transformer_lens":  # before any work: TransformerLens installed, weights local
            from mechkit.model.transformer_lens import check_bridgeable

            check_bridgeable(ctx.model)
        hs = detect_heads(ctx, opts["n_seqs"], opts["seg_len"], opts["batch_size"])
        kinds = KINDS if opts["kind"] == "all" else (opts["kind"],)
        copying = read_weights(ctx.model, ov_copying_scores)  # on a remote model: on its server, one job
        results = {
            "scores": {k: grid_list(hs.scores[k], ctx.model.anatomy) for k in KINDS},  # None where a pruned layer has no such head
            "top": {k: ranked(hs.scores[k], opts["top_k"]) for k in kinds},
            "ov_copying": grid_list(copying, ctx.model.anatomy),
            "top_induction_copying": [float(copying[h.layer, h.head])
                                      for h in top_heads(hs.scores["induction"], opts["top_k"])],
            "loss_per_position": hs.loss_per_position.tolist(),
            "loss_first_copy": hs.loss_first_copy,
            "loss_second_copy": hs.loss_second_copy,
            "summary": {f"top {k}": ", ".join(f"{h['layer']}.{h['head']} ({h['score']:.2f})"
                                              for h in ranked(hs.scores[k], 5)) for k in kinds},
        }
        results["summary"]["loss first → second copy"] = f"{hs.loss_first_copy:.2f} → {hs.loss_second_copy:.2f}"
        # every head's pattern on the first detection sequence: a click on a score grid opens it on the page
        patterns = record_patterns(ctx.model, repeated_tokens(ctx.model, 1, opts["seg_len"], ctx.seed),
                                   name="the first detection sequence")
        figures = {
            f"{k}_scores": head_heatmap(hs.scores[k], f"{k} score", "mean attention", patterns=patterns,
                                        highlight=[(h.layer, h.head) for h in top_heads(hs.scores[k], opts["top_k"])])
            for k in kinds
        }
        figures["ov_copying"] = head_heatmap(copying, "OV copying score (Σλ/Σ|λ|)", "copying")
        positions = list(range(1, len(hs.loss_per_position) + 1))
        figures["loss_per_position"] = line_plot(positions, {"loss": hs.loss_per_position.tolist()},
                                                 "Loss per position on repeated random tokens",
                                                 "position", "cross-entropy (nats)")
        if opts["reference"] == "transformer_lens":
            from mechkit.heads.reference import transformer_lens_reference

            tokens = repeated_tokens(ctx.model, n_seqs=opts["n_seqs"], seg_len=opts["seg_len"], seed=ctx.seed)
            results["reference"] = ctx.step("reference|transformer_lens", lambda: transformer_lens_reference(
                ctx.model, tokens, {k: hs.scores[k] for k in KINDS}, opts["top_k"]))
            for kind, agree in results["reference"]["agreement"].items():
                rho = "n/a" if agree["spearman"] is None else f"{agree['spearman']:.2f}"
                results["summary"][f"vs TransformerLens: {kind}"] = (
                    f"Spearman {rho}, top-{agree['top_k']} overlap {agree['top_k_overlap']:.0%}")
        return Result(results=results, figures=figures, finding=finding(results))

    @classmethod
    def tables(cls, results: dict) -> list:
        """Rank × kind: the top heads and their scores (the layer × head grids are the heatmaps)."""
        from mechkit.report import Table, kv_table

        top = results["top"]
        kinds = list(top)
        columns, rows = ["rank"], []
        for kind in kinds:
            columns += [f"{kind} head", f"{kind} score"] + (["OV copying"] if kind == "induction" else [])
        for i in range(max(len(v) for v in top.values())):
            row: list = [i + 1]
            for kind in kinds:
                h = top[kind][i] if i < len(top[kind]) else None
                row += [{"layer": h["layer"], "head": h["head"]} if h else None, h["score"] if h else None]
                if kind == "induction":
                    copying = results.get("top_induction_copying") or []
                    row.append(copying[i] if i < len(copying) else None)
            rows.append(row)
        first, second = results.get("loss_first_copy"), results.get("loss_second_copy")
        loss = {"first copy": first, "second copy": second,
                "drop": None if first is None or second is None else first - second}
        return [Table("Top heads by score", columns, rows,
                      note="score: mean attention to the kind's target position on repeated random tokens; "
                           "OV copying: Σλ/Σ|λ| of the head's OV circuit"),
                kv_table("Loss on repeated random tokens (nats)", loss)]


def finding(results: dict) -> str:
    """The strongest heads of each ranked kind and the loss drop on the repeated half.

    >>> finding({"top": {"induction": [{"layer": 1, "head": 2, "score": 0.83}, {"layer": 0, "head": 3, "score": 0.5}]},
    ...          "loss_first_copy": 5.48, "loss_second_copy": 2.1})
    'The strongest induction head is 1.2 (score 0.83; next 0.3 at 0.50); the loss falls from 5.48 nats on the first copy of the random tokens to 2.10 on the repeat.'
    """
    parts = []
    for kind, heads in results["top"].items():
        if heads:
            best = heads[0]
            nxt = ", ".join(f"{h['layer']}.{h['head']} at {h['score']:.2f}" for h in heads[1:3])
            parts.append(f"the strongest {kind} head is {best['layer']}.{best['head']} (score {best['score']:.2f}"
                         + (f"; next {nxt})" if nxt else ")"))
    text = "; ".join(parts[:2]) if parts else "no heads were ranked"
    first, second = results.get("loss_first_copy"), results.get("loss_second_copy")
    if first is not None and second is not None:
        verb = "falls" if second < first else "rises" if second > first else "stays"
        text += (f"; the loss {verb} from {first:.2f} nats on the first copy of the random tokens to "
                 f"{second:.2f} on the repeat")
    return text[0].upper() + text[1:] + "."
