"""The handle every analysis receives: the HF model, its tokenizer and its anatomy."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mechkit.model.anatomy import Anatomy
from mechkit.model.backends.base import NATIVE, Backend
from mechkit.model.headspec import non_utf8_at

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass
class ModelHandle:
    """A loaded causal LM with the anatomy mechkit discovered in it.

    The HF model is used as-is (never wrapped or mutated); hooks and edits attach to its
    modules only inside context managers.

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:llama")
    >>> m.anatomy.n_heads, m.anatomy.n_kv_heads
    (4, 2)
    """

    model: nn.Module
    tokenizer: Any
    anatomy: Anatomy
    spec: str
    name: str
    source: Path | None = None
    _sha256: str | None = field(default=None, repr=False)
    _sha_sums: dict | None = field(default=None, repr=False)  # the weights' checksums when _sha256 was computed
    backend: Backend = field(default=NATIVE, repr=False)
    _n_vocab: int | None = field(default=None, repr=False)  # the embedding's rows, read once (token_ids)
    _n_positions: int | None = field(default=None, repr=False)  # a learned position table's rows (-1: none)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the model's device, or for a model accelerate dispatched over several
        devices its main one (which also runs CPU-offloaded modules and receives the logits); for a model
        on NDIF the CPU (inputs are shipped from there)."""
        if self.backend.remote == "ndif":
            import torch

            return torch.device("cpu")
        if getattr(self.model, "hf_device_map", None) is not None or hasattr(self.model, "_hf_hook"):
            from mechkit.model.placement.stored import input_device

            return input_device(self.model)
        return next(self.model.parameters()).device

    @property
    def device_map(self) -> dict[str, str] | None:
        """``{module: device}`` where accelerate placed the model (``cpu``/``disk`` entries may be
        offloaded), None for a model on one device."""
        from mechkit.model.placement.stored import device_summary

        return device_summary(self.model)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def n_layers(self) -> int:
        return self.anatomy.n_layers

    @property
    def n_heads(self) -> int:
        return self.anatomy.n_heads

    @property
    def context_length(self) -> int | None:
        """The longest sequence the model's position embeddings cover (None where the config says nothing)."""
        cfg = self.model.config
        for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
            value = getattr(cfg, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def bos_id(self) -> int | None:
        """The BOS id where the tokenizer prepends one, else None."""
        tok = self.tokenizer
        if tok is None or tok.bos_token_id is None:
            return None
        ids = tok("a", add_special_tokens=True)["input_ids"]
        return tok.bos_token_id if ids and ids[0] == tok.bos_token_id else None

    def __call__(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """Logits of a plain forward pass, through the backend (on nnsight: one trace running the active
        hook functions). Without grad unless the caller asks inside :func:`mechkit.enable_grad`
        (:mod:`mechkit.model.backends.grad`): the logits plot and convert to numpy as they are."""
        from mechkit.model.checks.forward_args import refuse_outputs_beyond_logits

        refuse_outputs_beyond_logits(kwargs)  # this call returns the logits alone
        kwargs = {k: v for k, v in kwargs.items() if k != "return_dict"}  # the logits, in either form
        return self.forward(input_ids, **{"use_cache": False, **kwargs}).logits  # the caller's use_cache wins

    def forward(self, input_ids: torch.Tensor, **kwargs) -> Any:
        """The model's whole output (logits, the KV cache with ``use_cache=True``: read it with
        :func:`mechkit.model.compat.cache_of`…) of one forward
        through the backend: what code that decodes step by step calls instead of ``handle.model``.
        Without grad unless inside :func:`mechkit.enable_grad`, as for :meth:`__call__`."""
        from mechkit.model.backends.grad import forward_grad_mode

        input_ids = self.checked_inputs(input_ids, kwargs)
        with forward_grad_mode():
            if self.backend.traced:
                return self.backend.forward(input_ids.to(self.device), **kwargs)
            return self.model(input_ids=input_ids.to(self.device), **kwargs)

    def checked_inputs(self, input_ids: Any, kwargs: dict) -> torch.Tensor:
        """The token ids as a ``[batch, pos]`` tensor, and ``kwargs`` checked for this model (a 1-D
        ``position_ids`` made one row, in place), or one line naming what is wrong
        (:mod:`mechkit.model.checks.token_ids`, :mod:`mechkit.model.checks.forward_inputs`)."""
        from mechkit.model.checks.forward_args import check_forward_kwargs, refuse_ignored_kwargs
        from mechkit.model.checks.forward_inputs import normalise_positions
        from mechkit.model.checks.token_ids import check_forward_inputs, checked_ids, position_rows

        input_ids = checked_ids(input_ids, self.n_vocab_rows(), self.tokenizer)
        check_forward_kwargs(self.model, kwargs)
        refuse_ignored_kwargs(self.model, kwargs)  # known, but ignored by this model as loaded
        if self._n_positions is None:
            self._n_positions = position_rows(self.model) or -1
        normalise_positions(input_ids, kwargs)
        check_forward_inputs(input_ids, self._n_positions if self._n_positions > 0 else None, kwargs, self.model,
                             self.anatomy, self.n_vocab_rows())
        return input_ids

    def n_vocab_rows(self) -> int | None:
        """How many token ids the model embeds (read once; ``None`` where the model does not say)."""
        from mechkit.model.checks.token_ids import vocab_rows

        if self._n_vocab is None:
            self._n_vocab = vocab_rows(self.model) or -1
        return self._n_vocab if self._n_vocab > 0 else None

    def __repr__(self) -> str:
        """Its anatomy in a few lines, not the module tree (``handle.model`` shows that) nor the tokenizer.

        >>> import mechkit as mk
        >>> print(repr(mk.load_model("tiny:llama")))            # doctest: +ELLIPSIS
        ModelHandle tiny:llama
          family   llama (LlamaForCausalLM)
          layers   2
          heads    4 (2 KV) × d_head 16
          d_model  64 (d_mlp ...)
          params   ...
          device   cpu · float32
        """
        return handle_text(self)

    def _repr_html_(self) -> str:
        """The same rows as a small table, for Jupyter."""
        return handle_html(self)

    def text_tokenizer(self) -> Any:
        """The tokenizer, for an analysis that reads text; one line naming the fix where the model has none
        (a model directory without tokenizer files loads, for analyses on token ids only)."""
        if self.tokenizer is None:
            from mechkit.errors import MechkitError

            where = self.source if self.source is not None else self.spec
            raise MechkitError(f"{where} has no tokenizer (no tokenizer files beside its weights), and this "
                               "analysis reads text", f"save the model's tokenizer into {where} "
                               "(tokenizer.save_pretrained)")
        return self.tokenizer

    def to_tokens(self, text: str | list[str]) -> torch.Tensor:
        """Token ids (with BOS where the tokenizer adds one), right-padded to a batch."""
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
            from mechkit.errors import MechkitError

            raise MechkitError(f"to_tokens takes text or a list of texts, not {type(text).__name__}",
                               'pass a string (m.to_tokens("hello")) or a non-empty list of strings')
        for i, t in enumerate(texts):  # bytes that were not UTF-8 (lone surrogates): the tokenizer raised TypeError
            at = non_utf8_at(t)
            if at is not None:
                from mechkit.errors import MechkitError

                where = f"text {i}, " if len(texts) > 1 else ""
                raise MechkitError(f"to_tokens: the text holds bytes that are not UTF-8 ({where}{at})", "pass UTF-8 text: decode the bytes with their encoding first, "
                                   "e.g. data.decode('latin-1')")
        enc = self.text_tokenizer()(texts, return_tensors="pt", padding=True)
        return enc["input_ids"].to(self.device)

    def to_str_tokens(self, text: str | torch.Tensor | list[int]) -> list[str]:
        """Each token of ``text`` (or of token ids) as the text it stands for, BOS included where the
        tokenizer adds one: ``[..., ' John']``, not the vocabulary's ``ĠJohn`` (tick labels, tables).

        >>> import mechkit as mk
        >>> m = mk.load_model("tiny:llama")
        >>> m.to_str_tokens("hi you")       # the tiny models' tokenizer has one token per character
        ['h', 'i', ' ', 'y', 'o', 'u']
        """
        if isinstance(text, str):
            ids = self.to_tokens(text)[0]
        else:  # an id outside the vocabulary decoded to "" (or an OverflowError): one line instead
            from mechkit.model.checks.token_ids import checked_ids

            ids = checked_ids(text, self.n_vocab_rows())
        ids = ids.reshape(-1).tolist()
        return [self.text_tokenizer().decode([i]) for i in ids]

    def weights_sha256(self) -> str:
        """SHA-256 of the parameters' bytes in name order (computed once, then remembered).

        The same for a dispatched model as for the same weights on one device: offloaded tensors are
        read from where accelerate keeps them.
        """
        if self._sha256 is None and self.backend.remote == "ndif":  # the weights never leave the server
            self._sha256 = "ndif:" + hashlib.sha256(str(self.backend.model_key).encode()).hexdigest()
        if self._sha256 is None:
            from mechkit.model.placement.stored import state_items

            digest = hashlib.sha256()
            for name, tensor in sorted(state_items(self.model), key=lambda item: item[0]):
                digest.update(name.encode())
                digest.update(tensor.detach().cpu().contiguous().view(-1).view(dtype=_u8()).numpy().tobytes())
            self._sha256 = digest.hexdigest()
            from mechkit.model.checks.integrity import weights_checksums

            self._sha_sums = weights_checksums(self.model)  # what :meth:`forget_stale_sha256` compares
        return self._sha256

    def forget_sha256(self) -> None:
        """Drop the remembered hash: the weights are being edited in place (``mk.edit_weights``)."""
        if self.backend.remote != "ndif":
            self._sha256, self._sha_sums = None, None

    def forget_stale_sha256(self, sums: dict[str, int]) -> None:
        """Drop the remembered hash where the weights' checksums (``weights_checksums``) differ from when it was
        computed: weights edited in place since (by torch directly) must not keep the hash of the old ones,
        which a resume key and every saved artifact record."""
        if self._sha_sums is not None and self._sha_sums != sums:
            self.forget_sha256()

    def info(self) -> dict:
        """The ``model`` block of a report."""
        from mechkit.model.checks.identity import config_sha256

        config = self.model.config
        return {
            "spec": self.spec,
            "name": self.name,
            "architecture": (getattr(config, "architectures", None) or [type(self.model).__name__])[0],
            **self.anatomy.as_dict(),
            "dtype": str(self.dtype).removeprefix("torch."),
            "device": str(self.device),
            **({"device_map": self.device_map} if self.device_map else {}),
            **({"backend": self.backend.info()} if self.backend.traced else {}),
            "weights_sha256": self.weights_sha256(),
            "config_sha256": config_sha256(self.model),  # same weights, another config: other results
        }


def count(n: float) -> str:
    """``1234567`` → ``1.23M``: a parameter count as people say it.

    >>> count(134515008), count(6400), count(12)
    ('134.5M', '6.4k', '12')
    """
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:g}"


def handle_rows(handle: ModelHandle) -> list[tuple[str, str]]:
    """``(label, value)`` rows of the handle's anatomy and placement."""
    a = handle.anatomy
    arch = (getattr(handle.model.config, "architectures", None) or [type(handle.model).__name__])[0]
    heads = f"{a.n_heads}" + (f" ({a.n_kv_heads} KV)" if a.n_kv_heads not in (None, a.n_heads) else "")
    rows = [
        ("family", f"{a.family_name} ({arch})"),
        ("layers", str(a.n_layers)),
        ("heads", f"{heads} × d_head {a.d_head}"),
        ("d_model", f"{a.d_model}" + (f" (d_mlp {a.d_mlp})" if a.d_mlp else "")),
        ("params", count(sum(p.numel() for p in handle.model.parameters()))),
        ("device", _placement(handle)),
    ]
    if handle.backend.traced:
        rows.append(("backend", str(handle.backend.info().get("name", "nnsight"))))
    return rows


def _placement(handle: ModelHandle) -> str:
    where = str(handle.device)
    spread = handle.device_map
    if spread:
        where += f" (spread over {', '.join(sorted(set(map(str, spread.values()))))})"
    return f"{where} · {str(handle.dtype).removeprefix('torch.')}"


def handle_text(handle: ModelHandle) -> str:
    """The handle in a few aligned lines (its ``repr``)."""
    try:
        rows = handle_rows(handle)
    except Exception as err:  # a repr must never raise: a half-loaded or remote model still shows its name
        return f"ModelHandle {handle.spec} ({type(err).__name__} reading its anatomy)"
    width = max(len(label) for label, _ in rows)
    return "\n".join([f"ModelHandle {handle.spec}", *(f"  {label:<{width}}  {value}" for label, value in rows)])


def handle_html(handle: ModelHandle) -> str:
    """The same rows as a small HTML table (Jupyter's rich display of the handle)."""
    try:
        rows = handle_rows(handle)
    except Exception:
        return f"<pre>{escape(handle_text(handle))}</pre>"
    body = "".join(f'<tr><th style="text-align:left">{escape(k)}</th><td style="text-align:left">{escape(v)}</td></tr>'
                   for k, v in rows)
    return f"<table><caption style=\"text-align:left\"><b>ModelHandle</b> <code>{escape(handle.spec)}</code>" \
           f"</caption>{body}</table>"


def _u8():
    import torch

    return torch.uint8


def require_handle(handle: Any, what: str) -> None:
    """One line where a public function that takes a loaded model is given something else (``None``, a
    spec string, a raw transformers model): a :class:`MechkitError` naming the fix, never the
    ``AttributeError`` deep inside that the first use of ``handle.anatomy`` would raise.

    >>> require_handle("tiny:llama", "mk.edit_weights")
    Traceback (most recent call last):
    mechkit.errors.MechkitError: mk.edit_weights needs a loaded model, not the str 'tiny:llama' — load it first: m = mk.load_model('tiny:llama'), then mk.edit_weights(m, ...)
    """
    if all(hasattr(handle, name) for name in ("model", "anatomy", "backend")):
        return
    from mechkit.errors import MechkitError

    shown = f"the {type(handle).__name__} {handle!r}" if isinstance(handle, str | int | float) or handle is None \
        else f"a {type(handle).__name__}"
    spec = repr(handle) if isinstance(handle, str) else '"tiny:llama"'
    raise MechkitError(f"{what} needs a loaded model, not {shown}".replace("the NoneType None", "None"),
                       f"load it first: m = mk.load_model({spec}), then {what}(m, ...)")
