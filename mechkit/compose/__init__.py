"""Composition: can a model that solves two tasks in context solve their composite, and which
components does composing need? The seeds' study (000, Ch. 4; proposed work §6.2) as code.

- :mod:`~mechkit.compose.settings` — the prompt sets: each simple task, ``composite``,
  ``composite-in-context`` and Definition 4.4.1's S_k, S_g, S_k ∪ S_g, one query stream for all.
- :mod:`~mechkit.compose.stepwise` — the intermediate-step setting (``f(x) -> g(f(x))``
  demonstrations) and its scorer, which counts the final part.
- :mod:`~mechkit.compose.study` — accuracy per setting over shots and seeds, the
  compositional-ability test and the compositional gap.
- :mod:`~mechkit.compose.components` — ablation effects of every head and MLP block on the
  composite vs on each simple task, and the composite-specific effect that ranks them.
- :mod:`~mechkit.compose.strengthen` — scale the selected heads (or add their in-context mean
  output) vs the same treatment of random heads.
- :mod:`~mechkit.compose.analysis` — :class:`ComposeStudy`: the four parts over a model, each long
  unit a resumable step (what the ``compose`` plugin runs).
- :mod:`~mechkit.compose.tables` and :mod:`~mechkit.compose.plots` — the seeds' Table 4.4, the
  summary lines and the figures (as data for :mod:`mechkit.report`'s plot functions).

Names are imported from their modules on first use, so parsing ``--pairs`` / ``--parts``
(:mod:`~mechkit.compose.settings`) does not import torch.

The logical-operation tasks (negation, conjunction, disjunction and their composites) live with
the other tasks, in :mod:`mechkit.tasks.logic`.

>>> import mechkit as mk
>>> from mechkit import compose
>>> m = mk.load_model("tiny:llama")
>>> cell = compose.evaluate_cell(m, "capitalize+plus-one", shots=2, seed=0, n=2)
>>> compose.ability_test(cell["only:capitalize"]["accuracy"], cell["only:plus-one"]["accuracy"],
...                      cell["composite"]["accuracy"])["holds"] in (True, False)
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mechkit.lazy import lazy_attributes

if TYPE_CHECKING:
    from mechkit.compose.analysis import OFFSETS, ComposeConfig, ComposeStudy
    from mechkit.compose.components import (
        METHODS,
        MLP_MODES,
        ComponentEffects,
        component_effects,
        composite_specific,
        exact_head_effects,
        mlp_means,
        ranks_of,
    )
    from mechkit.compose.settings import (
        PARTS,
        composite_task,
        definition_prompts,
        demonstrations,
        only,
        parse_pairs,
        parse_parts,
        simple,
        study_prompts,
    )
    from mechkit.compose.stepwise import STEPS, StepsScore, chains, score_steps, split_chain, steps_prompts
    from mechkit.compose.strengthen import (
        TREATMENTS,
        choose_strength,
        head_vector_edits,
        random_draws,
        scale_heads,
    )
    from mechkit.compose.study import (
        STEPS_SETTING,
        ability_test,
        compositional_gap,
        evaluate_cell,
        summarize,
        word_accuracy,
    )
    from mechkit.compose.tables import accuracy_by_setting, summary_lines

_MODULES = {  # module -> the names it exports here
    "analysis": ("ComposeConfig", "ComposeStudy", "OFFSETS"),
    "components": ("METHODS", "MLP_MODES", "ComponentEffects", "component_effects", "composite_specific",
                   "exact_head_effects", "mlp_means", "ranks_of"),
    "settings": ("PARTS", "composite_task", "definition_prompts", "demonstrations", "only", "parse_pairs",
                 "parse_parts", "simple", "study_prompts"),
    "stepwise": ("STEPS", "StepsScore", "chains", "score_steps", "split_chain", "steps_prompts"),
    "strengthen": ("TREATMENTS", "choose_strength", "head_vector_edits", "random_draws", "scale_heads"),
    "study": ("STEPS_SETTING", "ability_test", "compositional_gap", "evaluate_cell", "summarize", "word_accuracy"),
    "tables": ("accuracy_by_setting", "summary_lines"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "METHODS",
    "MLP_MODES",
    "OFFSETS",
    "PARTS",
    "STEPS",
    "STEPS_SETTING",
    "TREATMENTS",
    "ComponentEffects",
    "ComposeConfig",
    "ComposeStudy",
    "StepsScore",
    "ability_test",
    "accuracy_by_setting",
    "chains",
    "choose_strength",
    "component_effects",
    "composite_specific",
    "composite_task",
    "compositional_gap",
    "definition_prompts",
    "demonstrations",
    "evaluate_cell",
    "exact_head_effects",
    "head_vector_edits",
    "mlp_means",
    "only",
    "parse_pairs",
    "parse_parts",
    "random_draws",
    "ranks_of",
    "scale_heads",
    "score_steps",
    "simple",
    "split_chain",
    "steps_prompts",
    "study_prompts",
    "summarize",
    "summary_lines",
    "word_accuracy",
]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, globals())
