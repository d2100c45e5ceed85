"""One model larger than one device: accelerate's big-model dispatch, and where its weights then live.

``load_model(spec, device_map=..., max_memory=..., offload_folder=...)`` spreads a model's modules
over the devices a :class:`Dispatch` names — GPUs, CPU memory, and disk for what fits nowhere else.
accelerate does the work: :func:`plan` asks ``infer_auto_device_map`` (after ``get_balanced_memory``
for the balanced strategies) on the model or on an empty copy of it (``init_empty_weights``), local
directories then load straight into that map through ``from_pretrained(device_map=...)`` and models
already in memory (tiny, toy, GGUF-converted, pruned, objects) go through ``dispatch_model``.

accelerate's hooks move each module's inputs to its device. A module offloaded to CPU memory (the
``"cpu"`` entries when the main device is an accelerator) or to disk keeps its parameters on
``meta`` and its weights in ``module._hf_hook.weights_map``, loaded for the module's forward and
dropped after it. Everything that reads or edits weights goes through this module, so it reaches
those weights: :func:`module_tensor` reads one, :func:`state_items` gives the whole state dict (what
``weights_sha256`` hashes), and :class:`WeightSlot` edits one reversibly — an offloaded weight is
edited in a copy that the module's hook reads in place of the stored one until the slot is
restored; the stored weights are never written, so restoring them is bit-exact by construction.

Checked before any model loads, each as one :class:`~mechkit.errors.ModelLoadError` line: a map
naming a device that is not here, sizes that do not parse, an offload folder that cannot be
written; after the plan and before any weight loads: ``max_memory`` too small for the model (what
does not fit would go to disk and no offload folder was given).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mechkit.errors import MechkitError, ModelLoadError

if TYPE_CHECKING:
    import torch
    from torch import nn

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
OFFLOADED = ("cpu", "disk")  # "cpu" offloads only when the main device is an accelerator
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_ONE_DEVICE = re.compile(r"^((cpu|disk|cuda|mps|xpu)(:\d+)?|\d+)$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)


class DispatchError(ModelLoadError):
    """A device map, memory limit or offload folder that cannot work here (one line, before weights load)."""


_MAP_FIX = (f"use {', '.join(STRATEGIES)}, one device, a .json file mapping module names to devices, "
            "or MODULE=DEVICE pairs (model.layers.0=cuda:0,model.layers.1=disk,...)")


# ---- what the user asked for, checked before anything loads ----------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """A checked request: a strategy or an explicit ``{module: device}`` map, per-device memory
    limits in bytes, and where disk-offloaded weights may go. Devices are spelled as torch spells
    them (``cuda:0``, ``cpu``), plus ``disk``."""

    device_map: str | dict[str, str]
    max_memory: dict[str, int] | None = None
    offload_folder: Path | None = None

    def uses_accelerator(self) -> bool:
        """Whether the model's main device will be an accelerator (bf16 is then the default dtype)."""
        import torch

        if isinstance(self.device_map, dict):
            return any(d not in OFFLOADED for d in self.device_map.values())
        if self.max_memory is not None:
            return any(d not in ("cpu", "disk") for d in self.max_memory)
        return torch.cuda.is_available()


def parse_device_map(text: str) -> str | dict[str, str]:
    """A ``--device-map`` value: a strategy, one device for the whole model, a ``.json`` file of
    ``{module: device}``, or ``MODULE=DEVICE`` pairs.

    Only the syntax is checked here (no torch import); :func:`request` checks the devices.

    >>> parse_device_map("balanced")
    'balanced'
    >>> parse_device_map("disk")
    {'': 'disk'}
    >>> parse_device_map("model.layers.0=cpu, model.layers.1=disk")
    {'model.layers.0': 'cpu', 'model.layers.1': 'disk'}
    """
    text = str(text).strip()
    if text in STRATEGIES:
        return text
    if _ONE_DEVICE.match(text):
        return {"": text}
    if text.endswith(".json"):
        try:
            mapping = json.loads(Path(text).expanduser().read_text())
        except (OSError, ValueError) as err:
            raise DispatchError(f"--device-map {text}: cannot read it as JSON ({type(err).__name__})",
                                'write a JSON object like {"model.layers.0": "cuda:0", "lm_head": "cpu"}') from None
        if not isinstance(mapping, dict) or not mapping:
            raise DispatchError(f"--device-map {text} holds no JSON object of module names to devices",
                                'write a JSON object like {"model.layers.0": "cuda:0", "lm_head": "cpu"}')
        return {str(k): str(v) for k, v in mapping.items()}
    pairs = [part.strip() for part in text.split(",") if part.strip()]
    if not pairs or any(p.count("=") != 1 for p in pairs):
        raise DispatchError(f"--device-map {text!r} is not a strategy, a device, a .json file or MODULE=DEVICE pairs",
                            _MAP_FIX)
    return {k.strip(): v.strip() for k, v in (p.split("=") for p in pairs)}


def parse_size(value: Any, what: str = "--max-memory") -> int:
    """Bytes from ``10GiB``, ``500MB``, ``1e9``-free integers or an int (GB = 10⁹, GiB = 2³⁰).

    >>> parse_size("2GiB"), parse_size("500MB"), parse_size(1024)
    (2147483648, 500000000, 1024)
    """
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        unit = match.group(2).upper() if match else None
        if unit is not None and unit not in _UNITS:
            unit = unit + "B" if unit + "B" in _UNITS else None
        if match is None or unit is None:
            raise DispatchError(f"{what}: cannot read {value!r} as a size", "write sizes like 10GiB, 500MB or 1073741824")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size < 0:
        raise DispatchError(f"{what}: {value!r} is negative", "write sizes like 10GiB, 500MB or 0")
    return size


def parse_max_memory(text: str) -> dict[str, str]:
    """A ``--max-memory`` value: ``DEVICE=SIZE`` pairs (sizes are checked by :func:`request`).

    >>> parse_max_memory("cuda:0=10GiB,cpu=30GiB")
    {'cuda:0': '10GiB', 'cpu': '30GiB'}
    """
    pairs = [part.strip() for part in str(text).split(",") if part.strip()]
    if not pairs or any(p.count("=") != 1 for p in pairs):
        raise DispatchError(f"--max-memory {text!r} is not DEVICE=SIZE pairs",
                            "write it like cuda:0=10GiB,cpu=30GiB (or cpu=200MB)")
    return {k.strip(): v.strip() for k, v in (p.split("=") for p in pairs)}


def check_device(device: str, flag: str = "--device") -> str:
    """``device`` as torch spells it, once it is known to exist here; else one :class:`ModelLoadError` line.

    Checked before any model loads, so ``--device cuda`` on a machine without CUDA fails at once
    (``flag`` names the option in the message: ``--device-map`` and ``--max-memory`` check theirs here too).

    >>> check_device("cpu")
    'cpu'
    >>> try:
    ...     check_device("gpu0")
    ... except ModelLoadError as err:
    ...     print(err)
    unknown device 'gpu0' — use cpu, cuda, cuda:N, mps or xpu
    """
    import torch

    try:
        parsed = torch.device(str(device))
    except (RuntimeError, ValueError, TypeError):
        raise ModelLoadError(f"unknown device {device!r}", "use cpu, cuda, cuda:N, mps or xpu") from None
    kind = parsed.type
    if kind == "cpu":
        return str(parsed)
    backends = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None), "mps": getattr(torch, "mps", None)}
    if kind not in backends:
        raise ModelLoadError(f"device {device!r} cannot run a model here", "use cpu, cuda, cuda:N, mps or xpu")
    if kind == "mps":
        available, count = torch.backends.mps.is_available(), 1
    else:
        module = backends[kind]
        available = module is not None and module.is_available()
        count = module.device_count() if available else 0
    if not available:
        why = (f"this torch {torch.__version__} was built without CUDA" if kind == "cuda" and torch.version.cuda is None
               else f"no {kind.upper()} device is visible")
        fix = ("use --device cpu (the default picks CUDA only where it is available)" if flag == "--device"
               else f"name only devices this machine has in {flag} (cpu, disk)")
        raise ModelLoadError(f"{flag} {device}: {why}", fix)
    if parsed.index is not None and parsed.index >= count:
        raise ModelLoadError(f"{flag} {device}: only {count} {kind.upper()} device(s) here",
                             f"use {kind}:0 to {kind}:{count - 1}")
    return str(parsed)


def _device(value: Any, flag: str) -> str:
    """A device as torch spells it (``cuda:N`` with its index), ``disk``, once known to exist here."""
    if isinstance(value, bool):
        raise DispatchError(f"{flag} names device {value!r}", "use cpu, disk, cuda:N or an integer GPU index")
    if isinstance(value, int):
        value = f"cuda:{value}"
    text = str(value).strip()
    if text == "disk":
        return text
    if text.isdigit():
        text = f"cuda:{text}"
    checked = check_device(text, flag=flag)
    return f"{checked}:0" if checked in ("cuda", "xpu") else checked


def _check_folder(folder: str | os.PathLike) -> Path:
    """``folder`` if offloaded weights could be written there (it need not exist yet); nothing is created."""
    path = Path(folder).expanduser()
    fix = "choose an --offload-folder in a writable place (e.g. one on a local disk under your home)"
    if path.exists() and not path.is_dir():
        raise DispatchError(f"--offload-folder {path} is a file, not a folder", fix)
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise DispatchError(f"--offload-folder {path} cannot be made: {existing} is a file", fix)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DispatchError(f"--offload-folder {path} is not writable ({existing}: permission denied)", fix)
    try:  # os.access trusts the mode bits; a read-only file system (or root squashing) says no only here
        probe = tempfile.mkdtemp(prefix=".mechkit-probe-", dir=existing)
    except OSError as err:
        raise DispatchError(f"--offload-folder {path} is not writable ({existing}: "
                            f"{err.strerror or type(err).__name__})", fix) from None
    os.rmdir(probe)
    return path


def request(device_map: Any = None, max_memory: Any = None, offload_folder: Any = None,
            device: str | None = None) -> Dispatch | None:
    """The checked :class:`Dispatch` for ``load_model``'s arguments; None when none was given.

    ``max_memory`` or ``offload_folder`` alone imply ``device_map="auto"``. Raises one
    :class:`~mechkit.errors.ModelLoadError` line for a device that is not here, a size that does not
    parse, a strategy that does not exist, or an offload folder that cannot be written.

    >>> request("sequential", {"cpu": "1GiB"})
    Dispatch(device_map='sequential', max_memory={'cpu': 1073741824}, offload_folder=None)
    """
    if device_map is None and max_memory is None and offload_folder is None:
        return None
    if device is not None:
        raise DispatchError("--device and --device-map/--max-memory/--offload-folder were both given",
                            "pass --device for one device, or --device-map (which names every device) alone")
    device_map = "auto" if device_map is None else device_map
    if isinstance(device_map, str) and device_map not in STRATEGIES:
        device_map = parse_device_map(device_map)
    if isinstance(device_map, Mapping):
        if not device_map:
            raise DispatchError("the device map is empty", _MAP_FIX)
        device_map = {str(k): _device(v, "--device-map") for k, v in device_map.items()}
    elif device_map not in STRATEGIES:
        raise DispatchError(f"--device-map {device_map!r} is not a strategy or a map", _MAP_FIX)
    memory = None
    if max_memory is not None:
        if isinstance(max_memory, str):
            max_memory = parse_max_memory(max_memory)
        if not isinstance(max_memory, Mapping) or not max_memory:
            raise DispatchError(f"--max-memory {max_memory!r} is not a map of devices to sizes",
                                "write it like cuda:0=10GiB,cpu=30GiB")
        memory = {_device(k, "--max-memory"): parse_size(v, f"--max-memory {k}") for k, v in max_memory.items()}
        if isinstance(device_map, dict):
            raise DispatchError("--max-memory was given with an explicit device map, which it cannot change",
                                "pass --max-memory with a strategy (--device-map auto), or the map alone")
    folder = _check_folder(offload_folder) if offload_folder is not None else None
    return Dispatch(device_map=device_map, max_memory=memory, offload_folder=folder)


# ---- the plan: which module goes where ------------------------------------------------------------


def _to_accelerate(device: str) -> str | int:
    """accelerate spells GPUs as integers in its maps and memory limits."""
    return int(device.split(":")[1]) if device.startswith("cuda:") else device


def _from_accelerate(device: Any) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


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


def plan(model: nn.Module, dispatch: Dispatch, dtype: torch.dtype | None = None) -> dict[str, str]:
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
            {_to_accelerate(d): n for d, n in dispatch.max_memory.items()}
        if dispatch.device_map != "sequential":
            memory = get_balanced_memory(model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype,
                                         low_zero=dispatch.device_map == "balanced_low_0")
        raw = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype)
        device_map = {name: _from_accelerate(d) for name, d in raw.items()}
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
        limits = ", ".join(f"{d}={_size(n)}" for d, n in (dispatch.max_memory or {}).items()) or "the free memory"
        raise DispatchError(f"--max-memory {limits} is too small for the model ({_size(total)} in "
                            f"{str(dtype).removeprefix('torch.')}): {len(on_disk)} module(s) would not fit "
                            f"({on_disk[0]}…)",
                            "raise --max-memory, or pass --offload-folder DIR to offload the rest to disk")
    return device_map


def main_device(device_map: Mapping[str, str]) -> str:
    """The device that runs offloaded modules and receives the inputs: the first one not offloaded."""
    return next((d for d in device_map.values() if d not in OFFLOADED), "cpu")


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
    device_map = plan(model, dispatch, dtype)
    _remember_ties(model)
    folder = offload_dir(dispatch, device_map)
    try:
        with _quiet_accelerate():
            dispatch_model(model, device_map={k: _to_accelerate(v) for k, v in device_map.items()},
                           main_device=_to_accelerate(main_device(device_map)), offload_dir=folder,
                           skip_keys=getattr(model, "_skip_keys_device_placement", None))
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if folder is not None:
        weakref.finalize(model, shutil.rmtree, folder, True)
    return model


def load_pretrained(source: str | os.PathLike, dispatch: Dispatch, dtype: torch.dtype, **kwargs) -> nn.Module:
    """``from_pretrained`` straight into the planned map: the plan is made on an empty model, so no
    weight is ever held twice and nothing loads before ``max_memory`` is known to suffice."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source, **kwargs)
    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(config, dtype=dtype)
    empty.tie_weights()  # tied embeddings must be planned onto one device, as from_pretrained will tie them
    device_map = plan(empty, dispatch, dtype)
    folder = offload_dir(dispatch, device_map)
    try:
        with _quiet_accelerate():
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, device_map={k: _to_accelerate(v) for k, v in device_map.items()},
                offload_folder=folder, **kwargs)
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if folder is not None:
        weakref.finalize(model, shutil.rmtree, folder, True)
    _remember_ties(model, source=empty)
    return model


# ---- where a dispatched model's weights and inputs live -----------------------------------------------


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate placed this model (a device map, or hooks that move weights or inputs)."""
    return getattr(model, "hf_device_map", None) is not None or hasattr(model, "_hf_hook") or any(
        hasattr(m, "_hf_hook") for m in model.modules())


def _align_hooks(module: nn.Module) -> list:
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    from accelerate.hooks import AlignDevicesHook, SequentialHook

    hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
    return [h for h in hooks if isinstance(h, AlignDevicesHook)]


def _torch_device(device: Any) -> torch.device:
    import torch

    if isinstance(device, int):
        kind = "xpu" if hasattr(torch, "xpu") and torch.xpu.is_available() else "cuda"
        return torch.device(kind, device)
    return torch.device(device)


def input_device(model: nn.Module) -> torch.device:
    """Where a forward's inputs go: the dispatched model's main device, else its parameters' device."""
    import torch

    if hasattr(model, "_hf_hook"):
        for hook in _align_hooks(model):
            if hook.execution_device is not None:
                return _torch_device(hook.execution_device)
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        return _torch_device(_to_accelerate(main_device({k: _from_accelerate(v) for k, v in device_map.items()})))
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


def device_summary(model: nn.Module) -> dict[str, str] | None:
    """``{module: device}`` where accelerate placed the model (``disk``/``cpu`` for offloaded), else None."""
    device_map = getattr(model, "hf_device_map", None)
    return None if not device_map else {k: _from_accelerate(v) for k, v in device_map.items()}


def _offload_hook(model: nn.Module, qualname: str) -> tuple[Any, str] | None:
    """The accelerate hook holding the offloaded tensor ``qualname`` and its key in the hook's weights map.

    The module's own hook, or an ancestor's that places its submodules (``preload_module_classes``).
    """
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        module = model.get_submodule(".".join(parts[:cut]))
        key = ".".join(parts[cut:])
        for hook in _align_hooks(module):
            if hook.offload and hook.weights_map is not None and (cut == len(parts) - 1 or hook.place_submodules):
                return hook, key
    return None


def _qualname(model: nn.Module, module: nn.Module, name: str) -> str:
    for prefix, m in model.named_modules(remove_duplicate=False):
        if m is module:
            return f"{prefix}.{name}" if prefix else name
    raise MechkitError(f"the module holding {name!r} is not part of the model", "edit a module of this model")


def stored_tensor(model: nn.Module, qualname: str) -> torch.Tensor:
    """The value of tensor ``qualname``: the parameter itself, or for an offloaded one the tensor its
    hook would load (from CPU memory or disk; edits in progress included), on its storage device."""
    module_name, _, leaf = qualname.rpartition(".")
    tensor = getattr(model.get_submodule(module_name), leaf)
    if tensor.device.type != "meta":
        return tensor
    found = _offload_hook(model, qualname)
    if found is None:
        raise MechkitError(f"{qualname} is on the meta device and no accelerate hook holds its weights",
                           "load the model with mechkit.load_model (or accelerate) so its weights are somewhere")
    hook, key = found
    return hook.weights_map[key]


def module_tensor(module: nn.Module, name: str = "weight", model: nn.Module | None = None) -> torch.Tensor:
    """A module's parameter or buffer as a real tensor, also where accelerate offloaded it (then a copy
    on the module's execution device). Read-only: edit through :class:`WeightSlot`."""
    tensor = getattr(module, name)
    if tensor.device.type != "meta":
        return tensor
    for hook in _align_hooks(module):
        if hook.offload and hook.weights_map is not None:
            value = hook.weights_map[name]
            return value.to(_torch_device(hook.execution_device)) if hook.execution_device is not None else value
    if model is not None:
        return stored_tensor(model, _qualname(model, module, name))
    raise MechkitError(f"{type(module).__name__}.{name} is offloaded by an ancestor module's hook",
                       "pass model= so the hook that holds it can be found")


def state_items(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model.state_dict()`` with every offloaded tensor read from where accelerate keeps it."""
    for name, tensor in model.state_dict().items():
        yield name, stored_tensor(model, name) if tensor.device.type == "meta" else tensor


class StateView(Mapping):
    """``model.state_dict()`` read lazily, offloaded tensors included (one at a time, never all at once);
    only ``names`` where given.

    >>> import mechkit as mk
    >>> view = StateView(mk.load_model("tiny:llama").model)
    >>> view["model.norm.weight"].shape
    torch.Size([64])
    """

    def __init__(self, model: nn.Module, names: Iterable[str] | None = None) -> None:
        self.model = model
        self._names = dict.fromkeys(model.state_dict() if names is None else names)

    def __getitem__(self, name: str):
        if name not in self._names:
            raise KeyError(name)
        return stored_tensor(self.model, name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


# ---- reversible edits of weights wherever they live ----------------------------------------------------


class _Overlay(Mapping):
    """A hook's weights map with some tensors replaced by edited copies (the stored ones untouched)."""

    def __init__(self, base: Mapping) -> None:
        self.base = base
        self.edited: dict[str, Any] = {}

    def __getitem__(self, key: str):
        return self.edited[key] if key in self.edited else self.base[key]

    def __iter__(self):
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


class WeightSlot:
    """One tensor of the model, editable in place through :attr:`editable` and put back by :meth:`restore`.

    A resident parameter is edited in place and copied back from a snapshot. An offloaded one (on
    ``meta``, its weights in accelerate's ``weights_map``) is edited in a copy that its hooks — the
    module's and those of weights tied to it — read instead of the stored tensor; :meth:`restore`
    removes the copy, so the stored weights come back untouched. Such copies live in CPU memory (or
    wherever the offloaded weight is kept) while the edit lasts.
    """

    def __init__(self, model: nn.Module, qualname: str, tied: list[str] | None = None) -> None:
        import torch

        self.qualname = qualname
        module_name, _, leaf = qualname.rpartition(".")
        tensor = getattr(model.get_submodule(module_name), leaf)
        self._param = None
        self._overlays: list[tuple[Any, _Overlay, str]] = []
        if tensor.device.type != "meta":
            self._param = tensor
            with torch.no_grad():
                self.original = tensor.detach().clone()
            self.editable = tensor.data
            return
        hooks = []
        for name in tied or [qualname]:
            found = _offload_hook(model, name)
            if found is not None:
                hooks.append(found)
        if not hooks:
            raise MechkitError(f"{qualname} is on the meta device and no accelerate hook holds its weights",
                               "load the model with mechkit.load_model (or accelerate) so its weights are somewhere")
        self.original = hooks[0][0].weights_map[hooks[0][1]]  # what the hook loads; never written
        self.editable = self.original.detach().clone()
        for hook, key in hooks:
            overlay = hook.weights_map if isinstance(hook.weights_map, _Overlay) else _Overlay(hook.weights_map)
            overlay.edited[key] = self.editable
            hook.weights_map = overlay
            self._overlays.append((hook, overlay, key))

    @property
    def offloaded(self) -> bool:
        return self._param is None

    def reset(self) -> None:
        """The editable tensor back to the original values (the slot stays open)."""
        import torch

        with torch.no_grad():
            self.editable.copy_(self.original)

    def restore(self) -> None:
        """The original back, bit-exactly; an offloaded weight's hooks read the stored tensor again."""
        if self._param is not None:
            self.reset()
            return
        for hook, overlay, key in self._overlays:
            overlay.edited.pop(key, None)
            if not overlay.edited and hook.weights_map is overlay:
                hook.weights_map = overlay.base
        self._overlays.clear()


# Tied groups found before dispatch: accelerate's hooks give each offloaded module a fresh meta
# parameter at every forward, so after one forward the ties cannot be seen on the model any more.
_TIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _remember_ties(model: nn.Module, source: nn.Module | None = None) -> None:
    from accelerate.utils import find_tied_parameters

    _TIES[model] = [list(group) for group in find_tied_parameters(source if source is not None else model)]


def _config_ties(model: nn.Module) -> list[list[str]]:
    """The input and output embeddings, where the config ties them (HF models): accelerate's
    ``cpu_offload`` unties them on ``meta`` before mechkit ever sees the model."""
    config = getattr(model, "config", None)
    get_text = getattr(config, "get_text_config", None)
    text = get_text(decoder=True) if callable(get_text) else config
    if not getattr(text, "tie_word_embeddings", False) or not hasattr(model, "get_output_embeddings"):
        return []
    try:
        out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return []
    if out_emb is None or in_emb is None:
        return []
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    if id(out_emb) not in names or id(in_emb) not in names:
        return []
    group = sorted({f"{names[id(in_emb)]}.weight", f"{names[id(out_emb)]}.weight"})
    return [group] if len(group) == 2 else []


def tied_names(model: nn.Module) -> dict[str, list[str]]:
    """For every tied tensor name, all the names sharing its weights (empty for untied models): the
    ties found before dispatch, on the model, and the embeddings its config ties."""
    from accelerate.utils import find_tied_parameters

    groups = _TIES.get(model)
    if groups is None:
        groups = find_tied_parameters(model)
    out: dict[str, set[str]] = {}
    for group in [*groups, *_config_ties(model)]:
        merged = set(group).union(*(out.get(name, set()) for name in group))
        for name in merged:
            out[name] = merged
    return {name: sorted(group) for name, group in out.items()}


def distinct_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """``dict(model.named_parameters())`` with tied weights once (under their first name), also where
    accelerate's hooks gave each tied module its own ``meta`` parameter; values are the model's own
    parameters (on ``meta`` where offloaded: read them with :func:`stored_tensor`).

    >>> import mechkit as mk
    >>> "lm_head.weight" in distinct_parameters(mk.load_model("tiny:gpt2").model)
    False
    """
    ties = tied_names(model)
    out: dict[str, nn.Parameter] = {}
    for name, param in model.named_parameters():
        if not any(other in out for other in ties.get(name, ())):
            out[name] = param
    return out


# ---- a plain copy of a dispatched model, from its stored weights -----------------------------------------


def free_bytes(device: torch.device | str) -> int | None:
    """Bytes free on ``device`` now (CPU: available memory); None where it cannot be known."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        import psutil  # accelerate's own dependency

        return int(psutil.virtual_memory().available)
    return None


def _nbytes(model: nn.Module, dtype: torch.dtype | None, ties: Mapping[str, list[str]]) -> int:
    seen: set[str] = set()
    total = 0
    for name, tensor in model.state_dict(keep_vars=True).items():
        if any(other in seen for other in ties.get(name, ())):
            continue
        seen.add(name)
        size = (dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype).itemsize
        total += tensor.numel() * size
    return total


class PlainCopy:
    """A copy of a dispatched model without accelerate's hooks, its tensors filled from the stored
    weights onto one device, module by module as :meth:`fill` is called.

    Deep-copying a dispatched model would copy accelerate's hooks and weights maps (for ``cpu_offload``
    the whole CPU state dict) and keep its ``meta`` parameters; this copy maps every parameter and
    persistent buffer to ``meta`` and every weights map to nothing while copying, removes the hooks,
    and then reads each tensor from where the original keeps it (:func:`stored_tensor`, edits in
    progress included) straight onto ``device``, as ``dtype`` if given. So a caller can slice one
    block before filling the next (pruning: never the whole dense model at once) or fill everything
    (:func:`plain_copy`). Tied weights (:func:`tied_names`) share one parameter again. The original
    is only read.
    """

    def __init__(self, model: nn.Module, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
        import copy

        import torch
        from accelerate.hooks import remove_hook_from_module
        from torch import nn

        self.original, self.device, self.dtype = model, torch.device(device), dtype
        self.ties = tied_names(model)
        persistent = {id(t) for t in model.state_dict(keep_vars=True).values()}
        memo: dict[int, Any] = {}
        for module in model.modules():
            for hook in _align_hooks(module):
                for attr in ("weights_map", "tied_params_map"):
                    if getattr(hook, attr, None) is not None:
                        memo[id(getattr(hook, attr))] = {}
            for param in module._parameters.values():
                if param is not None and id(param) not in memo:
                    memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"),
                                                   requires_grad=param.requires_grad)
            for name, buf in module._buffers.items():
                if buf is None or id(buf) in memo:
                    continue
                if id(buf) in persistent:
                    memo[id(buf)] = torch.empty_like(buf, device="meta")
                elif buf.device.type == "meta":
                    raise MechkitError(f"buffer {name} of {type(module).__name__} is on the meta device and not "
                                       "in the state dict", "load the model with mechkit.load_model")
                else:
                    memo[id(buf)] = self._cast(buf)
        self.model = copy.deepcopy(model, memo)
        for module in self.model.modules():
            for hook in _align_hooks(module):
                hook.offload = False  # nothing to put back: the copy's tensors are filled below
        remove_hook_from_module(self.model, recurse=True)
        self.model.__dict__.pop("hf_device_map", None)
        self._origin = {id(m): n for n, m in self.model.named_modules(remove_duplicate=False)}
        self._filled: dict[str, Any] = {}

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        dtype = self.dtype if self.dtype is not None and tensor.is_floating_point() else tensor.dtype
        return tensor.detach().to(self.device, dtype, copy=True)

    def nbytes(self) -> int:
        """Bytes of the copy as it stands (its ``meta`` tensors counted as they will be filled)."""
        return _nbytes(self.model, self.dtype, self.ties)

    def fill(self, module: nn.Module | None = None) -> None:
        """Give every ``meta`` tensor under ``module`` (default: the whole copy) its stored value."""
        from torch import nn

        for sub in (module or self.model).modules():
            prefix = self._origin.get(id(sub))
            if prefix is None:
                raise MechkitError(f"{type(sub).__name__} is not a module of the copied model",
                                   "fill modules of PlainCopy.model only")
            for kind in ("_parameters", "_buffers"):
                tensors = getattr(sub, kind)
                for leaf, tensor in list(tensors.items()):
                    if tensor is None or tensor.device.type != "meta":
                        continue
                    name = f"{prefix}.{leaf}" if prefix else leaf
                    shared = next((self._filled[n] for n in self.ties.get(name, ()) if n in self._filled), None)
                    if shared is None:
                        value = self._cast(stored_tensor(self.original, name))
                        if value.shape != tensor.shape:
                            raise MechkitError(f"{name}: stored weights of shape {tuple(value.shape)} for a "
                                               f"tensor of {tuple(tensor.shape)}", "fill before editing shapes")
                        shared = nn.Parameter(value, requires_grad=tensor.requires_grad) if kind == "_parameters" \
                            else value
                    tensors[leaf] = shared
                    self._filled[name] = shared


def plain_copy(model: nn.Module, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
               factor: float = 1.0, purpose: str = "a copy of the model",
               fix: str = "use a device with more free memory") -> nn.Module:
    """A hook-free copy of ``model`` with every weight on ``device`` (default: its main device), as
    ``dtype`` if given: a dispatched model's from its stored weights (:class:`PlainCopy`), any other's
    by ``copy.deepcopy``. The caller's model is only read.

    ``factor`` × the copy's bytes must be free on the device (training: weights, gradients and AdamW's
    two moments are ``4``), else one :class:`MechkitError` line naming ``purpose`` and ``fix``.

    >>> import mechkit as mk
    >>> plain_copy(mk.load_model("tiny:llama").model).model.norm.weight.shape
    torch.Size([64])
    """
    import copy

    if not is_dispatched(model):
        out = copy.deepcopy(model)
        return out.to(**({"device": device} if device is not None else {}), **({"dtype": dtype} if dtype else {}))
    target = input_device(model) if device is None else _torch_device(device)
    plain = PlainCopy(model, target, dtype)
    check_fits(plain.nbytes() * factor, target, purpose, fix)
    plain.fill()
    return plain.model


def check_fits(nbytes: float, device: torch.device | str, purpose: str, fix: str) -> None:
    """One :class:`MechkitError` line when ``nbytes`` are more than ``device`` has free now."""
    free = free_bytes(device)
    if free is not None and nbytes > free:
        raise MechkitError(f"{purpose} needs {_size(nbytes)} on {device} but only {_size(free)} is free there",
                           fix)


__all__ = [
    "STRATEGIES", "Dispatch", "DispatchError", "PlainCopy", "StateView", "WeightSlot", "check_device", "check_fits",
    "device_summary", "dispatch_in_memory", "distinct_parameters", "free_bytes", "input_device", "is_dispatched",
    "load_pretrained", "main_device", "module_tensor", "parse_device_map", "parse_max_memory", "parse_size",
    "plain_copy", "plan", "request", "state_items", "stored_tensor", "tied_names",
]
