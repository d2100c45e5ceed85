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
    # "interleaved" = per head [q_h | k_h | v_h] (GPT-NeoX), "mp4" = four model-parallel blocks, each
    # [q | v | k] for a quarter of the heads (CodeGen).
    qkv_layout: str = "concat"
    mlp_in: tuple[str, ...] = ()
    unembed: str = "lm_head"
    norm_offset: float = 0.0  # Gemma's RMSNorm scales by (1 + weight)
    # The module (inside a block) whose input is the residual stream between attention and MLP
    # (``hook_resid_mid``); None where attention and MLP read the same input (GPT-NeoX's parallel residual).
    resid_mid: str | None = "post_attention_layernorm"
    # Where the MLP module adds the residual itself (Bloom, MPT): the module inside ``mlp`` whose output is
    # the MLP's own output (``hook_mlp_out``); "" = the MLP module.
    mlp_output: str = ""
    # Mixture of experts: the expert bank inside ``mlp`` (its units are experts, not neurons), the router
    # and any shared expert. Filled in by the MoE rule of :func:`discover_anatomy` where ``mlp`` holds an
    # ``experts`` module instead of ``mlp_out``.
    experts: str | None = None
    router: str | None = None
    shared_expert: str | None = None
    # Families that compute attention inline instead of through transformers' attention functions: the
    # module inside ``attn`` whose input and output are the pattern (its dropout; identity in eval), whose
    # output a pattern hook reads and replaces; or "softmax": the softmax the attention module calls
    # (MPT, Falcon compute it with no module around it).
    pattern: str | None = None


_LLAMA_LIKE = Family(
    layers="model.layers", attn="self_attn", attn_out="o_proj", q="q_proj", k="k_proj", v="v_proj",
    mlp="mlp", mlp_in=("gate_proj", "up_proj"), mlp_out="down_proj",
    embed="model.embed_tokens", final_norm="model.norm",
)

_GEMMA = replace(_LLAMA_LIKE, norm_offset=1.0)
_GEMMA2 = replace(_GEMMA, resid_mid="pre_feedforward_layernorm")  # sandwich norms: the MLP's own pre-norm

_PARALLEL = dict(resid_mid=None)  # attention and MLP read the same normed input (GPT-J, Phi, Falcon)
# OPT-style blocks hold fc1/fc2 directly: the "MLP" is fc2 itself (mlp_out "" = the module is its own
# output projection), its output is the MLP's output, its input the neurons.
_OPT = Family(
    layers="model.decoder.layers", attn="self_attn", attn_out="out_proj", q="q_proj", k="k_proj", v="v_proj",
    mlp="fc2", mlp_out="", embed="model.decoder.embed_tokens", final_norm="model.decoder.final_layer_norm",
    resid_mid="final_layer_norm",
)
_GPTJ = Family(
    layers="transformer.h", attn="attn", attn_out="out_proj", q="q_proj", k="k_proj", v="v_proj",
    mlp="mlp", mlp_in=("fc_in",), mlp_out="fc_out", embed="transformer.wte", final_norm="transformer.ln_f",
    **_PARALLEL,
)

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
    "opt": _OPT,
    "biogpt": replace(_OPT, layers="biogpt.layers", embed="biogpt.embed_tokens", final_norm="biogpt.layer_norm",
                      unembed="output_projection"),
    "xglm": replace(_OPT, layers="model.layers", embed="model.embed_tokens", final_norm="model.layer_norm"),
    "gptj": _GPTJ,
    "codegen": replace(_GPTJ, q=None, k=None, v=None, qkv="qkv_proj", qkv_layout="mp4"),
    "phi": replace(_LLAMA_LIKE, attn_out="dense", mlp_in=("fc1",), mlp_out="fc2", final_norm="model.final_layernorm",
                   **_PARALLEL),
    "persimmon": replace(_LLAMA_LIKE, attn_out="dense", q=None, k=None, v=None, qkv="query_key_value",
                         qkv_layout="interleaved", mlp_in=("dense_h_to_4h",), mlp_out="dense_4h_to_h",
                         final_norm="model.final_layernorm"),
    "starcoder2": replace(_LLAMA_LIKE, mlp_in=("c_fc",), mlp_out="c_proj"),
    "granitemoe": replace(_LLAMA_LIKE, mlp="block_sparse_moe"),
    "bloom": Family(
        layers="transformer.h", attn="self_attention", attn_out="dense", qkv="query_key_value",
        qkv_layout="interleaved", mlp="mlp", mlp_in=("dense_h_to_4h",), mlp_out="dense_4h_to_h",
        embed="transformer.word_embeddings", final_norm="transformer.ln_f", pattern="attention_dropout",
        mlp_output="dense_4h_to_h",
    ),
    "gpt_neo": Family(
        layers="transformer.h", attn="attn.attention", attn_out="out_proj", q="q_proj", k="k_proj", v="v_proj",
        mlp="mlp", mlp_in=("c_fc",), mlp_out="c_proj", embed="transformer.wte", final_norm="transformer.ln_f",
        resid_mid="ln_2", pattern="attn_dropout",
    ),
    "openai-gpt": Family(  # post-norm blocks: the MLP reads the normed stream after attention
        layers="transformer.h", attn="attn", attn_out="c_proj", qkv="c_attn", mlp="mlp", mlp_in=("c_fc",),
        mlp_out="c_proj", embed="transformer.tokens_embed", final_norm="transformer.ln_f", resid_mid="mlp",
        pattern="attn_dropout",
    ),
    "mpt": Family(
        layers="transformer.blocks", attn="attn", attn_out="out_proj", qkv="Wqkv", mlp="ffn", mlp_in=("up_proj",),
        mlp_out="down_proj", embed="transformer.wte", final_norm="transformer.norm_f", resid_mid="norm_2",
        pattern="softmax", mlp_output="down_proj",
    ),
    "falcon": Family(  # the layout of query_key_value and the block follow the config: see _falcon
        layers="transformer.h", attn="self_attention", attn_out="dense", qkv="query_key_value",
        mlp="mlp", mlp_in=("dense_h_to_4h",), mlp_out="dense_4h_to_h", embed="transformer.word_embeddings",
        final_norm="transformer.ln_f", pattern="softmax", **_PARALLEL,
    ),
    "ctrl": Family(
        layers="transformer.h", attn="multi_head_attention", attn_out="dense", q="Wq", k="Wk", v="Wv",
        mlp="ffn", mlp_in=("0",), mlp_out="2", embed="transformer.w", final_norm="transformer.layernorm",
        resid_mid="layernorm2", pattern="softmax", unembed="lm_head",
    ),
    "gpt_neox_japanese": Family(
        layers="gpt_neox_japanese.layers", attn="attention", attn_out="dense", qkv="query_key_value",
        qkv_layout="interleaved", mlp="mlp", mlp_in=("dense_h_to_4h",), mlp_out="dense_4h_to_h",
        embed="gpt_neox_japanese.embed_in", final_norm="gpt_neox_japanese.final_layer_norm",
        pattern="attention_dropout", unembed="embed_out",
    ),
    "git": Family(  # BERT-style post-norm layers run with a causal mask: the MLP's halves are siblings
        layers="git.encoder.layer", attn="attention", attn_out="output.dense", q="self.query", k="self.key",
        v="self.value", mlp="output", mlp_out="dense", mlp_output="dense", embed="git.embeddings.word_embeddings",
        final_norm="git.final_norm", resid_mid="intermediate", pattern="self.dropout", unembed="output",
    ),
    "llama4_text": replace(_LLAMA_LIKE, mlp="feed_forward"),
    "nanochat": replace(_LLAMA_LIKE, mlp_in=("fc1",), mlp_out="fc2"),
    "modernbert-decoder": replace(_LLAMA_LIKE, attn="attn", attn_out="Wo", mlp_in=("Wi",), mlp_out="Wo",
                                  embed="model.embeddings.tok_embeddings", final_norm="model.final_norm",
                                  resid_mid="mlp_norm", unembed="decoder"),
}
# Other model types with a row's layout (tried first for them; any type also falls back to every row).
FAMILIES.update({t: FAMILIES["granitemoe"] for t in ("granitemoeshared", "granitemoe_swa")})
FAMILIES.update({"phi4_multimodal": FAMILIES["phi3"],  # Moshi wraps each projection's Linear in a MoshiLinear
                 "moshi": replace(FAMILIES["nanochat"], attn_out="o_proj.linear", q="q_proj.linear",
                                  k="k_proj.linear", v="v_proj.linear")})
# Multimodal models keep a family's text model under this path (Gemma 3, Fuyu…): each row is also tried there.
_TEXT_MODEL = "model.language_model"
_ROUTERS = ("gate", "router")
_SHARED = ("shared_expert", "shared_experts")


def _get(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _with_moe(block: nn.Module, fam: Family) -> Family:
    """The MoE rule: where the MLP holds an ``experts`` bank and no ``mlp_out``, the family's MoE variant
    (experts as units, its router and any shared expert)."""
    mlp = _get(block, fam.mlp)
    if fam.experts is not None or mlp is None or _get(mlp, fam.mlp_out) is not None or _get(mlp, "experts") is None:
        return fam
    router = next((r for r in _ROUTERS if _get(mlp, r) is not None), None)
    shared = next((s for s in _SHARED if _get(mlp, s) is not None), None)
    return replace(fam, mlp_in=(), mlp_out="", experts="experts", router=router, shared_expert=shared)


_MLP_PRE_NORMS = ("pre_feedforward_layernorm", "pre_mlp_layernorm", "feedforward_layernorm", "ffn_norm")


def _resid_mid(block: nn.Module, fam: Family) -> str | None:
    """The norm rule for ``hook_resid_mid`` where a row's Llama default does not fit the block: sandwich
    norms (Gemma, AFMoE: ``post_attention_layernorm`` normalises the attention output, the MLP has its own
    pre-norm), norms after each sublayer (OLMo 2/3, EXAONE 4: no input norm, the MLP reads the stream), other
    names for the MLP's pre-norm (Apertus); None where nothing fits (a parallel block, Cohere)."""
    if fam.resid_mid != "post_attention_layernorm":
        return fam.resid_mid
    for name in _MLP_PRE_NORMS:
        if _get(block, name) is not None:
            return name
    if _get(block, "input_layernorm") is None and _get(block, "post_feedforward_layernorm") is not None:
        return fam.mlp
    return fam.resid_mid if _get(block, fam.resid_mid) is not None else None


def _missing(model: nn.Module, fam: Family) -> tuple[list[str], Family]:
    layers = _get(model, fam.layers)
    if layers is None or len(layers) == 0:
        return [fam.layers], fam
    fam = _with_moe(layers[-1], fam)  # DeepSeek-style models keep their first layers dense
    fam = replace(fam, resid_mid=_resid_mid(layers[0], fam))
    last = len(layers) - 1
    projections = [fam.qkv] if fam.qkv else [fam.q, fam.k, fam.v]
    wanted = [(0, fam.attn), (0, _join(fam.attn, fam.attn_out)), (0, fam.mlp),
              *((0, _join(fam.attn, p)) for p in projections),
              (last, _join(fam.mlp, fam.experts or fam.mlp_out))]
    wanted += [(i, fam.attn) for i in range(1, len(layers))]  # every layer has heads (not a hybrid)
    return [f"{fam.layers}.{i}.{p}" for i, p in wanted if _get(layers[i], p) is None], fam


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
    d_mlp: int  # 0 for a mixture of experts
    layers: list = field(repr=False)
    embed: nn.Module = field(repr=False)
    final_norm: nn.Module | None = field(repr=False)
    n_experts: int = 0
    # per-layer head sizes where they differ across layers (Gemma 4's global layers); None: d_head everywhere
    d_heads: tuple[int, ...] | None = None
    # whether the expert bank is called as experts(hidden, indices, weights) (mlp.hook_routing and
    # mlp.hook_expert_out can read it)
    expert_routing: bool = False
    # Per-layer query and KV head counts where layers differ (a model with heads pruned out of some layers:
    # ``n_heads``/``n_kv_heads`` are then the widest layer's); None: every layer has ``n_heads``/``n_kv_heads``.
    layer_heads: tuple[int, ...] | None = None
    layer_kv_heads: tuple[int, ...] | None = None
    # Per-layer MLP widths where layers differ (neurons pruned: ``d_mlp`` is then the widest); None: ``d_mlp``.
    layer_d_mlp: tuple[int, ...] | None = None

    def block(self, layer: int) -> nn.Module:
        return self.layers[layer]

    def attn(self, layer: int) -> nn.Module:
        return self.layers[layer].get_submodule(self.family.attn)

    def attn_out(self, layer: int) -> nn.Module:
        """The attention output projection; its input is the concatenated per-head outputs."""
        return self.attn(layer).get_submodule(self.family.attn_out)

    def mlp(self, layer: int) -> nn.Module:
        return self.layers[layer].get_submodule(self.family.mlp)

    def mlp_output(self, layer: int) -> nn.Module:
        """The module whose output is the MLP's contribution to the stream (``hook_mlp_out``)."""
        return self.mlp(layer).get_submodule(self.family.mlp_output)

    def mlp_out(self, layer: int) -> nn.Module:
        """The MLP down projection; its input is the MLP's neurons. A mixture of experts has none."""
        self.refuse_moe("dense MLP neurons")
        return self.mlp(layer).get_submodule(self.family.mlp_out)

    @property
    def is_moe(self) -> bool:
        """Whether the MLP is a mixture of experts (its units are experts, not neurons)."""
        return self.family.experts is not None

    def refuse_moe(self, what: str, instead: str = "") -> None:
        """Raise one line, before any work, where an analysis needs ``what`` of a dense MLP."""
        if self.is_moe:
            raise UnsupportedArchitectureError(
                f"this model's MLP is a mixture of {self.n_experts} experts: it has no {what}",
                (f"{instead}; " if instead else "") + "at the expert level: blocks.L.mlp.hook_router (router "
                "logits), blocks.L.mlp.hook_expert_out (each expert's output), mk.ablate(experts='L.eN') and "
                "blocks.L.hook_mlp_out; the "
                "attention-side analyses (detect, ablate, shuffle, sweep, patch, attention, and head pruning where "
                "each head is normalised on its own) work unchanged")

    def joint_head_norm(self) -> str | None:
        """The name of a query/key norm that normalises all heads together (OLMoE's ``q_norm`` over
        ``n_heads · d_head``), or None. With one, a head's output depends on the others' pre-norm values,
        so heads can be masked or ablated but not sliced out of the weights."""
        for layer in range(self.n_layers):
            attn = self.attn(layer)
            for name in ("q_norm", "k_norm"):
                weight = getattr(getattr(attn, name, None), "weight", None)
                if hasattr(weight, "numel") and weight.numel() not in (0, self.d_head):
                    return f"{name} ({weight.numel()} channels, {weight.numel() // self.d_head} heads)"
        return None

    def refuse_joint_head_norm(self, what: str, instead: str) -> None:
        """Raise one line, before any work, where ``what`` slices heads out of a jointly normalised layer."""
        found = self.joint_head_norm()
        if found:
            raise UnsupportedArchitectureError(
                f"this model's attention normalises all heads together ({found}): {what} would change the "
                "heads it keeps", instead)

    def experts(self, layer: int) -> nn.Module:
        """The expert bank of an MoE layer."""
        return self.mlp(layer).get_submodule(self.family.experts)

    def router(self, layer: int) -> nn.Module | None:
        """The MoE router (its first output: router logits ``[tokens, n_experts]``), or None."""
        path = self.family.router
        return None if path is None else _get(self.mlp(layer), path)  # None in a leading dense layer

    def resid_mid_reader(self, layer: int) -> nn.Module | None:
        """The module whose input is ``hook_resid_mid`` (the stream between attention and MLP), or None
        where the family has no such point (parallel attention and MLP)."""
        path = self.family.resid_mid
        return None if path is None else self.layers[layer].get_submodule(path)

    def pattern_module(self, layer: int) -> nn.Module | None:
        """Where the family computes attention inline: the module whose output is the pattern, else None."""
        path = self.family.pattern
        return None if path is None else self.attn(layer).get_submodule(path)

    def attn_proj(self, layer: int, role: str) -> nn.Module | None:
        """``role`` in q, k, v, qkv: the projection module, or None where this family fuses it."""
        path = getattr(self.family, role)
        return None if path is None else self.attn(layer).get_submodule(path)

    def head_rows(self, layer: int, role: str, index: int) -> tuple[nn.Module, slice]:
        """The projection module and its output rows (``[out, in]`` layout) computing ``role`` for one head.

        ``role`` is ``q`` (``index`` = query head) or ``k``/``v`` (``index`` = KV head, see
        :meth:`kv_head`). Works the same for separate, concatenated and interleaved projections.
        """
        d = self.head_size(layer)
        if self.family.qkv is None:
            return self.attn_proj(layer, role), slice(index * d, (index + 1) * d)
        module = self.attn_proj(layer, "qkv")
        n_q, n_kv, groups = self.heads_in(layer), self.kv_heads_in(layer), self.groups_in(layer)
        if self.family.qkv_layout == "grouped":  # per KV group: its query heads, then its k, then its v
            per = groups + 2
            if role == "q":
                start = (self.kv_head(index, layer) * per + index % groups) * d
            else:
                start = (index * per + groups + (role == "v")) * d
        elif self.family.qkv_layout == "mp4":
            per_block = n_q // 4
            block, within = divmod(index, per_block)
            start = block * 3 * per_block * d + {"q": 0, "v": 1, "k": 2}[role] * per_block * d + within * d
        elif self.family.qkv_layout == "interleaved":
            start = index * 3 * d + {"q": 0, "k": d, "v": 2 * d}[role]
        else:
            start = {"q": 0, "k": n_q * d, "v": (n_q + n_kv) * d}[role] + index * d
        return module, slice(start, start + d)

    def final_norm_scale(self):
        """The final norm's effective per-channel scale (None if it has no weight)."""
        gamma = getattr(self.final_norm, "weight", None)
        if gamma is not None and gamma.device.type == "meta":  # offloaded by accelerate
            from mechkit.model.placement.stored import module_tensor

            gamma = module_tensor(self.final_norm)
        return None if gamma is None else gamma + self.family.norm_offset

    def head_size(self, layer: int) -> int:
        """The head size of ``layer``: ``d_head``, unless the family's layers differ (Gemma 4)."""
        return self.d_head if self.d_heads is None else self.d_heads[layer]

    def kv_head(self, head: int, layer: int | None = None) -> int:
        """The KV head a query head reads under grouped-query attention (in ``layer``, where layers differ)."""
        return head // (self.n_groups if layer is None else self.groups_in(layer))

    @property
    def n_groups(self) -> int:
        """Query heads per KV head (grouped-query attention); 1 for plain multi-head attention."""
        return self.n_heads // self.n_kv_heads

    def heads_in(self, layer: int) -> int:
        """How many query heads ``layer`` has: ``n_heads``, unless heads were pruned out of some layers."""
        return self.n_heads if self.layer_heads is None else self.layer_heads[layer]

    def kv_heads_in(self, layer: int) -> int:
        """How many KV heads ``layer`` has."""
        return self.n_kv_heads if self.layer_kv_heads is None else self.layer_kv_heads[layer]

    def groups_in(self, layer: int) -> int:
        """Query heads per KV head in ``layer``."""
        return self.heads_in(layer) // self.kv_heads_in(layer)

    @property
    def head_counts(self) -> tuple[int, ...]:
        """Query heads per layer; every analysis that enumerates heads reads this, not ``n_heads``, so a
        model whose layers keep different numbers of heads is analysed head by head like any other."""
        return tuple(self.heads_in(layer) for layer in range(self.n_layers))

    @property
    def ragged_heads(self) -> bool:
        """Whether layers have different head counts (heads pruned): a ``[layers, heads]`` grid then has
        cells with no head (``n_heads`` is the widest layer); they hold NaN."""
        return self.layer_heads is not None

    def head_mask(self):
        """``[n_layers, n_heads]`` bool array: True where the head exists."""
        import numpy as np

        return np.arange(self.n_heads)[None, :] < np.asarray(self.head_counts)[:, None]

    def mlp_width(self, layer: int) -> int:
        """How many MLP neurons ``layer`` has: ``d_mlp``, unless neurons were pruned out of some layers."""
        return self.d_mlp if self.layer_d_mlp is None else self.layer_d_mlp[layer]

    def as_dict(self) -> dict:
        return {
            "family": self.family_name, "n_layers": self.n_layers, "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads, "d_head": self.d_head, "d_model": self.d_model,
            "d_mlp": self.d_mlp, **({"n_experts": self.n_experts} if self.is_moe else {}),
            **({"heads_per_layer": list(self.layer_heads)} if self.layer_heads else {}),
            **({"d_mlp_per_layer": list(self.layer_d_mlp)} if self.layer_d_mlp else {}),
        }


def _config_int(config, *names: str, default: int | None = None) -> int | None:
    for name in names:
        try:
            value = getattr(config, name, None)
        except Exception:  # noqa: BLE001 - a config that refuses a global value (per-layer attributes)
            value = None
        if isinstance(value, int):
            return value
    return default


def discover_anatomy(model: nn.Module) -> Anatomy:
    """Read the anatomy from the config and the module tree.

    The family table is tried first by ``model_type``; an unknown type falls back to the first
    family whose paths resolve, so a new Llama-like architecture works without a code change.
    """
    refuse_peft(model)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    candidates = [(model_type, FAMILIES[model_type])] if model_type in FAMILIES else []
    candidates += [(k, f) for k, f in FAMILIES.items() if k != model_type]
    candidates += [(k, _under(f, _TEXT_MODEL)) for k, f in candidates if f.layers.startswith("model.")]
    first_missing: list[str] | None = None
    for name, fam in candidates:
        missing, fam = _missing(model, fam)
        if not missing:
            return _build(model, name, fam)
        if first_missing is None:
            first_missing = missing
    cls = type(model).__name__
    if callable(getattr(model, "get_base_model", None)):  # a peft wrapper: the model is inside it
        raise UnsupportedArchitectureError(
            f"{cls} is a peft wrapper around the model, not the model",
            "pass model.merge_and_unload() (the adapters merged in) or model.get_base_model() (the LoRA layers "
            "kept in place)")
    head = getattr(model, "get_output_embeddings", None)
    if callable(head) and head() is None and not cls.endswith("ForCausalLM"):  # LlamaModel: the body alone
        raise UnsupportedArchitectureError(
            f"{cls} is a model body without its language-model head (no lm_head): mechkit reads a causal LM's logits",
            f"load the causal-LM class that wraps it, transformers.AutoModelForCausalLM.from_pretrained(...) "
            f"({_causal_lm_class(model_type)}), and pass that, not the body taken from it")
    raise UnsupportedArchitectureError(
        f"unsupported architecture {cls} (model_type={model_type!r}): missing module(s) "
        f"{', '.join(first_missing or [])}",
        "add a Family row for it in mechkit/model/anatomy.py (module paths of layers, attention, "
        "attention output, MLP and MLP output)",
    )


def _causal_lm_class(model_type: str | None) -> str:
    """The transformers class that puts a language-model head on a ``model_type``'s body (``GPT2LMHeadModel``)."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:  # pragma: no cover - transformers is a dependency
        return "its *ForCausalLM class"
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type or "")
    return name if isinstance(name, str) else "its *ForCausalLM class"


def refuse_peft(model: nn.Module) -> None:
    """Refuse a peft wrapper up front, with the fix for its kind. A prompt-learning ``PeftModel`` (prompt
    tuning, prefix tuning, p-tuning) resolved ``model.layers`` through its ``__getattr__``, so it loaded and
    every analysis ran on logits shifted by its virtual tokens (``detect`` raised a raw ValueError); a tuner
    (``LoraModel``: ``PeftModel.base_model``) has no ``get_base_model`` and was told to add a Family row.
    Tuner layers left in the model (``peft.inject_adapter_in_model``, or a LoRA ``PeftModel``'s
    ``get_base_model()``) are refused too: each wraps a linear layer, whose weight moves to
    ``base_layer.weight`` and whose output adds the adapter's, so the weight analyses read and prune the wrong
    tensor (prune's surgery raised KeyError "attribute 'weight' already exists").
    Only where peft is imported: a model cannot be peft's without it."""
    import sys

    peft = sys.modules.get("peft")
    if peft is None:
        return
    cls = type(model).__name__
    peft_model = getattr(peft, "PeftModel", None)
    if isinstance(peft_model, type) and isinstance(model, peft_model):
        config = getattr(model, "active_peft_config", None)
        if getattr(config, "is_prompt_learning", False):
            n = getattr(config, "num_virtual_tokens", None)
            raise UnsupportedArchitectureError(
                f"{cls} is a peft prompt-learning wrapper ({getattr(config, 'peft_type', 'prompt learning')}): its "
                f"forward prepends {n or 'its'} virtual tokens, so every position and logit would be shifted",
                "pass model.get_base_model(): it analyses the base model without the virtual tokens, which are not "
                "part of it (mechkit cannot analyse them)")
        raise UnsupportedArchitectureError(
            f"{cls} is a peft wrapper around the model, not the model",
            "pass model.merge_and_unload() (the adapters merged in) or model.unload() (the base model without them)")
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    base_tuner = getattr(tuners, "BaseTuner", None)
    if isinstance(base_tuner, type) and isinstance(model, base_tuner):
        raise UnsupportedArchitectureError(
            f"{cls} is a peft tuner around the model (a PeftModel's .base_model), not the model",
            "pass model.merge_and_unload() (the adapters merged in) or model.unload() (the base model without them)")
    tuner_layer = getattr(tuners, "BaseTunerLayer", None)
    if isinstance(tuner_layer, type):
        layers = [name for name, module in model.named_modules() if isinstance(module, tuner_layer)]
        if layers:
            kind = type(model.get_submodule(layers[0]))
            raise UnsupportedArchitectureError(
                f"{cls} holds {len(layers)} peft adapter layer{'s' if len(layers) > 1 else ''} ({layers[0]}"
                f"{', ...' if len(layers) > 1 else ''}: {kind.__module__}.{kind.__qualname__}) in place of "
                "its own modules, whose weights the analyses read and edit",
                "merge them in and put the base layers back: for each such layer, layer.merge() then "
                "setattr(parent, name, layer.get_base_layer()) (a PeftModel does both: merge_and_unload()); "
                "or load the base model without the adapters")


def _under(fam: Family, prefix: str) -> Family:
    """A row with its top-level ``model.`` paths moved under ``prefix`` (a multimodal model's text model)."""
    def moved(path: str) -> str:
        return prefix + path.removeprefix("model") if path.startswith("model.") else path

    return replace(fam, layers=moved(fam.layers), embed=moved(fam.embed), final_norm=moved(fam.final_norm))


def _build(model: nn.Module, name: str, fam: Family) -> Anatomy:
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config  # multimodal: its text model
    layers = list(model.get_submodule(fam.layers))
    d_model = _config_int(config, "hidden_size", "n_embd", "d_model")
    n_heads = _config_int(config, "num_attention_heads", "n_head")
    n_kv = _config_int(config, "num_key_value_heads", "n_head_kv", "num_kv_heads", default=n_heads) or n_heads
    if getattr(config, "multi_query", False) is True and not getattr(config, "new_decoder_architecture", False):
        n_kv = 1  # GPT-BigCode, Falcon: one KV head
    elif name == "falcon" and not getattr(config, "new_decoder_architecture", False):
        n_kv = n_heads  # Falcon without multi-query: one KV head per query head, whatever num_kv_heads says
    # multi-head latent attention (DeepSeek) has per-head values of v_head_dim, q/k of another size
    d_head = _config_int(config, "v_head_dim", "head_dim", default=None) or d_model // n_heads
    d_heads, heads = _head_sizes(layers, fam, d_head, n_heads)
    if heads != n_heads:  # the modules' own head count (Inkling): KV heads from their group size too
        groups = getattr(layers[0].get_submodule(fam.attn), "num_key_value_groups", None)
        n_heads, n_kv = heads, heads // groups if isinstance(groups, int) and groups > 0 else heads
    d_head = d_heads[0] if d_heads else d_head
    if name == "falcon":
        fam = _falcon(fam, config)
    mlp = layers[-1].get_submodule(fam.mlp)
    d_mlp = 0 if fam.experts else _in_features(mlp.get_submodule(fam.mlp_out))
    n_experts = _n_experts(mlp.get_submodule(fam.experts), config) if fam.experts else 0
    widths = None if fam.experts else tuple(_in_features(block.get_submodule(fam.mlp).get_submodule(fam.mlp_out))
                                            for block in layers)
    heads, kv_heads = _pruned_heads(model, len(layers), n_heads, n_kv)
    if heads and len(set(heads)) == len(set(kv_heads)) == 1:  # every layer keeps as many: a rectangular model
        n_heads, n_kv, heads, kv_heads = heads[0], kv_heads[0], None, None
    return Anatomy(
        family_name=name, family=fam, n_layers=len(layers), n_heads=max(heads or (n_heads,)),
        n_kv_heads=max(kv_heads or (n_kv,)), d_head=d_head, d_model=d_model,
        d_mlp=max(widths) if widths else d_mlp, layers=layers,
        embed=model.get_submodule(fam.embed), final_norm=_get(model, fam.final_norm), n_experts=n_experts,
        d_heads=d_heads if d_heads and len(set(d_heads)) > 1 else None,
        expert_routing=bool(fam.experts) and _takes_routing(mlp.get_submodule(fam.experts)),
        layer_heads=heads, layer_kv_heads=kv_heads,
        layer_d_mlp=widths if widths and len(set(widths)) > 1 else None,
    )


def _pruned_heads(model: nn.Module, n_layers: int, n_heads: int, n_kv: int
                  ) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """Per-layer query and KV head counts of a model whose heads were physically pruned, read from the
    structure it records (``_mechkit_structure``: kept heads per dense layer, removed layers); ``(None,
    None)`` for any other model. The config's counts are the dense model's (transformers builds every
    layer alike), so the record, not the config, says what each layer holds."""
    structure = getattr(model, "_mechkit_structure", None)
    if structure is None or not structure.head_keep:
        return None, None
    kept_layers = [i for i in range(structure.n_layers) if i not in set(structure.layers_removed)]
    if len(kept_layers) != n_layers:
        return None, None
    groups = n_heads // n_kv
    heads = [structure.head_keep.get(dense, range(n_heads)) for dense in kept_layers]
    q, kv = tuple(len(h) for h in heads), tuple(len({i // groups for i in h}) for h in heads)
    return (None, None) if len(set(q)) == len(set(kv)) == 1 and q[0] == n_heads else (q, kv)


def _takes_routing(experts: nn.Module) -> bool:
    """Whether an expert bank's forward takes (hidden, indices, weights): transformers' convention, which
    Llama 4's bank (called on pre-routed tokens) does not follow."""
    import inspect

    params = [p for p in inspect.signature(experts.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 3


def _head_sizes(layers: list, fam: Family, d_head: int, n_heads: int) -> tuple[list[int] | None, int]:
    """Per-layer head sizes from the attention modules' own ``head_dim`` where the config's global one is
    not what the modules use (Gemma 4's global layers, Inkling), and the head count that fits the output
    projection then; ``(None, n_heads)`` where the modules say nothing or agree with the config."""
    sizes = [getattr(block.get_submodule(fam.attn), "head_dim", None) for block in layers]
    if not all(isinstance(s, int) and s > 0 for s in sizes) or all(s == d_head for s in sizes):
        return None, n_heads
    width = _in_features(layers[0].get_submodule(fam.attn).get_submodule(fam.attn_out))
    return sizes, width // sizes[0] if width % sizes[0] == 0 else n_heads


def _falcon(fam: Family, config) -> Family:
    """Falcon's config picks its layout: multi-query (one KV head after all query heads, the concat layout),
    per-head interleaved (neither flag), or grouped (new decoder architecture, not yet mapped here); and
    a parallel or sequential block."""
    layout = "grouped" if getattr(config, "new_decoder_architecture", False) else \
        "concat" if getattr(config, "multi_query", True) else "interleaved"
    mid = None if getattr(config, "parallel_attn", True) or layout == "grouped" else "post_attention_layernorm"
    return replace(fam, qkv_layout=layout, resid_mid=mid)


def _n_experts(experts: nn.Module, config) -> int:
    n = getattr(experts, "num_experts", None)
    if isinstance(n, int):
        return n
    return _config_int(config, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", default=0)


def _in_features(module: nn.Module) -> int:
    if hasattr(module, "in_features"):
        return module.in_features
    return module.weight.shape[0]  # GPT-2's Conv1D stores weight as [in, out]
