"""``load_model``: every way a user names a model, resolved to a :class:`ModelHandle`.

Specs: an alias (``llama``/``smollm2`` → the embedded model), ``tiny:FAMILY`` (random-init test
models), ``toy:induction`` (a 2-layer model mechkit trains itself, with a known induction circuit), a local HF directory, a ``.gguf`` file, a hub id (used as-is where the hub is reachable),
or a model object already in memory. Failures become one :class:`ModelLoadError` line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mechkit.errors import MechkitError, ModelLoadError, first_line
from mechkit.io.patharg import text_path
from mechkit.io.quiet import quietly
from mechkit.model.anatomy import discover_anatomy
from mechkit.model.backends import ndif
from mechkit.model.backends.base import check_backend
from mechkit.model.backends.nnsight_backend import NnsightBackend, wrap
from mechkit.model.backends.remotes import check_remote
from mechkit.model.checks.forward_args import named_outputs
from mechkit.model.checks.integrity import (
    config_fix,
    load_report_muted,
    raised_building,
    refuse_adapter_beside,
    refuse_deep_side_files,
    refuse_invalid_config,
    refuse_load_gaps,
    refuse_meta_weights,
    refuse_more_layers_than_weights,
    refuse_non_finite_weights,
    refuse_non_float_weights,
    refuse_nonpositive_sizes,
    refuse_pickle_only,
    refuse_shard_gaps,
    refuse_special_files,
    refuse_unsound_routing_and_rope,
)
from mechkit.model.handle import ModelHandle
from mechkit.model.placement.request import Dispatch, DispatchError, check_device, request
from mechkit.model.placement.spread import dispatch_in_memory, load_pretrained
from mechkit.model.placement.stored import is_dispatched
from mechkit.model.sources.gguf import cached_gguf
from mechkit.model.transformer_lens import from_bridge

EMBEDDED_ALIASES = ("llama", "smollm2")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype(dtype: Any, device: str):
    import torch

    if dtype is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if isinstance(dtype, str):
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
        except KeyError:
            raise ModelLoadError(f"unknown dtype {dtype!r}", "use float32, bfloat16 or float16") from None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ModelLoadError(f"dtype {dtype!r} is not a floating-point torch dtype", "use float32, bfloat16 or float16")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):  # float8: no kernels to compute in
        raise ModelLoadError(f"dtype {dtype!r} is a storage format, not one a model computes in",
                             "use float32, bfloat16 or float16")
    return dtype


@quietly  # transformers' progress bars and deprecation notes are not the user's output
def load_model(spec: Any, device: str | None = None, dtype: Any = None, tokenizer: Any = None, *,
               device_map: Any = None, max_memory: Any = None, offload_folder: Any = None,
               backend: str | None = None, remote: str | None = None) -> ModelHandle:
    """Load a causal LM and discover its anatomy.

    ``device`` defaults to CUDA when available (bf16 there), else CPU float32.

    A model larger than one device: ``device_map`` (``"auto"``, ``"balanced"``, ``"balanced_low_0"``,
    ``"sequential"`` or ``{module: device}`` with devices such as ``"cuda:0"``, ``"cpu"``, ``"disk"``),
    ``max_memory`` (``{device: size}``, e.g. ``{"cuda:0": "10GiB", "cpu": "30GiB"}``) and
    ``offload_folder`` (where disk-offloaded weights go) spread it with accelerate (see
    :mod:`mechkit.model.placement`); ``max_memory`` or ``offload_folder`` alone mean ``device_map="auto"``.
    A model object accelerate already dispatched is used as it is.

    >>> import mechkit as mk
    >>> mk.load_model("tiny:gpt2").anatomy.n_layers
    2
    >>> m = mk.load_model("tiny:llama", device_map={"model": "cpu", "lm_head": "cpu"})
    >>> str(m.device)
    'cpu'

    ``backend="nnsight"`` runs every forward as an nnsight trace (:mod:`mechkit.model.backends.nnsight_backend`), with
    ``remote="ndif"`` on an NDIF server (``spec`` a hub id it hosts) or ``remote="local"`` in nnsight's
    offline simulation of that path. A TransformerLens ``TransformerBridge`` is accepted as ``spec``
    (its HF model and tokenizer are used).
    """
    if isinstance(spec, ModelHandle):
        from mechkit.model.backends.base import handle_backend

        backend = handle_backend(spec, backend, remote)  # left out: the handle's own; another one: refused
        remote = None
    backend = check_backend(backend)
    if isinstance(spec, bytes | os.PathLike) and not isinstance(spec, Path):  # b"dir", or a PathLike giving bytes
        spec = text_path(spec) or spec
    if tokenizer is not None and not (callable(tokenizer) and hasattr(tokenizer, "decode")):
        raise ModelLoadError(f"tokenizer must be a tokenizer (callable on text, with .decode), not "
                             f"{type(tokenizer).__name__}", "pass AutoTokenizer.from_pretrained(...), or leave it out")
    if isinstance(spec, ModelHandle):
        given = {"device": device, "dtype": dtype, "tokenizer": tokenizer, "device_map": device_map,
                 "max_memory": max_memory, "offload_folder": offload_folder}
        ignored = [k for k, v in given.items() if v is not None]
        if ignored:  # it would be silently ignored: the handle is already placed
            raise ModelLoadError(f"a loaded handle keeps the {', '.join(ignored)} it was loaded with",
                                 f"pass {ignored[0]}= to mk.load_model, or pass the model spec instead of the handle")
        return spec
    remote = check_remote(remote, backend, spec)  # before anything loads
    if remote == "ndif":
        lm = ndif.connect(str(spec))
        model = lm._module
        return ModelHandle(model=model, tokenizer=ndif.client_tokenizer(lm), anatomy=discover_anatomy(model),
                           spec=str(spec), name=str(spec), backend=NnsightBackend(lm, "ndif", model_key=str(spec)))
    placed = request(device_map, max_memory, offload_folder, device=device)
    if placed is None:
        device = check_device(device or default_device())
        torch_dtype = _dtype(dtype, device)
    else:
        torch_dtype = _dtype(dtype, "cuda" if placed.uses_accelerator() else "cpu")
    model, tok, name, source, spec_str = _resolve(spec, torch_dtype, tokenizer, placed)
    if not is_dispatched(model):
        refuse_meta_weights(model, spec_str)  # nothing to compute on: one line, not torch's "Cannot copy out of meta"
    if is_dispatched(model):
        if placed is not None and not hasattr(model, "hf_device_map"):
            raise ModelLoadError("the model object is already dispatched by accelerate",
                                 "pass it without device_map/max_memory/offload_folder")
    elif placed is not None:
        dispatch_in_memory(model, placed, torch_dtype)
    else:
        model.to(device=device, dtype=torch_dtype)
    model.eval()
    named_outputs(model)  # a config's "return_dict": false broke transformers' own head on every forward
    refuse_non_finite_weights(model, spec_str)  # before any work, not as "the plugin" failing at the end
    anatomy = discover_anatomy(model)
    handle = ModelHandle(model=model, tokenizer=tok, anatomy=anatomy, spec=spec_str, name=name, source=source)
    if backend == "nnsight":
        handle.backend = wrap(model, tok, remote)
    return handle


def _resolve(spec: Any, torch_dtype, tokenizer: Any, placed: Dispatch | None = None):
    """``(model, tokenizer, name, source, spec)``; directories and hub ids load straight into ``placed``'s
    device map, everything else loads into CPU memory (and is dispatched by the caller)."""
    if not isinstance(spec, (str, Path)):
        bridge = from_bridge(spec)
        if bridge is not None:
            model, tok = bridge
            name = getattr(model.config, "_name_or_path", "") or type(model).__name__
            return model, tokenizer or tok, name, None, f"<TransformerBridge {type(model).__name__}>"
        if hasattr(spec, "config") and hasattr(spec, "forward"):
            if placed is not None and is_dispatched(spec):
                raise ModelLoadError("the model object is already dispatched by accelerate",
                                     "pass it without device_map/max_memory/offload_folder")
            name = getattr(spec.config, "_name_or_path", "") or type(spec).__name__
            return spec, tokenizer, name, None, f"<object {type(spec).__name__}>"
        raise ModelLoadError(f"cannot load a model from a value of type {type(spec).__name__}",
                             "pass a spec string, a path or a transformers model object")
    text = str(spec)
    if text in EMBEDDED_ALIASES:
        from mechkit.model.sources.embedded import NAME, gguf_path

        gguf = gguf_path()
        cached, model, tok = load_gguf_cached(gguf, torch_dtype, label=f"the embedded {NAME} from {gguf.name}",
                                              placed=placed)
        return model, tok, NAME, cached, text
    if text == "toy:induction":
        from mechkit.model.sources.toy import toy_model

        model, tok = toy_model()
        return model, tok, "toy-induction (2-layer, self-trained)", None, text
    if text.startswith("tiny:"):
        from mechkit.model.sources.tiny import tiny_model

        model, tok = tiny_model(text.removeprefix("tiny:"))
        return model, tok, text, None, text
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~user of a user without a home (Python cannot expand it)
        raise ModelLoadError(f"cannot expand {text!r}: no home directory for its user",
                             "spell the path out (an absolute path, or ~/ for your own home)") from None
    try:
        path.exists()
    except OSError as err:  # a name too long: the command line called it an --out it could not write
        raise ModelLoadError(f"cannot look up the model path {text[:120]}{'…' if len(text) > 120 else ''}: "
                             f"{err.strerror or err}",
                             "pass a model directory, a .gguf file or a hub id like org/name") from None
    if path.suffix == ".gguf":
        if path.exists() and not path.is_file():  # a FIFO or a device: named as such, not "not found"
            raise ModelLoadError(f"{path} is not a regular file (a directory, a FIFO or a device), so not a GGUF file",
                                 "pass the .gguf file itself")
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}", "check the path")
        cached, model, tok = load_gguf_cached(path, torch_dtype, placed=placed)
        return model, tok, path.stem, cached, text
    if path.is_dir():
        model, tok = load_directory(path, torch_dtype, placed=placed)
        return model, tok, path.name, path, text
    if path.exists():
        raise ModelLoadError(f"{path} is a file but not a .gguf model",
                             "pass a model directory (config.json + weights) or a .gguf file")
    if _HUB_ID.match(text):
        refuse_invalid_hub_id(text)
        model, tok = _load_hub(text, torch_dtype, placed)
        return model, tok, text, None, text
    raise ModelLoadError(
        f"unknown model {text!r}",
        f"use an alias ({', '.join(EMBEDDED_ALIASES)}), tiny:FAMILY, toy:induction, a local model directory, "
        "a .gguf file or a hub id like org/name",
    )


def refuse_invalid_hub_id(text: str) -> None:
    """A spec shaped like ``org/name`` that the hub's own rules refuse (over 96 characters, ``--`` or ``..``):
    huggingface_hub raised its HFValidationError as a traceback."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as err:
        raise ModelLoadError(f"{text[:120]}{'…' if len(text) > 120 else ''} is neither a local path nor a valid "
                             f"hub id ({first_line(err, 120)})",
                             "check the spelling: a model directory, a .gguf file or a hub id like org/name") from None


class UnreadableFiles(ModelLoadError):
    """transformers could not read a directory's weights or tokenizer files (damage, or files another version
    wrote): the one load failure a GGUF's cache entry is rebuilt for. mechkit's own refusals of what the files
    say (a vocab_size the weights disagree with...) are not: the conversion would write the same files again."""


def load_gguf_cached(gguf: Path, torch_dtype=None, label: str | None = None, placed: Dispatch | None = None):
    """``(cache directory, model, tokenizer)`` for a GGUF file: dequantized on first use of its content,
    read back from the safetensors cache (converted to ``torch_dtype``, into ``placed``'s device map) ever after.

    The first load also reads the freshly written cache, so every load of a file gives the same model.
    An entry that passes the checksums but that transformers still cannot read is rebuilt once; a refusal of
    the conversion's content is not (rebuilding wrote the same files on every load), and names the GGUF file,
    not the cache entry: editing the entry's files only makes the next load convert again.
    """
    cached, built = cached_gguf(gguf, label=label)
    try:
        return cached, *load_directory(cached, torch_dtype, placed=placed)
    except DispatchError:
        raise  # the device map or memory limits, not the cache
    except UnreadableFiles as err:
        if built:
            raise _conversion_refused(gguf, cached, err) from err
    except ModelLoadError as err:
        raise _conversion_refused(gguf, cached, err) from err
    cached, _ = cached_gguf(gguf, label=label, rebuild=True)
    try:
        return cached, *load_directory(cached, torch_dtype, placed=placed)
    except DispatchError:
        raise
    except ModelLoadError as err:
        raise _conversion_refused(gguf, cached, err) from err


def _conversion_refused(gguf: Path, cached: Path, err: ModelLoadError) -> ModelLoadError:
    """A refusal of a GGUF's converted model, told of the GGUF file: the cache entry is mechkit's copy, checked
    by checksum, so the fix a plain directory's refusal gives (edit its config.json) cannot work there."""
    problem = err.problem.replace(f"{cached}/", "its ").replace(str(cached), "its conversion")
    return ModelLoadError(f"the model converted from {gguf} is refused: {problem}",
                          "the GGUF file's metadata disagrees with its tensors: convert the original model to "
                          "GGUF again (llama.cpp's convert_hf_to_gguf.py), or pass the original model's directory "
                          "instead")


def load_directory(path: Path, torch_dtype=None, placed: Dispatch | None = None):
    """A local HF model directory: safetensors weights, no remote code; straight into ``placed``'s device
    map when given (a pruned directory loads into memory and is dispatched by :func:`load_model`)."""
    from mechkit.io.outlock import settle_interrupted

    settle_interrupted(path)  # a killed --force write's half set: rolled back, not read as "no config"
    refuse_special_files(path)  # a FIFO as model.safetensors hung the first read for ever
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"no model in {path}: config.json is missing",
                             "point --model at a directory written by save_pretrained (config.json + weights)")
    from transformers import AutoModelForCausalLM

    from mechkit.model.edit.surgery import CONFIG_KEY, load_pruned_directory

    try:
        pruned = _is_pruned(path / "config.json", CONFIG_KEY)
    except (OSError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {first_line(err)}",
                             "config.json must be UTF-8 JSON, as save_pretrained writes it") from None
    refuse_adapter_beside(path)  # transformers would apply a PEFT adapter found there, silently
    refuse_nonpositive_sizes(path)  # num_attention_heads 0, n_positions 1.5: the field, before transformers' checks
    refuse_unsound_routing_and_rope(path)  # 5 experts per token of 4, rope_theta "x": the field, not a traceback
    refuse_vocab_mismatch(path)  # vocab_size and the token ids: named in config.json, not "corrupt weights"
    refuse_invalid_config(path)  # fields that disagree are a config problem, not damaged weights
    refuse_deep_side_files(path)  # a generation_config.json nested past the decoder's limit: that file named
    refuse_pickle_only(path)  # never torch.load: a directory with only pytorch_model.bin is refused
    refuse_shard_gaps(path)  # a shard missing, or a second weight set beside the shards
    safe = {"local_files_only": True, "trust_remote_code": False, "use_safetensors": True,
            "output_loading_info": True}
    try:
        if pruned:
            model = load_pruned_directory(path, torch_dtype)
            refuse_non_float_weights(path, model)
            return model, _tokenizer(path)
        refuse_more_layers_than_weights(path)  # from the headers, before transformers builds every layer
        with load_report_muted():
            if placed is not None:
                model, info = load_pretrained(path, placed, torch_dtype, **safe)
            else:
                model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **safe)
        refuse_load_gaps(info, path)  # random-initialised or ignored tensors: never computed on
        refuse_non_float_weights(path, model)  # integers cast into float parameters: never computed on
    except MechkitError:
        raise
    except Exception as err:  # transformers raises many types; the user needs one line
        method = quantization_method(path / "config.json")
        if method is not None:  # not damaged weights: a quantization transformers cannot apply here
            why = ("the weights do not have the shapes it gives them" if "ignore_mismatched_sizes" in str(err)
                   else first_line(err, 160))  # transformers' "see the report above": a report mechkit mutes
            raise ModelLoadError(f"could not load the model in {path}: its config.json asks for {method} "
                                 f"quantization, which this setup cannot apply ({why})",
                                 "load the original float model, or a copy dequantized and re-saved with "
                                 "save_pretrained (no quantization_config in its config.json)") from err
        if "ignore_mismatched_sizes" in str(err):  # its "see the report above": a report mechkit mutes
            raise ModelLoadError(f"the weights in {path} do not have the shapes its config.json gives them",
                                 "use the config.json saved with these weights (a pruned model's has a "
                                 "mechkit_pruning entry), or re-export the directory") from err
        unknown = _config_fields_holding(path, err.args[0]) if isinstance(err, KeyError) and err.args else []
        if unknown:  # transformers' table of activations (ACT2FN) or of RoPE types has no such entry
            raise ModelLoadError(f"could not load the model in {path}: its config.json sets {unknown[0]} to "
                                 f"{err.args[0]!r}, which transformers does not know",
                                 f"fix {unknown[0]} in config.json (the value the weights were made with)") from err
        if raised_building(err):  # a rope table dividing by 0, a head count: config.json, not the weights
            raise ModelLoadError(f"transformers cannot build the model {path / 'config.json'} describes: "
                                 f"{first_line(err)} (the weights are not at fault)",
                                 config_fix(path, str(err))) from err
        raise UnreadableFiles(f"could not load the model in {path}: {first_line(err)}",
                             "the weights may be corrupt or truncated — re-export the directory") from err
    return model, _tokenizer(path)


EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight",
                   "tok_embeddings.weight")
TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def refuse_vocab_mismatch(path: Path) -> None:
    """A ``config.json`` whose ``vocab_size`` differs from the rows of the embedding the safetensors hold (read
    from their headers, before the load), or whose ``pad_token_id``/``bos_token_id``/``eos_token_id`` is not a
    token of that vocabulary: transformers failed with "Padding_idx must be within num_embeddings", which
    mechkit reported as corrupt weights and a re-export. Each is named here with the field and the value that
    fits. Files this cannot read are left to the load and its checks."""
    import json

    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    except RecursionError:  # a crafted config nested 100 000 deep: a traceback from the JSON decoder
        raise ModelLoadError(f"{path / 'config.json'} is nested too deeply to read",
                             "write config.json again as save_pretrained does (a flat JSON object)") from None
    config = data.get("text_config") if isinstance(data, dict) and isinstance(data.get("text_config"), dict) else data
    if not isinstance(config, dict):
        return
    vocab = config.get("vocab_size")
    rows = _embedding_rows(path)
    where = f"{path / 'config.json'}"
    if rows is not None and isinstance(vocab, int) and not isinstance(vocab, bool) and vocab != rows[1]:
        raise ModelLoadError(f"{where} gives vocab_size {vocab}, but the weights' embedding ({rows[0]}) has "
                             f"{rows[1]} rows", f'set "vocab_size": {rows[1]} in config.json (the rows the '
                             "weights hold), or use the config.json saved with these weights")
    n = rows[1] if rows is not None else vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None
    for field in TOKEN_ID_FIELDS:
        value = config.get(field)
        ids = value if field == "eos_token_id" and isinstance(value, list) else [value]
        for token in ids:
            if token is None:
                continue
            if isinstance(token, bool) or not isinstance(token, int):
                raise ModelLoadError(f"{where} gives {field} {value!r}, which is not a token id",
                                     f'set "{field}" in config.json to a whole number (the tokenizer\'s id for it), '
                                     "or to null")
            # the pad id indexes the embedding as its padding_idx (which reads -n..n-1); bos and eos are never
            # read as negatives (-1 marks "none" in some configs), only an id past the vocabulary is refused
            low = -n if n is not None and field == "pad_token_id" else None
            if n is not None and (token >= n or (low is not None and token < low)):
                raise ModelLoadError(f"{where} gives {field} {token}, outside the vocabulary of {n:,} tokens "
                                     f"(ids 0–{n - 1})", f'set "{field}" in config.json to the tokenizer\'s id for '
                                     f"it (below {n:,}), or to null")


def _embedding_rows(path: Path) -> tuple[str, int] | None:
    """``(tensor name, rows)`` of the input embedding in the directory's safetensors headers, where exactly one
    tensor is named as one (``model.embed_tokens.weight``, ``transformer.wte.weight``, ...); else ``None``."""
    try:
        from safetensors import safe_open

        found = {}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                    if key.endswith(EMBEDDING_NAMES) and key.rpartition(".")[0].rpartition(".")[2] + ".weight" \
                            in EMBEDDING_NAMES:
                        shape = f.get_slice(key).get_shape()
                        if len(shape) == 2:
                            found[key] = int(shape[0])
    except Exception:  # an unreadable header: the load reports it
        return None
    return next(iter(found.items())) if len(found) == 1 else None


def quantization_method(config: Path) -> str | None:
    """The ``quant_method`` of a ``quantization_config`` in ``config.json`` (``"quantized"`` where it names
    none), else None: a load that fails on such a config failed on the quantization, not on damaged weights."""
    import json

    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    quant = data.get("quantization_config") if isinstance(data, dict) else None
    if not quant:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return str(method)[:40] if method else "quantized"


def _is_pruned(config: Path, key: str) -> bool:
    """Whether ``config.json`` carries a pruned model's structure as a top-level entry: the key as a JSON key,
    not the text anywhere (a path or name holding ``mechkit_pruning`` sent a dense model down the pruned
    loader, which failed with "the weights may be corrupt"). JSON transformers cannot read: not pruned here,
    the config check says what is wrong."""
    import json

    text = config.read_text(encoding="utf-8")
    if key not in text:
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and key in data


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model")


def _tokenizer(path: Path):
    """The directory's tokenizer; ``None`` where it has no tokenizer files (token-level analyses still run),
    and one line where it has some that do not load: damaged files are refused, as damaged weights are,
    not reported later as "no tokenizer"."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as err:
        present = [name for name in TOKENIZER_FILES if (path / name).is_file()]
        if not present:
            return None
        raise UnreadableFiles(f"the tokenizer files in {path} ({', '.join(present)}) do not load: {first_line(err)}",
                             "re-save the model's tokenizer there (tokenizer.save_pretrained), or remove those "
                             "files for token-level analyses only") from err


def _hub_unreachable(repo_id: str) -> str | None:
    """The hub's host where ``repo_id`` is not in the local hub cache and the host cannot be reached (no
    proxy set); else ``None``. Without this an offline machine spends a minute in huggingface_hub's
    retries, printing its own lines, before the same refusal."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE or isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None  # offline mode fails fast by itself; a cached model loads without the network
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # the proxy may reach what a direct connection cannot
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        return host
    return None


def _load_hub(repo_id: str, torch_dtype, placed: Dispatch | None = None):
    import logging

    from transformers import AutoModelForCausalLM, AutoTokenizer

    host = _hub_unreachable(repo_id)
    if host is not None:
        raise ModelLoadError(f"{repo_id!r} is not a local directory, not in the hub cache, and {host} cannot be "
                             "reached", "pass a local model directory or .gguf file, or check the path, the id "
                             "and your network")
    safe = {"trust_remote_code": False, "use_safetensors": True, "output_loading_info": True}
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retry lines: mechkit says what failed, in one line
    try:
        with load_report_muted():
            if placed is not None:
                model, info = load_pretrained(repo_id, placed, torch_dtype, **safe)
            else:
                model, info = AutoModelForCausalLM.from_pretrained(repo_id, dtype=torch_dtype, **safe)
        tok = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=False)
    except Exception as err:
        raise ModelLoadError(f"could not load {repo_id!r} from the hub: {first_line(err)}",
                             "check the id and your network, or pass a local directory or .gguf file") from err
    finally:
        hub_log.setLevel(level)
    refuse_load_gaps(info, repo_id)
    return model, tok


def _config_fields_holding(path: Path, value: object) -> list[str]:
    """The top-level fields of ``path/config.json`` (and of a dict inside one) whose value is ``value``: a
    KeyError transformers raises while building the model names the value it could not look up (an unknown
    ``hidden_act``), and its fix is in config.json, not in re-exporting weights that are fine."""
    import json

    from mechkit.io.read import read_regular_text

    try:
        config = json.loads(read_regular_text(path / "config.json") or "{}")
    except (ValueError, RecursionError):
        return []
    found = []
    for key, held in config.items() if isinstance(config, dict) else ():
        inner = held.items() if isinstance(held, dict) else ()
        found += [key] if held == value else [f"{key}.{k}" for k, v in inner if v == value]
    return found

