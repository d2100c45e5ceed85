"""The ``lora-grad`` representation: a weight-space task vector with a per-example spread.

The issue asks for "a task vector: the weight-space difference after a short fine-tune". One fine-tune
per task gives one vector and no spread for the covariance C_T of seed 000 §3.3.2. The shortest
fine-tune gives both: attach LoRA exactly as the validation's fine-tunes start
(:func:`mechkit.taskarith.finetune.finetune`: a float32 copy, ``torch.manual_seed(seed)``, peft's
init with A random and **B = 0**, the same target modules and rank), and take, for each example, the
gradient of the fine-tune's loss (cross-entropy on the answer tokens and the terminator) with respect
to the LoRA B matrices. At B = 0 the gradient with respect to A is exactly zero
(∂L/∂A = s·Bᵀ·∂L/∂h·xᵀ), so the B gradient is the whole first-order effect.

Each example i of a task gives the point ``x_i = −(n / N) ∇_B Σ_{t∈answer_i} CE_t`` (n examples, N
answer tokens among them). Their mean is ``−∇_B`` of the fine-tune's loss on the whole set (the mean
over all N answer tokens, as transformers computes it), so ``lr · mean(x_i)`` is **exactly** the change
of B that one step of plain SGD (full batch, learning rate ``lr``) makes from the base model: the
weight-space task vector of that step, with ``x_i`` its per-example terms. (Adam's first step is
``−lr · m̂/(√v̂ + ε)`` with ``m̂ = g`` and ``v̂ = g²``: about ``−lr · sign(g)`` per coordinate, so it
points another way; the validation's AdamW fine-tunes take that step.)

Coverage is kept tractable and exact on the data in two ways (documented in the docs page):

- **Every block by default** (``blocks`` 0), the whole adapter the fine-tune trains; ``blocks`` K > 0
  keeps the last K blocks' B matrices only, and the backward pass stops there. On SmolLM2-135M a
  block's B matrices at rank 8 hold 41,472 numbers, all 30 blocks 1,244,160, so the study's float32
  points (25 tasks × 32 examples) take 4.0 GB while they are held (at most ``MAX_BYTES``).
- **The span of the study's points.** All points of all tasks are rewritten in an orthonormal basis of
  their own span (:func:`span_coordinates`): an isometry on the data, so cosines, means, distances
  and the sample covariance are unchanged. Ledoit–Wolf shrinks towards ``μ·I`` with ``μ = tr(S)/d``;
  in the span ``d`` is the number of directions the points occupy (at most the number of points), not
  the hundreds of thousands of coordinates they leave empty, which would make ``μ`` almost 0.

Per-example gradients come from one batched backward pass: a B matrix's gradient is
``Σ_t (∂L/∂y_t) u_tᵀ`` with ``u = A x`` its input and ``y = B u`` its output, and each example's
terms are summed apart (the per-sample gradient trick). Hooks live on the copy and are removed; the
loaded model is never touched. The copy runs in eval mode (no dropout; the embedded model has none,
so its fine-tune's train mode is the same).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from torch import nn

    from mechkit.model.handle import ModelHandle

MAX_BYTES = 6 * 2 ** 30  # the study's float32 points, held at once in one array


def lora_copy(handle: ModelHandle, rank: int = 8, lora_alpha: float = 16.0, seed: int = 0) -> nn.Module:
    """A float32 LoRA copy of the model, initialised exactly as the validation's fine-tune at ``seed``
    (the finetune core's own copy and adapter functions; the global random state is restored)."""
    from mechkit.taskarith.finetune import Recipe, float_copy, lora_targets, trainable_model

    recipe = Recipe(task="lora-grad", method="lora", rank=rank, lora_alpha=lora_alpha, seed=seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = trainable_model(float_copy(handle, recipe), recipe, lora_targets(handle))
    model.eval()
    return model


def block_of(name: str) -> int | None:
    """The block index in a module path (its first integer component), None outside the blocks."""
    found = re.search(r"\.(\d+)\.", f".{name}.")
    return int(found.group(1)) if found else None


def lora_b_modules(model: nn.Module, n_layers: int, blocks: int) -> dict[str, nn.Module]:
    """The LoRA B layers of the last ``blocks`` blocks (0: all), by name; only their weights keep
    ``requires_grad``, so the backward pass stops at the first of them."""
    first = 0 if blocks <= 0 else max(0, n_layers - blocks)
    chosen = {}
    for name, module in model.named_modules():
        if name.endswith("lora_B.default"):
            block = block_of(name)
            if block is not None and block >= first:
                chosen[name] = module
    if not chosen:
        raise MechkitError("no LoRA B matrix in the chosen blocks", "pass --grad-blocks 0 (every block)")
    keep = {id(m.weight) for m in chosen.values()}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return chosen


def example_gradients(model: nn.Module, modules: dict[str, nn.Module], rows: list[tuple[list[int], int]],
                      pad_id: int, device, out: np.ndarray, batch_size: int = 16) -> int:
    """Write into ``out`` ``[n, D]`` the per-example gradients of the summed answer-token cross-entropy
    w.r.t. the B matrices of ``modules`` (flattened in their order); return N, the answer tokens."""
    from mechkit.taskarith.finetune import training_batch

    tokens = 0
    for start in range(0, len(rows), batch_size):
        ids, mask, labels = training_batch(rows[start:start + batch_size], pad_id)
        saved: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        handles = [m.register_forward_hook(_keeper(name, saved)) for name, m in modules.items()]
        try:
            with torch.enable_grad():
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
                target = labels[:, 1:].to(device)
                ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), target,
                                                       ignore_index=-100, reduction="sum")
                ce.backward()
        finally:
            for h in handles:
                h.remove()
        tokens += int((target != -100).sum())
        at = 0
        for name in modules:
            block = torch.einsum("bto,btr->bor", *saved.pop(name)).reshape(len(ids), -1)
            out[start:start + len(ids), at:at + block.shape[1]] = block.detach().float().cpu().numpy()
            at += block.shape[1]
    for m in modules.values():
        m.weight.grad = None
    return tokens


def _keeper(name: str, saved: dict):
    def hook(_module, inputs, output):
        u = inputs[0].detach()
        output.register_hook(lambda g: saved.__setitem__(name, (g.detach(), u)))
    return hook


def task_rows(handle: ModelHandle, task: str, n: int, seed: int) -> list[tuple[list[int], int]]:
    """``n`` zero-shot examples of ``task`` with their answers, encoded as the fine-tune encodes them."""
    from mechkit.eval.scoring import encode
    from mechkit.tasks import build_prompts

    return [encode(handle.tokenizer, p.text, p.answer, p.terminator)
            for p in build_prompts(task, n=n, shots=0, seed=seed)]


def task_points(handle: ModelHandle, model: nn.Module, modules: dict[str, nn.Module],
                rows: list[tuple[list[int], int]], out: np.ndarray) -> None:
    """Write ``x_i = −(n/N) ∇_B Σ_answer CE`` of each of the ``n`` rows into ``out``: their mean is the
    B change of one full-batch SGD step at learning rate 1."""
    from mechkit.eval.scoring import pad_id

    tokens = example_gradients(model, modules, rows, pad_id(handle.tokenizer), handle.device, out)
    out *= np.float32(-len(rows) / max(tokens, 1))


def span_coordinates(x: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """The rows of ``x`` in an orthonormal basis of their span: ``Y = U Λ^½`` from the Gram matrix
    ``X Xᵀ = U Λ Uᵀ`` (directions with ``λ ≤ rtol·λ_max`` dropped), so ``Y Yᵀ = X Xᵀ``: inner products,
    hence norms, cosines and distances, are those of the full vectors."""
    gram = np.zeros((len(x), len(x)))
    for start in range(0, x.shape[1], 32768):  # a float64 Gram, one column slice at a time
        part = x[:, start:start + 32768].astype(np.float64)
        gram += part @ part.T
    lam, u = np.linalg.eigh(gram)
    keep = lam > rtol * max(float(lam.max()), 0.0)
    return u[:, keep] * np.sqrt(lam[keep])


def gradient_points(handle: ModelHandle, tasks: Sequence[str], n: int, seed: int = 0, rank: int = 8,
                    lora_alpha: float = 16.0, blocks: int = 0, project: bool = True) -> dict[str, np.ndarray]:
    """Each task's per-example B-gradient points (:func:`task_points`), in :func:`span_coordinates`
    unless ``project`` is False. The points are written into one float32 array (the only large one);
    one line before any gradient when it would exceed ``MAX_BYTES``."""
    model = lora_copy(handle, rank, lora_alpha, seed)
    modules = lora_b_modules(model, handle.anatomy.n_layers, blocks)
    dims = sum(m.weight.numel() for m in modules.values())
    rows = {task: task_rows(handle, task, n, seed) for task in tasks}
    total = sum(len(r) for r in rows.values())
    if total * dims * 4 > MAX_BYTES:
        raise MechkitError(f"lora-grad points of {len(tasks)} tasks ({total} examples) × {dims:,} numbers need "
                           f"{total * dims * 4 / 2 ** 30:.1f} GiB", "pass --grad-blocks K (the last K blocks), a "
                           "smaller --rank or --n")
    x = np.empty((total, dims), dtype=np.float32)
    spans, at = {}, 0
    for task, encoded in rows.items():
        spans[task] = slice(at, at + len(encoded))
        task_points(handle, model, modules, encoded, x[spans[task]])
        at += len(encoded)
    del model
    y = span_coordinates(x) if project else x
    return {task: y[where] for task, where in spans.items()}


__all__ = ["MAX_BYTES", "block_of", "example_gradients", "gradient_points", "lora_b_modules", "lora_copy",
           "span_coordinates", "task_points", "task_rows"]
