"""Activation-space task vectors: one vector that stands in for the demonstrations.

Two kinds, both written at the last token of a zero-shot prompt ``input: Q\\noutput:``:

- ICL task vectors (Hendel et al. 2023; :mod:`mechkit.actvec.task_vectors`) *replace* the residual
  stream after block L with its mean over demonstrations + a dummy query;
- function vectors (Todd et al. 2024; :mod:`mechkit.actvec.function_vectors`) *add* the summed mean
  outputs of the heads with the largest indirect effect.

:mod:`~mechkit.actvec.edits` writes and scores them, :mod:`~mechkit.actvec.vector` is the saved
file, :mod:`~mechkit.actvec.select` picks the layer (scale, span) on dev prompts, and
:mod:`~mechkit.actvec.study` runs a whole task: held-out prompt sets, extraction, the dev choice,
the test curve and the conditions with and without the vector.

>>> import mechkit as mk
>>> from mechkit import actvec
>>> m = mk.load_model("tiny:llama")
>>> theta = actvec.icl_task_vectors(m, "capitalize", n_contexts=2, shots=2)
>>> tuple(theta.shape) == (m.anatomy.n_layers, m.anatomy.d_model)
True
"""

from mechkit.actvec.edits import (
    Edits,
    ResidEdit,
    apply_vector,
    patch_last_token,
    patched_accuracy,
    score_edited,
)
from mechkit.actvec.function_vectors import (
    function_vector,
    head_contributions,
    indirect_effects,
    mean_head_outputs,
)
from mechkit.actvec.select import choose, choose_layer, parse_layers, parse_scales, parse_spans
from mechkit.actvec.study import (
    VectorStudy,
    baselines,
    conditions,
    extract,
    extracted_vector,
    held_out_prompts,
    sweep,
)
from mechkit.actvec.task_vectors import icl_task_vectors
from mechkit.actvec.vector import METHODS, ActivationVector

__all__ = [
    "METHODS",
    "ActivationVector",
    "Edits",
    "ResidEdit",
    "VectorStudy",
    "apply_vector",
    "baselines",
    "choose",
    "choose_layer",
    "conditions",
    "extract",
    "extracted_vector",
    "function_vector",
    "head_contributions",
    "held_out_prompts",
    "icl_task_vectors",
    "indirect_effects",
    "mean_head_outputs",
    "parse_layers",
    "parse_scales",
    "parse_spans",
    "patch_last_token",
    "patched_accuracy",
    "score_edited",
    "sweep",
]
