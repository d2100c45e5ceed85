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
# # Task vectors: in weight space and in activation space
#
# A **task vector** is a direction that carries a task. In weight space it is the difference between a
# fine-tuned model and its base, τ = Ψ_ft − Ψ0 (Ilharco et al., *Editing Models with Task Arithmetic*):
# adding it teaches the task, subtracting it unlearns it. In activation space it is a residual-stream
# vector read off in-context demonstrations (Hendel et al., *In-Context Learning Creates Task Vectors*):
# patched into a zero-shot prompt, it makes the model do the task without any demonstration.

# %% tags=["parameters"]
MODEL = "llama"   # the embedded model; "tiny:llama" runs in seconds
TASK = "capitalize"
STEPS = 60        # fine-tuning steps for the task model
N = 20            # held-out prompts
N_CONTEXTS = 16   # demonstrations sets averaged into the activation vector

# %%
import tempfile
from pathlib import Path

import mechkit as mk
from mechkit import taskarith

m = mk.load_model(MODEL)
work = Path(tempfile.mkdtemp(prefix="mechkit-tutorial-"))

# %% [markdown]
# ## 1. A task model to take the vector from
#
# `finetune` trains a copy of the model on the task (the loss on the answer only) and writes it as a
# model directory beside its report.

# %%
ft = mk.run("finetune", model=m, task=TASK, steps=STEPS, out=work / "ft")
ft

# %% [markdown]
# ## 2. τ = Ψ_ft − Ψ0, and what adding it does
#
# `taskarith.extract` takes the difference parameter by parameter; `taskarith.apply` adds λ·τ to the
# weights inside a `with` block and restores them bit for bit when the block ends.

# %%
tau = taskarith.extract(m, ft.out_dir)
tau

# %%
held_out = mk.build_prompts(TASK, n=N, shots=0, seed=123)
print(f"base model, zero-shot: accuracy {mk.score_prompts(m, held_out).accuracy:.2f}")
for scale in (0.5, 1.0, -1.0):
    with taskarith.apply(m, tau, scale=scale):
        score = mk.score_prompts(m, held_out)
    print(f"Ψ0 {scale:+.1f}·τ: accuracy {score.accuracy:.2f}, answer log-prob {score.logprob:.2f}")
print(f"restored: accuracy {mk.score_prompts(m, held_out).accuracy:.2f}")

# %% [markdown]
# ## 3. The activation-space version: ICL task vectors
#
# `icl-vectors` averages the residual stream at the last token of many few-shot prompts, picks the
# layer where patching that vector into zero-shot prompts helps most on a dev split, and reports
# zero-shot accuracy with and without it on held-out prompts.

# %%
icl = mk.run("icl-vectors", model=m, write=False, tasks="country-capital", method="task-vector", n=N,
             n_dev=max(4, N // 2), n_contexts=N_CONTEXTS)
icl

# %% [markdown]
# The weight-space vector needs a fine-tune and changes the model everywhere; the activation vector
# needs only demonstrations and acts at one layer and position. The analysis pages
# (taskvec and icl-vectors) give the full measured results on the embedded model.
