# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---


# %% [markdown]
# # Writing and registering a plugin
#
# A plugin is a class with a name, options and a `run` method that returns results, tables and figures.
# mechkit gives it the loaded model, checked options, a seed, progress and resumable steps, and writes
# `report.json` and `report.html` for it. Installed with an entry point, it becomes a `mechkit` command.
#
# This plugin scores each head by how much attention it pays to the first token (an "attention sink").

# %% tags=["parameters"]
MODEL = "llama"   # the embedded model; "tiny:llama" runs in seconds
N = 8             # prompts

# %%
import torch

import mechkit as mk
from mechkit.report import head_heatmap


class SinkHeads(mk.Plugin):
    name = "sink-heads"
    version = "0.1.0"
    summary = "Score heads by attention to the first token."
    options = (
        mk.Option("task", str, "capitalize", "Task whose prompts are used."),
        mk.Option("n", int, 8, "Prompts.", min=1),
    )

    def run(self, ctx: mk.RunContext) -> mk.Result:
        model, opts = ctx.model, ctx.options
        totals = torch.zeros(model.anatomy.n_layers, model.anatomy.n_heads)

        def to_first_token(pattern, point):  # pattern: [batch, heads, query, key]
            totals[point.layer] += pattern[0, :, 1:, 0].mean(dim=-1).float().cpu()

        prompts = mk.build_prompts(opts["task"], n=opts["n"], seed=ctx.seed)
        for prompt in prompts:
            with mk.hooks(model, {"blocks.*.attn.hook_pattern": to_first_token}):
                model(model.to_tokens(prompt.text))
        scores = (totals / len(prompts)).tolist()
        layer, head = divmod(int(torch.tensor(scores).argmax()), model.anatomy.n_heads)
        return mk.Result(
            results={"scores": scores, "top": {"layer": layer, "head": head, "score": scores[layer][head]}},
            figures={"sink_scores": head_heatmap(scores, "Attention to the first token", "mean attention",
                                                 highlight=[(layer, head)])},
            finding=f"Head {layer}.{head} puts {scores[layer][head]:.2f} of its attention on the first token.",
        )


# %% [markdown]
# `figures` maps a name to a matplotlib figure; mechkit saves each as a PNG beside the report and embeds
# it in `report.html` (the first one is the headline figure). `results` must be JSON-serialisable.
#
# ## Run it from Python

# %%
run = mk.run(SinkHeads, model=MODEL, write=False, n=N)
run

# %% [markdown]
# ## Register it as a command
#
# An installed package declares the plugin in its `pyproject.toml`:
#
# ```toml
# [project.entry-points."mechkit.plugins"]
# sink-heads = "mechkit_sink_heads:SinkHeads"
# ```
#
# `pip install -e .` writes that entry point into the package's metadata, where mechkit finds it. The cell
# below writes the same metadata by hand into a temporary directory on `sys.path`, which is all an
# installation does for discovery, and then finds the plugin through mechkit's registry.

# %%
import sys
import tempfile
from pathlib import Path

site = Path(tempfile.mkdtemp(prefix="mechkit-plugin-"))
(site / "my_sink_heads.py").write_text("from __main__ import SinkHeads\n")
dist = site / "my_sink_heads-0.1.0.dist-info"
dist.mkdir()
(dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-sink-heads\nVersion: 0.1.0\n")
(dist / "entry_points.txt").write_text("[mechkit.plugins]\nsink-heads = my_sink_heads:SinkHeads\n")
sys.path.insert(0, str(site))

from mechkit import registry

print(sorted(registry.entries()))
assert registry.get("sink-heads") is SinkHeads
mk.run("sink-heads", model=MODEL, write=False, n=N).report["finding"]

# %% [markdown]
# The plugin guide in the docs gives the complete package layout (`pyproject.toml`, the module, a test)
# and what every part of a `Result` means.
