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

from __future__ import annotations

from typing import TYPE_CHECKING

from mechkit.lazy import lazy_attributes

if TYPE_CHECKING:
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
        VectorConfig,
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

# Imported on first use (PEP 562), so that reading a report's results (its tables, its finding)
# never loads torch through this package.
_MODULES = {  # module -> the names it exports here
    "edits": ("Edits", "ResidEdit", "apply_vector", "patch_last_token", "patched_accuracy", "score_edited"),
    "function_vectors": ("function_vector", "head_contributions", "indirect_effects", "mean_head_outputs"),
    "select": ("choose", "choose_layer", "parse_layers", "parse_scales", "parse_spans"),
    "study": ("VectorConfig", "VectorStudy", "baselines", "conditions", "extract", "extracted_vector", "held_out_prompts", "sweep"),
    "task_vectors": ("icl_task_vectors",),
    "vector": ("METHODS", "ActivationVector"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "METHODS",
    "ActivationVector",
    "Edits",
    "ResidEdit",
    "VectorConfig",
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


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, globals())
