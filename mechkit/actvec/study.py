"""An activation-vector study of one task: extract, choose where on dev, evaluate on held-out test.

What the ``icl-vectors`` plugin reports per task, as plain functions and :class:`VectorStudy`:

- :func:`held_out_prompts` — zero-shot, ICL and shuffled-label versions of the same test queries;
- :func:`extract` — a task vector (θ for every layer) or a function vector (the top-k heads by
  average indirect effect on shuffled-label prompts, their mean outputs projected and summed),
  as JSON-able data, and :func:`extracted_vector`, the :class:`ActivationVector` it makes;
- :func:`sweep` — accuracy and log-prob per (scale, span) config and layer, every cell batched
  into one :func:`~mechkit.actvec.score_edited` call; the dev sweep feeds
  :func:`~mechkit.actvec.select.choose`;
- :func:`baselines` and :func:`conditions` — accuracy without the vector (zero-shot, shuffled-label
  ICL, real ICL) and with it (zero-shot and shuffled-label prompts).

Prompt sets of a study seeded ``s``: extraction contexts ``s``, indirect-effect prompts ``s + 1``,
dev ``s + 2``, test ``s + 3`` (test queries that also occur in dev are replaced). Each set is its
own seed so that no test prompt ever chose the layer or built the vector.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mechkit.actvec.edits import score_edited
from mechkit.actvec.function_vectors import function_vector, indirect_effects, mean_head_outputs
from mechkit.actvec.select import choose
from mechkit.actvec.task_vectors import icl_task_vectors
from mechkit.actvec.vector import METHODS, ActivationVector
from mechkit.errors import MechkitError
from mechkit.heads.scores import grid_list
from mechkit.model.backends.weight_reads import read_weights
from mechkit.model.checks.identity import config_sha256, tokenizer_sha256
from mechkit.model.headspec import top_heads
from mechkit.tasks import build_prompts
from mechkit.tasks.shuffled import shuffled_label_prompts

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

Step = Callable[[str, Callable[[], Any]], Any]
"""``step(key, compute)``: run ``compute()`` (or return its stored result under ``key``)."""

CONTEXTS_SEED, CIE_SEED, DEV_SEED, TEST_SEED = 0, 1, 2, 3  # offsets from the study's seed
BASELINES = (("zero-shot", "zero-shot"), ("shuffled ICL", "shuffled"), ("ICL", "icl"))  # (name, prompt set)


def compute_now(_key: str, compute: Callable[[], Any]) -> Any:
    """The default step: compute now, keep nothing."""
    return compute()


def held_out_prompts(task: str, n: int, shots: int, seed: int, avoid: set[str]) -> dict[str, list]:
    """Zero-shot, ICL and shuffled-label prompts asking the same ``n`` queries, none of them in ``avoid``.

    All three are built from one seed on a pool large enough to drop the avoided queries, so the
    conditions compare the same questions with and without (real or shuffled) demonstrations.

    >>> sets = held_out_prompts("capitalize", n=3, shots=2, seed=3, avoid=set())
    >>> sorted(sets), len({p.query for p in sets["icl"]} ^ {p.query for p in sets["zero-shot"]})
    (['icl', 'shuffled', 'zero-shot'], 0)
    """
    pool = 3 * n + len(avoid)
    sets = {"zero-shot": build_prompts(task, n=pool, shots=0, seed=seed),
            "icl": build_prompts(task, n=pool, shots=shots, seed=seed),
            "shuffled": shuffled_label_prompts(task, n=pool, shots=shots, seed=seed)}
    keep = [i for i, p in enumerate(sets["zero-shot"]) if p.query not in avoid][:n]
    return {name: [ps[i] for i in keep] for name, ps in sets.items()}


def extract(handle: ModelHandle, method: str, task: str, *, n_contexts: int = 24, shots: int = 10,
            n_cie: int = 10, top_k: int = 10, seed: int = 0) -> dict:
    """A ``method`` vector of ``task`` as JSON-able data (``vector``, ``heads`` and the recipe).

    ``"task-vector"``: θ for every layer, the mean last-token residual stream over ``n_contexts``
    ``shots``-shot prompts. ``"function-vector"``: the heads' mean outputs on the same contexts, each
    head's average indirect effect (``aie``) on ``n_cie`` shuffled-label prompts, and the sum of the
    ``top_k`` heads' projected means (above the model's head count: all heads).
    """
    if method not in METHODS:
        raise MechkitError(f"unknown vector method {method!r}", f"use one of {', '.join(METHODS)}")
    contexts = build_prompts(task, n=n_contexts, shots=shots, seed=seed + CONTEXTS_SEED)
    common = {"n_contexts": n_contexts, "shots": shots, "seed": seed}
    if method == "task-vector":
        return {"vector": icl_task_vectors(handle, task, prompts=contexts).tolist(), "heads": [], **common}
    means = mean_head_outputs(handle, contexts)
    corrupted = shuffled_label_prompts(task, n=n_cie, shots=shots, seed=seed + CIE_SEED)
    aie = indirect_effects(handle, corrupted, means).mean(0)
    heads = top_heads(aie, top_k)
    fv = read_weights(handle, function_vector, means, heads)  # W_O: on a remote model's server, one job
    aie = grid_list(aie.numpy(), handle.anatomy)  # None: a head a pruned layer does not have
    return {"vector": fv.tolist(), "heads": [h.to_dict() for h in heads], "aie": aie, "n_cie": n_cie,
            "top_k": top_k, **common}


def extracted_vector(handle: ModelHandle, method: str, task: str, extracted: dict) -> ActivationVector:
    """The :class:`ActivationVector` of :func:`extract`'s data: no layer chosen yet (``-1``), task
    vectors replace and function vectors add, the recipe kept as ``info``."""
    return ActivationVector(vector=torch.tensor(extracted["vector"]), method=method, task=task, layer=-1,
                            mode="replace" if method == "task-vector" else "add",
                            model_sha256=handle.weights_sha256(), model_config_sha256=config_sha256(handle.model),
                            model_dtype=str(handle.dtype).removeprefix("torch."),
                            model_tokenizer_sha256=tokenizer_sha256(handle.tokenizer) if handle.tokenizer else "",
                            heads=extracted["heads"],
                            info={k: v for k, v in extracted.items() if k not in ("vector", "heads")})


def sweep(handle: ModelHandle, vec: ActivationVector, prompts: Sequence, layers: Sequence[int],
          configs: Sequence[tuple[float, int]], batch_size: int = 16) -> dict:
    """Accuracy and log-prob of ``prompts`` with ``vec`` at each ``(scale, span)`` of ``configs`` and
    each layer of ``layers``, all (config, layer, prompt) rows batched together; ``None`` where the
    span would run past the last layer. The shape :func:`~mechkit.actvec.select.choose` reads."""
    n_layers = handle.anatomy.n_layers
    cells = [(i, j) for i, (_, k) in enumerate(configs) for j, L in enumerate(layers) if L + k <= n_layers]
    edits = [vec.edits(layers[j], *configs[i]) for i, j in cells]
    scores = score_edited(handle, prompts, edits, batch_size)
    acc: list[list[float | None]] = [[None] * len(layers) for _ in configs]
    lps: list[list[float | None]] = [[None] * len(layers) for _ in configs]
    for (i, j), s in zip(cells, scores, strict=True):
        acc[i][j], lps[i][j] = s.accuracy, s.logprob
    return {"scales": [x for x, _ in configs], "spans": [k for _, k in configs], "accuracy": acc,
            "logprob": lps}


def baselines(handle: ModelHandle, test: dict[str, list], batch_size: int = 16) -> dict[str, float]:
    """Accuracy without a vector on :func:`held_out_prompts`: zero-shot, shuffled-label ICL, ICL."""
    return {name: score_edited(handle, test[key], [None], batch_size)[0].accuracy for name, key in BASELINES}


def conditions(handle: ModelHandle, vec: ActivationVector, test: dict[str, list],
               batch_size: int = 16) -> dict[str, float]:
    """Accuracy with ``vec`` at its chosen layer, scale and span on the zero-shot and the
    shuffled-label prompts of :func:`held_out_prompts`."""
    return {"zero-shot": score_edited(handle, test["zero-shot"], [vec.edits()], batch_size)[0].accuracy,
            "shuffled ICL": score_edited(handle, test["shuffled"], [vec.edits()], batch_size)[0].accuracy}


@dataclass(frozen=True)
class VectorConfig:
    """The settings of :class:`VectorStudy` (what the ``icl-vectors`` plugin builds from its options): prompt
    counts (test ``n``, ``n_dev``, extraction ``n_contexts``, ``n_cie``), ``shots``, the function vector's
    ``top_k`` heads, the ``fv_scales`` and ``spans`` tried on dev, ``batch_size`` and ``seed``."""

    n: int = 40
    n_dev: int = 20
    n_contexts: int = 24
    n_cie: int = 10
    shots: int = 10
    top_k: int = 10
    fv_scales: Sequence[float] = (1.0, 2.0, 4.0, 8.0)
    spans: Sequence[int] = (1,)
    batch_size: int = 16
    seed: int = 0


class VectorStudy:
    """One task's prompt sets and its resumable steps: baselines, then per method extraction, the dev
    choice of (layer, scale, span), the test curve and the conditions.

    ``config`` is a :class:`VectorConfig`; keywords instead build one. ``layers`` are swept (default all); function vectors try every scale of ``fv_scales`` (task
    vectors scale 1) and every span of ``spans``. ``step`` keys are prefixed ``TASK|``.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> study = VectorStudy(m, "swap", n=2, n_dev=2, n_contexts=2, shots=2)
    >>> vec, record = study.run("task-vector")
    >>> vec.layer == record["layer"] and sorted(record["conditions"])
    ['shuffled ICL', 'zero-shot']
    """

    def __init__(self, handle: ModelHandle, task: str, layers: Sequence[int] | None = None,
                 config: VectorConfig | None = None, *, step: Step = compute_now, **settings: Any) -> None:
        config = dataclasses.replace(config or VectorConfig(), **settings)
        n, n_dev, n_contexts, n_cie, shots, top_k = (config.n, config.n_dev, config.n_contexts, config.n_cie,
                                                     config.shots, config.top_k)
        fv_scales, spans, batch_size, seed = config.fv_scales, config.spans, config.batch_size, config.seed
        self.handle, self.task, self.seed, self.batch_size = handle, task, seed, batch_size
        self.layers = list(range(handle.anatomy.n_layers) if layers is None else layers)
        self.n_contexts, self.n_cie, self.shots, self.top_k = n_contexts, n_cie, shots, top_k
        self.fv_scales, self.spans = [float(x) for x in fv_scales], list(spans)
        self._step = step
        self.dev = build_prompts(task, n=n_dev, shots=0, seed=seed + DEV_SEED)
        self.test = held_out_prompts(task, n, shots, seed + TEST_SEED, {q.query for q in self.dev})

    def step(self, name: str, compute: Callable[[], Any]) -> Any:
        return self._step(f"{self.task}|{name}", compute)

    def baselines(self) -> dict[str, float]:
        """:func:`baselines` on the test prompts (a step)."""
        return self.step("baselines", lambda: baselines(self.handle, self.test, self.batch_size))

    def extract(self, method: str) -> ActivationVector:
        """:func:`extract` (a step) as an :class:`ActivationVector` with no layer chosen yet."""
        stored = self.step(f"{method}|extract", lambda: extract(
            self.handle, method, self.task, n_contexts=self.n_contexts, shots=self.shots, n_cie=self.n_cie,
            top_k=self.top_k, seed=self.seed))
        return extracted_vector(self.handle, method, self.task, stored)

    def choose(self, method: str, vec: ActivationVector) -> dict:
        """The dev sweep over (scale, span) × layer (a step); sets ``vec``'s layer, scale and span to
        :func:`~mechkit.actvec.select.choose`'s and returns the sweep."""
        scales = self.fv_scales if method == "function-vector" else [1.0]
        configs = [(x, k) for x in scales for k in self.spans]
        key = f"{method}|dev|{scales}" + (f"|spans={self.spans}" if self.spans != [1] else "")
        dev = self.step(key, lambda: sweep(self.handle, vec, self.dev, self.layers, configs, self.batch_size))
        vec.layer, vec.scale, vec.span = choose(dev, self.layers)
        return dev

    def run(self, method: str, vector: ActivationVector | None = None) -> tuple[ActivationVector, dict]:
        """Extract ``method``'s vector and choose its place on dev — or take ``vector`` as it is — then
        measure the test curve (every layer at the chosen scale and span) and the conditions.

        Returns the vector and its record: ``layer``, ``scale``, ``span``, ``dev`` (``None`` for a
        given vector), ``test`` (accuracy and log-prob per layer), ``conditions``, ``heads``, ``aie``.
        """
        vec = vector or self.extract(method)
        dev = None if vector is not None else self.choose(method, vec)
        at = f"x{vec.scale}" + (f"|span={vec.span}" if vec.span != 1 else "")
        test = self.step(f"{method}|test|{at}", lambda: sweep(
            self.handle, vec, self.test["zero-shot"], self.layers, [(vec.scale, vec.span)], self.batch_size))
        cond = self.step(f"{method}|conditions|L={vec.layer}|{at}",
                         lambda: conditions(self.handle, vec, self.test, self.batch_size))
        test = {k: test[k][0] for k in ("accuracy", "logprob")}
        return vec, {"layer": vec.layer, "scale": vec.scale, "span": vec.span, "dev": dev, "test": test,
                     "conditions": cond, "heads": vec.heads, "aie": vec.info.get("aie")}
