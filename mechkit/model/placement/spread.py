"""Which module goes where, and putting the model there (accelerate's ``infer_auto_device_map``,
``dispatch_model`` and ``from_pretrained(device_map=...)``).

Checked after the device map is made and before any weight loads: a ``max_memory`` too small for the
model (what does not fit would go to disk and no offload folder was given).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mechkit.io.remove import discard_tree
from mechkit.model.placement.devices import from_accelerate, main_device, to_accelerate
from mechkit.model.placement.request import Dispatch, DispatchError, format_size
from mechkit.model.placement.ties import remember_ties

if TYPE_CHECKING:
    import torch
    from torch import nn


def _check_covers(model: nn.Module, device_map: dict[str, str]) -> None:
    names = dict(model.named_modules())
    unknown = [k for k in device_map if k and k not in names]
    if unknown:
        raise DispatchError(f"the device map names {unknown[0]!r}, which this model does not have"
                            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""),
                            "use module names from the model (e.g. model.layers.0, lm_head), or --device-map auto")
    prefixes = tuple(f"{k}." for k in device_map if k)
    if "" in device_map:
        return
    missing = [n for n in model.state_dict() if n not in device_map and not n.startswith(prefixes)]
    if missing:
        raise DispatchError(f"the device map gives no device for {missing[0]}"
                            + (f" (and {len(missing) - 1} more tensors)" if len(missing) > 1 else ""),
                            "map every module (the embedding, each layer, the final norm, the head), "
                            "or use --device-map auto")


def assign_devices(model: nn.Module, dispatch: Dispatch, dtype: torch.dtype | None = None) -> dict[str, str]:
    """``{module name: device}`` for ``model`` (real or empty weights) under ``dispatch``.

    Strategies go to accelerate (``infer_auto_device_map``; ``auto`` and ``balanced`` spread the
    layers evenly over the GPUs with ``get_balanced_memory``, ``sequential`` fills GPU 0 first), never
    splitting a decoder layer. Raises one line when the plan puts modules on disk and no offload
    folder was given (``max_memory`` too small for the model).
    """
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes, get_balanced_memory

    if isinstance(dispatch.device_map, dict):
        _check_covers(model, dispatch.device_map)
        device_map = dict(dispatch.device_map)
    else:
        no_split = sorted(getattr(model, "_no_split_modules", None) or [])
        memory = None if dispatch.max_memory is None else \
            {to_accelerate(d): n for d, n in dispatch.max_memory.items()}
        if dispatch.device_map != "sequential":
            memory = get_balanced_memory(model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype,
                                         low_zero=dispatch.device_map == "balanced_low_0")
        raw = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype)
        device_map = {name: from_accelerate(d) for name, d in raw.items()}
    if "" in device_map:  # the whole model on one device: named per top-level module, which dispatch_model
        # needs to offload it to disk (it collects a module's weights by its name)
        device = device_map.pop("")
        device_map = {name: device for name, _ in model.named_children()} | device_map
    on_disk = [name for name, d in device_map.items() if d == "disk"]
    if on_disk and dispatch.offload_folder is None:
        if isinstance(dispatch.device_map, dict):
            raise DispatchError(f"the device map puts {len(on_disk)} module(s) on disk ({on_disk[0]}…) "
                                "but no --offload-folder was given", "pass --offload-folder DIR")
        total = compute_module_sizes(model, dtype=dtype)[""]
        limits = ", ".join(f"{d}={format_size(n)}" for d, n in (dispatch.max_memory or {}).items()) or "the free memory"
        raise DispatchError(f"--max-memory {limits} is too small for the model ({format_size(total)} in "
                            f"{str(dtype).removeprefix('torch.')}): {len(on_disk)} module(s) would not fit "
                            f"({on_disk[0]}…)",
                            "raise --max-memory, or pass --offload-folder DIR to offload the rest to disk")
    return device_map


def offload_dir(dispatch: Dispatch, device_map: Mapping[str, str]) -> Path | None:
    """A fresh folder inside ``--offload-folder`` for one model's disk weights (None without disk).

    Fresh because accelerate reuses weights already offloaded in a folder it is given; the caller
    removes it with the model (``weakref.finalize``: when the model is collected or the process ends).
    """
    if "disk" not in device_map.values():
        return None
    folder = dispatch.offload_folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix="mechkit-offload-", dir=folder))
    except OSError as err:
        raise DispatchError(f"--offload-folder {folder} is not writable ({err.strerror or type(err).__name__})",
                            "choose an --offload-folder in a writable place") from None
    return path


@contextlib.contextmanager
def _quiet_accelerate() -> Iterator[None]:
    """accelerate logs a warning for every offloaded dispatch ("Some parameters are on the meta device");
    mechkit reports where modules live in the report's model block instead."""
    logger = logging.getLogger("accelerate.big_modeling")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def dispatch_in_memory(model: nn.Module, dispatch: Dispatch, dtype: torch.dtype) -> nn.Module:
    """Spread a model already in CPU memory over the planned devices (``accelerate.dispatch_model``)."""
    from accelerate import dispatch_model

    model.to(dtype=dtype)
    device_map = assign_devices(model, dispatch, dtype)
    remember_ties(model)
    folder = offload_dir(dispatch, device_map)
    try:
        with _quiet_accelerate():
            dispatch_model(model, device_map={k: to_accelerate(v) for k, v in device_map.items()},
                           main_device=to_accelerate(main_device(device_map)), offload_dir=folder,
                           skip_keys=getattr(model, "_skip_keys_device_placement", None))
    except BaseException:
        if folder is not None:
            discard_tree(folder)
        raise
    if folder is not None:
        weakref.finalize(model, discard_tree, folder)
    return model


def load_pretrained(source: str | os.PathLike, dispatch: Dispatch, dtype: torch.dtype, **kwargs) -> nn.Module:
    """``from_pretrained`` straight into the planned map: the plan is made on an empty model, so no
    weight is ever held twice and nothing loads before ``max_memory`` is known to suffice."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source, **{k: v for k, v in kwargs.items()
                                                   if k in ("local_files_only", "trust_remote_code")})
    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(config, dtype=dtype)
    empty.tie_weights()  # tied embeddings must be planned onto one device, as from_pretrained will tie them
    device_map = assign_devices(empty, dispatch, dtype)
    folder = offload_dir(dispatch, device_map)
    try:
        with _quiet_accelerate():
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, device_map={k: to_accelerate(v) for k, v in device_map.items()},
                offload_folder=folder, **kwargs)
    except BaseException:
        if folder is not None:
            discard_tree(folder)
        raise
    info = None
    if kwargs.get("output_loading_info"):
        model, info = model
    if folder is not None:
        weakref.finalize(model, discard_tree, folder)
    remember_ties(model, source=empty)
    return model if info is None else (model, info)
