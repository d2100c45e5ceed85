"""Where the parts of a transformer live, per family — a declarative table and nothing else.

Every layer above the model layer talks to :class:`Anatomy` ("layer 3's attention output
projection"), never to family-specific module names. Adding a family means adding one
:class:`Family` row here, like TransformerLens' architecture tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from mechkit.errors import UnsupportedArchitectureError

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Family:
    """Module paths of one model family. Paths inside a block are relative to the block."""

    layers: str
    attn: str
    attn_out: str
    mlp: str
    mlp_out: str
    embed: str
    final_norm: str
    q: str | None = None
    k: str | None = None
    v: str | None = None
    qkv: str | None = None  # fused query/key/value projection
    # How a fused projection orders its output rows: "concat" = [all q | all k | all v],
    # "interleaved" = per head [q_h | k_h | v_h] (GPT-NeoX).
    qkv_layout: str = "concat"
    mlp_in: tuple[str, ...] = ()
    unembed: str = "lm_head"
    norm_offset: float = 0.0  # Gemma's RMSNorm scales by (1 + weight)
    # The module (inside a block) whose input is the residual stream between attention and MLP
    # (``hook_resid_mid``); None where attention and MLP read the same input (GPT-NeoX's parallel residual).
    resid_mid: str | None = "post_attention_layernorm"


_LLAMA_LIKE = Family(
    layers="model.layers", attn="self_attn", attn_out="o_proj", q="q_proj", k="k_proj", v="v_proj",
    mlp="mlp", mlp_in=("gate_proj", "up_proj"), mlp_out="down_proj",
    embed="model.embed_tokens", final_norm="model.norm",
)

_GEMMA = replace(_LLAMA_LIKE, norm_offset=1.0)
_GEMMA2 = replace(_GEMMA, resid_mid="pre_feedforward_layernorm")  # sandwich norms: the MLP's own pre-norm

FAMILIES: dict[str, Family] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gemma": _GEMMA,
    "gemma2": _GEMMA2,
    "gemma3_text": _GEMMA2,
    "olmo": _LLAMA_LIKE,
    "olmo2": replace(_LLAMA_LIKE, resid_mid="mlp"),  # norms after each sublayer: the MLP reads the stream
    "phi3": Family(
        layers="model.layers", attn="self_attn", attn_out="o_proj", qkv="qkv_proj",
        mlp="mlp", mlp_in=("gate_up_proj",), mlp_out="down_proj",
        embed="model.embed_tokens", final_norm="model.norm",
    ),
    "gpt2": Family(
        layers="transformer.h", attn="attn", attn_out="c_proj", qkv="c_attn",
        mlp="mlp", mlp_in=("c_fc",), mlp_out="c_proj",
        embed="transformer.wte", final_norm="transformer.ln_f", resid_mid="ln_2",
    ),
    "gpt_neox": Family(
        layers="gpt_neox.layers", attn="attention", attn_out="dense", qkv="query_key_value",
        qkv_layout="interleaved",
        mlp="mlp", mlp_in=("dense_h_to_4h",), mlp_out="dense_4h_to_h",
        embed="gpt_neox.embed_in", final_norm="gpt_neox.final_layer_norm", resid_mid=None,
    ),
}


def _get(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _missing(model: nn.Module, fam: Family) -> list[str]:
    layers = _get(model, fam.layers)
    if layers is None or len(layers) == 0:
        return [fam.layers]
    block = layers[0]
    wanted = [fam.attn, f"{fam.attn}.{fam.attn_out}", fam.mlp, f"{fam.mlp}.{fam.mlp_out}"]
    return [f"{fam.layers}.0.{p}" for p in wanted if _get(block, p) is None]


@dataclass
class Anatomy:
    """The parts of one loaded model that analyses need, with the shapes that go with them."""

    family_name: str
    family: Family
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    d_mlp: int
    layers: list = field(repr=False)
    embed: nn.Module = field(repr=False)
    final_norm: nn.Module | None = field(repr=False)

    def block(self, layer: int) -> nn.Module:
        return self.layers[layer]

    def attn(self, layer: int) -> nn.Module:
        return self.layers[layer].get_submodule(self.family.attn)

    def attn_out(self, layer: int) -> nn.Module:
        """The attention output projection; its input is the concatenated per-head outputs."""
        return self.attn(layer).get_submodule(self.family.attn_out)

    def mlp(self, layer: int) -> nn.Module:
        return self.layers[layer].get_submodule(self.family.mlp)

    def mlp_out(self, layer: int) -> nn.Module:
        """The MLP down projection; its input is the MLP's neurons."""
        return self.mlp(layer).get_submodule(self.family.mlp_out)

    def resid_mid_reader(self, layer: int) -> nn.Module | None:
        """The module whose input is ``hook_resid_mid`` (the stream between attention and MLP), or None
        where the family has no such point (parallel attention and MLP)."""
        path = self.family.resid_mid
        return None if path is None else self.layers[layer].get_submodule(path)

    def attn_proj(self, layer: int, role: str) -> nn.Module | None:
        """``role`` in q, k, v, qkv: the projection module, or None where this family fuses it."""
        path = getattr(self.family, role)
        return None if path is None else self.attn(layer).get_submodule(path)

    def head_rows(self, layer: int, role: str, index: int) -> tuple[nn.Module, slice]:
        """The projection module and its output rows (``[out, in]`` layout) computing ``role`` for one head.

        ``role`` is ``q`` (``index`` = query head) or ``k``/``v`` (``index`` = KV head, see
        :meth:`kv_head`). Works the same for separate, concatenated and interleaved projections.
        """
        d = self.d_head
        if self.family.qkv is None:
            return self.attn_proj(layer, role), slice(index * d, (index + 1) * d)
        module = self.attn_proj(layer, "qkv")
        if self.family.qkv_layout == "interleaved":
            start = index * 3 * d + {"q": 0, "k": d, "v": 2 * d}[role]
        else:
            start = {"q": 0, "k": self.n_heads * d, "v": (self.n_heads + self.n_kv_heads) * d}[role] + index * d
        return module, slice(start, start + d)

    def final_norm_scale(self):
        """The final norm's effective per-channel scale (None if it has no weight)."""
        gamma = getattr(self.final_norm, "weight", None)
        if gamma is not None and gamma.device.type == "meta":  # offloaded by accelerate
            from mechkit.model.placement.stored import module_tensor

            gamma = module_tensor(self.final_norm)
        return None if gamma is None else gamma + self.family.norm_offset

    def kv_head(self, head: int) -> int:
        """The KV head a query head reads under grouped-query attention."""
        return head // self.n_groups

    @property
    def n_groups(self) -> int:
        """Query heads per KV head (grouped-query attention); 1 for plain multi-head attention."""
        return self.n_heads // self.n_kv_heads

    def as_dict(self) -> dict:
        return {
            "family": self.family_name, "n_layers": self.n_layers, "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads, "d_head": self.d_head, "d_model": self.d_model,
            "d_mlp": self.d_mlp,
        }


def _config_int(config, *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return default


def discover_anatomy(model: nn.Module) -> Anatomy:
    """Read the anatomy from the config and the module tree.

    The family table is tried first by ``model_type``; an unknown type falls back to the first
    family whose paths resolve, so a new Llama-like architecture works without a code change.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    candidates = [(model_type, FAMILIES[model_type])] if model_type in FAMILIES else []
    candidates += [(k, f) for k, f in FAMILIES.items() if k != model_type]
    first_missing: list[str] | None = None
    for name, fam in candidates:
        missing = _missing(model, fam)
        if not missing:
            return _build(model, name, fam)
        if first_missing is None:
            first_missing = missing
    cls = type(model).__name__
    raise UnsupportedArchitectureError(
        f"unsupported architecture {cls} (model_type={model_type!r}): missing module(s) "
        f"{', '.join(first_missing or [])}",
        "add a Family row for it in mechkit/model/anatomy.py (module paths of layers, attention, "
        "attention output, MLP and MLP output)",
    )


def _build(model: nn.Module, name: str, fam: Family) -> Anatomy:
    config = model.config
    layers = list(model.get_submodule(fam.layers))
    d_model = _config_int(config, "hidden_size", "n_embd", "d_model")
    n_heads = _config_int(config, "num_attention_heads", "n_head")
    n_kv = _config_int(config, "num_key_value_heads", "n_head_kv", default=n_heads) or n_heads
    d_head = _config_int(config, "head_dim", default=None) or d_model // n_heads
    mlp_out = layers[0].get_submodule(fam.mlp).get_submodule(fam.mlp_out)
    d_mlp = _in_features(mlp_out)
    return Anatomy(
        family_name=name, family=fam, n_layers=len(layers), n_heads=n_heads, n_kv_heads=n_kv,
        d_head=d_head, d_model=d_model, d_mlp=d_mlp, layers=layers,
        embed=model.get_submodule(fam.embed), final_norm=_get(model, fam.final_norm),
    )


def _in_features(module: nn.Module) -> int:
    if hasattr(module, "in_features"):
        return module.in_features
    return module.weight.shape[0]  # GPT-2's Conv1D stores weight as [in, out]
