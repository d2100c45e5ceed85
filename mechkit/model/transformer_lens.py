"""A TransformerLens ``TransformerBridge`` as a model spec: mechkit works on the HF model inside it.

TransformerLens is never imported here unless the object passed comes from it (``--help`` stays fast,
and mechkit works without it installed).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from typing import Any

from mechkit.errors import MechkitError, ModelLoadError, first_line

SUPPORTED = (4, 5)  # TransformerLens major versions [from, to) whose TransformerBridge is understood


def is_transformer_lens(obj: Any) -> bool:
    """Whether ``obj`` is an object of TransformerLens (checked by its class's module, without importing it)."""
    return type(obj).__module__.split(".")[0] == "transformer_lens"


def check_version() -> str:
    """The installed TransformerLens version, refused (one line) outside :data:`SUPPORTED`."""
    from importlib.metadata import version

    found = version("transformer_lens")
    try:
        major = int(found.split(".")[0])
    except ValueError:
        major = -1
    if not SUPPORTED[0] <= major < SUPPORTED[1]:
        raise ModelLoadError(f"TransformerLens {found} is not supported",
                             f"install transformer_lens>={SUPPORTED[0]},<{SUPPORTED[1]} (its TransformerBridge)")
    return found


def from_bridge(obj: Any) -> tuple[Any, Any] | None:
    """``(HF model, tokenizer)`` of a TransformerLens ``TransformerBridge``; None for anything else.

    A TransformerLens object that is not a bridge (a ``HookedTransformer``, with its own weight layout)
    or from an unsupported version is refused with one line.
    """
    if not is_transformer_lens(obj):
        return None
    check_version()
    model = obj.__dict__.get("original_model") if hasattr(obj, "__dict__") else None
    if model is None or not hasattr(model, "config"):
        raise ModelLoadError(f"a TransformerLens {type(obj).__name__} is not a TransformerBridge over a HF model",
                             "pass a TransformerBridge (TransformerBridge.boot_transformers(...)) or the HF model")
    return unwrapped(model), getattr(obj, "tokenizer", None)


def unwrapped(model: Any) -> Any:
    """A copy of a bridged HF model with TransformerLens' wrappers taken out again.

    The bridge put a wrapper (``BlockBridge``, ``LinearBridge``…) in place of each HF module it hooks,
    keeping the module inside as ``_original_component``; mechkit hooks the HF modules themselves, so
    the copy gets them back in place. The bridge keeps working on its own model. The attention
    implementation stays as the bridge set it (eager).
    """
    import copy

    model = copy.deepcopy(model)
    _unwrap(model)
    return model


def _unwrap(module: Any) -> None:
    for name, child in list(module._modules.items()):
        inner = child
        while inner is not None and is_transformer_lens(inner) and "_original_component" in inner._modules:
            inner = inner._modules["_original_component"]
        if inner is not child:
            module._modules[name] = inner
        if inner is not None:
            _unwrap(inner)


def check_bridgeable(handle: Any) -> None:
    """Refuse (one line, before any work) a model :func:`to_transformer_lens` cannot bridge."""
    remote = getattr(handle.backend, "remote", None)
    if remote:  # --remote local simulates a server: its weights are not the client's either
        where = "NDIF" if remote == "ndif" else "a (simulated) remote server"
        raise ModelLoadError(f"a model on {where} has no local weights to build a TransformerBridge from",
                             "load the model locally for TransformerLens (drop --remote)")
    try:
        check_version()
    except PackageNotFoundError:
        raise ModelLoadError("TransformerLens is not installed", "pip install 'mechkit[interop]'") from None


def to_transformer_lens(handle: Any) -> Any:
    """A TransformerLens ``TransformerBridge`` around a copy of ``handle``'s model.

    TransformerLens' boot inserts its wrappers into the HF module tree and switches attention to eager
    in place; it gets a deep copy (model and tokenizer), so the mechkit model is left exactly as it was
    (at the cost of a second copy of the weights). Hook names agree with mechkit's for the points both
    name (``blocks.L.attn.hook_z`` …), so a mechkit recording converts to an ``ActivationCache``
    directly (:meth:`mechkit.hooking.Cache.to_transformer_lens`). (The example needs TransformerLens, the
    ``interop`` extra, so the doctest suite skips it; tests/test_transformer_lens.py runs it.)

    >>> import mechkit as mk
    >>> m = mk.load_model("tiny:gpt2")
    >>> bridge = to_transformer_lens(m)  # doctest: +SKIP
    >>> bridge.cfg.n_layers  # doctest: +SKIP
    2
    """
    from mechkit.model.handle import require_handle

    require_handle(handle, "mk.to_transformer_lens")
    import copy

    check_bridgeable(handle)
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as err:
        raise ModelLoadError("TransformerLens is not installed", "pip install 'mechkit[interop]'") from err
    model = copy.deepcopy(handle.model)
    tok = copy.deepcopy(handle.tokenizer)
    if tok is not None:
        # TransformerLens reloads a tokenizer from its path to switch BOS on; one built in memory has none.
        tok.init_kwargs.setdefault("name_or_path", getattr(tok, "name_or_path", "") or "")
        if not tok.init_kwargs["name_or_path"]:
            tok.init_kwargs["add_bos_token"] = True
    import logging
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        level = logging.getLogger().level
        try:
            return TransformerBridge.boot_transformers(handle.name or type(model).__name__, hf_model=model,
                                                       tokenizer=tok, device=str(handle.device), dtype=handle.dtype)
        except MechkitError:
            raise
        except Exception as err:
            raise bridge_error(handle, err) from err
        finally:
            logging.getLogger().setLevel(level)


def bridge_error(handle: Any, err: Exception) -> ModelLoadError:
    """The line for a model TransformerLens failed to bridge. Where heads were pruned unevenly the cause is
    the pruning, not the architecture (GPT-2's fused projections cannot be split into layers of different
    head counts), so the fix must not send the user to check architecture support."""
    a = handle.anatomy
    if a.ragged_heads:
        return ModelLoadError(f"TransformerLens cannot bridge this model, whose layers keep different numbers of "
                              f"heads ({', '.join(map(str, a.head_counts))}) after pruning: {first_line(err)}",
                              "bridge the dense model, or use mechkit's own hooks (mk.run_with_cache), which number "
                              "each layer's kept heads")
    return ModelLoadError(f"TransformerLens cannot bridge this model: {first_line(err)}",
                          "check that TransformerLens supports the architecture")
