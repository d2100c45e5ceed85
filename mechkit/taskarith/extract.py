"""Extract ΔΨ = Ψ_ft − Ψ0 tensor by tensor, streaming the fine-tuned weights from safetensors.

The base comes from a loaded handle (its ``named_parameters()``, so tied weights are counted once;
from a model accelerate offloaded, its stored weights, read one at a time) or from a model
directory, which is then streamed too. The fine-tuned model is always read one
tensor at a time with ``safe_open``: the two full models are never in memory together, only the
base and the growing delta. Before any arithmetic the configs are compared (model type, hidden size,
layer and head counts) and so are the vocabularies; a vocabulary or embedding-shape mismatch is an
error unless ``embeddings="truncate"`` (delta over the rows both share) or ``"skip"`` (no embedding or
output-head deltas) is chosen explicitly.

Task ids (given, or read from the fine-tune's ``report.json``) must be in the task registry. When that
report records the weights the fine-tune started from (``model.weights_sha256``, same dtype as the
base here), a different base is refused: the difference would not be the fine-tune's update. A
fine-tuned or base tensor holding NaN or inf is refused, naming the tensor.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mechkit.errors import MechkitError, first_line
from mechkit.io.journal import plain_name
from mechkit.model.edit.surgery import saved_config
from mechkit.model.names import checkpoint_renamer
from mechkit.model.placement.stored import StateView, is_dispatched
from mechkit.model.placement.ties import distinct_parameters, tied_names
from mechkit.taskarith.checks import architecture, non_finite
from mechkit.taskarith.probe import weights_probe
from mechkit.taskarith.vector import TaskVector

if TYPE_CHECKING:
    from mechkit.model.handle import ModelHandle

EMBEDDING_MODES = ("error", "truncate", "skip")
_EMBEDDING_NAMES = ("embed_tokens", "wte", "embed_in", "embed_out", "lm_head", "word_embeddings")
_ARCH_KEYS = ("model_type", "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "num_attention_heads",
              "n_head", "num_key_value_heads", "intermediate_size", "head_dim")


def is_embedding(name: str) -> bool:
    return any(part in name for part in _EMBEDDING_NAMES)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a model directory (single file or sharded with an index)."""
    from mechkit.model.checks.integrity import refuse_special_files

    refuse_special_files(model_dir)  # a FIFO under a weights' name: named, not "no safetensors weights"
    if (model_dir / "model.safetensors").is_file():
        return [model_dir / "model.safetensors"]
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        fix = "write the model again with save_pretrained (its index names each tensor's shard file)"
        weight_map = _read_json(index, "safetensors index", fix).get("weight_map")
        shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else None
        if not shards or not all(isinstance(s, str) and plain_name(s) for s in shards):
            raise MechkitError(f"{index} is not a safetensors index: its weight_map is not an object of tensor "
                               "names to shard files in that directory", fix)
        return [model_dir / s for s in shards]
    raise MechkitError(f"no safetensors weights in {model_dir}",
                       "pass a directory written by `mechkit finetune` or save_pretrained (model.safetensors)")


def stream_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs, one at a time, from a model directory's safetensors files."""
    from safetensors import safe_open

    for path in weight_files(model_dir):
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield key, f.get_tensor(key)
        except Exception as err:  # safetensors raises its own error types for a truncated or foreign file
            raise MechkitError(f"cannot read weights {path}: {first_line(err, 160)}",
                               "the file may be truncated or not safetensors — write the model again") from None


def _read_json(path: Path, what: str, fix: str) -> dict:
    """A JSON object from a file the user handed in, or one line naming the file and what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise MechkitError(f"{path} is not a readable {what} ({first_line(err, 100)})", fix) from None
    if not isinstance(data, dict):
        raise MechkitError(f"{path} is not a {what}: it holds a JSON {type(data).__name__}, not an object", fix)
    return data


def _config(source: Any) -> dict:
    if isinstance(source, Path):
        from mechkit.io.outlock import settle_interrupted

        settle_interrupted(source)
        path = source / "config.json"
        if not path.is_file():
            raise MechkitError(f"no config.json in {source}", "pass a model directory written by save_pretrained")
        return _read_json(path, "model config", "pass a model directory written by save_pretrained")
    return saved_config(source.model)


def check_architecture(base_cfg: dict, ft_cfg: dict) -> None:
    """Same family, sizes and pruning, or a one-line error naming the first difference."""
    fix = "a task vector needs the fine-tuned model of this very base model"
    for key in _ARCH_KEYS:
        if key in base_cfg and key in ft_cfg and base_cfg[key] != ft_cfg[key]:
            raise MechkitError(f"architectures differ: {key} is {base_cfg[key]} in the base, {ft_cfg[key]} fine-tuned",
                               fix)
    if (architecture(base_cfg)["pruning"] or None) != (architecture(ft_cfg)["pruning"] or None):
        raise MechkitError("architectures differ: the base and the fine-tuned model are not pruned alike "
                           "(one is pruned, or they keep other units)", fix)


def vocab_of(source: Any) -> dict | None:
    """Token → id, added tokens included on both sides (``get_vocab()`` counts them; tokenizer.json
    keeps them apart from ``model.vocab``)."""
    if isinstance(source, Path):
        path = source / "tokenizer.json"
        if not path.is_file():
            return None
        fix = "save the fine-tuned model's tokenizer again (tokenizer.save_pretrained)"
        data = _read_json(path, "tokenizer", fix)
        model, added = data.get("model"), data.get("added_tokens") or []
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if not isinstance(vocab or {}, dict) or not isinstance(added, list) or not all(
                isinstance(t, dict) and isinstance(t.get("content"), str) and isinstance(t.get("id"), int) for t in added):
            raise MechkitError(f"{path} is not a tokenizer.json: its model.vocab is not an object of tokens to ids, "
                               "or its added_tokens not a list of tokens with their ids", fix)
        vocab = dict(vocab or {})
        vocab.update({t["content"]: t["id"] for t in added})
        return vocab
    tok = source.tokenizer
    return tok.get_vocab() if tok is not None else None


def _base_tensors(base: Any) -> tuple[Mapping[str, torch.Tensor], dict[str, str]]:
    """Base parameters by name, plus aliases of tied names (``lm_head.weight`` → the embedding's name)."""
    if isinstance(base, Path):
        return dict(stream_tensors(base)), {}
    if is_dispatched(base.model):  # offloaded weights on meta: ties by name, values where accelerate keeps them
        params = distinct_parameters(base.model)
        ties = tied_names(base.model)
        aliases = {n: next(t for t in ties[n] if t in params) for n in base.model.state_dict()
                   if n not in params and any(t in params for t in ties.get(n, ()))}
        return StateView(base.model, params), aliases  # read one tensor at a time
    params = dict(base.model.named_parameters())
    by_ptr = {p.data_ptr(): n for n, p in params.items()}
    aliases = {n: by_ptr[t.data_ptr()] for n, t in base.model.state_dict().items()
               if n not in params and t.data_ptr() in by_ptr}
    return {n: p.detach().cpu() for n, p in params.items()}, aliases


def _delta(name: str, ft: torch.Tensor, base: torch.Tensor, embeddings: str) -> torch.Tensor | None:
    base = base.to(ft.dtype)  # a bf16 fine-tune minus a float32 base would add the base's rounding error
    if ft.shape == base.shape:
        return ft.float() - base.float()
    if not is_embedding(name) or ft.ndim != base.ndim or ft.shape[1:] != base.shape[1:]:
        raise MechkitError(f"shape mismatch for {name}: base {tuple(base.shape)}, fine-tuned {tuple(ft.shape)}",
                           "a task vector needs the fine-tuned model of this very base model")
    if embeddings == "skip":
        return None
    if embeddings == "truncate":
        rows = min(ft.shape[0], base.shape[0])
        return ft[:rows].float() - base[:rows].float()
    raise MechkitError(f"vocabulary sizes differ for {name}: base {base.shape[0]}, fine-tuned {ft.shape[0]}",
                       "pass --embeddings truncate (shared rows) or --embeddings skip (no embedding deltas)")


def _refuse_non_finite(name: str, ft: torch.Tensor, base: torch.Tensor, ft_dir: Path) -> None:
    bad = non_finite({name: ft})
    if bad is not None:
        raise MechkitError(f"the fine-tuned model {ft_dir} holds {bad[1]} values in {name}",
                           "its fine-tune diverged: run `mechkit finetune` again with a lower learning rate")
    bad = non_finite({name: base})
    if bad is not None:
        raise MechkitError(f"the base model holds {bad[1]} values in {name}", "use a base model with finite weights")


def extract(base: ModelHandle | str | Path, finetuned: str | Path, embeddings: str = "error",
            tasks: list[str] | None = None) -> TaskVector:
    """ΔΨ = Ψ_ft − Ψ0 with HF parameter names (see :mod:`mechkit.taskarith.vector` for the naming).

    ``base`` is a loaded handle or a model directory; ``finetuned`` a model directory (for example
    the output of ``mechkit finetune``, whose recipe and task are copied into the metadata).
    """
    if embeddings not in EMBEDDING_MODES:
        raise MechkitError(f"unknown --embeddings {embeddings!r}", f"use one of: {', '.join(EMBEDDING_MODES)}")
    if tasks is not None:
        tasks = _task_ids(tasks)
    ft_dir = Path(finetuned)
    base_src = Path(base) if isinstance(base, (str, Path)) else base
    base_cfg = _config(base_src)
    check_architecture(base_cfg, _config(ft_dir))
    recipe, trained_from = _finetune_report(ft_dir)
    if not isinstance(base_src, Path):
        _check_trained_from(base_src, trained_from, ft_dir)
    vocab_base, vocab_ft = vocab_of(base_src), vocab_of(ft_dir)
    vocab_differs = vocab_base is not None and vocab_ft is not None and vocab_base != vocab_ft
    if vocab_differs and embeddings == "error":
        raise MechkitError("the base and fine-tuned tokenizers have different vocabularies",
                           "pass --embeddings truncate or --embeddings skip if the shared ids mean the same")
    base_tensors, aliases = _base_tensors(base_src)
    rename = (lambda key: key) if isinstance(base_src, Path) else checkpoint_renamer(base_src.model)
    deltas: dict[str, torch.Tensor] = {}
    probe: dict[str, list[float]] = {}
    for name, ft in stream_tensors(ft_dir):
        target = aliases.get(name, name)
        if target not in base_tensors:
            target = aliases.get(rename(name), rename(name))  # a checkpoint name, e.g. GPT-NeoX's embed_out
        if target not in base_tensors:
            raise MechkitError(f"the fine-tuned model has a tensor the base lacks: {name}",
                               "a task vector needs the fine-tuned model of this very base model")
        if target in deltas or (vocab_differs and embeddings == "skip" and is_embedding(target)):
            continue  # a tied alias already counted, or an embedding the user chose to skip
        base_t = base_tensors[target].detach().cpu()
        delta = _delta(target, ft, base_t, embeddings)
        if delta is not None:
            _refuse_non_finite(name, ft, base_t, ft_dir)
            deltas[target] = delta
            probe.update(weights_probe([(target, base_t)]))  # the base's values: a check across dtypes
    missing = sorted(set(base_tensors) - set(deltas) - ({n for n in base_tensors if is_embedding(n)}
                                                       if embeddings != "error" else set()))
    if missing:
        raise MechkitError(f"the fine-tuned model lacks {len(missing)} base tensors (first: {missing[0]})",
                           "a task vector needs the fine-tuned model of this very base model")
    if tasks is None:
        tasks = _task_ids([recipe["task"]], ft_dir / "report.json") if recipe and "task" in recipe else []
    meta = _metadata(base_src, base_cfg, ft_dir, embeddings, tasks, recipe)
    meta["base"]["probe"] = probe
    return TaskVector(deltas, meta)


def _task_ids(tasks: list[str], source: Path | None = None) -> list[str]:
    """Canonical registry ids (an unknown id is one line naming it, and the file it came from)."""
    from mechkit.tasks import parse_tasks

    if not all(isinstance(t, str) for t in tasks):
        raise MechkitError(f"task ids must be strings, not {tasks!r}"
                           + (f" (in {source})" if source else ""), "pass ids such as capitalize")
    try:
        return parse_tasks(tasks)
    except MechkitError as err:
        if source is None:
            raise
        raise MechkitError(f"{source}: {err.problem}", "pass --task to name the vector's task") from None


def _finetune_report(ft_dir: Path) -> tuple[dict | None, dict | None]:
    """The recipe and the ``model`` block of the fine-tune's report.json (None where there is none)."""
    path = ft_dir / "report.json"
    if not path.is_file():
        return None, None
    fix = "remove it, or pass the directory `mechkit finetune` wrote"
    report = _read_json(path, "mechkit report", fix)
    results, model = report.get("results", {}), report.get("model")
    recipe = results.get("recipe") if isinstance(results, dict) else None
    if not isinstance(results, dict) or not (recipe is None or isinstance(recipe, dict)) \
            or not (model is None or isinstance(model, dict)):
        raise MechkitError(f"{path} is not a mechkit report: 'results', 'results.recipe' and 'model' must be objects",
                           fix)
    return recipe, model


def _check_trained_from(base: ModelHandle, trained_from: dict | None, ft_dir: Path) -> None:
    """A fine-tune whose report names other starting weights (in this dtype) is not a fine-tune of ``base``."""
    if not trained_from or not isinstance(trained_from.get("weights_sha256"), str):
        return
    dtype = str(base.dtype).removeprefix("torch.")
    if trained_from.get("dtype", dtype) != dtype or trained_from["weights_sha256"] == base.weights_sha256():
        return
    raise MechkitError(f"{ft_dir} was fine-tuned from other weights ({trained_from.get('spec', '?')}, sha256 "
                       f"{trained_from['weights_sha256'][:12]}…) than the base {base.spec} "
                       f"(sha256 {base.weights_sha256()[:12]}…)",
                       "pass the model it was fine-tuned from as --base")


def _metadata(base: Any, base_cfg: dict, ft_dir: Path, embeddings: str, tasks: list[str],
              recipe: dict | None) -> dict:
    if isinstance(base, Path):
        base_info = {"spec": str(base), "architecture": architecture(base_cfg)}
    else:
        base_info = {"spec": base.spec, "name": base.name, "sha256": base.weights_sha256(),
                     "dtype": str(base.dtype).removeprefix("torch."), "architecture": architecture(base_cfg)}
    return {"base": base_info, "source": str(ft_dir), "tasks": tasks, "recipe": recipe,
            "embeddings": embeddings, "ops": ["extract"], "dtype": "float32"}


__all__ = ["EMBEDDING_MODES", "check_architecture", "extract", "is_embedding", "stream_tensors", "weight_files"]
