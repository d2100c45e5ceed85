"""Weight-space task vectors and task arithmetic (the seeds' ΔΨ_T = Ψ*_T − Ψ0, Ψ = Ψ0 + Σ λ_i ΔΨ_i).

>>> import mechkit as mk
>>> from mechkit import taskarith as ta
>>> m = mk.load_model("llama")                                   # doctest: +SKIP
>>> cap = ta.extract(m, "runs/ft-capitalize")                    # doctest: +SKIP
>>> past = ta.extract(m, "runs/ft-past-tense")                   # doctest: +SKIP
>>> with ta.apply(m, [(cap, 1.0), (past, 1.0)]):                 # doctest: +SKIP
...     mk.score_prompts(m, mk.build_prompts("past-tense", n=20, shots=0))

Parameter names are HuggingFace's (``model.named_parameters()``); see :mod:`.vector`.
"""

from mechkit.taskarith.apply import TaskArithmetic, apply, arithmetic, save_merged
from mechkit.taskarith.compress import low_rank, sparsify
from mechkit.taskarith.expr import evaluate_expression
from mechkit.taskarith.extract import extract
from mechkit.taskarith.merge import METHODS, merge
from mechkit.taskarith.similarity import task_correlation
from mechkit.taskarith.vector import TaskVector, analogy, layer_of

__all__ = ["METHODS", "TaskArithmetic", "TaskVector", "analogy", "apply", "arithmetic", "evaluate_expression",
           "extract", "layer_of", "low_rank", "merge", "save_merged", "sparsify", "task_correlation"]
