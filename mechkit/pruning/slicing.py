"""Make a plan physical: a sliced copy of the model, and saving / reloading it in safetensors.

A saved pruned model is an ordinary HF directory (``config.json``, ``model.safetensors``, tokenizer
files) whose config is the *dense* config plus a ``mechkit_pruning`` entry holding the per-layer
structure. The installed transformers builds every layer with one width, so
:func:`mechkit.load_model` rebuilds the dense modules from that config, slices them to the recorded
structure and then loads the weights strictly (:func:`mechkit.model.edit.surgery.build_pruned`).
A model holding NaN or inf weights (say, from a compensation over degenerate statistics) is refused
before anything is written.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mechkit.errors import MechkitError
from mechkit.io import check_out, refuse_non_finite
from mechkit.io.atomic import umask_modes
from mechkit.io.replace import replacing_dir
from mechkit.model.edit.surgery import (
    Structure,
    apply_structure,
    compose_structures,
    pruned_config,
    renamed_after_drop,
)
from mechkit.model.handle import ModelHandle
from mechkit.model.modules.linear import weight_out_in
from mechkit.model.placement.stored import is_dispatched

if TYPE_CHECKING:
    from mechkit.pruning.plan import UnitsToRemove
    from mechkit.pruning.reconstruct import Fit
    from mechkit.pruning.stats import UnitStats


def compensation(handle: ModelHandle, plan: UnitsToRemove, stats: UnitStats | None,
                 skip: Collection[str] = ()) -> dict[str, torch.Tensor]:
    """FLAP bias compensation: for each output projection (but those named in ``skip``),
    ``W[:, removed] @ mean(removed inputs)``."""
    a = handle.anatomy
    names = {id(m): n for n, m in handle.model.named_modules()}
    out: dict[str, torch.Tensor] = {}
    gone = set(plan.layers)
    needed = [names[id(a.mlp_out(layer))] for layer, rm in plan.mlp.items() if rm and layer not in gone] + \
        [names[id(a.attn_out(layer))] for layer, rm in plan.heads.items() if rm and layer not in gone]
    if stats is None and set(needed) - set(skip):
        raise ValueError("mean compensation needs the calibration statistics (pass stats, or fits for every "
                         "pruned projection)")
    with torch.no_grad():
        for layer, removed in plan.mlp.items():
            if removed and layer not in gone and names[id(a.mlp_out(layer))] not in skip:
                module = a.mlp_out(layer)
                idx = torch.tensor(sorted(removed))
                w = weight_out_in(module)[:, idx].double()
                out[names[id(module)]] = (w @ stats.mlp_mean[layer][idx].to(w.device)).to(module.weight.dtype)
        for layer, removed in plan.heads.items():
            if removed and layer not in gone and names[id(a.attn_out(layer))] not in skip:
                module = a.attn_out(layer)
                d = a.d_head
                cols = torch.cat([torch.arange(h * d, (h + 1) * d) for h in sorted(removed)])
                w = weight_out_in(module)[:, cols].double()
                mean = stats.head_mean[layer][sorted(removed)].reshape(-1).to(w.device)
                out[names[id(module)]] = (w @ mean).to(module.weight.dtype)
    return out


def prune_copy(handle: ModelHandle, plan: UnitsToRemove, stats: UnitStats | None = None,
               fits: dict[str, Fit] | None = None) -> ModelHandle:
    """A new handle holding a physically pruned deep copy; ``handle`` is left untouched.

    From a model accelerate dispatched (offloaded to CPU or disk), the copy is built from the stored
    weights block by block on the main device (:func:`_pruned_from_stored`): the same weights, so
    the same numbers, as pruning the undispatched model.

    ``fits`` (:func:`~mechkit.pruning.reconstruct.reconstruct`) replace the kept input columns of the
    projections they name and give them their bias (created where the dense model has none, the
    mechanism mean compensation uses, so a saved copy reloads with it); they take precedence over
    the plan's mean compensation for those projections (``stats`` is needed only for the others).
    """
    refuse_pruned_units(handle)
    fits = fits or {}
    comp = compensation(handle, plan, stats, skip=fits) if plan.compensate else {}
    comp.update({name: fit.bias for name, fit in fits.items()})
    if is_dispatched(handle.model):
        model, structure = _pruned_from_stored(handle, plan, comp)
    else:
        model = copy.deepcopy(handle.model)
        structure = apply_structure(model, plan.structure(handle.anatomy), comp,
                                    handle.anatomy.n_heads, handle.anatomy.n_kv_heads)
    with torch.no_grad():
        for name, fit in fits.items():
            module = model.get_submodule(renamed_after_drop(name, handle.anatomy.family.layers, plan.layers))
            w = weight_out_in(module)
            if w.shape != fit.weight.shape:
                raise ValueError(f"{name}: fit of shape {tuple(fit.weight.shape)} for a weight of {tuple(w.shape)}")
            w.copy_(fit.weight.to(w))
    first = structure_of(handle.model)  # a model that lost whole layers before: record the dense model it came from
    if first is not None:
        structure = compose_structures(first, structure, handle.anatomy.family.layers)
    setattr(model, "_mechkit_structure", structure)  # noqa: B010 - read by save_pruned
    from mechkit.model.anatomy import discover_anatomy

    anatomy = discover_anatomy(model)
    return ModelHandle(model=model, tokenizer=handle.tokenizer, anatomy=anatomy, spec=f"{handle.spec} (pruned)",
                       name=f"{handle.name} (pruned)", source=handle.source)  # where its weights came from: an input


def refuse_pruned_units(handle: ModelHandle) -> None:
    """One line for a model whose neurons or heads were already pruned: the new :class:`Structure` would
    replace the one it records (kept units in the dense model's numbering), so its copy would claim the
    dense head counts and widths its weights no longer have. A model that only lost layers is an ordinary
    smaller model and is pruned like one."""
    old = structure_of(getattr(handle, "model", None))
    if old is not None and (old.mlp_keep or old.head_keep):
        raise MechkitError(f"{handle.name} had neurons or heads pruned already; pruning it again would lose the "
                           "record of what its layers keep", "prune the dense model with every unit to remove")


def _pruned_from_stored(handle: ModelHandle, plan: UnitsToRemove, comp: dict[str, torch.Tensor]):
    """The pruned copy of a dispatched model, built from its stored weights on its main device.

    Deep-copying a dispatched model would slice its ``meta`` parameters and copy accelerate's weights
    maps; instead a :class:`~mechkit.model.placement.copies.PlainCopy` reads each kept block from where
    accelerate keeps it just before slicing it (:func:`~mechkit.model.edit.surgery.apply_structure`'s
    ``materialize``): memory holds the pruned copy and one dense block, never the whole dense model,
    and removed blocks are never read.

    Why an ordinary model on the main device (the device that already runs every offloaded block)
    rather than one dispatched again: the copy is smaller than the dense model by what was pruned,
    it is what ``prune`` measures (accuracy, perplexity, FLOPs and forward latency: a copy streaming
    its weights from disk would time the disk, not the pruning) and what ``--save-model`` writes, and
    it equals the undispatched model's copy tensor for tensor. Its size is known before any weight
    is read (the same slicing done on ``meta``): one that does not fit the main device's free memory
    is one line saying so. (Dispatching it again — each sliced block written to an offload folder,
    then ``dispatch_model`` with that index — would lift that limit; it is not done yet.)
    """
    from mechkit.model.placement.copies import PlainCopy, check_fits

    a, device = handle.anatomy, handle.device
    structure = plan.structure(a)
    shapes = PlainCopy(handle.model, device)  # never filled: the pruned shapes, on meta
    apply_structure(shapes.model, structure, {k: v.to("meta") for k, v in comp.items()}, a.n_heads, a.n_kv_heads)
    check_fits(shapes.nbytes(), device, f"the pruned copy of the dispatched model {handle.name}",
               f"prune more (a higher --sparsity or --budget lower), or free memory on {device}")
    del shapes
    plain = PlainCopy(handle.model, device)
    return plain.model, apply_structure(plain.model, structure, comp, a.n_heads, a.n_kv_heads, materialize=plain.fill)


def structure_of(model) -> Structure | None:
    return getattr(model, "_mechkit_structure", None)


def _untied_state(model) -> dict[str, torch.Tensor]:
    """The state dict without the output embedding when it is tied to the input one (the loader re-ties)."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is not None and in_emb is not None and out_emb.weight is in_emb.weight:
        state.pop(next(n for n, m in model.named_modules() if m is out_emb) + ".weight", None)
    return state


def save_pruned(handle: ModelHandle, out_dir: str | Path, force: bool = False) -> Path:
    """Write a pruned handle as a reloadable directory, atomically (temp dir, then rename).

    An existing non-empty ``out_dir`` is refused unless ``force`` is true, a file there always; an
    empty directory is replaced. The directory the dense model was loaded from is refused whatever
    ``force`` says: it would replace the weights the pruned copy was made from. The directory gets the umask's permissions, not mkdtemp's 0700.
    """
    structure = structure_of(handle.model)
    if structure is None:
        raise ValueError("this model was not pruned by mechkit (no structure to save)")
    from mechkit.io.outlock import out_lock

    inputs = (handle.source,) if isinstance(handle.source, Path) else ()  # the dense model's own directory
    out = check_out(out_dir, force, kind="dir", inputs=inputs)
    with out_lock(out):
        check_out(out, force, kind="dir", inputs=inputs)  # again under the lock: another writer may have finished
        return _write_pruned(handle, structure, out, force)


def _write_pruned(handle: ModelHandle, structure: Structure, out: Path, force: bool) -> Path:
    from safetensors.torch import save_file

    state = _untied_state(handle.model)
    refuse_non_finite(state, out / "model.safetensors",
                      "check the dense model's weights and the pruning statistics, then prune again")
    with replacing_dir(out, writer="prune", force=force) as tmp:  # only its own files replaced, as one set
        (tmp / "config.json").write_text(json.dumps(pruned_config(handle.model), indent=2, default=str))
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if handle.tokenizer is not None:
            handle.tokenizer.save_pretrained(tmp)
        umask_modes(tmp)  # also where --force installs the files into an existing directory
    return out
