"""Fine-tune a copy of a model on one of the seeds' tasks, to make task models for task arithmetic.

No fine-tuned checkpoints exist offline, so mechkit makes its own: Ψ*_T for a task T is the base
model trained on ``input: X\\noutput: Y\\n`` prompts (zero-shot and/or few-shot, drawn with a data
seed distinct from the evaluation prompts' seed, and never asking an evaluation query), with the
loss on the answer tokens and the terminating newline only. The caller's model is never touched:
training runs on a deep copy. LoRA (through peft) is merged into the copy's weights before saving,
so the task vector ``Ψ*_T − Ψ0`` is always a plain weight difference.

Training stops at the first step whose loss, or whose updated weights, are NaN or inf, with one line
naming the step and the settings of the update (``training diverged at step 3 (loss nan; --lr 1, --weight-decay 0,
--batch-size 8, --method full) — lower --lr``), and a decay that no step survives (``lr·weight_decay ≥ 1``:
:func:`decay_problem`) is refused before any copy is made: no diverged model or
checkpoint is ever written, and :func:`model_files` and :func:`save_checkpoint` refuse non-finite
tensors themselves. A checkpoint records the base model it was trained from (its weights' sha256);
one written for another base or another recipe, or one that does not read back as a checkpoint of
this model (missing or misshapen tensors, NaN, odd metadata), is ignored with a warning line on
stderr and training starts over.

>>> import mechkit as mk
>>> from mechkit.taskarith.finetune import Recipe, finetune
>>> out = finetune(mk.load_model("tiny:llama"), Recipe(task="capitalize", steps=2, batch_size=4))
>>> len(out.losses)
2
"""

from __future__ import annotations

import copy
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError, first_line
from mechkit.io import atomic_file
from mechkit.model.edit.surgery import save_model_files
from mechkit.taskarith.apply import model_base
from mechkit.taskarith.checks import non_finite, refuse_non_finite

if TYPE_CHECKING:
    from torch import nn

    from mechkit.model.handle import ModelHandle

ADAPTER_WEIGHTS = "lora_adapter.safetensors"  # not adapter_model.*: transformers would try to load it as a PEFT dir
ADAPTER_CONFIG = "lora_adapter_config.json"


@dataclass
class Recipe:
    """Everything that determines a fine-tuning run (recorded in the report and the task vector)."""

    task: str
    steps: int = 100
    lr: float = 1e-4
    method: str = "full"  # full | lora
    rank: int = 8
    lora_alpha: float = 16.0
    batch_size: int = 8
    shots: tuple[int, ...] = (0,)
    seed: int = 0
    data_seed: int = 1000
    eval_n: int = 20
    eval_seed: int = 0
    weight_decay: float = 0.0
    pool: int = 512

    def as_dict(self) -> dict:
        d = asdict(self)
        d["shots"] = list(self.shots)
        return d


@dataclass
class Finetuned:
    """A trained copy of the model (merged, plain HF module) with its loss curve."""

    model: nn.Module
    losses: list[float]
    recipe: Recipe
    adapter: dict | None = field(default=None, repr=False)  # LoRA tensors before merging
    adapter_config: dict | None = None


def parse_shots(text: str) -> tuple[int, ...]:
    """``"0,3"`` -> ``(0, 3)``: demonstration counts for a mix of prompt settings."""
    try:
        shots = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        shots = ()
    if not shots or min(shots) < 0:
        raise MechkitError(f"malformed --shots {text!r}", "use demonstration counts like 0 or 0,3")
    return shots


def eval_prompts(recipe: Recipe, shots: int = 0) -> list:
    """The held-out prompts a recipe is evaluated on (seed ``eval_seed``)."""
    from mechkit.tasks import build_prompts

    return build_prompts(recipe.task, n=recipe.eval_n, shots=shots, seed=recipe.eval_seed)


def training_rows(handle: ModelHandle, recipe: Recipe) -> list[tuple[list[int], int]]:
    """Token ids and answer start of ``pool`` training prompts; evaluation queries are excluded."""
    from mechkit.eval.scoring import encode

    rows = [encode(handle.tokenizer, p.text, p.answer, p.terminator) for p in training_prompts(recipe)]
    if not rows:
        raise MechkitError(f"no training prompts left for {recipe.task!r} after holding out evaluation queries",
                           "lower --eval-n or use a task with more distinct inputs")
    return rows


def training_prompts(recipe: Recipe) -> list:
    """The recipe's ``pool`` training prompts (its ``shots`` mix), evaluation queries excluded."""
    from mechkit.tasks import build_prompts

    held_out = {p.query for p in eval_prompts(recipe)}
    per_shot = max(1, recipe.pool // len(recipe.shots))
    return [p for i, shots in enumerate(recipe.shots)
            for p in build_prompts(recipe.task, n=per_shot, shots=shots, seed=recipe.data_seed + i)
            if p.query not in held_out]


def _context_fix(handle: ModelHandle, recipe: Recipe, own: bool) -> str:
    """The fix for training rows past the context: fewer ``--shots`` only where the same rows without their
    demonstrations fit (counted from the recipe's own prompts); else a model with a longer context."""
    if not any(recipe.shots):
        return "use a model with a longer context: a 0-shot training row does not fit"
    if own:
        from mechkit.eval.scoring import encode, query_only

        bare = max((len(encode(handle.tokenizer, query_only(p.text), p.answer, p.terminator)[0])
                    for p in training_prompts(recipe)), default=0)
        if bare > (handle.context_length or bare):
            return (f"use a model with a longer context (even 0-shot training rows are {bare} tokens; it holds "
                    f"{handle.context_length})")
    return "use fewer --shots (demonstrations per training row), or a model with a longer context"


def training_batch(rows: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and labels that are -100 everywhere but the answer."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for r, (seq, start) in enumerate(rows):
        ids[r, :len(seq)] = torch.tensor(seq)
        mask[r, :len(seq)] = 1
        labels[r, start:len(seq)] = torch.tensor(seq[start:])
    return ids, mask, labels


def lora_targets(handle: ModelHandle) -> list[str]:
    """The projection names LoRA adapts, read from the model's anatomy (no per-family list here)."""
    fam = handle.anatomy.family
    paths = [fam.q, fam.k, fam.v, fam.qkv, fam.attn_out, *fam.mlp_in, fam.mlp_out]
    return sorted({p.rsplit(".", 1)[-1] for p in paths if p})


def trainable_model(model: nn.Module, recipe: Recipe, targets: list[str]) -> nn.Module:
    """``model`` as the recipe trains it: itself (full), or with LoRA adapters on ``targets`` (peft's
    init: A random, B = 0; lora-grad starts from exactly this)."""
    if recipe.method == "full":
        return model
    if recipe.method != "lora":
        raise MechkitError(f"unknown fine-tuning method {recipe.method!r}", "use --method full or --method lora")
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=recipe.rank, lora_alpha=recipe.lora_alpha, target_modules=targets, lora_dropout=0.0)
    return get_peft_model(model, config)


@torch.enable_grad()  # training: grad on even under the caller's torch.no_grad() (mechkit.model.backends.grad)
def finetune(handle: ModelHandle, recipe: Recipe,
             on_step: Callable[[int, float], None] | None = None,
             checkpoint: Path | None = None, checkpoint_every: int = 50,
             rows: list[tuple[list[int], int]] | None = None) -> Finetuned:
    """Train a deep copy of ``handle.model`` for ``recipe.steps`` AdamW steps; the handle is untouched.

    ``rows`` (token ids and answer start, as :func:`training_rows` makes them) replaces the recipe's own
    training prompts: a multitask mix (:mod:`mechkit.taskselect.validate`) names itself in ``recipe.task``.

    With ``checkpoint`` (a directory), the trainable weights, AdamW moments, batch-sampler state and
    losses are written there every ``checkpoint_every`` steps (0: never), and a later call with the same
    recipe continues from the last one: an interrupted run ends with the same weights as an uninterrupted one.
    """
    if recipe.steps < 1 or recipe.batch_size < 1 or not _finite(recipe.lr) or recipe.lr <= 0:
        raise MechkitError("steps, batch size and learning rate must be positive (and the rate finite)",
                           "pass e.g. --steps 100 --batch-size 8 --lr 1e-4")
    if not _finite(recipe.weight_decay) or recipe.weight_decay < 0 or not _finite(recipe.lora_alpha) \
            or recipe.lora_alpha <= 0:
        raise MechkitError(f"weight decay {recipe.weight_decay!r} and LoRA alpha {recipe.lora_alpha!r} must be "
                           "finite (decay >= 0, alpha > 0)", "pass e.g. --weight-decay 0 --lora-alpha 16")
    problem = lr_problem(recipe.lr) or decay_problem(recipe.lr, recipe.weight_decay)
    if problem:  # before the copy: no step can work
        raise MechkitError(*problem)
    if checkpoint_every < 0:
        raise MechkitError(f"--checkpoint-every must be 0 or more, got {checkpoint_every}",
                           "pass e.g. --checkpoint-every 50 (0 turns checkpoints off)")
    given, rows = rows, training_rows(handle, recipe) if rows is None else rows
    if not rows:
        raise MechkitError("no training rows given", "pass at least one encoded training prompt")
    from mechkit.model.checks.token_ids import checked_ids, vocab_rows

    for ids, _ in rows:  # the training forward skips the handle's own id check: an id past the embedding was an IndexError
        checked_ids(ids, vocab_rows(handle.model), handle.tokenizer)
    from mechkit.eval.scoring import check_context

    # and its position check: a row past a learned position table was an IndexError from inside torch
    longest, own = max(len(ids) for ids, _ in rows), given is None
    if handle.context_length is not None and longest > handle.context_length:
        check_context(handle, longest, _context_fix(handle, recipe, own))
    pad_id = handle.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else (handle.tokenizer.eos_token_id or 0)
    if recipe.method == "lora" and recipe.rank < 1:
        raise MechkitError(f"LoRA rank must be at least 1, got {recipe.rank}", "pass e.g. --rank 8")
    torch.manual_seed(recipe.seed)
    # Train (and save) in float32: AdamW steps of lr·1e-3 vanish when rounded into bf16 weights, and a
    # float32 fine-tune minus the base is exactly the update.
    model = trainable_model(float_copy(handle, recipe), recipe, lora_targets(handle))
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in named], lr=recipe.lr, weight_decay=recipe.weight_decay)
    rng = random.Random(recipe.seed)
    losses: list[float] = []
    base = model_base(handle) if checkpoint is not None else None
    if checkpoint is not None:
        losses = load_checkpoint(checkpoint, recipe, named, opt, rng, base=base)
    for step in range(len(losses), recipe.steps):
        ids, mask, labels = training_batch(rng.sample(rows, min(recipe.batch_size, len(rows))), pad_id)
        loss = model(input_ids=ids.to(handle.device), attention_mask=mask.to(handle.device),
                     labels=labels.to(handle.device), use_cache=False).loss
        value = float(loss.detach())
        if not math.isfinite(value):
            _diverged(step, f"loss {value}", recipe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _adam_step(opt, step, recipe)
        bad = _non_finite_params(named)
        if bad is not None:
            _diverged(step, f"weights became {bad[1]} in {bad[0]}", recipe)
        losses.append(value)
        if checkpoint is not None and checkpoint_every > 0 and (step + 1) % checkpoint_every == 0 \
                and step + 1 < recipe.steps:
            save_checkpoint(checkpoint, recipe, named, opt, rng, losses, base=base)
        if on_step is not None:
            on_step(step, losses[-1])
    return _finish(model, losses, recipe)


def float_copy(handle: ModelHandle, recipe: Recipe) -> nn.Module:
    """The float32 copy that trains, on the model's (main) device.

    A model accelerate dispatched is copied from its stored weights onto its main device
    (:func:`~mechkit.model.placement.copies.plain_copy`): training needs every weight, its gradient and AdamW's
    moments in memory at once, so streaming weights from disk or CPU would not save memory, only
    time; the same float32 weights then train to the same losses as the undispatched model's copy.
    Where the copy would not fit, one line says so before anything is copied.
    """
    from mechkit.model.placement.copies import plain_copy
    from mechkit.model.placement.stored import is_dispatched

    if not is_dispatched(handle.model):
        return copy.deepcopy(handle.model).float()
    full = recipe.method == "full"  # weights, gradients, AdamW's two moments; LoRA: the weights
    return plain_copy(handle.model, handle.device, torch.float32, factor=4.0 if full else 1.1,
                      purpose=f"fine-tuning ({recipe.method}) the dispatched model {handle.name}",
                      fix="fine-tune with --method lora (the weights alone), or on a device with more memory"
                      if full else "fine-tune on a device with more memory, or a smaller model")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


_ADAM_BETA1 = 0.9  # torch's AdamW default, which the trainer uses
_FLOAT32_MAX = 3.4028234663852886e38


def lr_problem(lr: float) -> tuple[str, str] | None:
    """``(problem, fix)`` for an ``--lr`` AdamW cannot turn into a float32 step, else None: its first step
    scales the update by lr/(1 − beta1) = 10·lr, a scalar torch converts to the weights' float32, and past
    float32's range (``--lr 1e39``) it raised "value cannot be converted to type float without overflow" from
    inside torch, after the load and the evaluation before training.

    >>> lr_problem(1e-4) is None, lr_problem(1e39)[1]
    (True, 'pass a learning rate within it, e.g. --lr 0.0001 (fine-tuning rates are about 1e-5 to 1e-3)')
    """
    if not lr * (1 / (1 - _ADAM_BETA1)) > _FLOAT32_MAX:
        return None
    return (f"--lr {lr:g} is past the range of AdamW's float32 step: its first step is lr/(1 − {_ADAM_BETA1}) = "
            f"{lr / (1 - _ADAM_BETA1):g}, more than float32's largest value ({_FLOAT32_MAX:.3g}), so --lr is at "
            f"most {_FLOAT32_MAX * (1 - _ADAM_BETA1):.3g}",
            "pass a learning rate within it, e.g. --lr 0.0001 (fine-tuning rates are about 1e-5 to 1e-3)")


def _adam_step(opt: torch.optim.Optimizer, step: int, recipe: Recipe) -> None:
    """One optimizer step; a scalar of the update past the weights' float range (torch's RuntimeError "value
    cannot be converted to type float without overflow", from a setting :func:`lr_problem` does not foresee)
    is one line naming the step and the settings, as a divergence is."""
    try:
        opt.step()
    except RuntimeError as err:
        if "without overflow" not in str(err):
            raise
        decay = " or --weight-decay" if recipe.weight_decay > 0 else ""
        raise MechkitError(f"the AdamW update at step {step + 1} is past the weights' float range ({first_line(err)}; "
                           f"{_settings(recipe)})", f"lower --lr{decay}, e.g. --lr 0.0001") from None


def decay_problem(lr: float, weight_decay: float) -> tuple[str, str] | None:
    """``(problem, fix)`` where AdamW's decay alone wrecks the weights, else None: torch's AdamW decays
    decoupled, ``p ← p·(1 − lr·weight_decay)`` before each Adam step, so ``lr·weight_decay ≥ 1`` zeroes every
    weight (= 1) or flips its sign each step, and grows it past 2 until it overflows to NaN (``--lr 1e-6
    --weight-decay 1e30`` "diverged", with a fix that named --lr alone). The fix keeps ``--lr`` and names a
    decay with ``lr·weight_decay`` at most 0.1 (weights shrink by 10% a step at most).

    >>> decay_problem(1e-4, 0.01) is None
    True
    >>> decay_problem(1e-6, 1e30)[1]
    'pass --weight-decay 100000 or less (below 1/lr = 1e+06), e.g. --weight-decay 0.01, or leave it out (0)'
    """
    product = lr * weight_decay
    if not product >= 1:  # NaN from inf·0 cannot come from options (both finite, lr > 0)
        return None
    most = 10 ** math.floor(math.log10(0.1 / lr))  # a power of ten with lr·decay ≤ 0.1
    example = min(0.01, most)
    return (f"--lr {lr:g} × --weight-decay {weight_decay:g} = {product:g}: AdamW's decoupled weight decay multiplies "
            f"every weight by 1 − lr·weight_decay = {1 - product:g} each step, which zeroes or flips (and past 2 "
            "grows until it overflows) the weights instead of shrinking them",
            f"pass --weight-decay {most:g} or less (below 1/lr = {1 / lr:g}), e.g. --weight-decay {example:g}, or "
            "leave it out (0)")


def _settings(recipe: Recipe) -> str:
    """The options the trainer reads that can make training diverge, with their values."""
    lora = f", --rank {recipe.rank}, --lora-alpha {recipe.lora_alpha:g}" if recipe.method == "lora" else ""
    return (f"--lr {recipe.lr:g}, --weight-decay {recipe.weight_decay:g}, --batch-size {recipe.batch_size}, "
            f"--method {recipe.method}{lora}")


def _diverged(step: int, what: str, recipe: Recipe) -> None:
    """One line naming the step, what went non-finite, and every setting of the update (a NaN under a
    huge --weight-decay was blamed on --lr, whose lowering did not help)."""
    decay = " or --weight-decay" if recipe.weight_decay > 0 else ""
    alpha = " or --lora-alpha" if recipe.method == "lora" else ""
    raise MechkitError(f"training diverged at step {step + 1} ({what}; {_settings(recipe)})",
                       f"lower --lr{decay}{alpha} (or check the base model's weights for NaN)")


def _non_finite_params(named: list) -> tuple[str, str] | None:
    """The first trainable parameter holding NaN/inf, with one device sync for the whole model."""
    if not named:
        return None
    flags = torch.stack([~torch.isfinite(p.detach()).all() for _, p in named])
    if not bool(flags.any()):
        return None
    return non_finite({name: p.detach() for name, p in named})


def _warn(message: str) -> None:
    """One warning line on stderr (the way a run tells of something it chose to ignore)."""
    print(f"mechkit: warning: {message}", file=sys.stderr)


CHECKPOINT = "checkpoint.safetensors"


def save_checkpoint(directory: Path, recipe: Recipe, named: list, opt: torch.optim.Optimizer,
                    rng: random.Random, losses: list[float], base: dict | None = None) -> None:
    """Write weights and AdamW moments as tensors, recipe, base model, losses and sampler state as
    header metadata (``base``: :func:`~mechkit.taskarith.apply.model_base` of the model trained from).

    One file, replaced atomically: a run killed mid-write keeps the previous checkpoint whole. NaN or
    inf weights, moments or losses are refused before anything is written.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = {}
    for i, (name, p) in enumerate(named):
        tensors[f"param.{name}"] = p.detach().cpu().contiguous()
        for key, value in opt.state.get(p, {}).items():
            tensors[f"adam.{i}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()  # dropout masks, so a resumed run draws the same ones
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    path = directory / CHECKPOINT
    refuse_non_finite(tensors, path, "training diverged: lower --lr")
    if not all(_finite(x) for x in losses):
        raise MechkitError(f"refusing to write {path}: the losses hold NaN or inf", "training diverged: lower --lr")
    state = {"recipe": recipe.as_dict(), "base": base, "step": len(losses), "losses": losses,
             "rng": _jsonable_rng(rng.getstate())}
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as tmp:  # a unique temporary name: two runs never share one
        save_file(tensors, str(tmp), metadata={"mechkit_checkpoint": json.dumps(state, allow_nan=False)})


def checkpoint_state(directory: Path) -> dict | None:
    """The recipe, base, step, losses and sampler state of the checkpoint in ``directory`` (None if absent).

    A file that is not a readable checkpoint is one line naming it and the problem.
    """
    from safetensors import safe_open

    path = Path(directory) / CHECKPOINT
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            state = json.loads((f.metadata() or {}).get("mechkit_checkpoint", "null"))
    except Exception as err:  # safetensors' own error types for a truncated or foreign file, JSON errors
        raise MechkitError(f"cannot read the checkpoint {path}: {first_line(err, 120)}",
                           "delete it to train from the start") from None
    if not isinstance(state, dict):
        raise MechkitError(f"{path} holds no mechkit checkpoint metadata (a JSON {type(state).__name__})",
                           "delete it to train from the start")
    rng = state.get("rng")
    losses = state.get("losses")
    shapes_ok = (isinstance(state.get("recipe"), dict) and isinstance(state.get("step"), int)
                 and isinstance(losses, list) and all(_finite(x) for x in losses) and len(losses) == state["step"]
                 and isinstance(rng, list) and len(rng) == 3 and isinstance(rng[1], list)
                 and all(isinstance(x, int) for x in rng[1]) and (state.get("base") is None
                                                                  or isinstance(state["base"], dict)))
    if not shapes_ok:
        raise MechkitError(f"{path} has malformed checkpoint metadata (recipe, step, finite losses, sampler state)",
                           "delete it to train from the start")
    return state


def load_checkpoint(directory: Path, recipe: Recipe, named: list, opt: torch.optim.Optimizer,
                    rng: random.Random, base: dict | None = None) -> list[float]:
    """Restore a matching checkpoint into the model, optimizer and sampler; return its losses (or []).

    A checkpoint of another recipe or another base model (``base``, as :func:`save_checkpoint` got it),
    or one that does not fit this model, is ignored with a warning line; nothing is restored from it.
    """
    path = Path(directory) / CHECKPOINT
    try:
        state = checkpoint_state(directory)
        if not state:
            return []
        if state.get("recipe") != recipe.as_dict():
            _warn(f"ignoring the checkpoint {path}: it was written for another recipe; training from the start")
            return []
        theirs = state.get("base") or {}
        if base is not None and theirs.get("sha256") and theirs["sha256"] != base.get("sha256"):
            _warn(f"ignoring the checkpoint {path}: it was trained from other base weights "
                  f"({theirs.get('spec', 'unrecorded')}, not {base.get('spec')}); training from the start")
            return []
        tensors = _checkpoint_tensors(path, named)
        try:
            random.Random().setstate(_tuple_rng(state["rng"]))
        except (TypeError, ValueError):
            raise MechkitError(f"{path} holds a malformed sampler state") from None
    except MechkitError as err:
        _warn(f"ignoring a checkpoint: {err.problem}; training from the start")
        return []
    with torch.no_grad():
        for i, (name, p) in enumerate(named):
            p.copy_(tensors[f"param.{name}"])
            moments = {k.rsplit(".", 1)[-1]: v for k, v in tensors.items() if k.startswith(f"adam.{i}.")}
            if moments:
                opt.state[p] = {k: v.to(p.device) if v.dim() else v for k, v in moments.items()}
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    rng.setstate(_tuple_rng(state["rng"]))
    return list(state["losses"])


def _checkpoint_tensors(path: Path, named: list) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, checked against the model before any is used: each trainable
    parameter present with its shape, moments shaped like their parameter, all finite."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as err:
        raise MechkitError(f"cannot read the checkpoint {path}: {first_line(err, 120)}",
                           "delete it to train from the start") from None
    for i, (name, p) in enumerate(named):
        stored = tensors.get(f"param.{name}")
        if stored is None or stored.shape != p.shape or not stored.is_floating_point():
            got = "missing" if stored is None else f"{stored.dtype} {tuple(stored.shape)}"
            raise MechkitError(f"{path} does not fit this model: param.{name} is {got}, the model's {tuple(p.shape)}",
                               "delete it to train from the start")
        for key, value in tensors.items():
            if key.startswith(f"adam.{i}.") and value.dim() and value.shape != p.shape:
                raise MechkitError(f"{path} does not fit this model: {key} has shape {tuple(value.shape)}",
                                   "delete it to train from the start")
    if "rng.torch" not in tensors or tensors["rng.torch"].dtype != torch.uint8:
        raise MechkitError(f"{path} lacks the sampler's random state (rng.torch)", "delete it to train from the start")
    bad = non_finite(tensors)
    if bad is not None:
        raise MechkitError(f"{path}: tensor {bad[0]} holds {bad[1]} values", "delete it to train from the start")
    return tensors


def _jsonable_rng(state: tuple) -> list:
    return [state[0], list(state[1]), state[2]]


def _tuple_rng(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])


def _finish(model: nn.Module, losses: list[float], recipe: Recipe) -> Finetuned:
    adapter = adapter_config = None
    if recipe.method == "lora":
        from peft import get_peft_model_state_dict

        adapter = {k: v.detach().clone().contiguous() for k, v in get_peft_model_state_dict(model).items()}
        adapter_config = model.peft_config["default"].to_dict()
        model = model.merge_and_unload()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return Finetuned(model=model, losses=losses, recipe=recipe, adapter=adapter, adapter_config=adapter_config)


def refuse_temp_write(err: Exception, tmp: Path) -> None:
    """One line where the model could not be written to the system's temporary directory, naming it and
    TMPDIR (the fix); the run's --out is not where it failed."""
    from mechkit.io.fs_errors import describe, os_error_of

    found = os_error_of(err, tmp)
    line = describe(found) if found is not None else None
    if line is not None:
        import errno

        full = found.errno in (errno.ENOSPC, errno.EDQUOT)
        raise MechkitError(f"{line.problem} (the temporary directory the model is saved in before it goes into "
                           "--out)", "free space there, or set TMPDIR to a directory with room" if full
                           else line.fix.replace("choose an --out on", "set TMPDIR to a directory on")) from err


def model_files(result: Finetuned, tokenizer) -> dict[str, bytes]:
    """The files of a loadable model directory (config, safetensors weights, tokenizer, adapter), as bytes.

    Returned as bytes so the report writer can place them beside ``report.json`` atomically.
    """
    import tempfile

    from safetensors.torch import save

    refuse_non_finite(result.model.state_dict(), "model.safetensors", "training diverged: lower --lr")
    if result.adapter is not None:
        refuse_non_finite(result.adapter, ADAPTER_WEIGHTS, "training diverged: lower --lr")
    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            save_model_files(result.model, tmp)  # a pruned model's widths: save_pretrained writes the dense ones
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        except Exception as err:  # a full or size-limited temporary directory: the fix is TMPDIR, not --out
            refuse_temp_write(err, Path(tmp))
            raise
        for path in sorted(Path(tmp).iterdir()):
            if path.is_file():
                files[path.name] = path.read_bytes()
    if result.adapter is not None:
        files[ADAPTER_WEIGHTS] = save(result.adapter)
        files[ADAPTER_CONFIG] = json.dumps(result.adapter_config, indent=2, default=str).encode()
    return files


__all__ = ["Finetuned", "Recipe", "eval_prompts", "finetune", "float_copy", "model_files", "parse_shots",
           "trainable_model", "training_batch", "training_rows"]
