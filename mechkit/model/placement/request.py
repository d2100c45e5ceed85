"""What the user asked for: a device map, memory limits and an offload folder, checked before anything loads.

Each failure is one :class:`~mechkit.errors.ModelLoadError` line: a map naming a device that is not here,
sizes that do not parse, an offload folder that cannot be written. No torch import until a device is
checked, so ``--device-map`` parses as fast as any option.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechkit.errors import ModelLoadError
from mechkit.model.placement.devices import OFFLOADED

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_ONE_DEVICE = re.compile(r"^((cpu|disk|cuda|mps|xpu)(:\d+)?|\d+)$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)


class DispatchError(ModelLoadError):
    """A device map, memory limit or offload folder that cannot work here (one line, before weights load)."""


_MAP_FIX = (f"use {', '.join(STRATEGIES)}, one device, a .json file mapping module names to devices, "
            "or MODULE=DEVICE pairs (model.layers.0=cuda:0,model.layers.1=disk,...)")


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
        mapping = _map_file(text)
        if not isinstance(mapping, dict) or not mapping:
            raise DispatchError(f"--device-map {text} holds no JSON object of module names to devices",
                                'write a JSON object like {"model.layers.0": "cuda:0", "lm_head": "cpu"}')
        return {str(k): str(v) for k, v in mapping.items()}
    pairs = [part.strip() for part in text.split(",") if part.strip()]
    if not pairs or any(p.count("=") != 1 for p in pairs):
        raise DispatchError(f"--device-map {text!r} is not a strategy, a device, a .json file or MODULE=DEVICE pairs",
                            _MAP_FIX)
    return {k.strip(): v.strip() for k, v in (p.split("=") for p in pairs)}


MAX_MAP_BYTES = 16 * 2**20  # a device map names each module once: far below this


def _map_file(text: str) -> Any:
    """The JSON a ``--device-map X.json`` holds, read only as a regular file of at most :data:`MAX_MAP_BYTES`: a FIFO
    there had blocked the read for ever, and ``~nosuchuser/map.json`` had raised RuntimeError."""
    from mechkit.errors import MechkitError
    from mechkit.io.patharg import expand_user
    from mechkit.io.read import read_plain

    fix = 'write a JSON object like {"model.layers.0": "cuda:0", "lm_head": "cpu"}'
    try:
        path = expand_user(text, "--device-map")
    except MechkitError as err:
        raise DispatchError(err.problem, err.fix) from None
    try:
        return json.loads(read_plain(os.path.realpath(path), MAX_MAP_BYTES).decode("utf-8"))  # a link: its file
    except (OSError, ValueError, RecursionError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
        raise DispatchError(f"--device-map {text}: cannot read it as JSON ({why})", fix) from None


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
    if text.isascii() and text.isdigit():  # "²" is a digit to Python, and no device number
        text = f"cuda:{text}"
    checked = check_device(text, flag=flag)
    return f"{checked}:0" if checked in ("cuda", "xpu") else checked


def _check_folder(folder: str | os.PathLike) -> Path:
    """``folder`` if offloaded weights could be written there (it need not exist yet); nothing is created."""
    from mechkit.errors import MechkitError
    from mechkit.io.patharg import checked_text, expand_user

    fix = "choose an --offload-folder in a writable place (e.g. one on a local disk under your home)"
    try:  # a PathLike giving bytes decoded; no path, "" (the working directory) or a NUL byte: one line
        text = checked_text(folder, "offload_folder", 'offload_folder="offload"')
    except MechkitError as err:
        raise DispatchError(err.problem, err.fix) from None
    try:
        path = expand_user(text, "--offload-folder")
    except MechkitError as err:
        raise DispatchError(err.problem, err.fix) from None
    try:
        return _writable_folder(path, fix)
    except OSError as err:  # a name too long, a folder above that cannot be searched: one line
        raise DispatchError(f"cannot look up --offload-folder {path}: {err.strerror or type(err).__name__}",
                            fix) from None


def _writable_folder(path: Path, fix: str) -> Path:
    from mechkit.errors import MechkitError

    if path.exists() and not path.is_dir():
        raise DispatchError(f"--offload-folder {path} is a file, not a folder", fix)
    from mechkit.io.out import refuse_dot_dot_past_missing

    try:  # nosuch/../OF: the system stops at nosuch, and making the folder made nosuch too (left behind)
        refuse_dot_dot_past_missing(path, "dir", "--offload-folder")
    except MechkitError as err:
        raise DispatchError(err.problem, err.fix) from None
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
    if isinstance(device_map, dict):
        _refuse_nested(device_map)
    folder = _check_folder(offload_folder) if offload_folder is not None else None
    return Dispatch(device_map=device_map, max_memory=memory, offload_folder=folder)


def _refuse_nested(mapping: Mapping) -> None:
    """One line where the map names a module and one inside it (``model=cpu,model.layers.1=disk``): accelerate
    placed the parent whole and left the child's weights on the meta device, which the load blamed on the weights."""
    names = sorted(str(k) for k in mapping if str(k))
    for outer in names:
        inner = next((n for n in names if n.startswith(outer + ".")), None)
        if inner is not None:
            raise DispatchError(f"--device-map names {outer} and {inner}, one inside the other",
                                f"name each module once: drop {outer}= and place its parts, or drop {inner}=")


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
