"""A custom head-scoring plugin written against mechkit's public API.

Scores every head by how much attention it puts on the first token (an "attention sink"), on
the task prompts of your choice, and plots the layer × head map. Install it and it becomes a
command::

    pip install -e examples/custom_plugin
    mechkit sink-heads --model llama --tasks capitalize
"""

from __future__ import annotations

import mechkit as mk


class SinkHeads(mk.Plugin):
    name = "sink-heads"
    version = "0.1.0"
    summary = "Score heads by attention to the first token (attention sinks) on task prompts."
    options = (
        mk.Option("tasks", str, "capitalize", "Task ids whose prompts are used."),
        mk.Option("n", int, 8, "Prompts per task."),
        mk.Option("top_k", int, 10, "How many heads to list."),
    )

    def run(self, ctx: mk.RunContext) -> mk.Result:
        import torch

        from mechkit.model.headspec import top_heads
        from mechkit.report import head_heatmap
        from mechkit.tasks import parse_tasks

        model, opts = ctx.model, ctx.options
        anatomy = model.anatomy
        totals = torch.zeros(anatomy.n_layers, anatomy.n_heads)
        count = 0

        def to_first_token(pattern, point):  # pattern: [batch, heads, query, key]
            totals[point.layer] += pattern[:, :, 1:, 0].mean(dim=(0, 2)).float().cpu()

        for task in parse_tasks(opts["tasks"]):
            for prompt in mk.build_prompts(task, n=opts["n"], seed=ctx.seed):
                with torch.no_grad(), mk.hooks(model, {"blocks.*.attn.hook_pattern": to_first_token}):
                    model(model.to_tokens(prompt.text))
                count += 1
        scores = (totals / count).tolist()
        best = top_heads(scores, opts["top_k"])
        return mk.Result(
            results={"scores": {"sink": scores},
                     "top": [{**h.to_dict(), "score": scores[h.layer][h.head]} for h in best]},
            figures={"sink_scores": head_heatmap(scores, "Attention to the first token", "mean attention",
                                                 highlight=[(h.layer, h.head) for h in best])},
        )
