"""Fine-tune a copy of a model on one of the seeds' tasks, to make task models for task arithmetic.

No fine-tuned checkpoints exist offline, so mechkit makes its own: Ψ*_T for a task T is the base
model trained on ``input: X\\noutput: Y\\n`` prompts (zero-shot and/or few-shot, drawn with a data
seed distinct from the evaluation prompts' seed, and never asking an evaluation query), with the
loss on the answer tokens and the terminating newline only. The caller's model is never touched:
training runs on a deep copy. LoRA (through peft) is merged into the copy's weights before saving,
so the task vector ``Ψ*_T − Ψ0`` is always a plain weight difference.

>>> import mechkit as mk
>>> from mechkit.taskarith.finetune import Recipe, finetune
>>> out = finetune(mk.load_model("tiny:llama"), Recipe(task="capitalize", steps=2, batch_size=4))
>>> len(out.losses)
2
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.io import atomic_file

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
    from mechkit.tasks import build_prompts

    held_out = {p.query for p in eval_prompts(recipe)}
    rows = []
    per_shot = max(1, recipe.pool // len(recipe.shots))
    for i, shots in enumerate(recipe.shots):
        for p in build_prompts(recipe.task, n=per_shot, shots=shots, seed=recipe.data_seed + i):
            if p.query not in held_out:
                rows.append(encode(handle.tokenizer, p.text, p.answer, p.terminator))
    if not rows:
        raise MechkitError(f"no training prompts left for {recipe.task!r} after holding out evaluation queries",
                           "lower --eval-n or use a task with more distinct inputs")
    return rows


def _batch(rows: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def _trainable(model: nn.Module, recipe: Recipe, targets: list[str]) -> nn.Module:
    if recipe.method == "full":
        return model
    if recipe.method != "lora":
        raise MechkitError(f"unknown fine-tuning method {recipe.method!r}", "use --method full or --method lora")
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=recipe.rank, lora_alpha=recipe.lora_alpha, target_modules=targets, lora_dropout=0.0)
    return get_peft_model(model, config)


def finetune(handle: ModelHandle, recipe: Recipe,
             on_step: Callable[[int, float], None] | None = None,
             checkpoint: Path | None = None, checkpoint_every: int = 50) -> Finetuned:
    """Train a deep copy of ``handle.model`` for ``recipe.steps`` AdamW steps; the handle is untouched.

    With ``checkpoint`` (a directory), the trainable weights, AdamW moments, batch-sampler state and
    losses are written there every ``checkpoint_every`` steps (0: never), and a later call with the same
    recipe continues from the last one: an interrupted run ends with the same weights as an uninterrupted one.
    """
    if recipe.steps < 1 or recipe.batch_size < 1 or recipe.lr <= 0:
        raise MechkitError("steps, batch size and learning rate must be positive",
                           "pass e.g. --steps 100 --batch-size 8 --lr 1e-4")
    if checkpoint_every < 0:
        raise MechkitError(f"--checkpoint-every must be 0 or more, got {checkpoint_every}",
                           "pass e.g. --checkpoint-every 50 (0 turns checkpoints off)")
    rows = training_rows(handle, recipe)
    pad_id = handle.tokenizer.pad_token_id
    pad_id = pad_id if pad_id is not None else (handle.tokenizer.eos_token_id or 0)
    if recipe.method == "lora" and recipe.rank < 1:
        raise MechkitError(f"LoRA rank must be at least 1, got {recipe.rank}", "pass e.g. --rank 8")
    torch.manual_seed(recipe.seed)
    # Train (and save) in float32: AdamW steps of lr·1e-3 vanish when rounded into bf16 weights, and a
    # float32 fine-tune minus the base is exactly the update.
    model = _trainable(copy.deepcopy(handle.model).float(), recipe, lora_targets(handle))
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in named], lr=recipe.lr, weight_decay=recipe.weight_decay)
    rng = random.Random(recipe.seed)
    losses: list[float] = []
    if checkpoint is not None:
        losses = load_checkpoint(checkpoint, recipe, named, opt, rng)
    for step in range(len(losses), recipe.steps):
        ids, mask, labels = _batch(rng.sample(rows, min(recipe.batch_size, len(rows))), pad_id)
        loss = model(input_ids=ids.to(handle.device), attention_mask=mask.to(handle.device),
                     labels=labels.to(handle.device), use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if checkpoint is not None and checkpoint_every > 0 and (step + 1) % checkpoint_every == 0 \
                and step + 1 < recipe.steps:
            save_checkpoint(checkpoint, recipe, named, opt, rng, losses)
        if on_step is not None:
            on_step(step, losses[-1])
    return _finish(model, losses, recipe)


CHECKPOINT = "checkpoint.safetensors"


def save_checkpoint(directory: Path, recipe: Recipe, named: list, opt: torch.optim.Optimizer,
                    rng: random.Random, losses: list[float]) -> None:
    """Write weights and AdamW moments as tensors, recipe, losses and sampler state as header metadata.

    One file, replaced atomically: a run killed mid-write keeps the previous checkpoint whole.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, (name, p) in enumerate(named):
        tensors[f"param.{name}"] = p.detach().cpu().contiguous()
        for key, value in opt.state.get(p, {}).items():
            tensors[f"adam.{i}.{key}"] = torch.as_tensor(value).detach().cpu().contiguous()
    tensors["rng.torch"] = torch.get_rng_state()  # dropout masks, so a resumed run draws the same ones
    if torch.cuda.is_available():
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    state = {"recipe": recipe.as_dict(), "step": len(losses), "losses": losses,
             "rng": _jsonable_rng(rng.getstate())}
    with atomic_file(directory / CHECKPOINT) as tmp:  # a unique temporary name: two runs never share one
        save_file(tensors, str(tmp), metadata={"mechkit_checkpoint": json.dumps(state)})


def checkpoint_state(directory: Path) -> dict | None:
    """The recipe, step, losses and sampler state of the checkpoint in ``directory`` (None if absent)."""
    from safetensors import safe_open

    path = Path(directory) / CHECKPOINT
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("mechkit_checkpoint", "null"))


def load_checkpoint(directory: Path, recipe: Recipe, named: list, opt: torch.optim.Optimizer,
                    rng: random.Random) -> list[float]:
    """Restore a matching checkpoint into the model, optimizer and sampler; return its losses (or [])."""
    from safetensors import safe_open

    state = checkpoint_state(directory)
    if not state or state.get("recipe") != recipe.as_dict():
        return []
    with safe_open(str(Path(directory) / CHECKPOINT), framework="pt") as f:
        stored = list(f.keys())
        with torch.no_grad():
            for i, (name, p) in enumerate(named):
                p.copy_(f.get_tensor(f"param.{name}"))
                moments = {k.rsplit(".", 1)[-1]: f.get_tensor(k) for k in stored if k.startswith(f"adam.{i}.")}
                if moments:
                    opt.state[p] = {k: v.to(p.device) if v.dim() else v for k, v in moments.items()}
        torch.set_rng_state(f.get_tensor("rng.torch"))
        if "rng.cuda" in stored and torch.cuda.is_available():
            torch.cuda.set_rng_state(f.get_tensor("rng.cuda"))
    rng.setstate(_tuple_rng(state["rng"]))
    return list(state["losses"])


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


def model_files(result: Finetuned, tokenizer) -> dict[str, bytes]:
    """The files of a loadable model directory (config, safetensors weights, tokenizer, adapter), as bytes.

    Returned as bytes so the report writer can place them beside ``report.json`` atomically.
    """
    import tempfile

    from safetensors.torch import save

    files: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        result.model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for path in sorted(Path(tmp).iterdir()):
            if path.is_file():
                files[path.name] = path.read_bytes()
    if result.adapter is not None:
        files[ADAPTER_WEIGHTS] = save(result.adapter)
        files[ADAPTER_CONFIG] = json.dumps(result.adapter_config, indent=2, default=str).encode()
    return files


__all__ = ["Finetuned", "Recipe", "eval_prompts", "finetune", "model_files", "parse_shots", "training_rows"]
