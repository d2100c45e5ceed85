"""Physical structured pruning: remove MLP channels, query/KV heads and whole blocks from the weights.

Everything here is shape surgery on the HuggingFace modules, driven by the :class:`Anatomy`, so it
works the same for separate, concatenated (Phi-3, GPT-2) and interleaved (GPT-NeoX) projections and
for GPT-2's transposed ``Conv1D``. The pruned model still runs through the normal HF ``forward`` and
``generate``: the attention modules infer their head count from the projection shapes, and the few
attributes they read (``num_key_value_groups``, ``split_size``…) are updated per layer.

**Heads under grouped-query attention.** HF attention maps query head ``j`` to KV head
``j // num_key_value_groups``, one number per layer. So every KV group a layer keeps must keep the
same number of query heads. Two selections satisfy that and both are supported: removing whole KV
groups (query heads, keys and values together: saves K/V compute and cache), or removing the same
number of query heads from every group (finer: 1/9 of a layer's heads at a time on SmolLM2). A
selection that keeps uneven counts is refused with the reason.

A :class:`Structure` (original indices of what each layer keeps) records every edit, so a saved
pruned model is rebuilt from the *original* config: build the dense modules, apply the structure,
load the weights (:func:`build_pruned`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mechkit.errors import MechkitError
from mechkit.model.anatomy import discover_anatomy
from mechkit.model.headspec import whole_number_text
from mechkit.model.modules.linear import is_transposed

if TYPE_CHECKING:
    from mechkit.model.anatomy import Anatomy

CONFIG_KEY = "mechkit_pruning"  # config.json entry of a saved pruned model
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


@dataclass
class Structure:
    """What a pruned model keeps, in the dense model's layer and unit indices (JSON-able)."""

    n_layers: int
    mlp_keep: dict[int, list[int]] = field(default_factory=dict)
    head_keep: dict[int, list[int]] = field(default_factory=dict)
    layers_removed: list[int] = field(default_factory=list)
    biased: list[str] = field(default_factory=list)  # parameter names given a compensation bias
    config_restore: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"n_layers": self.n_layers, "mlp_keep": {str(k): v for k, v in self.mlp_keep.items()},
                "head_keep": {str(k): v for k, v in self.head_keep.items()},
                "layers_removed": list(self.layers_removed), "biased": list(self.biased),
                "config_restore": dict(self.config_restore)}

    @classmethod
    def from_dict(cls, d: Mapping) -> Structure:
        return cls(n_layers=int(d["n_layers"]),
                   mlp_keep={int(k): list(v) for k, v in d.get("mlp_keep", {}).items()},
                   head_keep={int(k): list(v) for k, v in d.get("head_keep", {}).items()},
                   layers_removed=list(d.get("layers_removed", [])), biased=list(d.get("biased", [])),
                   config_restore=dict(d.get("config_restore", {})))


def compose_structures(first: Structure, second: Structure, layers_path: str) -> Structure:
    """``second`` (a prune of a model that ``first`` pruned by whole layers only) in the dense model's numbering,
    so a twice-pruned model records the dense model it came from, not the first pruned one as if it were dense.

    ``second``'s layer indices count the first pruned model's blocks; its config values to restore are the
    first pruned model's, so ``first``'s (the dense ones) win. Bias names are the final model's: ``first``'s
    are renamed past ``second``'s dropped blocks (those in dropped blocks go with them).

    >>> a = Structure(n_layers=4, layers_removed=[1], config_restore={"num_hidden_layers": 4})
    >>> b = Structure(n_layers=3, head_keep={2: [0, 1]}, layers_removed=[0], config_restore={"num_hidden_layers": 3})
    >>> c = compose_structures(a, b, "model.layers")
    >>> c.n_layers, c.layers_removed, c.head_keep, c.config_restore
    (4, [0, 1], {3: [0, 1]}, {'num_hidden_layers': 4})
    """
    if first.mlp_keep or first.head_keep:
        raise ValueError("only a model pruned by whole layers can be pruned again")
    kept = [i for i in range(first.n_layers) if i not in set(first.layers_removed)]  # first model's block j is kept[j]
    dropped = set(second.layers_removed)
    biased = [renamed_after_drop(name, layers_path, second.layers_removed) for name in first.biased
              if _block_of(name, layers_path) not in dropped]
    return Structure(n_layers=first.n_layers,
                     mlp_keep={kept[k]: v for k, v in second.mlp_keep.items()},
                     head_keep={kept[k]: v for k, v in second.head_keep.items()},
                     layers_removed=sorted(set(first.layers_removed) | {kept[k] for k in dropped}),
                     biased=sorted(set(biased) | set(second.biased)),
                     config_restore={**second.config_restore, **first.config_restore})


def _block_of(name: str, layers_path: str) -> int | None:
    """The block index in a parameter name under ``layers_path`` (``model.layers.3.mlp…`` -> 3), else None."""
    prefix = layers_path + "."
    if not name.startswith(prefix):
        return None
    head = name[len(prefix):].split(".", 1)[0]
    return int(head) if whole_number_text(head) else None

class LayerConfig:
    """A per-layer view of a shared config: a few overridden fields, everything else read live.

    Some attention modules read the head count from ``self.config`` at forward time (Phi-3). A copy
    would stop following run-time switches of the shared config (``_attn_implementation``), so
    this view overrides only the head counts and forwards every other read and write.
    """

    def __init__(self, base: Any, **overrides: Any) -> None:
        base = base._base if isinstance(base, LayerConfig) else base
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_overrides", overrides)

    def __getattr__(self, name: str) -> Any:
        overrides = object.__getattribute__(self, "_overrides")
        return overrides[name] if name in overrides else getattr(object.__getattribute__(self, "_base"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._overrides:
            self._overrides[name] = value
        else:
            setattr(self._base, name, value)


# --- one module at a time -------------------------------------------------------------------------

def _set_weight(module: nn.Module, weight: torch.Tensor) -> None:
    module.weight = nn.Parameter(weight.contiguous(), requires_grad=module.weight.requires_grad)


def keep_outputs(module: nn.Module, rows: torch.Tensor) -> None:
    """Keep only output features ``rows`` of a projection (Linear ``[out, in]`` or Conv1D ``[in, out]``)."""
    rows = rows.to(module.weight.device)
    with torch.no_grad():
        if is_transposed(module):
            _set_weight(module, module.weight[:, rows])
            module.nf = len(rows)
        else:
            _set_weight(module, module.weight[rows])
            module.out_features = len(rows)
        if getattr(module, "bias", None) is not None:
            module.bias = nn.Parameter(module.bias[rows].contiguous(), requires_grad=module.bias.requires_grad)


def keep_inputs(module: nn.Module, cols: torch.Tensor) -> None:
    """Keep only input features ``cols`` of a projection."""
    cols = cols.to(module.weight.device)
    with torch.no_grad():
        if is_transposed(module):
            _set_weight(module, module.weight[cols])
        else:
            _set_weight(module, module.weight[:, cols])
            module.in_features = len(cols)


def add_output_bias(module: nn.Module, delta: torch.Tensor) -> bool:
    """Add ``delta`` to the module's output bias, creating the bias if the module has none.

    Returns True when a bias parameter was created (the saved structure must recreate it).
    """
    delta = delta.to(module.weight)
    with torch.no_grad():
        if getattr(module, "bias", None) is not None:
            module.bias.add_(delta)
            return False
        module.bias = nn.Parameter(delta.clone(), requires_grad=False)
        return True


def _index(idx: Sequence[int]) -> torch.Tensor:
    return torch.as_tensor(sorted(int(i) for i in idx), dtype=torch.long)


# --- units of one layer ---------------------------------------------------------------------------

def slice_mlp(anatomy: Anatomy, layer: int, keep: Sequence[int]) -> None:
    """Keep MLP channels ``keep`` of ``layer``: rows of every input projection, columns of the output one.

    A fused gate/up projection (Phi-3) has twice the channels as rows; both halves are sliced.
    """
    d_mlp = _in_width(anatomy.mlp_out(layer))
    idx = _index(keep)
    mlp = anatomy.mlp(layer)
    for name in anatomy.family.mlp_in:
        module = mlp.get_submodule(name)
        width = _out_width(module)
        rows = torch.cat([idx + k * d_mlp for k in range(width // d_mlp)])
        keep_outputs(module, rows)
    keep_inputs(anatomy.mlp_out(layer), idx)
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = len(idx)


def head_groups(anatomy: Anatomy, keep: Sequence[int], n_heads: int, n_kv: int) -> tuple[list[int], int]:
    """The KV heads that ``keep`` (query heads) reads and the query heads per kept group.

    Raises when kept groups would hold different numbers of query heads (see the module docstring).
    """
    g = n_heads // n_kv
    counts: dict[int, int] = {}
    for h in keep:
        counts[h // g] = counts.get(h // g, 0) + 1
    if len(set(counts.values())) > 1:
        raise MechkitError(
            f"cannot slice heads {sorted(keep)}: grouped-query attention needs the same number of query "
            f"heads in every kept KV group, got {dict(sorted(counts.items()))}",
            "remove whole KV groups or the same number of query heads from every group "
            "(mechkit.pruning selects heads that way)")
    return sorted(counts), (next(iter(counts.values())) if counts else 0)


def slice_heads(anatomy: Anatomy, layer: int, keep: Sequence[int], n_heads: int | None = None,
                n_kv: int | None = None) -> None:
    """Keep query heads ``keep`` of ``layer`` (dense indices) and the KV heads they read."""
    n_heads = n_heads or anatomy.n_heads
    n_kv = n_kv or anatomy.n_kv_heads
    anatomy.refuse_joint_head_norm("removing heads from the weights", "mask or ablate the heads (mk.ablate) instead")
    keep = sorted(int(h) for h in keep)
    if not keep:
        raise MechkitError(f"layer {layer}: cannot remove every attention head", "remove the whole layer instead")
    kv_keep, per_group = head_groups(anatomy, keep, n_heads, n_kv)
    d = anatomy.d_head

    def rows(role: str, indices: Sequence[int]) -> list[torch.Tensor]:
        spans = [anatomy.head_rows(layer, role, i)[1] for i in indices]
        return [torch.arange(span.start, span.stop) for span in spans]

    fam = anatomy.family
    if fam.qkv is None:
        for role, idx in (("q", keep), ("k", kv_keep), ("v", kv_keep)):
            keep_outputs(anatomy.attn_proj(layer, role), torch.cat(rows(role, idx)))
    elif fam.qkv_layout == "interleaved":  # only multi-head attention uses it: kv_keep == keep
        keep_outputs(anatomy.attn_proj(layer, "qkv"),
                     torch.cat([r for h in keep for r in rows("q", [h]) + rows("k", [h]) + rows("v", [h])]))
    else:
        keep_outputs(anatomy.attn_proj(layer, "qkv"),
                     torch.cat(rows("q", keep) + rows("k", kv_keep) + rows("v", kv_keep)))
    keep_inputs(anatomy.attn_out(layer), torch.cat([torch.arange(h * d, (h + 1) * d) for h in keep]))
    _set_head_counts(anatomy.attn(layer), len(keep), len(kv_keep), per_group, d)


def _set_head_counts(attn: nn.Module, n_q: int, n_kv: int, per_group: int, d_head: int) -> None:
    """Update the per-layer attributes HF attention modules read at forward time."""
    values = {"num_heads": n_q, "num_attention_heads": n_q, "num_key_value_heads": n_kv,
              "num_key_value_groups": per_group, "split_size": n_q * d_head}
    for name, value in values.items():
        if isinstance(getattr(attn, name, None), int):
            setattr(attn, name, value)
    if getattr(attn, "config", None) is not None:
        attn.config = LayerConfig(attn.config, num_attention_heads=n_q, num_key_value_heads=n_kv)


def drop_layers(model: nn.Module, anatomy: Anatomy, layers: Sequence[int]) -> dict[str, Any]:
    """Remove whole blocks; renumber the cache indices and the config's layer count and types.

    Returns the config values it changed (their dense values), so a save can restore them.
    """
    drop = set(int(i) for i in layers)
    container = model.get_submodule(anatomy.family.layers)
    kept = [block for i, block in enumerate(container) if i not in drop]
    if not kept:
        raise MechkitError("cannot remove every layer", "keep at least one block")
    for new_index, block in enumerate(kept):
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new_index
    container._modules.clear()
    for i, block in enumerate(kept):
        container.add_module(str(i), block)
    config = model.config
    restore = {key: getattr(config, key) for key in _LAYER_COUNT_KEYS if isinstance(getattr(config, key, None), int)}
    for key in restore:  # read all first: GPT-2's num_hidden_layers is an alias of n_layer
        setattr(config, key, len(kept))
    if isinstance(getattr(config, "layer_types", None), list):
        restore["layer_types"] = list(config.layer_types)
        config.layer_types = [t for i, t in enumerate(config.layer_types) if i not in drop]
    return restore


def _in_width(module: nn.Module) -> int:
    return module.weight.shape[0] if is_transposed(module) else module.weight.shape[1]


def _out_width(module: nn.Module) -> int:
    return module.weight.shape[1] if is_transposed(module) else module.weight.shape[0]


# --- a whole model --------------------------------------------------------------------------------

def apply_structure(model: nn.Module, structure: Structure, compensation: Mapping[str, torch.Tensor] | None = None,
                    n_heads: int | None = None, n_kv: int | None = None,
                    materialize: Callable[[nn.Module], None] | None = None) -> Structure:
    """Slice ``model`` in place to ``structure``; ``compensation`` maps parameter-less module names
    (``model.layers.3.mlp.down_proj``) to bias deltas added after slicing. Returns the structure with
    ``biased`` and ``config_restore`` filled in.

    ``materialize(module)``, where given, gives a module whose tensors are still on ``meta`` its
    weights (:class:`mechkit.model.placement.copies.PlainCopy`): each sliced block just before it is sliced,
    the rest of the model once the removed blocks are gone — so a copy of a dispatched model is sliced
    holding one dense block at a time, and removed blocks are never read.
    """
    anatomy = discover_anatomy(model)
    n_heads, n_kv = n_heads or anatomy.n_heads, n_kv or anatomy.n_kv_heads
    for layer in sorted(set(structure.mlp_keep) | set(structure.head_keep)):
        if materialize is not None:
            materialize(anatomy.layers[layer])
        if layer in structure.mlp_keep:
            slice_mlp(anatomy, layer, structure.mlp_keep[layer])
        if layer in structure.head_keep:
            slice_heads(anatomy, layer, structure.head_keep[layer], n_heads, n_kv)
    biased = list(structure.biased)
    for name, delta in (compensation or {}).items():
        if materialize is not None:
            materialize(model.get_submodule(name))
        if add_output_bias(model.get_submodule(name), delta):
            biased.append(f"{name}.bias")
    restore = dict(structure.config_restore)
    if structure.layers_removed:
        restore.update(drop_layers(model, anatomy, structure.layers_removed))
        new = [renamed_after_drop(b, anatomy.family.layers, structure.layers_removed) for b in biased[len(structure.biased):]]
        biased = biased[:len(structure.biased)] + new
    if materialize is not None:
        materialize(model)
    return Structure(structure.n_layers, structure.mlp_keep, structure.head_keep, structure.layers_removed,
                     sorted(set(biased)), restore)


def renamed_after_drop(name: str, layers_prefix: str, removed: Sequence[int]) -> str:
    """The parameter name a dense-model name has after ``removed`` blocks were dropped."""
    prefix = layers_prefix + "."
    if not name.startswith(prefix):
        return name
    index, rest = name[len(prefix):].split(".", 1)
    shift = sum(1 for r in removed if r < int(index))
    return f"{prefix}{int(index) - shift}.{rest}"


RESAVE = (f"restore the config.json saved with the pruned model (its {CONFIG_KEY} entry says what the weights hold), "
          "or save the model again with mechkit prune --save-model")

WEIGHTS_FIX = (f"use the weights saved with this config.json (a pruned model's weights and its {CONFIG_KEY} entry "
               "belong together), or save the model again with mechkit prune --save-model")


def _indices(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise MechkitError(f"config.json's {CONFIG_KEY} entry is malformed: {what} is not a list of integers", RESAVE)
    return value


def structure_of(entry: Any) -> Structure:
    """The :class:`Structure` a saved config's entry records, refused in one line where the entry is not one
    (a hand edit): what it says decides the model that is built, so it is never read loosely."""
    if not isinstance(entry, dict) or not isinstance(entry.get("n_layers"), int) or isinstance(entry["n_layers"], bool):
        raise MechkitError(f"config.json's {CONFIG_KEY} entry is malformed: not an object with an integer n_layers",
                           RESAVE)
    for key in ("mlp_keep", "head_keep"):
        units = entry.get(key, {})
        if not isinstance(units, dict):
            raise MechkitError(f"config.json's {CONFIG_KEY} entry is malformed: {key} is not an object keyed by "
                               "layer", RESAVE)
        for k in units:  # ASCII digits as str(int) writes them: '¹'.isdigit() is true, and int('¹') raised
            if not (whole_number_text(k) and str(int(k)) == k):
                raise MechkitError(f"config.json's {CONFIG_KEY} entry is malformed: {key} key {k!r} is not a layer "
                                   "number (keys are layer numbers as text: \"0\", \"1\", ...)", RESAVE)
        for layer, kept in units.items():
            _indices(kept, f"{key}[{layer}]")
    _indices(entry.get("layers_removed", []), "layers_removed")
    if not isinstance(entry.get("biased", []), list) or not isinstance(entry.get("config_restore", {}), dict):
        raise MechkitError(f"config.json's {CONFIG_KEY} entry is malformed: biased or config_restore", RESAVE)
    odd = next((b for b in entry.get("biased", []) if not (isinstance(b, str) and b.endswith(".bias"))), None)
    if odd is not None:  # [1]: "'int' object has no attribute 'rsplit'", blamed on the weights
        raise MechkitError(f"config.json's {CONFIG_KEY} entry is malformed: biased holds {odd!r}, not a bias's "
                           "name", RESAVE)
    return Structure.from_dict(entry)


def check_structure(structure: Structure, dense: Anatomy, config: Any) -> None:
    """Refuse (one line) a structure that does not fit the dense model its config builds: every index in
    range and once, no kept list empty, and the config values it restores on a save the config's own.
    Shapes alone would not catch all of it: a wrong layer count or repeated index can still load."""
    def bad(what: str) -> MechkitError:
        return MechkitError(f"config.json's {CONFIG_KEY} entry does not fit the model: {what}", RESAVE)

    n = dense.n_layers
    if structure.n_layers != n:
        raise bad(f"n_layers {structure.n_layers}, but the config builds {n} layers")
    gone = structure.layers_removed
    if len(set(gone)) != len(gone) or any(not 0 <= i < n for i in gone) or len(gone) >= n:
        raise bad(f"layers_removed {gone} (layers 0–{n - 1}, each once, at least one kept)")
    for key, width in (("mlp_keep", dense.d_mlp), ("head_keep", dense.n_heads)):
        for layer, kept in getattr(structure, key).items():
            if not 0 <= layer < n or layer in gone:
                raise bad(f"{key} names layer {layer}, which is not a kept layer")
            if not kept or len(set(kept)) != len(kept) or any(not 0 <= i < width for i in kept):
                raise bad(f"{key}[{layer}] = {kept} (indices 0–{width - 1}, each once, at least one)")
    aliased = set(getattr(config, "attribute_map", {}).values())  # GPT-2's n_layer: saved once as the kept count
    for key, value in structure.config_restore.items():
        legacy = key in aliased and key in _LAYER_COUNT_KEYS and value == n - len(gone)
        if key not in (*_LAYER_COUNT_KEYS, "layer_types") or (getattr(config, key, None) != value and not legacy):
            raise bad(f"config_restore {key}={value!r} is not the config's own {key}")


def build_pruned(config: Any, structure: Structure, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """Rebuild a saved pruned model: dense modules from the original config, then the structure,
    then the saved weights (strictly: a missing or extra tensor is an error)."""
    from transformers import AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from transformers.modeling_utils import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    check_structure(structure, discover_anatomy(model), config)
    apply_structure(model, Structure(structure.n_layers, structure.mlp_keep, structure.head_keep,
                                     structure.layers_removed))
    for name in structure.biased:
        try:
            module = model.get_submodule(name.rsplit(".", 1)[0])
        except AttributeError:  # a module the model has not: the entry's fault, not the weights'
            raise MechkitError(f"config.json's {CONFIG_KEY} entry does not fit this model: biased names {name}, "
                               "which it has no module for", RESAVE) from None
        add_output_bias(module, torch.zeros(_out_width(module)))
    out_name = next(n for n, m in model.named_modules() if m is model.get_output_embeddings()) + ".weight"
    in_name = next(n for n, m in model.named_modules() if m is model.get_input_embeddings()) + ".weight"
    tied = getattr(config, "tie_word_embeddings", False) and not _distinct(state, out_name, in_name)
    if not tied and model.get_output_embeddings().weight is model.get_input_embeddings().weight:
        out = model.get_output_embeddings()  # built tied: one tensor would take both files' values, the last wins
        out.weight = nn.Parameter(out.weight.detach().clone())
    try:
        missing, unexpected = model.load_state_dict(dict(state), strict=False)
    except RuntimeError as err:  # a shape the structure does not give: name the first, not torch's header
        first = next((line.strip() for line in str(err).splitlines() if "size mismatch" in line), str(err))
        raise MechkitError(f"pruned weights do not match their structure ({first[:300]})", WEIGHTS_FIX) from None
    missing = [k for k in missing if not (tied and k == out_name)]
    if missing or unexpected:
        raise MechkitError(f"pruned weights do not match their structure (missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]})", WEIGHTS_FIX)
    if tied:
        model.tie_weights()
    model.eval()
    return model


def _distinct(state: Mapping[str, torch.Tensor], out_name: str, in_name: str) -> bool:
    """Whether the saved weights hold an output embedding of their own, other than the input one: a config
    saying the two are tied must not replace it by the input embedding (transformers' own load keeps both
    then), which computed on an output layer the weights do not hold."""
    out, inp = state.get(out_name), state.get(in_name)
    return out is not None and inp is not None and (out.shape != inp.shape or not torch.equal(out, inp))


def pruned_config(model: nn.Module) -> dict | None:
    """The ``config.json`` content of a physically pruned model (the dense config and its
    :class:`Structure`, what :func:`load_pruned_directory` rebuilds it from), or None for any other model.

    Every writer of a model directory uses it: ``save_pretrained`` alone would write the dense widths
    beside the pruned weights, a directory that does not load.
    """
    structure = getattr(model, "_mechkit_structure", None)
    if structure is None:
        return None
    config = model.config.to_dict()
    config.update(structure.config_restore)
    config[CONFIG_KEY] = structure.as_dict()
    return config


def saved_config(model: nn.Module) -> dict:
    """The ``config.json`` content that a save of ``model`` writes: :func:`pruned_config` for a pruned model
    (whose in-memory config counts only its kept layers), else the model's own config. It is what a model
    loaded back from that directory and the directory itself are compared by."""
    return pruned_config(model) or model.config.to_dict()


def save_model_files(model: nn.Module, where: Any, **kwargs: Any) -> None:
    """``save_pretrained`` (safetensors) into ``where``, a pruned model's config in place of the dense one it
    writes: every writer of a model directory calls this, so none writes a directory that does not load."""
    import json
    from pathlib import Path

    model.save_pretrained(where, safe_serialization=True, **kwargs)
    config = pruned_config(model)
    if config is not None:
        (Path(where) / "config.json").write_text(json.dumps(config, indent=2, default=str))


def _weight_files(path) -> list:
    """``model.safetensors``, or the shards its index names (``save_pretrained`` shards a large model: a
    fine-tuned pruned one too); a shard name that is not a plain file name in ``path`` is refused."""
    import json

    index = path / "model.safetensors.index.json"
    if (path / "model.safetensors").is_file() or not index.is_file():
        return [path / "model.safetensors"]
    names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    if not names or any(not isinstance(n, str) or "/" in n or "\\" in n or n in (".", "..") for n in names):
        raise MechkitError(f"{index} names no shards, or shards outside its directory", WEIGHTS_FIX)
    return [path / n for n in names]


def load_pruned_directory(path, torch_dtype=None) -> nn.Module:
    """The model of a directory whose ``config.json`` carries a pruned :class:`Structure`."""
    import json

    from safetensors.torch import load_file
    from transformers import AutoConfig

    raw = json.loads((path / "config.json").read_text())
    structure = structure_of(raw[CONFIG_KEY])
    config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    if hasattr(config, CONFIG_KEY):
        delattr(config, CONFIG_KEY)
    state: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        state.update(load_file(str(file)))
    model = build_pruned(config, structure, state)
    if torch_dtype is not None:
        model.to(dtype=torch_dtype)
    model._mechkit_structure = structure
    return model
