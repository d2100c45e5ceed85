"""What a run must leave as it found besides the weights: hooks, replaced ``forward`` methods, train/eval
mode, the modules themselves, the config and the tokenizer.

The logits of a few probe tokens miss a hook that acts only on longer inputs, on batches or on padding,
a ``forward`` replaced to act only past the probe's length, a model left in train mode whose dropout is
zero, or a config field read only for long inputs. The run's model would then compute differently for
the next caller. These are read directly, before and after the run: the hooks every module (and torch's
global registry) holds, each module's own ``forward`` attribute and mode, and the config's fields. Only
references are compared, so the check is exact and costs a walk over the modules. References, not names:
a module swapped for another object under the same name (or its class swapped), a hook's function
replaced under the same handle, or a parameter replaced by a copy (a tie broken) changes what the model
computes while every name stays. The tokenizer's definition and settings (a ``padding_side`` left flipped,
tokens added) change the next caller's ids. Every module's own plain attributes are read too (a submodule's
``config`` replaced by an edited copy, ``_loss_function`` or ``loss_type`` set, ``self_attn.scaling``
changed), and torch's process-wide modes and numeric settings (:func:`torch_state`): a ``TorchFunctionMode``
entered and never exited rewrote every later forward where no probe could see.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mechkit.model.checks.buffers import buffer_state, changed_buffer, library_attrs
from mechkit.model.checks.rope import rope_attrs

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
# What state_dict() and load_state_dict() run: a hook left there changes what a later save writes (a pruned
# model's weights) while every forward computes as before, so it is compared but does not mark a model hooked.
_STATE_DICT_HOOKS = ("_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                     "_load_state_dict_post_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


@dataclass(frozen=True)
class ModuleState:
    """One module: the object and its class, its hooks (handle ids and functions), its own ``forward``
    attribute if any, its mode, and its own parameters (objects and ``requires_grad``)."""

    module: Any
    cls: type
    hooks: tuple
    forward: Any
    training: bool
    params: tuple
    refs: tuple  # the hook functions and parameters, held so that their ids stay theirs while compared
    calls: tuple = ()  # (name, object) of its own attributes that replace a method torch calls on it
    attrs: tuple = ()  # (name, comparable value) of its other plain instance attributes: see :func:`_own_attrs`
    saves: tuple = ()  # its state_dict / load_state_dict hooks (handle ids and functions)


def _own_calls(m: Any) -> tuple:
    """The module's own attributes that stand in for a method of its class (``_call_impl``, a helper such as
    ``_attn``) and torch's ``_compiled_call_impl``: ``nn.Module.__call__`` runs either in place of
    ``forward``, so one acting only on long inputs passed every check."""
    cls = type(m)
    return tuple((name, value) for name, value in sorted(vars(m).items())
                 if name != "forward" and (name == "_compiled_call_impl" or
                                           (callable(value) and callable(getattr(cls, name, None)))))


# What torch keeps in every module's __dict__ besides its attributes: compared elsewhere (hooks, parameters,
# submodules, mode) or bookkeeping of those hooks.
_TORCH_SLOTS = frozenset({"training", "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                          "_is_full_backward_hook", "_state_dict_hooks", "_state_dict_pre_hooks",
                          "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs",
                          "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs", "forward",
                          "_compiled_call_impl", *_HOOK_DICTS})
# Attributes a library changes in an ordinary forward or call, with no effect on what later forwards compute:
# transformers marks a model whose output-capturing hooks it installed (they are exempt, see
# :func:`_library_hook`), and torch.compile marks the module it wrapped (a flag functorch reads, not what it
# computes). A dynamic RoPE's recorded length and scaling are compared with its frequencies (:mod:`.rope`).
_LIBRARY_ATTRS = frozenset({"_output_capturing_hooks_installed", "_is_torch_compile",
                            "_require_grads_hooks", "_require_grads_hook",  # the handles of enable_input_require_grads
                            "_gradient_checkpointing_func"})  # read only while gradient_checkpointing (compared) is on
_PLAIN = (int, float, complex, str, bytes, bool, type(None))


# The hooks transformers installs on a model once and keeps, named by the function that defines them: the
# output-capturing hooks (``output_hidden_states=True``, ``output_attentions=True``: they record outputs and
# return None) and the hook ``gradient_checkpointing_enable`` installs through ``enable_input_require_grads``
# (it marks the embedding's output as requiring grad; ``gradient_checkpointing_disable`` leaves it, outside
# peft): neither changes what a forward computes.
LIBRARY_HOOKS = (("transformers.utils.output_capturing", "install_output_capuring_hook"),
                 ("transformers.modeling_utils", "PreTrainedModel.enable_input_require_grads"))


def _library_hook(fn: Any) -> bool:
    """``fn`` is one of :data:`LIBRARY_HOOKS`: an inner function of the named function (its code object one of
    that function's constants, its globals that module's), whose closure holds only that function's other
    inner functions. A function that only says it comes from there (another code object, another namespace)
    is not it."""
    import sys
    import types

    if not isinstance(fn, types.FunctionType):
        return False
    for module_name, path in LIBRARY_HOOKS:
        module = sys.modules.get(module_name)
        install: Any = module
        for part in path.split("."):
            install = getattr(install, part, None)
        if module is None or not isinstance(install, types.FunctionType):
            continue
        inner = [c for c in install.__code__.co_consts if isinstance(c, types.CodeType)]
        if fn.__code__ in inner and fn.__globals__ is vars(module) and _closure_within(fn, inner, vars(module)):
            return True
    return False


def _closure_within(fn: Any, inner: list, namespace: dict) -> bool:
    import types

    for cell in fn.__closure__ or ():
        try:
            held = cell.cell_contents
        except ValueError:
            continue
        if callable(held) and not (isinstance(held, types.FunctionType) and held.__code__ in inner
                                   and held.__globals__ is namespace and not held.__closure__):
            return False
    return True


def _comparable(value: Any, configs: dict) -> Any:
    """An attribute as compared: a config by identity and content (its ``to_dict``, read once per object in a
    snapshot), a plain value or container of them by value (a copy: one changed in place must show), a dtype
    or device by value, anything else by identity (held, so its id stays its own)."""
    import torch

    if hasattr(value, "to_dict") and callable(value.to_dict) and not isinstance(value, type):
        if id(value) not in configs:
            try:
                data = json.dumps({k: v for k, v in value.to_dict().items() if k not in _CONFIG_RECORDS},
                                  sort_keys=True, default=str)
            except Exception:  # a to_dict that fails: the object itself is compared
                data = None
            data = (data, str(getattr(value, "_attn_implementation", None)), type(value))  # its class swapped shows
            configs[id(value)] = ("config", id(value), data, value)
        return configs[id(value)]
    if _is_plain(value):
        return ("value", _frozen(value), value if isinstance(value, (*_PLAIN, torch.dtype, torch.device)) else None)
    return ("object", id(value), value)


def _is_plain(value: Any, depth: int = 0) -> bool:
    import torch

    if isinstance(value, (*_PLAIN, torch.dtype, torch.device)):
        return True
    if depth < 3 and isinstance(value, (tuple, list, set, frozenset)):
        return all(_is_plain(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return all(_is_plain(k, depth + 1) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _frozen(value: Any) -> Any:
    """A plain value as a hashable, comparable copy (a list changed in place after the snapshot must show)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, frozenset(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((_frozen(k), _frozen(v)) for k, v in value.items()))
    return value


def _same(was: Any, now: Any) -> bool:
    """Two compared attributes agree: the same object, or equal values (a NaN float, the same object, agrees)."""
    if was[0] != now[0]:
        return False
    if was[0] == "value":
        return was[1] is now[1] or was[1] == now[1]
    return was[1] == now[1] and was[2] == now[2] if was[0] == "config" else was[1] == now[1]


def _own_attrs(m: Any, configs: dict) -> tuple:
    """The module's own plain instance attributes (what its forward reads besides parameters and submodules):
    a submodule's ``config`` replaced by an edited copy (``sliding_window`` changed for one layer),
    ``_loss_function`` or ``loss_type`` set (what ``labels=`` trains on), a flag such as ``is_causal`` flipped.
    Its own ``_call_impl``-like attributes are compared by :func:`_own_calls`, its hooks and mode apart."""
    calls = {name for name, _ in _own_calls(m)} | set(library_attrs(m)) | set(rope_attrs(m))  # with the buffers
    return tuple((name, _comparable(value, configs)) for name, value in vars(m).items()
                 if name not in _TORCH_SLOTS and name not in _LIBRARY_ATTRS and name not in calls
                 and not _as_class_says(m, name, value))


def _as_class_says(m: Any, name: str, value: Any) -> bool:
    """``value``, set on the module, is its class's own default for ``name`` (a plain value of the same type): the
    module reads the same either way. ``gradient_checkpointing_disable`` sets ``gradient_checkpointing = False``
    on layers whose class said False, which was taken for a change left by the plugin."""
    default = getattr(type(m), name, _NO_DEFAULT)
    return (default is not _NO_DEFAULT and type(default) is type(value) and isinstance(value, _PLAIN)
            and default == value)


_NO_DEFAULT = object()
# Config fields that record where a model came from and what it was saved as, read by no forward:
# save_pretrained fills in "architectures", the library version and "dtype" on a model whose config lacked them.
# They are compared apart (:func:`_changed_records`): only the value a save writes is no change.
_CONFIG_RECORDS = frozenset({"architectures", "transformers_version", "dtype", "torch_dtype"})  # dtype: the saved one


def _records(model: Any, configs: dict) -> dict:
    """``{id: (config, {field: value}, allowed architectures)}`` for the model's config and every config a module
    holds: the :data:`_CONFIG_RECORDS` set on it (read from its ``__dict__``: ``to_dict`` writes the installed
    version whatever is set, and ``torch_dtype`` is a deprecated alias of ``dtype``), and the ``architectures``
    a ``save_pretrained`` of a module holding it writes: the class of every module with a ``save_pretrained`` that
    holds it (the model's own, and its backbone's ``LlamaModel``, which shares the model's config: a plugin saving
    ``model.model`` writes ``["LlamaModel"]`` there, and was refused as if that were a foreign record)."""
    top = getattr(model, "config", None)
    found: dict = {}
    for m in model.modules():
        config = vars(m).get("config")
        if config is not None and hasattr(config, "__dict__") and hasattr(config, "to_dict"):
            names = found.setdefault(id(config), (config, set()))[1]
            if callable(getattr(m, "save_pretrained", None)):  # an attention block holding it saves nothing
                names.add(type(m).__name__.removeprefix("FSDP"))
    if top is not None and hasattr(top, "__dict__"):  # with the names of every saving module holding it too
        found.setdefault(id(top), (top, set()))[1].add(type(model).__name__.removeprefix("FSDP"))
    for entry in configs.values():  # a config held elsewhere (a module's other attribute): only as it was
        config = entry[3]
        if hasattr(config, "__dict__"):
            found.setdefault(id(config), (config, set()))
    return {key: (config, {k: _frozen(vars(config).get(k)) for k in sorted(_CONFIG_RECORDS)}, names)
            for key, (config, names) in found.items()}


def _thawed(value: Any) -> Any:
    """A :func:`_frozen` list as the list it was, to show."""
    return list(value[1]) if isinstance(value, tuple) and value[:1] == ("list",) else value


def _saved_record(key: str, value: Any, names: set, dtype: Any) -> bool:
    """``value``, now in the config field ``key``, is what ``save_pretrained`` writes there: the saving model's
    class name (in a one-item list), the model's dtype (``"float32"`` or ``torch.float32``), the installed
    transformers version. Any other value (``architectures = ["GPT2LMHeadModel"]`` on a llama) is read later as
    fact: a report's architecture, the structure a schedule file is keyed on."""
    if key == "architectures":
        return isinstance(value, tuple) and len(value) == 2 and value[0] == "list" and len(value[1]) == 1 \
            and value[1][0] in names
    if key in ("dtype", "torch_dtype"):
        return dtype is not None and value in (dtype, str(dtype).removeprefix("torch."))
    try:
        import transformers
    except ImportError:
        return False
    return value == transformers.__version__


def _changed_records(before: dict, after: dict, dtype: Any) -> str | None:
    """The first :data:`_CONFIG_RECORDS` field set to another value than a save writes, in words, else None."""
    for key, (_, was, _) in before.items():
        if key not in after:
            continue  # the config object itself replaced: compared as a module attribute
        _, now, names = after[key]
        for field, value in now.items():
            if value != was.get(field) and not _saved_record(field, value, names, dtype):
                expected = {"architectures": " or ".join(f"[{n!r}]" for n in sorted(names)) if names
                            else "none: no save writes it here",
                            "transformers_version": "the installed transformers version"}.get(field, "the model's dtype")
                return (f"its config field {field} was set to {_shown(_thawed(value))} (was "
                        f"{_shown(_thawed(was.get(field)))}), not what save_pretrained records ({expected}): it is "
                        "read later as what the model is")
    return None


def _tensor_hooks(p: Any) -> tuple:
    """A parameter's own gradient hooks (``p.register_hook``, ``register_post_accumulate_grad_hook``) and the
    gradient it holds: one left by a run zeroes or scales every later backward through the model, and a
    ``p.grad`` left filled is added to the next one. An all-zero gradient (``zero_grad(set_to_none=False)``)
    adds nothing, so it counts as none."""
    hooks = tuple(tuple((k, id(fn)) for k, fn in (getattr(p, d, None) or {}).items())
                  for d in ("_backward_hooks", "_post_accumulate_grad_hooks"))
    grad = p.grad
    return hooks, None if grad is None or (not grad.is_meta and not bool(grad.any())) else id(grad)


def _module_state(m: Any, configs: dict | None = None) -> ModuleState:
    named = list(m.named_parameters(recurse=False))
    hook_dicts = [{k: fn for k, fn in getattr(m, d, {}).items() if not _library_hook(fn)} for d in _HOOK_DICTS]
    hooks = tuple(tuple((k, id(fn)) for k, fn in d.items()) for d in hook_dicts)
    save_dicts = [dict(getattr(m, d, None) or {}) for d in _STATE_DICT_HOOKS]
    saves = tuple(tuple((k, id(fn)) for k, fn in d.items()) for d in save_dicts)
    managed = hasattr(m, "_hf_hook")  # accelerate swaps a dispatched module's parameters in and out per forward
    params = tuple((name, None if managed else id(p), bool(p.requires_grad), _tensor_hooks(p)) for name, p in named)
    held = [fn for d in (*hook_dicts, *save_dicts) for fn in d.values()]
    held += [fn for _, p in named for d in ("_backward_hooks", "_post_accumulate_grad_hooks")
             for fn in (getattr(p, d, None) or {}).values()] + [p.grad for _, p in named if p.grad is not None]
    refs = (tuple(held), tuple(p for _, p in named))
    return ModuleState(m, type(m), hooks, m.__dict__.get("forward"), bool(m.training), params, refs, _own_calls(m),
                       _own_attrs(m, {} if configs is None else configs), saves)


def _config(model: Any) -> dict:
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}
    data = json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))
    data["_attn_implementation"] = str(getattr(config, "_attn_implementation", None))  # not in to_dict()
    return data


def _generation(model: Any) -> dict:
    """The model's generation settings (``generation_config``: a ``repetition_penalty`` or ``do_sample`` left
    set changes every later ``generate``), as plain JSON."""
    config = getattr(model, "generation_config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}
    return json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))


def handle_state(handle: Any) -> dict:
    """What a :class:`~mechkit.model.handle.ModelHandle` says about its model besides the model object: its
    anatomy (what every analysis reads its layers and heads from), where it came from, its backend and the
    weights' hash it remembers (what resume keys and saved artifacts record). A run that changes one leaves
    the next caller's analyses, keys or artifacts wrong although the model computes as before."""
    return {"anatomy": _anatomy(handle.anatomy), "anatomy_obj": handle.anatomy, "spec": handle.spec, "name": handle.name,
            "source": handle.source, "backend": handle.backend, "model": handle.model,
            "tokenizer": handle.tokenizer, "sha256": handle._sha256, "own": _handle_extras(handle),
            "memos": _memos(handle), "tokenizer_own": _tokenizer_own(handle.tokenizer), "classes": _classes(handle)}


def _classes(handle: Any) -> dict:
    """The classes of the handle and of the objects it holds besides the model (whose modules' classes
    :func:`model_state` compares): ``obj.__class__ = Sub``, a same-named subclass overriding ``to_tokens`` or the
    tokenizer's ``__call__``, changes every later tokenization while every object and attribute stays the same,
    and the code check reads the new class's methods as names that appeared."""
    return {name: type(obj) for name, obj in (("handle", handle), ("tokenizer", handle.tokenizer),
                                              ("backend", handle.backend), ("anatomy", handle.anatomy))}


def _memos(handle: Any) -> dict:
    """The handle's remembered vocabulary and position counts (read once, then kept): one set to another value
    turned off the id and length checks, and a later call gave torch's raw IndexError."""
    return {k: getattr(handle, k, None) for k in ("_n_vocab", "_n_positions")}


def _fresh_memo(handle: Any, key: str) -> int:
    """What the handle would remember for ``key`` read afresh from its model (-1: none)."""
    from mechkit.model.checks.token_ids import position_rows, vocab_rows

    return ((vocab_rows if key == "_n_vocab" else position_rows)(handle.model) or -1)


def _tokenizer_own(tokenizer: Any) -> dict:
    """What is set on the tokenizer object itself and changes what it returns: a method replaced on the
    instance (``tokenizer.encode = …``, which its class's check cannot see) by identity, and the names of the
    inputs it gives (``model_input_names``: without ``attention_mask`` a later run failed on a missing key)."""
    own = {k: v for k, v in vars(tokenizer).items() if callable(v) and not isinstance(v, type)} \
        if hasattr(tokenizer, "__dict__") else {}
    names = getattr(tokenizer, "model_input_names", None)
    return {"calls": own, "model_input_names": list(names) if isinstance(names, list | tuple) else names}


def _handle_extras(handle: Any) -> dict:
    """The handle's instance attributes besides its fields: ``handle.to_tokens`` or ``handle.forward`` set on
    the instance (reversing every later tokenization, or acting only on long inputs) passed every check."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(handle)} if dataclasses.is_dataclass(handle) else set()
    return {k: v for k, v in vars(handle).items() if k not in fields}


def _anatomy(anatomy: Any) -> tuple:
    """An anatomy's fields as comparable values: modules by identity (held, so their ids stay theirs), lists
    of them item by item, everything else by value (a copy: a list changed in place must show)."""
    import copy
    import dataclasses

    from torch import nn

    def frozen(value: Any) -> Any:
        if isinstance(value, nn.Module):
            return ("module", id(value), value)
        if isinstance(value, (list, tuple)):
            return tuple(frozen(v) for v in value)
        return copy.deepcopy(value)

    if not dataclasses.is_dataclass(anatomy):
        return (anatomy,)
    return tuple((f.name, frozen(getattr(anatomy, f.name))) for f in dataclasses.fields(anatomy))


def changed_handle(before: dict, handle: Any) -> str | None:
    """What of :func:`handle_state` differs after a run, in words, else None. A weights' hash dropped (an
    in-place edit forgets it, to be computed again) is no change; one replaced by another value is."""
    if handle.anatomy is not before["anatomy_obj"] or _anatomy(handle.anatomy) != before["anatomy"]:
        return "its anatomy (handle.anatomy: layers, heads, module names) was changed"
    for key in ("spec", "name", "source"):
        if getattr(handle, key) != before[key]:
            return f"handle.{key} was changed ({before[key]!r} -> {getattr(handle, key)!r})"
    for key in ("backend", "model", "tokenizer"):
        if getattr(handle, key) is not before[key]:
            return f"handle.{key} was replaced by another object"
    for key, was in before.get("memos", {}).items():  # a memo filled in with the model's own count is no change
        now_memo = getattr(handle, key, None)
        if now_memo != was and not (was is None and now_memo in (None, _fresh_memo(handle, key))):
            return f"handle.{key} (the model's remembered {key[3:]} count) was changed ({was!r} -> {now_memo!r})"
    for name, cls in before.get("classes", {}).items():
        now_cls = _classes(handle)[name]
        if now_cls is not cls:
            where = "the handle" if name == "handle" else f"handle.{name}"
            return (f"the class of {where} ({cls.__qualname__}) was swapped for {now_cls.__module__}."
                    f"{now_cls.__qualname__} and not put back")
    tok = before.get("tokenizer_own")
    if tok is not None and handle.tokenizer is before["tokenizer"]:
        now_tok = _tokenizer_own(handle.tokenizer)
        if set(tok["calls"]) != set(now_tok["calls"]) or any(tok["calls"][k] is not now_tok["calls"][k] for k in tok["calls"]):
            name = next(k for k in sorted(set(tok["calls"]) | set(now_tok["calls"]))
                        if tok["calls"].get(k, _NO_DEFAULT) is not now_tok["calls"].get(k, _NO_DEFAULT))
            return f"tokenizer.{name} was set on the tokenizer object and not put back"
        if tok["model_input_names"] != now_tok["model_input_names"]:
            return (f"tokenizer.model_input_names was changed ({tok['model_input_names']!r} -> "
                    f"{now_tok['model_input_names']!r})")
    own, now = before.get("own", {}), _handle_extras(handle)
    if set(own) != set(now) or any(own[k] is not now[k] for k in own):
        name = next(k for k in sorted(set(own) | set(now)) if own.get(k, _NO_DEFAULT) is not now.get(k, _NO_DEFAULT))
        return f"handle.{name} was set on the handle and not put back"
    if handle._sha256 is not None and before["sha256"] is not None and handle._sha256 != before["sha256"]:
        return "the weights' hash it remembers (handle._sha256) was replaced while its weights stayed the same"
    return None


def model_state(model: Any, tokenizer: Any = None) -> dict:
    """The model's modules, hooks, ``forward`` overrides, modes, parameters, buffers (:mod:`.buffers`), config and
    (given) tokenizer, to compare with :func:`changed_state`."""
    from torch.nn.modules import module as torch_module

    from mechkit.model.checks.identity import tokenizer_sha256

    configs: dict = {}  # each config object's content read once, however many modules hold it
    modules = {name: _module_state(m, configs) for name, m in model.named_modules()}
    global_dicts = [getattr(torch_module, d, {}) for d in _GLOBAL_HOOKS]
    global_hooks = tuple(tuple((k, id(fn)) for k, fn in d.items()) for d in global_dicts)
    return {"modules": modules, "global_hooks": global_hooks, "config": _config(model), "buffers": buffer_state(model),
            "generation": _generation(model), "records": _records(model, configs), "dtype": _dtype(model),
            "classes": _config_classes(model),
            "global_refs": [fn for d in global_dicts for fn in d.values()],  # held: their ids stay theirs
            "tokenizer": tokenizer_sha256(tokenizer) if tokenizer is not None else None}


def _dtype(model: Any) -> Any:
    try:
        return model.dtype
    except Exception:  # a model without floating parameters: no dtype a save would write
        return None


def _config_classes(model: Any) -> dict:
    """The classes of the model's config and generation config: one swapped for a same-named subclass (a
    property overriding a field) changes what is read while every field's stored value stays."""
    return {name: type(getattr(model, name, None)) for name in ("config", "generation_config")}


def hooked(state: dict) -> str | None:
    """Where the model carries a hook or a replaced ``forward`` (the first found), else None: a run's results
    then depend on code no resume key can name."""
    if any(state["global_hooks"]):
        return "a global module hook"
    for name, s in state["modules"].items():
        if any(s.hooks) or s.forward is not None:
            return f"{'a hook' if any(s.hooks) else 'a replaced forward'} on {name or 'the model'}"
    return None


def changed_state(before: dict, after: dict) -> str | None:
    """What differs, in words (the first thing found), else None."""
    if before["global_hooks"] != after["global_hooks"]:
        return "a global module hook (torch.nn.modules.module.register_module_forward_hook) was left registered"
    old, new = before["modules"], after["modules"]
    if set(old) != set(new):
        return f"its modules changed ({sorted(set(old) ^ set(new))[0] or 'the model'} appeared or vanished)"
    for name, was in old.items():
        now, label = new[name], name or "the model"
        if was.module is not now.module or was.cls is not now.cls:
            return f"{label} was replaced by another module (or its class was swapped) and not put back"
        if was.hooks != now.hooks:
            return f"a hook was left on {label} (or one it had was removed)"
        if was.forward is not now.forward:
            return f"{label}.forward was replaced and not put back"
        if [(n, id(v)) for n, v in was.calls] != [(n, id(v)) for n, v in now.calls]:
            name = next(n for n, _ in (*now.calls, *was.calls) if dict(was.calls).get(n) is not dict(now.calls).get(n))
            return f"{label}.{name} was replaced and not put back"
        if was.training != now.training:
            return f"{label} was left in {'train' if now.training else 'eval'} mode"
        if was.params != now.params:
            return _changed_param(label, was.params, now.params)
        if was.saves != now.saves:
            return (f"a state_dict or load_state_dict hook was left on {label} (or one it had was removed): a later "
                    "save would write other weights than the model holds")
    what = changed_buffer(before["buffers"], after["buffers"]) if "buffers" in before else None
    if what is not None:
        return what
    for name, cls in before.get("classes", {}).items():
        if after["classes"].get(name) is not cls:
            return f"the class of its {name} was swapped (a same-named subclass runs in its place) and not put back"
    for key in sorted(set(before["config"]) | set(after["config"])):
        if key in _CONFIG_RECORDS:
            continue
        if before["config"].get(key) != after["config"].get(key):
            return f"its config field {key} changed ({before['config'].get(key)!r} -> {after['config'].get(key)!r})"
    what = _changed_records(before.get("records", {}), after.get("records", {}), after.get("dtype"))
    if what is not None:
        return what
    if before.get("generation") != after.get("generation"):
        key = next(k for k in sorted(set(before["generation"]) | set(after["generation"]))
                   if before["generation"].get(k) != after["generation"].get(k))
        return (f"its generation_config field {key} changed ({before['generation'].get(key)!r} -> "
                f"{after['generation'].get(key)!r})")
    if before.get("tokenizer") != after.get("tokenizer"):
        return "its tokenizer was changed (its vocabulary, special tokens or a setting such as padding_side)"
    for name, was in old.items():
        what = _changed_attrs(was.attrs, new[name].attrs)
        if what is not None:
            return f"{name}.{what}" if name else f"the model's own attribute {what}"
    return None


def _changed_param(label: str, was: tuple, now: tuple) -> str:
    """Which parameter of ``label`` differs, and how, in words."""
    for old, new in zip(was, now, strict=False):
        if old == new:
            continue
        name = f"{label}.{old[0]}" if label != "the model" else old[0]
        if old[:3] != new[:3]:
            return f"the parameter {name} was replaced or its requires_grad changed, and not put back"
        if old[3][0] != new[3][0]:
            return (f"a gradient hook was left on the parameter {name} (p.register_hook or register_post_accumulate_"
                    "grad_hook): every later backward runs it")
        return (f"the parameter {name} was left holding a gradient (p.grad), which the next backward adds to"
                if old[3][1] is None else f"the gradient the parameter {name} held (p.grad) was replaced or cleared")
    return f"the parameters of {label} were replaced or their requires_grad changed, and not put back"


def _changed_attrs(was: tuple, now: tuple) -> str | None:
    """The first attribute changed, in words: one changed in place is named before one set or deleted, since a
    change can move an attribute into or out of what is compared apart (``rope_type`` set to ``"dynamic"`` on a
    default RoPE hands its ``max_seq_len_cached`` to :mod:`.rope`, and "max_seq_len_cached was deleted" named the
    wrong field)."""
    old, new = dict(was), dict(now)
    for key in [*(k for k in old if k in new), *(k for k in old if k not in new), *(k for k in new if k not in old)]:
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            return f"{key} was {'set' if a is None else 'deleted'} and not put back"
        if _same(a, b):
            continue
        if a[0] == "config" and b[0] == "config" and a[1] == b[1] and a[2][2] is not b[2][2]:
            return f"{key} (a config) had its class swapped and not put back"
        if a[0] == "config" and b[0] == "config" and a[1] == b[1]:
            x, y = json.loads(a[2][0] or "{}"), json.loads(b[2][0] or "{}")
            field = next((k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)), "_attn_implementation")
            return f"{key} (a config) had its field {field} changed ({x.get(field)!r} -> {y.get(field)!r})"
        if a[0] == "value" and b[0] == "value":
            if a[2] is None or b[2] is None:
                return f"{key} was changed and not put back"
            return f"{key} changed ({_shown(a[2])} -> {_shown(b[2])}) and was not put back"
        return f"{key} was replaced by another object and not put back"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _flushes_denormals() -> bool:
    """Whether ``torch.set_flush_denormal(True)`` is in force (torch has no getter): a subnormal times one
    is then zero."""
    import torch

    return float((torch.tensor([1e-39]) * torch.tensor([1.0])).item()) == 0.0


def torch_state() -> dict:
    """torch's process-wide settings that decide what every model computes, to compare with
    :func:`changed_torch`: the function-mode and dispatch-mode stacks (a ``TorchFunctionMode`` entered and never
    exited rewrites every op, e.g. scales attention past 16 tokens, where the probe cannot see), the default
    dtype, autocast, denormal flushing, the float32 matmul precision, TF32 and reduced-precision reductions,
    and which attention (SDPA, MHA fast path) kernels may run."""
    import torch
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    state: dict[str, Any] = {
        "a torch function mode (torch.overrides.TorchFunctionMode, or torch.set_default_device)":
            tuple(_get_current_function_mode_stack()),
        "a torch dispatch mode (TorchDispatchMode)": tuple(_get_current_dispatch_mode_stack()),
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.set_flush_denormal": _flushes_denormals(),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.backends.cuda.matmul.allow_tf32": cuda.matmul.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            cuda.matmul.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            cuda.matmul.allow_bf16_reduced_precision_reduction,
        "torch.backends.cudnn.allow_tf32": cudnn.allow_tf32,
        "torch.backends.cudnn.enabled": cudnn.enabled,
        "torch.backends.mkldnn.enabled": torch.backends.mkldnn.enabled,
        "torch.backends.mha.get_fastpath_enabled()": torch.backends.mha.get_fastpath_enabled(),
    }
    for kernel in ("flash", "mem_efficient", "math", "cudnn"):
        enabled = getattr(cuda, f"{kernel}_sdp_enabled", None)
        if enabled is not None:
            state[f"torch.backends.cuda.{kernel}_sdp_enabled()"] = enabled()
    for device in ("cpu", "cuda"):
        try:
            state[f"autocast on {device} (torch.autocast)"] = (torch.is_autocast_enabled(device),
                                                              torch.get_autocast_dtype(device))
        except Exception:  # a torch without per-device autocast queries
            continue
    return state


def changed_torch(before: dict, after: dict) -> str | None:
    """The first of :func:`torch_state`'s settings left changed, in words, else None. Modes are compared by
    identity (the stack's objects, held in ``before``), settings by value."""
    for key, was in before.items():
        now = after.get(key)
        if isinstance(was, tuple) and key.startswith("a torch"):
            if len(was) != len(now) or any(a is not b for a, b in zip(was, now, strict=False)):
                extra = [type(m).__name__ for m in now if not any(m is w for w in was)]
                return (f"{key} was left {'entered: ' + ', '.join(extra) if extra else 'changed'} (its stack held "
                        f"{len(was)}, now {len(now)})")
        elif was != now:
            return f"{key} was left changed ({was!r} -> {now!r})"
    return None
