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
# # Pruning a model for a task, and checking the saved model
#
# `prune` removes attention heads, MLP channels or whole layers, ranked by an interpretability guide
# (attribution scores, Wanda, magnitude, …) against a random guide, then refits what follows each cut by
# least squares on calibration prompts — no retraining. It measures accuracy, perplexity, parameters and
# speed for each guide, and with `save_model=True` writes the pruned model as a directory of safetensors
# that loads like any other model.

# %% tags=["parameters"]
MODEL = "llama"       # the embedded model; "tiny:llama" runs in seconds
TASK = "capitalize"
SPARSITY = "0.2"      # a fifth of the heads
N = 20                # prompts per task
CALIB = 16            # calibration prompts per task
SHOTS = 10            # demonstrations per prompt

# %%
import tempfile
from pathlib import Path

import mechkit as mk

m = mk.load_model(MODEL)
work = Path(tempfile.mkdtemp(prefix="mechkit-tutorial-"))

# %% [markdown]
# ## 1. Prune heads by attribution, against random

# %%
prune = mk.run("prune", model=m, out=work / "prune", target="heads", guide="attribution,random",
               sparsity=SPARSITY, tasks=TASK, n=N, calib=CALIB, shots=SHOTS, save_model=True, repeats=3)
prune

# %% [markdown]
# ## 2. Load the saved model and check it
#
# The saved directory holds the first guide's model (here attribution). Reload it as a user would, and
# check three things: it has the parameter count the report claims, fewer heads than the dense model,
# and its accuracy on fresh prompts.

# %%
saved = prune.out_dir / "model"
small = mk.load_model(saved)
row = next(r for r in prune.results["rows"] if r["guide"] == "attribution")
n_params = sum(p.numel() for p in small.model.parameters())
print(f"parameters: {n_params:,} saved, {row['params']:,} in the report, {prune.results['dense']['params']:,} dense")
assert n_params == row["params"]
small

# %%
fresh = mk.build_prompts(TASK, n=N, shots=SHOTS, seed=321)
dense_score, small_score = mk.score_prompts(m, fresh), mk.score_prompts(small, fresh)
print(f"accuracy on {N} fresh prompts: dense {dense_score.accuracy:.2f}, pruned {small_score.accuracy:.2f}")

# %% [markdown]
# The same run from the command line is
# `mechkit prune --target heads --guide attribution,random --sparsity 0.2 --tasks capitalize --save-model`;
# the pruning page of the docs gives the measured frontier on the embedded model.
