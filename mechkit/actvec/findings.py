"""What an ``icl-vectors`` run's results say: where each vector was written, mean accuracies, the finding.

Derived from the results alone, so a report reads the same without a model.
"""

from __future__ import annotations

SHORT = {"task-vector": "TV", "function-vector": "FV"}
"""How tables and series name the two methods."""


def mean_accuracy(row: dict, tasks: list[str]) -> float | None:
    """A condition's accuracy averaged over ``tasks``; None where a task has none."""
    values = [row.get(t) for t in tasks]
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def where_written(results: dict, method: str, task: str) -> str:
    """Where the vector was written: ``L12``, ``L12-13`` for a span, ``×4`` for a function-vector scale."""
    layer, span = results["chosen_layer"][method][task], results["chosen_span"][method][task]
    scale = results["chosen_scale"][method][task]
    return f"L{layer}" + (f"-{layer + span - 1}" if span != 1 else "") + (f" ×{scale:g}" if scale != 1 else "")


def finding(results: dict) -> str:
    """Zero-shot and ICL accuracy beside zero-shot + each vector (averaged over the tasks when several)."""
    tasks, table = results["tasks"], results["accuracy_table"]

    def acc(condition: str) -> str:
        v = mean_accuracy(table[condition], tasks)
        return "—" if v is None else f"{v:.2f}"

    names = {"task-vector": "the task vector", "function-vector": "the function vector"}
    if len(tasks) == 1:
        where = {m: f" at {where_written(results, m, tasks[0])}" for m in results["methods"]}
        head = f"On {tasks[0]}, zero-shot accuracy is {acc('zero-shot')} and ICL {acc('ICL')}"
    else:
        where = {m: "" for m in results["methods"]}
        head = (f"Averaged over {len(tasks)} tasks, zero-shot accuracy is {acc('zero-shot')} and ICL "
                f"{acc('ICL')}")
    vectors = [f"{names[m]}{where[m]} gives {acc(f'zero-shot + {SHORT[m]}')}" for m in results["methods"]]
    return f"{head}; added to zero-shot prompts, " + " and ".join(vectors) + " (layer chosen on dev prompts)."
