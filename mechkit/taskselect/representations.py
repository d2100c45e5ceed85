"""How a task is seen by the model: its examples' hidden states, their first principal component, its
activation task vector, or its weight-space task vector (one SGD step of LoRA).

Every representation gives, per task, ``points`` ``[n, d]`` (what the mean μ_T and covariance C_T of
seed 000 §3.3.2 are taken over, so what coverage uses) and one ``vector`` ``[d]`` (what the cosine
similarity compares):

- ``hidden`` — the residual stream after block ``layer`` at ``position`` of each zero-shot example
  with its answer filled in (``input: X\\noutput: Y``), as the seeds embed each example with its label
  in place (seed 000 §8.6.4); vector: the mean μ_T.
- ``pc1`` — the same points; vector: their first principal component (seed 000 §8.6.4, "we compute the
  first principal component to obtain a feature vector for each dataset"), its sign chosen to point
  along μ_T (a principal axis has no sign of its own).
- ``actvec`` — the residual stream after block ``layer`` at the last token of each few-shot context
  (demonstrations and a query, no answer): the per-context terms whose mean is Hendel et al.'s task
  vector θ_L (:func:`mechkit.actvec.task_vectors.icl_task_vectors`); vector: that mean.

- ``lora-grad`` — the weight-space task vector of the shortest fine-tune: each example's gradient of
  the fine-tune's answer-token loss with respect to the LoRA B matrices (every block, or the last
  ``grad_blocks``), at the validation's own LoRA start (B = 0), negated and scaled so that the task's mean is
  exactly the B change of one full-batch SGD step at learning rate 1 (:mod:`mechkit.taskselect.gradients`;
  the points are rewritten in an orthonormal basis of their span, an isometry); vector: that mean.
  A multi-step fine-tune per task (:mod:`mechkit.taskarith`) would cost as much as the validation
  and give one τ per task, with no per-example spread for a covariance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mechkit.errors import MechkitError

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

REPRESENTATIONS = ("hidden", "pc1", "actvec", "lora-grad")
POSITIONS = ("last", "mean")
MIN_POINTS = 2  # a covariance (and a principal component) needs two points


@dataclass
class TaskFeatures:
    """One task as the model sees it: ``points`` ``[n, d]`` for coverage, ``vector`` ``[d]`` for similarity."""

    points: np.ndarray
    vector: np.ndarray


def check_examples(representation: str, n: int) -> None:
    """One line when ``n`` examples per task cannot give the representation a covariance."""
    if representation not in REPRESENTATIONS:
        raise MechkitError(f"unknown representation {representation!r}", f"use one of {', '.join(REPRESENTATIONS)}")
    if n < MIN_POINTS:
        raise MechkitError(f"--n {n} is too few examples for --representation {representation}: a task's "
                           f"covariance needs at least {MIN_POINTS}", "pass --n 16 or more")


def check_layer(layer: int, n_layers: int) -> int:
    """``layer`` as a block index (-1: the last), refused in one line outside the model: read modulo the
    layer count, ``--layer 40`` on a 30-layer model would silently embed block 10."""
    if not -n_layers <= layer < n_layers:
        raise MechkitError(f"--layer {layer} is outside the model's {n_layers} blocks",
                           f"pass --layer 0 to {n_layers - 1}, or -1 for the last block")
    return layer % n_layers


def first_component(points: np.ndarray) -> np.ndarray:
    """The unit first principal component of ``points``, signed to point along their mean."""
    points = np.asarray(points, dtype=np.float64)
    centred = points - points.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    pc = vt[0]
    return pc if float(pc @ points.mean(0)) >= 0 else -pc


def embed(handle: ModelHandle, texts: Sequence[str], layer: int, position: str = "last",
          batch_size: int = 16) -> np.ndarray:
    """``[len(texts), d_model]``: the residual stream after block ``layer`` at the last token (``last``)
    or averaged over the tokens (``mean``) of each text."""
    import torch

    from mechkit.eval.scoring import last_logits_only, pad_id, pad_right
    from mechkit.hooking.core import hooks

    ids = [handle.tokenizer(t)["input_ids"] for t in texts]
    out = []
    keep = last_logits_only(handle)
    for start in range(0, len(ids), batch_size):
        batch, mask, last = pad_right(ids[start:start + batch_size], pad_id(handle.tokenizer))
        got: list = []

        def take(x, _point, got=got, mask=mask, last=last):
            x = x.detach().double().cpu()
            if position == "last":
                got.append(x[torch.arange(len(x)), last])
            else:
                m = mask.unsqueeze(-1).double()
                got.append((x * m).sum(1) / m.sum(1))

        with torch.no_grad(), hooks(handle, {f"blocks.{layer}.hook_resid_post": take}):
            handle(batch.to(handle.device), attention_mask=mask.to(handle.device), **keep)
        out.append(got[0].numpy())
    return np.concatenate(out)


def centred(feats: dict[str, TaskFeatures], representation: str) -> dict[str, TaskFeatures]:
    """Every task's points less the mean over all tasks' points, vectors recomputed from them.

    A causal LM's residual stream shares one large direction across all inputs, so raw task means
    all point the same way (on SmolLM2-135M's last block, raw cosines of 0.89–0.97 to past-tense for its
    eight nearest tasks, modular and negation among them) and the ranking rests on small differences. Centring on the study's overall mean removes that common
    part; it leaves coverage unchanged (μ_D − μ_T0 and C_D do not move under a shift). ``--raw`` keeps
    the seeds' uncentred cosine.
    """
    overall = np.concatenate([f.points for f in feats.values()]).mean(0)
    out = {}
    for task, f in feats.items():
        points = f.points - overall
        out[task] = TaskFeatures(points, first_component(points) if representation == "pc1" else points.mean(0))
    return out


def task_texts(task: str, representation: str, n: int, seed: int, shots: int = 5) -> list[str]:
    """The texts a task is embedded from: examples with the answer filled in (``hidden``, ``pc1``),
    or few-shot contexts without the answer (``actvec``)."""
    from mechkit.tasks import build_prompts

    if representation == "actvec":
        return [p.text for p in build_prompts(task, n=n, shots=shots, seed=seed)]
    return [p.text + p.answer for p in build_prompts(task, n=n, shots=0, seed=seed)]


def task_features(handle: ModelHandle, tasks: Sequence[str], representation: str = "hidden", n: int = 32,
                  layer: int = -1, position: str = "last", seed: int = 0, batch_size: int = 16,
                  shots: int = 5, center: bool = True, rank: int = 8, lora_alpha: float = 16.0,
                  grad_blocks: int = 0) -> dict[str, TaskFeatures]:
    """Each task's :class:`TaskFeatures` under ``representation`` (``layer`` -1: the last block),
    :func:`centred` unless ``center`` is False. ``rank``, ``lora_alpha`` and ``grad_blocks`` are
    ``lora-grad``'s (the validation's LoRA; the last blocks whose B gradients count, 0: all)."""
    check_examples(representation, n)
    layer = check_layer(layer, handle.anatomy.n_layers)
    if not isinstance(grad_blocks, int) or grad_blocks < 0:
        raise MechkitError(f"--grad-blocks {grad_blocks} is below 0", "pass --grad-blocks 0 (every block) or more")
    if grad_blocks > handle.anatomy.n_layers:  # else the report would record more blocks than were counted
        raise MechkitError(f"--grad-blocks {grad_blocks} is more than the model's {handle.anatomy.n_layers} blocks",
                           f"pass --grad-blocks {handle.anatomy.n_layers} or less (0: every block)")
    where = "last" if representation == "actvec" else position
    feats = {}
    if representation == "lora-grad":
        from mechkit.taskselect.gradients import gradient_points

        points = gradient_points(handle, tasks, n, seed, rank, lora_alpha, grad_blocks)
        feats = {task: TaskFeatures(points=p, vector=p.mean(0)) for task, p in points.items()}
        return centred(feats, representation) if center else feats
    for task in tasks:
        points = embed(handle, task_texts(task, representation, n, seed, shots), layer, where, batch_size)
        vector = first_component(points) if representation == "pc1" else points.mean(0)
        feats[task] = TaskFeatures(points=points, vector=vector)
    return centred(feats, representation) if center else feats


__all__ = ["MIN_POINTS", "POSITIONS", "REPRESENTATIONS", "TaskFeatures", "check_examples", "centred", "embed",
           "first_component", "task_features", "task_texts"]
