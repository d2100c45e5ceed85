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
# # Induction heads, end to end
#
# Induction heads complete patterns: having seen `… A B … A`, they attend from the second `A` to the
# token after the first one and copy `B`. This tutorial finds them, looks at one, and proves that they
# matter for in-context learning by removing them — against removing as many random heads — and by
# shuffling their query–key weights.
#
# The outputs below come from the embedded model (SmolLM2-135M, `MODEL = "llama"`); the test suite runs
# the same notebook on a tiny random model by changing the parameters cell.

# %% tags=["parameters"]
MODEL = "llama"   # the embedded model; "tiny:llama" runs in seconds
N = 20            # prompts per task
N_SEQS = 50       # random sequences for detection
K = 10            # how many top heads to ablate and shuffle
SEEDS = 3         # random-head draws for the baselines

# %%
import matplotlib.pyplot as plt
import torch

import mechkit as mk

m = mk.load_model(MODEL)
m

# %% [markdown]
# ## 1. Find them: `detect`
#
# `detect` runs repeated random token sequences (a random segment, then the same segment again) and
# scores every head: the **induction score** is the attention from each token of the repeat to the token
# after its earlier copy. The returned run renders its report inline: the finding, the headline heatmap
# and the tables.

# %%
detect = mk.run("detect", model=m, write=False, n_seqs=N_SEQS)
detect

# %%
top = detect.results["top"]["induction"][:5]
top

# %% [markdown]
# ## 2. Look at one
#
# Record the attention pattern (`attn.hook_pattern`) of the strongest induction head on one repeated
# sequence. The stripe one below the diagonal's offset is the induction signature: each token of the
# second copy attends to the token *after* its first occurrence.

# %%
from mechkit.tasks import repeated_random_tokens

seq = torch.as_tensor(repeated_random_tokens(m.tokenizer.vocab_size, n_seqs=1, seg_len=20, seed=1,
                                             bos_id=m.bos_id))
layer, head = top[0]["layer"], top[0]["head"]
with mk.record(m, f"blocks.{layer}.attn.hook_pattern") as cache:
    m(seq)
pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0, head].float()

fig, ax = plt.subplots(figsize=(4.5, 4))
ax.imshow(pattern, cmap="Blues")
ax.set(title=f"head {layer}.{head} on a repeated sequence", xlabel="source", ylabel="query")
plt.show()

# %% [markdown]
# ## 3. Prove they matter: ablate the top heads against random heads
#
# `ablate` zeroes the top-K induction heads and measures few-shot accuracy on in-context tasks, then does
# the same with K random heads (several draws), so the effect is compared with a fair baseline.

# %%
ablate = mk.run("ablate", model=m, write=False, heads="induction", top_k=K, tasks="capitalize,country-capital",
                n=N, baseline_seeds=SEEDS, n_seqs=N_SEQS)
ablate

# %% [markdown]
# ## 4. Shuffle instead of delete
#
# Ablation removes a head's output entirely. `shuffle` keeps every head's output but permutes the
# query–key weights among the selected heads, so each head attends where another would: if accuracy
# still drops, it is *where* the induction heads attend that matters.

# %%
shuffle = mk.run("shuffle", model=m, write=False, heads="induction", top_k=K, tasks="capitalize,country-capital",
                 n=N, seeds=SEEDS, n_seqs=N_SEQS)
shuffle

# %% [markdown]
# ## What to take away
#
# The three findings above (the detect heatmap, the ablation against random heads, the shuffle) are the
# end-to-end argument: the heads are found by a mechanistic score, and their role in in-context learning
# is shown causally against a baseline. The same three commands exist on the command line:
# `mechkit detect`, `mechkit ablate --heads induction`, `mechkit shuffle --heads induction`.
